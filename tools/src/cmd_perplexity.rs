//! `pn perplexity`: the perplexity of a text file, by llama-perplexity's method so the two
//! figures compare: the text is tokenized once (BOS added if the model asks for it), cut
//! into non-overlapping windows of `--ctx` tokens (the last partial window dropped); each
//! window runs from a fresh state with its first token replaced by BOS (when the model
//! uses one), and only its second half is scored — every position from ctx/2 predicts the
//! next token — so each scored token has at least ctx/2 tokens of context.
//! PPL = exp(mean negative log-likelihood), ± its standard error as llama.cpp gives it.

use crate::{generate, load, output};
use anyhow::{bail, Result};
use clap::Args;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args)]
pub struct PerplexityArgs {
    #[command(flatten)]
    opts: load::ModelOpts,
    /// Text file to score (`-` = stdin)
    #[arg(long, short = 'f')]
    file: PathBuf,
    /// Window size in tokens (llama-perplexity's -c; its default is 512)
    #[arg(long, short = 'c', visible_alias = "ctx-size", default_value_t = 512)]
    ctx: usize,
    /// Score at most this many windows (default: all)
    #[arg(long)]
    chunks: Option<usize>,
}

/// `-log p(tok)` under softmax(`logits`), in f64 like llama.cpp's log_softmax.
fn nll(logits: &[f32], tok: u32) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
    -((logits[tok as usize] - max) as f64 - sum.ln())
}

/// Running sums of the scored tokens' NLL.
#[derive(Default)]
struct Score {
    nll: f64,
    nll2: f64,
    count: usize,
}

impl Score {
    fn add(&mut self, v: f64) {
        self.nll += v;
        self.nll2 += v * v;
        self.count += 1;
    }
    fn ppl(&self) -> f64 {
        (self.nll / self.count as f64).exp()
    }
    /// llama.cpp's `PPL ± ppl * sqrt(var(nll) / (count - 1))`.
    fn ppl_err(&self) -> f64 {
        let n = self.count as f64;
        let mean = self.nll / n;
        let var = self.nll2 / n - mean * mean;
        if var > 0.0 && self.count > 1 {
            (var / (n - 1.0)).sqrt() * self.ppl()
        } else {
            0.0
        }
    }
}

pub fn run(a: PerplexityArgs) -> Result<()> {
    if a.ctx < 4 {
        bail!("--ctx: expected a window of at least 4 tokens, found {}", a.ctx);
    }
    if a.chunks == Some(0) {
        bail!("--chunks: expected at least 1, found 0");
    }
    let state_cfg = load::state_config(&a.opts, Some(a.ctx), Some(pn_ops::KvType::F32))?;
    if state_cfg.max_seq < a.ctx {
        bail!("--ctx {}: expected at most {} tokens", a.ctx, state_cfg.max_seq);
    }
    let text = output::read_text(&a.file, "-f")?;
    load::check(&a.opts)?;
    let l = load::load(&a.opts)?;
    let tok = load::tokenizer(&l)?;
    let mut tokens: Vec<u32> = if tok.add_bos() { tok.bos().into_iter().collect() } else { vec![] };
    tokens.extend(tok.encode(&text, false));
    if tokens.len() < 2 * a.ctx {
        bail!("{}: expected at least {} tokens for --ctx {} (two windows), found {}", a.file.display(), 2 * a.ctx, a.ctx, tokens.len());
    }
    let n_chunk = (tokens.len() / a.ctx).min(a.chunks.unwrap_or(usize::MAX));
    let mut st = load::first_state(&l, &state_cfg)?;
    if !crate::progress::quiet() {
        eprintln!("{} tokens, {n_chunk} windows of {} (scoring the last {} of each)", tokens.len(), a.ctx, a.ctx - a.ctx / 2 - 1);
    }
    let first = a.ctx / 2;
    let mut score = Score::default();
    let pb = crate::progress::bar(n_chunk as u64, "perplexity", "windows");
    let t0 = Instant::now();
    for c in 0..n_chunk {
        let mut window = tokens[c * a.ctx..(c + 1) * a.ctx].to_vec();
        if let (true, Some(b)) = (tok.add_bos(), tok.bos()) {
            window[0] = b;
        }
        st.reset();
        let logits = generate::prefill(&l.runner, &mut st, &window, true, None)?;
        for j in first..a.ctx - 1 {
            score.add(nll(load::finite(logits.row(j))?, window[j + 1]));
        }
        pb.inc(1);
        pb.set_message(format!("perplexity {:.4}", score.ppl()));
        if !crate::progress::enabled() && !crate::progress::quiet() {
            eprintln!("[{}/{n_chunk}] {:.4}", c + 1, score.ppl());
        }
    }
    pb.finish_and_clear();
    let secs = t0.elapsed().as_secs_f64();
    output::print(
        &mut std::io::stdout().lock(),
        &format!("perplexity: {:.4} +/- {:.5} ({} tokens scored in {n_chunk} windows of {}, {secs:.1} s)\n", score.ppl(), score.ppl_err(), score.count, a.ctx),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nll_is_minus_log_softmax() {
        let l = [1.0f32, 2.0, 3.0];
        let z: f64 = l.iter().map(|&x| (x as f64).exp()).sum();
        assert!((nll(&l, 2) - (z.ln() - 3.0)).abs() < 1e-9);
        // uniform logits: ppl = vocabulary size
        let mut s = Score::default();
        for _ in 0..10 {
            s.add(nll(&[0.0; 8], 3));
        }
        assert!((s.ppl() - 8.0).abs() < 1e-9);
        assert!(s.ppl_err() < 1e-6, "{}", s.ppl_err());
    }
}

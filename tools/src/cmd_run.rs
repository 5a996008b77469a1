//! `pn run`: generate text, streamed token by token.

use crate::load;
use anyhow::{bail, Result};
use clap::Args;
use pn_engine::sampler::Sampler;
use pn_engine::tensor_dump::TensorRecorder;
use pn_engine::tokenizer::StreamDecoder;
use std::io::Write;
use std::time::Instant;

/// The prompt used when the built-in model runs without one.
const DEFAULT_PROMPT: &str = "def fibonacci(n):";

#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    opts: load::ModelOpts,
    #[command(flatten)]
    dump: crate::tensor_opts::DumpOpts,
    /// Prompt text (special tokens such as <|im_start|> are parsed)
    #[arg(long, short = 'p')]
    prompt: Option<String>,
    /// Tokens to generate
    #[arg(short = 'n', long = "n-predict", default_value_t = 128, allow_negative_numbers = true)]
    n: usize,
    #[command(flatten)]
    sampling: crate::sampling::SamplingOpts,
    /// Context size in tokens (KV cache capacity). Default: $PN_MAX_SEQ, $QWEN35_MAX_SEQ,
    /// else 4096; clamped to [16, 262144]
    #[arg(long)]
    max_seq: Option<usize>,
    /// Do not stop at end-of-generation tokens
    #[arg(long)]
    ignore_eos: bool,
}

/// One forward pass (last-token logits), observed by the tensor recorder when dumping.
fn step(r: &pn_engine::Runner, st: &mut pn_engine::SeqState, ids: &[u32], rec: Option<&mut TensorRecorder>) -> Result<pn_engine::runner::Logits> {
    Ok(match rec {
        Some(rec) => r.forward_observed(st, ids, false, Some(&mut |n, t| rec.record(n, t)))?,
        None => r.forward(st, ids, false)?,
    })
}

pub fn run(a: RunArgs) -> Result<()> {
    if a.n == 0 {
        bail!("-n: expected at least 1 token to generate, found 0");
    }
    let l = load::load(&a.opts)?;
    let tok = load::tokenizer(&l)?;
    let prompt = match (&a.prompt, l.is_default) {
        (Some(p), _) => p.clone(),
        (None, true) => DEFAULT_PROMPT.to_string(),
        (None, false) => bail!("--prompt: expected a prompt for --model (only the built-in model has a default prompt)"),
    };
    let cfg = a.sampling.config(l.is_default)?;
    let seed = cfg.seed;
    let kv_cfg = load::state_config(&a.opts, a.max_seq, None)?;
    let max_seq = kv_cfg.max_seq;
    let ring = kv_cfg.overflow == pn_ops::Overflow::Ring;
    let mut ids = Vec::new();
    if tok.add_bos() {
        ids.extend(tok.bos());
    }
    ids.extend(tok.encode(&prompt, true));
    if ids.is_empty() {
        bail!("--prompt: the text tokenized to no tokens");
    }
    if !ring && ids.len() >= max_seq {
        bail!("the prompt has {} tokens but the context holds {max_seq} (raise --max-seq, or --context-overflow ring)", ids.len());
    }
    let n_gen = if ring { a.n } else { a.n.min(max_seq - ids.len()) };
    if n_gen < a.n {
        eprintln!("warning: generating {n_gen} tokens, not {}: the context holds {max_seq}", a.n);
    }

    let mut st = load::alloc_state(&l, &kv_cfg)?;
    let mut sampler = Sampler::new(cfg);
    sampler.observe(&ids);
    let mut out = std::io::stdout().lock();
    write!(out, "{prompt}")?;
    out.flush()?;

    let t0 = Instant::now();
    let mut rec = a.dump.recorder()?;
    let logits = step(&l.runner, &mut st, &ids, rec.as_mut())?;
    let t_prompt = t0.elapsed().as_secs_f64();
    let mut next = sampler.sample(load::finite(logits.last())?);
    let mut dec = StreamDecoder::new();
    let t1 = Instant::now();
    let mut generated = 0;
    loop {
        if !a.ignore_eos && tok.is_eog(next) {
            break;
        }
        write!(out, "{}", dec.push(&tok, next))?;
        out.flush()?;
        generated += 1;
        if generated >= n_gen {
            break;
        }
        let logits = step(&l.runner, &mut st, &[next], rec.as_mut())?;
        next = sampler.sample(load::finite(logits.last())?);
    }
    writeln!(out, "{}", dec.flush())?;
    a.dump.finish(rec)?;
    let t_gen = t1.elapsed().as_secs_f64();
    eprintln!(
        "\n[{}: prompt {} tokens in {:.2}s ({:.1} tok/s), generated {} tokens in {:.2}s ({:.1} tok/s), seed {seed}]",
        l.name,
        ids.len(),
        t_prompt,
        ids.len() as f64 / t_prompt.max(1e-9),
        generated,
        t_gen,
        generated as f64 / t_gen.max(1e-9)
    );
    Ok(())
}

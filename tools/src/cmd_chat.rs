//! `pn chat`: an interactive multi-turn chat. The conversation state stays in the model:
//! each turn feeds only the text the chat template adds since the last turn.
//! Ctrl-C stops the current answer; Ctrl-D (end of input) quits; `/reset` starts over.

use crate::load;
use anyhow::{bail, Result};
use clap::Args;
use pn_engine::sampler::Sampler;
use pn_engine::tokenizer::{StreamDecoder, Tokenizer};
use pn_engine::conversation::Conversation;
use pn_engine::{Runner, SeqState};
use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

#[derive(Args)]
pub struct ChatArgs {
    #[command(flatten)]
    opts: load::ModelOpts,
    /// System prompt
    #[arg(long)]
    system: Option<String>,
    /// Most tokens per answer
    #[arg(short = 'n', long = "n-predict", default_value_t = 512)]
    n: usize,
    #[command(flatten)]
    sampling: crate::sampling::SamplingOpts,
    /// Context size in tokens (default 4096, or PN_MAX_SEQ)
    #[arg(long)]
    max_seq: Option<usize>,
}

pub fn run(a: ChatArgs) -> Result<()> {
    if a.n == 0 {
        bail!("-n: expected at least 1 token per answer, found 0");
    }
    let l = load::load(&a.opts)?;
    let tok = load::tokenizer(&l)?;
    let cfg = a.sampling.config(l.is_default)?;
    let state_cfg = load::state_config(&a.opts, a.max_seq, None)?;
    let max_seq = state_cfg.max_seq;
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        ctrlc::set_handler(move || stop.store(true, Ordering::SeqCst))?;
    }
    let mut sampler = Sampler::new(cfg);
    let mut conv = Conversation::new(a.system.as_deref(), load::alloc_state(&l, &state_cfg)?);
    eprintln!("{}: chat (Ctrl-C stops an answer, Ctrl-D quits, /reset starts over)", l.name);
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    loop {
        write!(out, "\n> ")?;
        out.flush()?;
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            writeln!(out)?;
            return Ok(());
        }
        let line = line.trim_end_matches(['\n', '\r']);
        if line.trim().is_empty() {
            continue;
        }
        if line.trim() == "/reset" {
            conv = Conversation::new(a.system.as_deref(), load::alloc_state(&l, &state_cfg)?);
            eprintln!("(conversation cleared)");
            continue;
        }
        let ids = match conv.user_turn(&tok, line) {
            Ok(ids) => ids,
            Err(e) => {
                eprintln!("error: {e}");
                continue;
            }
        };
        if !conv.st.fits(ids.len() + 1) {
            conv.cancel_user_turn();
            eprintln!("error: context full: the conversation would need {} tokens but --max-seq is {max_seq}; /reset to start over", conv.st.pos + ids.len() + 1);
            continue;
        }
        stop.store(false, Ordering::SeqCst);
        let answer = answer(&l.runner, &tok, &mut conv.st, &mut sampler, &ids, a.n, &stop, &mut out)?;
        conv.assistant_turn(answer);
    }
}

/// Feed `ids`, then sample until an end-of-generation token, `n` tokens, a full
/// context or Ctrl-C. Streams the text and returns it.
#[allow(clippy::too_many_arguments)]
fn answer(r: &Runner, tok: &Tokenizer, st: &mut SeqState, sampler: &mut Sampler, ids: &[u32], n: usize, stop: &AtomicBool, out: &mut impl Write) -> Result<String> {
    let t0 = Instant::now();
    sampler.observe(ids);
    let mut next = sampler.sample(r.forward(st, ids, false)?.last());
    let mut dec = StreamDecoder::new();
    let mut text = String::new();
    let t1 = Instant::now();
    let mut generated = 0;
    // every printed token is also fed, so the state always holds exactly the text shown
    while !tok.is_eog(next) && !stop.load(Ordering::SeqCst) {
        let piece = dec.push(tok, next);
        write!(out, "{piece}")?;
        out.flush()?;
        text.push_str(&piece);
        generated += 1;
        if !st.fits(1) {
            break;
        }
        let logits = r.forward(st, &[next], false)?;
        if generated >= n || !st.fits(1) {
            break;
        }
        next = sampler.sample(logits.last());
    }
    let rest = dec.flush();
    write!(out, "{rest}")?;
    text.push_str(&rest);
    let dt = t1.elapsed().as_secs_f64();
    let stopped = if stop.load(Ordering::SeqCst) { ", stopped" } else { "" };
    eprintln!(
        "\n[{generated} tokens, {:.1} tok/s; prompt {} tokens in {:.2}s{stopped}]",
        generated as f64 / dt.max(1e-9),
        ids.len(),
        (t1 - t0).as_secs_f64()
    );
    Ok(text)
}

//! `pn bench`: prefill and decode tokens/s as one JSON line, the same measurement and
//! fields as the oracle's `llama_bench.py`, so the two run side by side.

use crate::load;
use anyhow::{bail, Result};
use clap::Args;
use std::time::Instant;

#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    opts: load::ModelOpts,
    #[arg(long, default_value_t = 128)]
    prompt_len: usize,
    #[arg(long, default_value_t = 32)]
    gen: usize,
    /// Repetitions; the best is reported
    #[arg(long, default_value_t = 3)]
    reps: usize,
}

pub fn run(a: BenchArgs) -> Result<()> {
    if a.prompt_len == 0 || a.gen == 0 || a.reps == 0 {
        bail!("--prompt-len, --gen and --reps: expected values ≥ 1, found {}, {}, {}", a.prompt_len, a.gen, a.reps);
    }
    if a.prompt_len.checked_add(a.gen).is_none_or(|n| n > 262_144) {
        bail!("--prompt-len + --gen: expected at most 262144 tokens, found {} + {}", a.prompt_len, a.gen);
    }
    let l = load::load(&a.opts)?;
    let n_vocab = l.runner.model().n_vocab();
    if n_vocab <= 8 {
        bail!("the model's vocabulary ({n_vocab}) is too small to benchmark");
    }
    let v = n_vocab - 8;
    // the same token stream as llama_bench.py
    let prompt: Vec<u32> = (0..a.prompt_len).map(|i| ((i * 7919 + 13) % v) as u32).collect();
    let state_cfg = load::state_config(&a.opts, Some(a.prompt_len + a.gen + 16), None)?;
    let (mut best_pp, mut best_tg) = (0f64, 0f64);
    for rep in 0..a.reps {
        let mut st = if rep == 0 { load::first_state(&l, &state_cfg)? } else { load::alloc_state(&l, &state_cfg)? };
        let t0 = Instant::now();
        l.runner.forward(&mut st, &prompt, false)?;
        let t1 = Instant::now();
        let tok = *prompt.last().expect("prompt is not empty") as usize;
        for i in 0..a.gen {
            l.runner.forward(&mut st, &[((tok + i) % v) as u32], false)?;
        }
        let t2 = Instant::now();
        best_pp = best_pp.max(a.prompt_len as f64 / (t1 - t0).as_secs_f64());
        best_tg = best_tg.max(a.gen as f64 / (t2 - t1).as_secs_f64());
    }
    let round2 = |x: f64| (x * 100.0).round() / 100.0;
    let line = serde_json::json!({
            "engine": "pantheon",
            "model": l.name,
            "threads": a.opts.threads,
            "kv_type": state_cfg.kv.to_string(),
            "prompt_len": a.prompt_len,
            "gen": a.gen,
            "pp_tok_s": round2(best_pp),
            "tg_tok_s": round2(best_tg),
    });
    crate::output::print(&mut std::io::stdout().lock(), &format!("{line}\n"))
}

//! `pn bench`: prefill and decode tokens/s as one JSON line, the same measurement and
//! fields as the oracle's `llama_bench.py`, so the two run side by side. With
//! `--slots K`: K sequences decoded together through the decode slots, the measurement
//! of `llama_bench_batch.py` (its token streams too).

use crate::load;
use anyhow::{bail, Result};
use clap::Args;
use pn_engine::{SlotHandle, Slots};
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
    /// K sequences stepped together (decode slots): prints `agg_tg_tok_s` (decode steps
    /// only, K·gen tokens) and `agg_tok_s` (the same tokens over prefill + decode)
    #[arg(long)]
    slots: Option<usize>,
    #[command(flatten)]
    draft: crate::draft::DraftOpts,
    /// With --draft: the prompt, from a text file (default: the bench's token stream)
    #[arg(long, value_name = "FILE")]
    prompt_file: Option<std::path::PathBuf>,
    /// Also time verify passes of 2, 4 and 8 tokens against a 1-token step
    #[arg(long)]
    verify_cost: bool,
    /// With --draft lookup: the predicted output is the answer itself (the plain run's
    /// greedy token ids), as when an answer repeats a known text (a rewrite that keeps
    /// most of a file); on random weights the one way to get text that repeats
    #[arg(long)]
    predict_answer: bool,
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

pub fn run(a: BenchArgs) -> Result<()> {
    if a.prompt_len == 0 || a.gen == 0 || a.reps == 0 {
        bail!("--prompt-len, --gen and --reps: expected values ≥ 1, found {}, {}, {}", a.prompt_len, a.gen, a.reps);
    }
    if a.prompt_len.checked_add(a.gen).is_none_or(|n| n > 262_144) {
        bail!("--prompt-len + --gen: expected at most 262144 tokens, found {} + {}", a.prompt_len, a.gen);
    }
    if let Some(k) = a.slots {
        if k == 0 || k > pn_engine::slots::MAX_SLOTS {
            bail!("--slots: expected 1..={} sequences, found {k}", pn_engine::slots::MAX_SLOTS);
        }
    }
    a.draft.check()?;
    let drafting = a.draft.draft != pn_engine::spec::DraftKind::None;
    if a.predict_answer && (a.draft.draft != pn_engine::spec::DraftKind::Lookup || a.draft.draft_ref.is_some()) {
        bail!("--predict-answer: needs --draft lookup and no --draft-ref (found --draft {}{})", a.draft.draft, if a.draft.draft_ref.is_some() { " --draft-ref" } else { "" });
    }
    if (drafting || a.verify_cost) && a.slots.is_some() {
        bail!("--draft / --verify-cost: one sequence only (not with --slots)");
    }
    let l = load::load(&a.opts)?;
    let n_vocab = l.runner.model().n_vocab();
    if n_vocab <= 8 {
        bail!("the model's vocabulary ({n_vocab}) is too small to benchmark");
    }
    let state_cfg = load::state_config(&a.opts, Some(a.prompt_len.max(if a.prompt_file.is_some() { 4096 } else { 0 }) + a.gen + 16), None)?;
    let head = serde_json::json!({
        "engine": "pantheon",
        "model": l.name,
        "threads": a.opts.threads,
        "kv_type": state_cfg.kv.to_string(),
        "prompt_len": a.prompt_len,
        "gen": a.gen,
    });
    let mut line = match a.slots {
        None if drafting || a.verify_cost => drafts(&a, &l, &state_cfg)?,
        None => single(&a, &l, &state_cfg)?,
        Some(k) => slots(&a, l, &state_cfg, k)?,
    };
    let mut all = head.as_object().expect("an object").clone();
    all.append(line.as_object_mut().expect("an object"));
    crate::output::print(&mut std::io::stdout().lock(), &format!("{}\n", serde_json::Value::Object(all)))
}

/// One sequence: prefill the prompt, then `gen` single-token passes. Besides the best
/// repetition, `first_pp_tok_s`: the first one's prefill, a fresh process's first prompt
/// (its scratch and state pages touched for the first time — the best of the repetitions
/// hides what that costs, docs/perf.md "Session 32").
fn single(a: &BenchArgs, l: &load::Loaded, cfg: &pn_engine::state::kv::StateConfig) -> Result<serde_json::Value> {
    let v = l.runner.model().n_vocab() - 8;
    // the same token stream as llama_bench.py
    let prompt: Vec<u32> = (0..a.prompt_len).map(|i| ((i * 7919 + 13) % v) as u32).collect();
    let (mut best_pp, mut best_tg, mut first_pp) = (0f64, 0f64, 0f64);
    for rep in 0..a.reps {
        let mut st = if rep == 0 { load::first_state(l, cfg)? } else { load::alloc_state(l, cfg)? };
        let t0 = Instant::now();
        l.runner.forward(&mut st, &prompt, false)?;
        let t1 = Instant::now();
        let tok = *prompt.last().expect("prompt is not empty") as usize;
        for i in 0..a.gen {
            l.runner.forward(&mut st, &[((tok + i) % v) as u32], false)?;
        }
        let t2 = Instant::now();
        let pp = a.prompt_len as f64 / (t1 - t0).as_secs_f64();
        if rep == 0 {
            first_pp = pp;
        }
        best_pp = best_pp.max(pp);
        best_tg = best_tg.max(a.gen as f64 / (t2 - t1).as_secs_f64());
    }
    Ok(serde_json::json!({ "pp_tok_s": round2(best_pp), "tg_tok_s": round2(best_tg), "first_pp_tok_s": round2(first_pp) }))
}

/// `--draft` / `--verify-cost` (bench_draft.rs).
fn drafts(a: &BenchArgs, l: &load::Loaded, cfg: &pn_engine::state::kv::StateConfig) -> Result<serde_json::Value> {
    let prompt: Vec<u32> = match &a.prompt_file {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|e| anyhow::anyhow!("--prompt-file {}: {e}", p.display()))?;
            load::tokenizer(l)?.encode(&text, true)
        }
        None => {
            let v = l.runner.model().n_vocab() - 8;
            (0..a.prompt_len).map(|i| ((i * 7919 + 13) % v) as u32).collect()
        }
    };
    if prompt.is_empty() || prompt.len() + a.gen + 16 > cfg.max_seq {
        bail!("--prompt-file: expected 1..={} tokens, found {}", cfg.max_seq.saturating_sub(a.gen + 16), prompt.len());
    }
    let mut out = serde_json::Map::new();
    if a.draft.draft != pn_engine::spec::DraftKind::None {
        out.append(crate::bench_draft::compare(l, cfg, &a.draft, &prompt, a.gen, a.reps, a.predict_answer)?.as_object_mut().expect("an object"));
    }
    if a.verify_cost {
        out.append(crate::bench_draft::verify_cost(l, cfg, &prompt, a.reps)?.as_object_mut().expect("an object"));
    }
    Ok(serde_json::Value::Object(out))
}

/// K sequences: each prompt prefilled, bound to a slot, then `gen` steps of all K slots
/// in one pass each (token streams of llama_bench_batch.py). Each step goes through
/// `step_begin` + `step_wait`, so it runs in the mode `pn batch` uses (`async_for`: sync
/// on the CPU unless `PN_ASYNC=1`); the JSON says which (`async`). With K = 1 each rep
/// also decodes the same prompt and tokens as one plain sequence (`forward`, as
/// [`single`]), alternated in this process: `single_tg_tok_s` and `k1_over_single` (the
/// median of the reps' ratios) compare the slot path with the single-sequence one in the
/// same minutes, where two processes on a noisy host differ by more than the 3% asked.
fn slots(a: &BenchArgs, l: load::Loaded, cfg: &pn_engine::state::kv::StateConfig, k: usize) -> Result<serde_json::Value> {
    let v = l.runner.model().n_vocab() - 8;
    let mut first = Some(load::first_state(&l, cfg)?);
    let runner = std::sync::Arc::new(l.runner);
    let asynchronous = pn_engine::async_step::async_for(&runner);
    let (mut best_tg, mut best_all, mut best_pp) = (0f64, 0f64, 0f64);
    let (mut best_single, mut ratios) = (0f64, Vec::new());
    // slot s's prompt and its token at each step (K = 1's plain sequence decodes slot 0's)
    let prompt_of = |s: usize| -> Vec<u32> { (0..a.prompt_len).map(|i| ((s * 7919 + i * 13) % v) as u32).collect() };
    let token_of = |s: usize, step: usize| ((s * 31 + step) % v) as u32;
    for _ in 0..a.reps {
        let mut table = Slots::new(k);
        let t0 = Instant::now();
        let mut hs: Vec<SlotHandle> = Vec::with_capacity(k);
        for s in 0..k {
            let prompt = prompt_of(s);
            let mut st = match first.take() {
                Some(st) => st,
                None => load::alloc_state_on(&runner, cfg)?,
            };
            runner.forward(&mut st, &prompt, false)?;
            hs.push(table.bind(st)?);
        }
        let t1 = Instant::now();
        let mut batch: Vec<(SlotHandle, u32)> = Vec::with_capacity(k);
        for step in 0..a.gen {
            batch.clear();
            batch.extend(hs.iter().enumerate().map(|(s, &h)| (h, token_of(s, step))));
            table.step_begin_with(&runner, &batch, asynchronous)?;
            table.step_wait()?;
        }
        let t2 = Instant::now();
        let toks = (k * a.gen) as f64;
        best_pp = best_pp.max((k * a.prompt_len) as f64 / (t1 - t0).as_secs_f64());
        best_tg = best_tg.max(toks / (t2 - t1).as_secs_f64());
        best_all = best_all.max(toks / (t2 - t0).as_secs_f64());
        if k == 1 {
            let mut st = load::alloc_state_on(&runner, cfg)?;
            runner.forward(&mut st, &prompt_of(0), false)?;
            let t3 = Instant::now();
            for step in 0..a.gen {
                runner.forward(&mut st, &[token_of(0, step)], false)?;
            }
            let single = a.gen as f64 / t3.elapsed().as_secs_f64();
            best_single = best_single.max(single);
            ratios.push(a.gen as f64 / (t2 - t1).as_secs_f64() / single);
        }
    }
    let mut out = serde_json::json!({ "seqs": k, "async": asynchronous, "pp_tok_s": round2(best_pp), "agg_tg_tok_s": round2(best_tg), "agg_tok_s": round2(best_all) });
    if k == 1 {
        ratios.sort_by(f64::total_cmp);
        out["single_tg_tok_s"] = round2(best_single).into();
        out["k1_over_single"] = ((ratios[ratios.len() / 2] * 1000.0).round() / 1000.0).into();
    }
    Ok(out)
}

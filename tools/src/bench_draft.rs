//! `pn bench --draft …`: greedy decode tokens/s without and with drafts, side by side
//! in one run (the same prompt and the same greedy tokens, so the same work), and with
//! `--verify-cost` the time of a verify pass of 2/4/8 tokens relative to a 1-token
//! step (docs/speculative.md).

use crate::draft::DraftOpts;
use crate::load::{self, Loaded};
use anyhow::Result;
use pn_engine::sampler::{argmax, Sampler, SamplerConfig};
use pn_engine::state::kv::StateConfig;
use std::time::Instant;

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// Plain greedy decode of `gen` tokens after `prompt`: (decode seconds, tokens).
fn plain(l: &Loaded, cfg: &StateConfig, prompt: &[u32], gen: usize) -> Result<(f64, Vec<u32>)> {
    let mut st = load::alloc_state(l, cfg)?;
    let mut row = l.runner.forward(&mut st, prompt, false)?.last().to_vec();
    let t0 = Instant::now();
    let mut out = Vec::with_capacity(gen);
    while out.len() < gen {
        let t = argmax(&row) as u32;
        out.push(t);
        if out.len() < gen {
            row = l.runner.forward(&mut st, &[t], false)?.last().to_vec();
        }
    }
    Ok((t0.elapsed().as_secs_f64(), out))
}

/// The same with drafts (`answer`: a predicted output for the lookup drafter): (decode
/// seconds, tokens, acceptance line, acceptance).
fn drafted(l: &Loaded, cfg: &StateConfig, d: &DraftOpts, prompt: &[u32], gen: usize, answer: Option<&[u32]>) -> Result<(f64, Vec<u32>, String, f64, serde_json::Value)> {
    let mut st = load::alloc_state(l, cfg)?;
    let mut sp = d.speculator(l, cfg.max_seq)?.expect("--draft is not none");
    if let Some(a) = answer {
        sp.drafter.set_reference(a.into());
    }
    let mut s = Sampler::new(SamplerConfig::greedy());
    let row = sp.prefill(&l.runner, &mut st, prompt)?;
    let t0 = Instant::now();
    let mut next = s.sample(row.last());
    let mut out = Vec::with_capacity(gen + 16);
    while out.len() < gen {
        out.push(next);
        if out.len() == gen {
            break;
        }
        let (acc, n) = sp.round(&l.runner, &mut st, next, &mut s)?;
        out.extend(acc);
        next = n;
    }
    out.truncate(gen);
    let (t, k) = (sp.times, sp.stats.rounds.max(1) as f64);
    let drafting = sp.adapt.as_ref().map_or(1.0, |a| a.drafting_share());
    let per = serde_json::json!({"draft_ms": round2(t.draft * 1e3 / k), "verify_ms": round2(t.verify * 1e3 / k), "accept_ms": round2(t.accept * 1e3 / k), "rounds": sp.stats.rounds, "drafting_share": round2(drafting)});
    Ok((t0.elapsed().as_secs_f64(), out, sp.stats.line(), sp.stats.acceptance(), per))
}

/// Best-of-`reps` decode tokens/s without and with drafts, and whether the greedy tokens
/// agree; `predict_answer`: the plain run's tokens are the lookup drafter's predicted
/// output.
pub fn compare(l: &Loaded, cfg: &StateConfig, d: &DraftOpts, prompt: &[u32], gen: usize, reps: usize, predict_answer: bool) -> Result<serde_json::Value> {
    let (mut best_plain, mut best_draft) = (0f64, 0f64);
    let (mut same, mut line, mut acc, mut per) = (true, String::new(), 0.0, serde_json::Value::Null);
    for _ in 0..reps {
        let (tp, a) = plain(l, cfg, prompt, gen)?;
        let (td, b, ln, ac, pr) = drafted(l, cfg, d, prompt, gen, predict_answer.then_some(&a[..]))?;
        same &= a == b;
        best_plain = best_plain.max(gen as f64 / tp);
        if gen as f64 / td > best_draft {
            per = pr;
        }
        best_draft = best_draft.max(gen as f64 / td);
        (line, acc) = (ln, ac);
    }
    Ok(serde_json::json!({
        "draft": d.draft.to_string(),
        "draft_n": d.n(),
        "draft_policy": format!("{:?}", d.draft_policy).to_lowercase(),
        "predicted": if predict_answer { "answer" } else if d.draft_ref.is_some() { "file" } else { "none" },
        "tg_tok_s": round2(best_plain),
        "draft_tg_tok_s": round2(best_draft),
        "speedup": round2(best_draft / best_plain.max(1e-9)),
        "acceptance": round2(acc * 100.0),
        "acceptance_line": line,
        "same_tokens": same,
        "per_round": per,
        "plain_step_ms": round2(1e3 / best_plain.max(1e-9)),
    }))
}

/// A verify pass of n tokens (all logits, then rolled back) against a 1-token step, at
/// the end of `prompt`: best-of-`reps` seconds of each, as ratios.
pub fn verify_cost(l: &Loaded, cfg: &StateConfig, prompt: &[u32], reps: usize) -> Result<serde_json::Value> {
    let mut st = load::alloc_state(l, cfg)?;
    l.runner.forward(&mut st, prompt, false)?;
    let snap = st.snapshot()?;
    let v = l.runner.model().n_vocab() as u32;
    // n = 1: a plain decode step; n > 1: a verify pass rolled back to its first token
    // (with `hidden`: also copying out the hidden rows, as an MTP round's pass does)
    let mut time = |n: usize, hidden: bool| -> Result<f64> {
        let mut rows = Vec::new();
        let toks: Vec<u32> = (0..n as u32).map(|i| (i * 7 + 5) % v).collect();
        let mut best = f64::MAX;
        for _ in 0..reps.max(3) {
            let t0 = Instant::now();
            if n == 1 {
                l.runner.forward(&mut st, &toks, false)?;
            } else {
                let (_, pass) = pn_engine::spec::verify::verify(&l.runner, &mut st, &toks, hidden.then_some(&mut rows))?;
                pass.rollback(&mut st, 1)?;
            }
            best = best.min(t0.elapsed().as_secs_f64());
            st.restore(&snap)?;
        }
        Ok(best)
    };
    let one = time(1, false)?;
    let mut out = serde_json::Map::new();
    out.insert("step_1_ms".into(), round2(one * 1e3).into());
    for n in [2, 4, 8] {
        out.insert(format!("verify_{n}_ratio"), round2(time(n, false)? / one).into());
    }
    out.insert("verify_2_hidden_ratio".into(), round2(time(2, true)? / one).into());
    Ok(serde_json::Value::Object(out))
}

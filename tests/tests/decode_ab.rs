//! Decode speed of one model under several kernel knob sets, alternated in one process
//! (ignored; the only A/B a noisy shared box leaves meaningful):
//! `MODEL=/tmp/fd.gguf CFGS="plain=10:0;r16=" cargo test --release -p pn-tests --test
//! decode_ab -- --ignored --nocapture`. Each round runs `STEPS` decode steps per set
//! (after a 16-token prompt, in fresh states; `CONTEXT=N`: an N-token one), `ROUNDS`
//! rounds; prints tok/s best and median per set and the median of the per-round ratios to
//! the first set. `SLOTS=K`: K sequences per step (`Runner::forward_multi`).
#![cfg(target_arch = "x86_64")]

use pn_engine::gguf::{Gguf, LoadMode};
use pn_engine::Runner;
use std::sync::Arc;
use std::time::Instant;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn cfgs() -> Vec<(String, [usize; pn_ops::quant::N_KNOBS])> {
    pn_ops::testing::knob_sets(&std::env::var("CFGS").unwrap_or_else(|_| "plain=10:0;r16=".into())).expect("CFGS")
}

/// `n` tokens 100 + (7i mod 3000): decode_ab's prompt, prefill_ab's `TOKENS=seq`.
fn seq_tokens(n: usize) -> Vec<u32> {
    (0..n).map(|i| (100 + 7 * i % 3000) as u32).collect()
}

/// The runner of the `MODEL` file on the CPU (`THREADS`, default 2); None (and a note)
/// without `MODEL`.
fn runner() -> Option<Runner> {
    let Ok(path) = std::env::var("MODEL") else {
        eprintln!("MODEL=path.gguf not set: nothing to measure");
        return None;
    };
    let g = Arc::new(Gguf::open_with(std::path::Path::new(&path), LoadMode::Auto).expect("model opens"));
    let m = pn_models::load(&g).expect("model builds");
    Some(Runner::new(m, g, Arc::new(pn_cpu::CpuBackend::new(env("THREADS", 2)))).expect("runner"))
}

/// One line per set `names[c]`: tok/s best and median of its rounds `times[c]`, and the
/// median per-round ratio to the first set.
fn report(names: &[String], times: &[Vec<f64>]) {
    for (name, ts) in names.iter().zip(times) {
        let mut ratios: Vec<f64> = ts.iter().zip(&times[0]).map(|(a, b)| a / b).collect();
        ratios.sort_by(f64::total_cmp);
        let mut t = ts.clone();
        t.sort_by(f64::total_cmp);
        eprintln!("{name} best {:7.2} median {:7.2} tok/s, per-round ratio to {} median {:.3}", t[t.len() - 1], t[t.len() / 2], names[0].trim(), ratios[ratios.len() / 2]);
    }
}

#[test]
#[ignore]
fn decode_ab() {
    let Some(r) = runner() else { return };
    let (steps, rounds, slots) = (env("STEPS", 16), env("ROUNDS", 10), env("SLOTS", 1));
    let cf = cfgs();
    // `CONTEXT`: the prompt's length, the context each decode step attends over
    let prompt = seq_tokens(env("CONTEXT", 16));
    let mut times = vec![Vec::new(); cf.len()];
    for round in 0..rounds + 1 {
        for (c, (_, kn)) in cf.iter().enumerate() {
            pn_ops::quant::set_knobs(kn);
            let mut states: Vec<_> = (0..slots).map(|_| r.new_state(prompt.len() + steps + 1)).collect();
            for st in states.iter_mut() {
                r.forward(st, &prompt, false).expect("prefill");
            }
            let t0 = Instant::now();
            for s in 0..steps {
                let toks: Vec<u32> = (0..slots).map(|k| (200 + 13 * s + k) as u32).collect();
                if slots == 1 {
                    r.forward(&mut states[0], &toks, false).expect("decode");
                } else {
                    let mut parts: Vec<(&mut _, &[u32])> = states.iter_mut().zip(toks.chunks(1)).collect();
                    r.forward_multi(&mut parts).expect("decode step");
                }
            }
            if round > 0 {
                times[c].push((steps * slots) as f64 / t0.elapsed().as_secs_f64());
            }
        }
    }
    pn_ops::quant::set_knobs(&[usize::MAX; pn_ops::quant::N_KNOBS]);
    let names: Vec<String> = cf.iter().map(|(name, _)| format!("{name:10}")).collect();
    report(&names, &times);
}

/// Prefill speed of one model under several `ubatch` values, alternated in one process
/// (ignored): `MODEL=/tmp/real.gguf UBATCHES=128,256 PROMPT=512 cargo test --release -p
/// pn-tests --test decode_ab prefill_ab -- --ignored --nocapture`. Each round prefills
/// `PROMPT` tokens once per value (and knob set of `CFGS`, as in `decode_ab`) in a fresh
/// state (round 0 warms up: not counted); prints tok/s best and median per value and the
/// median per-round ratio to the first value.
#[test]
#[ignore]
fn prefill_ab() {
    let Some(mut r) = runner() else { return };
    let ubs: Vec<usize> = std::env::var("UBATCHES").unwrap_or_else(|_| "128,256".into()).split(',').filter_map(|s| s.trim().parse().ok()).collect();
    let (n, rounds) = (env("PROMPT", 512), env("ROUNDS", 3));
    // `pn bench`'s token stream (TOKENS=seq: 100 + 7i mod 3000)
    let v = r.model().n_vocab() - 8;
    let prompt: Vec<u32> = if std::env::var("TOKENS").is_ok_and(|t| t == "seq") {
        seq_tokens(n)
    } else {
        (0..n).map(|i| ((i * 7919 + 13) % v) as u32).collect()
    };
    // every ubatch under every knob set (`CFGS`, as in `decode_ab`; default: none)
    let cf = pn_ops::testing::knob_sets(&std::env::var("CFGS").unwrap_or_else(|_| "=".into())).expect("CFGS");
    let combos: Vec<(usize, &(String, _))> = ubs.iter().flat_map(|&ub| cf.iter().map(move |c| (ub, c))).collect();
    let mut times = vec![Vec::new(); combos.len()];
    for round in 0..rounds + 1 {
        for (c, &(ub, (_, kn))) in combos.iter().enumerate() {
            pn_ops::quant::set_knobs(kn);
            r.ubatch = ub;
            let mut st = r.new_state(n + 1);
            let t0 = Instant::now();
            r.forward(&mut st, &prompt, false).expect("prefill");
            if round > 0 {
                times[c].push(n as f64 / t0.elapsed().as_secs_f64());
            }
        }
    }
    pn_ops::quant::set_knobs(&[usize::MAX; pn_ops::quant::N_KNOBS]);
    let names: Vec<String> = combos.iter().map(|(ub, (name, _))| format!("ubatch {ub:5} {name}")).collect();
    report(&names, &times);
}

//! Speculative sampling keeps the model's distribution exactly (Leviathan et al. 2023;
//! engine/src/spec/accept.rs). On a tiny model's real logits, many seeds: the first and
//! second tokens a round emits follow the target distributions (chi-square at p = 0.001,
//! and a total-variation bound), and a known-wrong rule (on rejection, draw from the
//! target itself) fails the same test. End to end, the token after a forced one in a
//! prompt-lookup round has the model's distribution.

use pn_engine::runner::Logits;
use pn_engine::sampler::{Dist, Sampler, SamplerConfig};
use pn_engine::spec::accept::{accept_with, Rule};
use pn_engine::spec::{Drafter, Lookup, Speculator};
use pn_tests::*;

fn cfg(seed: u64) -> SamplerConfig {
    SamplerConfig { temperature: 1.0, top_k: 6, top_p: 1.0, min_p: 0.0, repeat_penalty: 1.0, repeat_last_n: 64, seed }
}

/// χ² critical values at p = 0.001 for 1..=10 degrees of freedom.
const CHI2_001: [f64; 10] = [10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12, 27.88, 29.59];

/// (χ², its critical value, total variation) of `counts` (n draws) against `d`.
fn fit(counts: &std::collections::HashMap<u32, u64>, d: &Dist) -> (f64, f64, f64) {
    let n: u64 = counts.values().sum();
    let total: f64 = d.w.iter().sum();
    let (mut chi, mut tv) = (0.0, 0.0);
    for (&id, &w) in d.ids.iter().zip(&d.w) {
        let e = n as f64 * w / total;
        let o = *counts.get(&id).unwrap_or(&0) as f64;
        chi += (o - e) * (o - e) / e.max(1e-9);
        tv += (o / n as f64 - w / total).abs();
    }
    let outside: u64 = counts.iter().filter(|(id, _)| !d.ids.contains(id)).map(|(_, c)| c).sum();
    tv += outside as f64 / n as f64;
    (chi + if outside > 0 { f64::INFINITY } else { 0.0 }, CHI2_001[(d.ids.len() - 2).min(9)], tv / 2.0)
}

/// A verify pass's rows for [x, d1, d2] on the tiny model, and the target distributions.
fn rows(r: &pn_engine::Runner, prompt: &[u32], x: u32, d: &[u32]) -> Logits {
    let mut st = r.new_state(64);
    r.forward(&mut st, prompt, false).unwrap();
    let toks: Vec<u32> = std::iter::once(x).chain(d.iter().copied()).collect();
    r.forward(&mut st, &toks, true).unwrap()
}

/// The candidate of `d` whose probability is nearest `p` (a draft the rule must weigh).
fn near(d: &Dist, p: f64) -> u32 {
    let total: f64 = d.w.iter().sum();
    let i = (0..d.ids.len()).min_by(|&a, &b| ((d.w[a] / total - p).abs()).total_cmp(&(d.w[b] / total - p).abs())).unwrap();
    d.ids[i]
}

/// Counts of the first and (after an accepted first draft) second emitted token.
fn run(rule: Rule, rows: &Logits, drafts: &[u32], n: u64) -> (std::collections::HashMap<u32, u64>, std::collections::HashMap<u32, u64>) {
    let (mut first, mut second) = (std::collections::HashMap::new(), std::collections::HashMap::new());
    for seed in 0..n {
        let mut s = Sampler::new(cfg(seed * 7919 + 1));
        let (k, next) = accept_with(&mut s, rows, drafts, rule);
        let y1 = if k >= 1 { drafts[0] } else { next };
        *first.entry(y1).or_insert(0) += 1;
        if k >= 1 {
            let y2 = if k >= 2 { drafts[1] } else { next };
            *second.entry(y2).or_insert(0) += 1;
        }
    }
    (first, second)
}

#[test]
fn rejection_sampling_keeps_the_distribution_and_a_broken_rule_fails() {
    let r = runner("tiny-f16.gguf", 2);
    let v = r.model().n_vocab() as u32;
    let prompt: Vec<u32> = (0..9).map(|i| (i * 31 + 5) % v).collect();
    let x = 17 % v;
    // the target distributions of the two positions (drafts chosen at p ≈ 0.35)
    let probe = rows(&r, &prompt, x, &[0]);
    let s = Sampler::new(cfg(0));
    let p1 = s.distribution(probe.row(0));
    let d1 = near(&p1, 0.35);
    let rw = rows(&r, &prompt, x, &[d1, 0]);
    let p2 = s.distribution(rw.row(1));
    let d2 = near(&p2, 0.35);
    let rw = rows(&r, &prompt, x, &[d1, d2]);
    assert_eq!(s.distribution(rw.row(0)), p1);
    let n = 20_000;
    let (f, sec) = run(Rule::Exact, &rw, &[d1, d2], n);
    let (c1, crit1, tv1) = fit(&f, &p1);
    let (c2, crit2, tv2) = fit(&sec, &p2);
    assert!(c1 < crit1 && tv1 < 0.02, "position 1: χ² {c1:.1} (critical {crit1}), TV {tv1:.4}");
    assert!(c2 < crit2 && tv2 < 0.03, "position 2: χ² {c2:.1} (critical {crit2}), TV {tv2:.4}");
    // the broken rule over-weights the drafts: caught at both positions
    let (f, sec) = run(Rule::ResampleFromTarget, &rw, &[d1, d2], n);
    let (b1, _, btv1) = fit(&f, &p1);
    let (b2, _, _) = fit(&sec, &p2);
    assert!(b1 > crit1 * 10.0 && btv1 > 0.1, "the broken rule passed position 1: χ² {b1:.1}, TV {btv1:.4}");
    assert!(b2 > crit2 * 10.0, "the broken rule passed position 2: χ² {b2:.1}");
    eprintln!("exact: χ² {c1:.1} / {c2:.1} (critical {crit1} / {crit2}), TV {tv1:.4} / {tv2:.4}; broken: χ² {b1:.1} / {b2:.1}, TV {btv1:.4}");
}

/// End to end: prefill, then a lookup round from a forced token whose earlier
/// occurrence proposes drafts; the round's first emitted token over many seeds follows
/// the model's distribution after the forced token.
#[test]
fn a_lookup_round_samples_the_model_distribution() {
    let r = runner("tiny-f16.gguf", 2);
    let v = r.model().n_vocab() as u32;
    let x = 23 % v;
    let base: Vec<u32> = (0..8).map(|i| (i * 41 + 3) % v).collect();
    // ... x a b c ... then x pending: lookup drafts a b c
    let prompt: Vec<u32> = [base.clone(), vec![x, base[1], base[2], base[3]], base[4..].to_vec()].concat();
    let p1 = {
        let mut st = r.new_state(64);
        let all: Vec<u32> = prompt.iter().copied().chain([x]).collect();
        let l = r.forward(&mut st, &all, false).unwrap();
        Sampler::new(cfg(0)).distribution(l.last())
    };
    let mut counts = std::collections::HashMap::new();
    let mut drafted = 0;
    for seed in 0..2000u64 {
        let mut st = r.new_state(64);
        let mut sp = Speculator::new(&r, Drafter::Lookup(Lookup::default()), 3).unwrap();
        let mut s = Sampler::new(cfg(seed * 104729 + 7));
        sp.prefill(&r, &mut st, &prompt).unwrap();
        let (acc, next) = sp.round(&r, &mut st, x, &mut s).unwrap();
        *counts.entry(acc.first().copied().unwrap_or(next)).or_insert(0u64) += 1;
        drafted += sp.stats.drafted;
    }
    assert!(drafted >= 2000, "lookup proposed no drafts after the forced token");
    let (c, crit, tv) = fit(&counts, &p1);
    assert!(c < crit && tv < 0.04, "χ² {c:.1} (critical {crit}), TV {tv:.4}");
}

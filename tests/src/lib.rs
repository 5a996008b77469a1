//! Shared helpers for the end-to-end tests: fixtures, loading, oracle comparison.
#![forbid(unsafe_code)]

use pn_cpu::CpuBackend;
use pn_engine::{Gguf, Runner};
use std::path::PathBuf;
use std::sync::Arc;

/// `tests/fixtures/NAME` (regenerate with `tests/fixtures/README.md`'s command).
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures").join(name)
}

pub fn runner(gguf_name: &str, threads: usize) -> Runner {
    let g = Arc::new(Gguf::open(&fixture(gguf_name)).expect("fixture opens"));
    let m = pn_models::load(&g).expect("fixture model loads");
    Runner::new(m, g, Arc::new(CpuBackend::new(threads))).expect("runner builds")
}

/// llama.cpp's logits for a fixture: tokens and one row of logits per position.
pub struct Oracle {
    pub tokens: Vec<u32>,
    pub logits: Vec<Vec<f32>>,
}

pub fn oracle(json_name: &str) -> Oracle {
    let s = std::fs::read_to_string(fixture(json_name)).expect("oracle json");
    let v: serde_json::Value = serde_json::from_str(&s).expect("oracle json parses");
    let tokens = v["tokens"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
    let logits = v["logits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_array().unwrap().iter().map(|x| x.as_f64().unwrap_or(f64::NAN) as f32).collect())
        .collect();
    Oracle { tokens, logits }
}

pub fn greedy_oracle(json_name: &str) -> (Vec<u32>, Vec<u32>) {
    let s = std::fs::read_to_string(fixture(json_name)).expect("greedy json");
    let v: serde_json::Value = serde_json::from_str(&s).expect("greedy json parses");
    let ids = |k: &str| v[k].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
    (ids("tokens"), ids("generated"))
}

/// Agreement of our logits with the oracle's, over positions.
#[derive(Debug, Clone, Copy)]
pub struct Agreement {
    pub argmax: f64,
    pub mean_pearson: f64,
    pub max_abs: f32,
}

pub fn pearson(a: &[f32], b: &[f32]) -> f64 {
    let n = a.len() as f64;
    let ma = a.iter().map(|&x| x as f64).sum::<f64>() / n;
    let mb = b.iter().map(|&x| x as f64).sum::<f64>() / n;
    let (mut sab, mut saa, mut sbb) = (0.0, 0.0, 0.0);
    for (&x, &y) in a.iter().zip(b) {
        let (dx, dy) = (x as f64 - ma, y as f64 - mb);
        sab += dx * dy;
        saa += dx * dx;
        sbb += dy * dy;
    }
    sab / (saa.sqrt() * sbb.sqrt()).max(1e-30)
}

pub fn agreement(ours: &[Vec<f32>], theirs: &[Vec<f32>]) -> Agreement {
    assert_eq!(ours.len(), theirs.len(), "row count");
    let mut agree = 0;
    let mut pr = 0.0;
    let mut max_abs = 0f32;
    for (a, b) in ours.iter().zip(theirs) {
        assert_eq!(a.len(), b.len(), "vocab size");
        if pn_engine::sampler::argmax(a) == pn_engine::sampler::argmax(b) {
            agree += 1;
        }
        pr += pearson(a, b);
        for (x, y) in a.iter().zip(b) {
            max_abs = max_abs.max((x - y).abs());
        }
    }
    let n = ours.len() as f64;
    Agreement { argmax: agree as f64 / n, mean_pearson: pr / n, max_abs }
}

/// Our logits for every position of `tokens`, in one batch.
pub fn all_logits(r: &Runner, tokens: &[u32]) -> Vec<Vec<f32>> {
    let mut st = r.new_state(tokens.len().max(16));
    let l = r.forward(&mut st, tokens, true).expect("forward");
    (0..l.rows()).map(|i| l.row(i).to_vec()).collect()
}

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

/// [`runner`] with `lanes` one-thread replicas running a multi-sequence pass in groups
/// side by side (`Runner::set_lanes`).
pub fn runner_with_lanes(gguf_name: &str, threads: usize, lanes: usize) -> Runner {
    let mut r = runner(gguf_name, threads);
    pn_cpu::add_lanes(&mut r, lanes).expect("lanes start");
    r
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

/// `n` greedy tokens after `prompt` (one prefill, then one token per step).
pub fn greedy(r: &Runner, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut st = r.new_state(prompt.len() + n + 16);
    let mut next = pn_engine::sampler::argmax(r.forward(&mut st, prompt, false).expect("prefill").last()) as u32;
    let mut got = vec![next];
    while got.len() < n {
        next = pn_engine::sampler::argmax(r.forward(&mut st, &[next], false).expect("decode").last()) as u32;
        got.push(next);
    }
    got
}

/// Our logits for every position of `tokens`, in one batch.
pub fn all_logits(r: &Runner, tokens: &[u32]) -> Vec<Vec<f32>> {
    let mut st = r.new_state(tokens.len().max(16));
    let l = r.forward(&mut st, tokens, true).expect("forward");
    (0..l.rows()).map(|i| l.row(i).to_vec()).collect()
}

/// Resident-protocol helpers (tests/tests/resident*.rs): runners whose dies are the
/// CPU backend or [`pn_engine::testing::ResidentMock`] over it.
pub mod resident {
    use super::fixture;
    use pn_cpu::CpuBackend;
    use pn_engine::planner::{Device, Placement};
    use pn_engine::runner::Die;
    use pn_engine::testing::ResidentMock;
    use pn_engine::{Backend, Gguf, Model, Runner};
    use std::path::PathBuf;
    use std::sync::Arc;

    /// The models the resident tests run: an attention-only llama, a hybrid
    /// (DeltaNet + attention) quantized model, and the default qwen35moe model.
    pub const MODELS: [&str; 3] = ["tiny-f16.gguf", "ktiny-q4_k_m.gguf", "default"];

    fn path(name: &str) -> PathBuf {
        if name == "default" {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/default/pn-default-code-q4_k_m.gguf")
        } else {
            fixture(name)
        }
    }

    pub fn load(name: &str) -> (Arc<Gguf>, Arc<dyn Model>) {
        let g = Arc::new(Gguf::open(&path(name)).expect("model opens"));
        let m = pn_models::load(&g).expect("model loads");
        (g, m)
    }

    /// A die: the CPU backend, or (`mock`) a ResidentMock over its own CPU backend.
    pub fn die(device: Device, mock: bool) -> (Die, Option<Arc<ResidentMock>>) {
        let cpu = Arc::new(CpuBackend::new(2));
        if mock {
            let m = Arc::new(ResidentMock::new(cpu));
            (Die { device, backend: m.clone() }, Some(m))
        } else {
            (Die { device, backend: cpu as Arc<dyn Backend> }, None)
        }
    }

    /// One die (`mock`: resident) with micro-batches of `ubatch` tokens.
    pub fn single(name: &str, mock: bool, ubatch: usize) -> (Runner, Option<Arc<ResidentMock>>) {
        let (g, m) = load(name);
        let dev = if mock { Device::cuda(0) } else { Device::cpu(0) };
        let (d, mk) = die(dev, mock);
        let mut r = Runner::with_dies(m, g, vec![d], Placement::single(dev)).expect("runner builds");
        r.ubatch = ubatch;
        (r, mk)
    }

    /// Layers `[0, split)` on die A, the rest on die B; `mocks` says which is resident.
    pub fn split(name: &str, split: usize, mocks: [bool; 2]) -> (Runner, [Option<Arc<ResidentMock>>; 2]) {
        let (g, m) = load(name);
        let dev = |i: usize| if mocks[i] { Device::cuda(i) } else { Device::cpu(i) };
        let (a, ma) = die(dev(0), mocks[0]);
        let (b, mb) = die(dev(1), mocks[1]);
        let p = Placement::split(dev(0), dev(1), split);
        (Runner::with_dies(m, g, vec![a, b], p).expect("split runner builds"), [ma, mb])
    }
}

//! KV-format quality benchmark (docs/kv-cache.md; driven by bench/kv_quality.sh). Ignored
//! by default: `cargo test --release -p pn-tests --test kv_quality -- --ignored --nocapture`.
//!
//! Env: PN_KVQ_MODEL (default the ktiny-q4_k_m fixture), PN_KVQ_N (2048 random token ids,
//! seed PN_KVQ_SEED), PN_KVQ_TOKENS_OUT (write the ids, comma-separated, for llama.cpp),
//! PN_KVQ_LLAMA (a folder with llama.cpp's f32.json / q8_0.json / q4_0.json logits for
//! the same ids), PN_KVQ_SWEEP=1 (also sweep the q4_0 shadow sizes), PN_KVQ_OUT (a
//! markdown file to write the table to).
//!
//! Each format is compared with f32 KV of the same engine: mean / max KL(p_f32 ‖ p_x) per
//! position in nats, and top-1 agreement, over all positions and over the second half.

use pn_engine::{Runner, SeqState};
use pn_ops::{KvCache, KvType, LayerState};
use pn_tests::*;

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|s| !s.is_empty())
}

fn log_softmax(x: &[f32]) -> Vec<f64> {
    let m = x.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let z = x.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln() + m;
    x.iter().map(|&v| v as f64 - z).collect()
}

/// (mean KL, median KL, max KL, top-1 agreement) of `b` against `a`, over rows `from..`.
fn compare(a: &[Vec<f32>], b: &[Vec<f32>], from: usize) -> (f64, f64, f64, f64) {
    let mut kls = Vec::new();
    let mut agree = 0usize;
    for (x, y) in a[from..].iter().zip(&b[from..]) {
        let (lp, lq) = (log_softmax(x), log_softmax(y));
        kls.push(lp.iter().zip(&lq).map(|(p, q)| p.exp() * (p - q)).sum::<f64>());
        agree += (pn_engine::sampler::argmax(x) == pn_engine::sampler::argmax(y)) as usize;
    }
    let n = kls.len() as f64;
    let mean = kls.iter().sum::<f64>() / n;
    kls.sort_by(f64::total_cmp);
    (mean, kls[kls.len() / 2], *kls.last().unwrap(), agree as f64 / n)
}

fn run(r: &Runner, st: &mut SeqState, toks: &[u32]) -> Vec<Vec<f32>> {
    let l = r.forward(st, toks, true).expect("forward");
    (0..l.rows()).map(|i| l.row(i).to_vec()).collect()
}

/// A state of format `ty` with explicit shadows and rotation (`rot`: keep the Hadamard).
fn state(r: &Runner, n: usize, ty: KvType, sink: usize, window: usize, rot: bool) -> SeqState {
    let mut st = r.new_state_with(n, ty);
    for l in st.layers_mut().unwrap() {
        if let LayerState::Kv(c) = l {
            let mut k = KvCache::with_shadows(c.n_head_kv, c.head_dim, c.capacity, ty, sink, window);
            if !rot {
                (k.rot_k, k.rot_v) = (0, 0);
            }
            *c = k;
        }
    }
    st
}

#[test]
#[ignore]
fn kv_quality() {
    let model = env("PN_KVQ_MODEL").unwrap_or_else(|| fixture("ktiny-q4_k_m.gguf").display().to_string());
    let n: usize = env("PN_KVQ_N").map_or(2048, |s| s.parse().unwrap());
    let seed: u64 = env("PN_KVQ_SEED").map_or(42, |s| s.parse().unwrap());
    let g = std::sync::Arc::new(pn_engine::Gguf::open(std::path::Path::new(&model)).unwrap());
    let m = pn_models::load(&g).unwrap();
    let n_vocab = m.n_vocab().min(1024) as u64;
    let r = Runner::new(m, g, std::sync::Arc::new(pn_cpu::CpuBackend::new(0))).unwrap();
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let toks: Vec<u32> = (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 33) % n_vocab) as u32
        })
        .collect();
    if let Some(p) = env("PN_KVQ_TOKENS_OUT") {
        std::fs::write(p, toks.iter().map(u32::to_string).collect::<Vec<_>>().join(",")).unwrap();
    }
    let half = n / 2;
    let mut table = format!("model `{}`, {n} random token ids (seed {seed})\n\n", model.rsplit('/').next().unwrap());
    table += "| KV | mean KL | median KL | max KL | top-1 | median KL 2nd half | top-1 2nd half |\n|---|---|---|---|---|---|---|\n";
    let mut row = |name: &str, a: &[Vec<f32>], b: &[Vec<f32>]| {
        let (kl, med, mx, t1) = compare(a, b, 0);
        let (_, med2, _, t2) = compare(a, b, half);
        let line = format!("| {name} | {kl:.3e} | {med:.3e} | {mx:.3e} | {t1:.4} | {med2:.3e} | {t2:.4} |\n");
        eprint!("{line}");
        table += &line;
    };
    let t0 = std::time::Instant::now();
    let f32l = run(&r, &mut r.new_state_with(n, KvType::F32), &toks);
    eprintln!("f32 pass: {:.1}s", t0.elapsed().as_secs_f64());
    let (sink, window) = KvType::Q4_0.default_shadows();
    let mut configs = vec![
        ("f16".to_string(), KvType::F16, 0, 0, true),
        ("q8_0".to_string(), KvType::Q8_0, 0, 0, true),
        ("q8_0, no Hadamard".to_string(), KvType::Q8_0, 0, 0, false),
        ("q4_0, no shadows".to_string(), KvType::Q4_0, 0, 0, true),
        ("q4_0, no shadows, no Hadamard".to_string(), KvType::Q4_0, 0, 0, false),
        (format!("q4_0 (default: sink {sink}, window {window})"), KvType::Q4_0, sink, window, true),
    ];
    if env("PN_KVQ_SWEEP").is_some() {
        for (s, w) in [(1, 0), (4, 0), (16, 0), (0, 16), (0, 64), (0, 256), (4, 16), (4, 256), (16, 64), (4, 1024)] {
            configs.push((format!("q4_0 sink {s} window {w}"), KvType::Q4_0, s, w, true));
        }
    }
    for (name, ty, s, w, rot) in configs {
        let l = run(&r, &mut state(&r, n, ty, s, w, rot), &toks);
        row(&name, &f32l, &l);
    }
    if let Some(dir) = env("PN_KVQ_LLAMA") {
        let rows = |f: &str| oracle_path(&format!("{dir}/{f}"));
        let lf = rows("f32.json");
        row("ours f32 vs llama.cpp f32 (sanity)", &lf, &f32l);
        for q in ["f16", "q8_0", "q4_0"] {
            if std::path::Path::new(&format!("{dir}/{q}.json")).exists() {
                row(&format!("llama.cpp {q} (vs llama.cpp f32)"), &lf, &rows(&format!("{q}.json")));
            }
        }
    }
    if let Some(p) = env("PN_KVQ_OUT") {
        std::fs::write(p, &table).unwrap();
    }
}

fn oracle_path(path: &str) -> Vec<Vec<f32>> {
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).expect(path)).unwrap();
    v["logits"].as_array().unwrap().iter().map(|r| r.as_array().unwrap().iter().map(|x| x.as_f64().unwrap_or(f64::NAN) as f32).collect()).collect()
}

/// Attention alone on inputs shaped like a trained model's: an attention sink (position
/// 0's key aligned with every query), a recency bias from rotary-like position pairs,
/// Gaussian noise and a few large key channels. Reports the relative L2 error of the
/// attention output of each KV format vs f32, and the share of attention mass on the
/// sink and on the last WINDOW positions. PN_KVQ_ATTN_N positions (default 2048).
#[test]
#[ignore]
fn kv_quality_attention() {
    use pn_ops::reference::common::meta_of;
    use pn_ops::{Op, Shape, Tensor, TensorMeta, Value};
    let n: usize = env("PN_KVQ_ATTN_N").map_or(2048, |s| s.parse().unwrap());
    let (h, hkv, d) = (4usize, 2usize, 128usize);
    let scale = 1.0 / (d as f32).sqrt();
    let mut s = 12345u64;
    let mut gauss = || {
        let mut u = || {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        };
        ((-2.0 * u().ln()).sqrt() * (std::f64::consts::TAU * u()).cos()) as f32
    };
    let amp = (6.0 / (8.0 * scale)).sqrt(); // recency: scale·amp²·Σcos = 6 at distance 0
    let sink = (9.0 / scale).sqrt(); // sink: scale·q·k = 9
    let (mut q, mut k, mut v) = (vec![0f32; n * h * d], vec![0f32; n * hkv * d], vec![0f32; n * hkv * d]);
    for t in 0..n {
        let rot = |x: &mut [f32], a: f32| {
            for f in 0..8 {
                let th = t as f32 * 0.5f32.powi(f as i32 + 1);
                (x[2 * f], x[2 * f + 1]) = (a * th.cos(), a * th.sin());
            }
        };
        for hh in 0..h {
            let x = &mut q[(t * h + hh) * d..][..d];
            x.iter_mut().for_each(|e| *e = gauss());
            rot(x, amp);
            x[16] = sink;
        }
        for g in 0..hkv {
            let x = &mut k[(t * hkv + g) * d..][..d];
            x.iter_mut().for_each(|e| *e = gauss());
            rot(x, amp);
            x[16] = if t == 0 { sink } else { 0.0 };
            x[17..21].iter_mut().for_each(|e| *e *= 5.0);
            v[(t * hkv + g) * d..][..d].iter_mut().for_each(|e| *e = gauss());
        }
    }
    let be = pn_cpu::CpuBackend::new(0);
    let op = Op::Attention { n_head: h, n_head_kv: hkv, head_dim: d, scale, state: 0 };
    let (qt, kt, vt) = (Tensor::f32(Shape::d3(d, h, n), q.clone()), Tensor::f32(Shape::d3(d, hkv, n), k.clone()), Tensor::f32(Shape::d3(d, hkv, n), v));
    let pt = Tensor::i32(Shape::d1(n), (0..n as i32).collect());
    let ins = [Value::Act(&qt), Value::Act(&kt), Value::Act(&vt), Value::Act(&pt)];
    let out = op.infer(&ins.iter().map(meta_of).collect::<Vec<TensorMeta>>()).unwrap();
    let attend = |mut c: KvCache, rot: bool| {
        if !rot {
            (c.rot_k, c.rot_v) = (0, 0);
        }
        let mut st = LayerState::Kv(c);
        pn_engine::HostKernels::execute(&be, &op, &ins, &out, Some(&mut st)).unwrap().as_f32().to_vec()
    };
    let want = attend(KvCache::new(hkv, d, n), true);
    // attention mass on the sink and on the last 64 positions (query t = n-1, head 0)
    let sc: Vec<f64> = (0..n).map(|j| scale as f64 * (0..d).map(|i| q[((n - 1) * h) * d + i] as f64 * k[(j * hkv) * d + i] as f64).sum::<f64>()).collect();
    let m = sc.iter().cloned().fold(f64::MIN, f64::max);
    let e: Vec<f64> = sc.iter().map(|x| (x - m).exp()).collect();
    let z: f64 = e.iter().sum();
    eprintln!("attention mass of the last query: sink {:.2}, last 64 positions {:.2}", e[0] / z, e[n - 64..].iter().sum::<f64>() / z);
    let err = |got: &[f32], from: usize| {
        let rows = (from..n).flat_map(|t| (0..h).map(move |hh| (t * h + hh) * d));
        let (mut sum, mut cnt) = (0.0, 0);
        for r in rows {
            let (a, b) = (&want[r..r + d], &got[r..r + d]);
            let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
            let den: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum();
            sum += (num / den).sqrt();
            cnt += 1;
        }
        sum / cnt as f64
    };
    eprintln!("| KV | mean rel. L2 error | 2nd half |\n|---|---|---|");
    let mut cases: Vec<(String, KvCache, bool)> = vec![
        ("f16".into(), KvCache::with_type(hkv, d, n, KvType::F16), true),
        ("q8_0".into(), KvCache::with_type(hkv, d, n, KvType::Q8_0), true),
        ("q8_0, no Hadamard".into(), KvCache::with_type(hkv, d, n, KvType::Q8_0), false),
        ("q4_0, no Hadamard, no shadows".into(), KvCache::with_shadows(hkv, d, n, KvType::Q4_0, 0, 0), false),
    ];
    for (s, w) in [(0, 0), (1, 0), (4, 0), (16, 0), (0, 16), (0, 64), (0, 256), (1, 16), (4, 16), (4, 32), (4, 64), (4, 128), (4, 256), (16, 256)] {
        cases.push((format!("q4_0 sink {s} window {w}"), KvCache::with_shadows(hkv, d, n, KvType::Q4_0, s, w), true));
    }
    for (name, c, rot) in cases {
        let got = attend(c, rot);
        eprintln!("| {name} | {:.4e} | {:.4e} |", err(&got, 0), err(&got, n / 2));
    }
}

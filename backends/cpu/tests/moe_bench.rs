//! MoeExperts with few tokens per expert, at full-dims shapes (K = 2048, F = 512, gate /
//! up Q4_K, down Q6_K as in q4_k_m), the weights of `LAYERS` layers cycled so every call
//! streams its experts from memory as a forward pass does (ignored by default):
//! `E=64 cargo test --release -p pn-cpu --test moe_bench -- --ignored --nocapture`
//! (`KD`, `F`, `TOP`: other expert shapes and top-k).
//! Prints, per token count n: best and median ms per call, the distinct experts, and the
//! ratio to the byte bound (distinct experts' bytes at the n = 1 call's bandwidth).
//! `matmul_few_tokens`: the non-expert matmuls the same way. `CFGS="a=;b=1:99,3:99"`
//! (name=knob:value,…; knobs `pn_ops::quant::KNOB_*`) alternates dispatch thresholds call
//! by call in one process: on a box shared with other work, the only A/B that means much.
//! The weights carry their `rows16` copies (`pn_ops::quant::rows16`) as the loader makes
//! them; knob 10 (`KNOB_ROWS16`) at 0 reads the plain rows: `CFGS="plain=10:0;r16="`.
#![cfg(target_arch = "x86_64")]

mod common;

use pn_cpu::CpuBackend;
use pn_engine::HostKernels;
use pn_ops::reference::common::meta_of;
use pn_ops::*;
use std::time::Instant;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// `rows` random rows of `ty` (Q4_K or Q6_K) with small super-block scales.
fn weights(ty: GgmlType, k: usize, rows: usize, rng: &mut Rng) -> Vec<u8> {
    let rb = ty.row_bytes(k).unwrap();
    if ty == GgmlType::F32 {
        // small finite floats (random bytes would hold NaNs and denormals)
        return (0..k * rows).flat_map(|_| ((rng.next() % 2001) as f32 / 1000.0 - 1.0).to_le_bytes()).collect();
    }
    let mut out: Vec<u8> = (0..rb * rows).map(|_| rng.next() as u8).collect();
    let h = half::f16::from_f32(0.002).to_le_bytes();
    for b in out.chunks_mut(ty.type_size()) {
        match ty {
            GgmlType::Q6K => b[208..210].copy_from_slice(&h),
            _ => {
                b[0..2].copy_from_slice(&h);
                b[2..4].copy_from_slice(&h);
            }
        }
    }
    out
}

#[test]
#[ignore]
fn moe_few_tokens() {
    let be = CpuBackend::new(env("THREADS", 2));
    // full-dims by default; KD / F / TOP give other shapes (the default model: 256, 256, 2)
    let (kd, f, e, top) = (env("KD", 2048), env("F", 512), env("E", 64), env("TOP", 8));
    let layers = env("LAYERS", 8);
    let reps = env("REPS", 24);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let ws: Vec<(Vec<u8>, Vec<u8>, Vec<u8>)> = (0..layers)
        .map(|_| {
            (
                weights(GgmlType::Q4K, kd, f * e, &mut rng),
                weights(GgmlType::Q4K, kd, f * e, &mut rng),
                weights(GgmlType::Q6K, f, kd * e, &mut rng),
            )
        })
        .collect();
    let ws16: Vec<(Vec<u8>, Vec<u8>, Vec<u8>)> = ws
        .iter()
        .map(|(g, u, d)| (rows16_of(GgmlType::Q4K, kd, f * e, g), rows16_of(GgmlType::Q4K, kd, f * e, u), rows16_of(GgmlType::Q6K, f, kd * e, d)))
        .collect();
    let per_expert = 2 * GgmlType::Q4K.row_bytes(kd).unwrap() * f + GgmlType::Q6K.row_bytes(f).unwrap() * kd;
    let tokens: Vec<usize> = std::env::var("NS")
        .ok()
        .map(|v| v.split(',').filter_map(|s| s.parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 2, 4, 8, 16, 32, 128]);
    let mut bw1 = None;
    eprintln!("threads {}, {e} experts, {layers} layers, {:.2} MB per expert", be.threads(), per_expert as f64 / 1e6);
    for &t in &tokens {
        let x = Tensor::f32(Shape::d2(kd, t), pn_ops::testing::uniform(kd * t, 9, 99991));
        // each token: `top` distinct experts drawn at random (`RANDOM_IDS=1`: new ones
        // every call, so the experts come from memory as a model's do, not from the cache)
        let draw = |rng: &mut Rng| -> Vec<i32> {
            (0..t)
                .flat_map(|_| {
                    let mut s: Vec<i32> = Vec::new();
                    while s.len() < top {
                        let id = (rng.next() % e as u64) as i32;
                        if !s.contains(&id) {
                            s.push(id);
                        }
                    }
                    s
                })
                .collect()
        };
        let ids = draw(&mut rng);
        let mut distinct = ids.clone();
        distinct.sort_unstable();
        distinct.dedup();
        let random_ids = env("RANDOM_IDS", 0) != 0;
        let idss: Vec<Tensor> = (0..if random_ids { 64 } else { 1 }).map(|i| Tensor::i32(Shape::d2(top, t), if i == 0 { ids.clone() } else { draw(&mut rng) })).collect();
        let wt = Tensor::f32(Shape::d2(top, t), vec![0.125; top * t]);
        let cf = cfgs();
        let mut times = vec![Vec::new(); cf.len()];
        let mut call = 0;
        for rep in 0..reps + layers {
            for (c, (_, kn)) in cf.iter().enumerate() {
                pn_ops::quant::set_knobs(kn);
                let ((g, u, d), (g16, u16, d16)) = (&ws[call % layers], &ws16[call % layers]);
                call += 1;
                let view = |name, ty, shape, bytes, rows16| Value::Weight(WeightView { name, ty, shape, bytes, rows16 });
                let ids = &idss[call % idss.len()];
                let ins = [
                    Value::Act(&x),
                    Value::Act(ids),
                    Value::Act(&wt),
                    view("g", GgmlType::Q4K, Shape::d3(kd, f, e), g, copy(g16)),
                    view("u", GgmlType::Q4K, Shape::d3(kd, f, e), u, copy(u16)),
                    view("d", GgmlType::Q6K, Shape::d3(f, kd, e), d, copy(d16)),
                ];
                let metas: Vec<TensorMeta> = ins.iter().map(meta_of).collect();
                let op = Op::MoeExperts { merged_gate_up: false };
                let out = op.infer(&metas).unwrap();
                let t0 = Instant::now();
                be.execute(&op, &ins, &out, None).unwrap();
                if rep >= layers {
                    times[c].push(t0.elapsed().as_secs_f64() * 1e3);
                }
            }
        }
        let bytes = (distinct.len() * per_expert) as f64;
        let mut line = format!("n={t:4} experts {:3}", distinct.len());
        for (c, (name, _)) in cf.iter().enumerate() {
            times[c].sort_by(f64::total_cmp);
            let (best, q1, med) = (times[c][0], times[c][times[c].len() / 4], times[c][times[c].len() / 2]);
            let bw = *bw1.get_or_insert(bytes / best);
            line += &format!(" | {name} {best:6.3}/{q1:6.3}/{med:6.3} ms {:5.1} GB/s {:.2}x", bytes / best / 1e6, best / (bytes / bw));
        }
        eprintln!("{line}");
    }
}

/// `w`'s `rows16` copy as the loader makes it (`common::rows16_copy`; empty: none).
fn rows16_of(ty: GgmlType, k: usize, rows: usize, w: &[u8]) -> Vec<u8> {
    common::rows16_copy(ty, k, rows, w).unwrap_or_default()
}

/// A weight's `rows16` copy for its view (None where `rows16_of` made none).
fn copy(p: &[u8]) -> Option<&[u8]> {
    (!p.is_empty()).then_some(p)
}

/// Knob sets to compare: `CFGS="a=;b=0:9,1:99"` (`pn_ops::testing::knob_sets`).
fn cfgs() -> Vec<(String, [usize; pn_ops::quant::N_KNOBS])> {
    pn_ops::testing::knob_sets(&std::env::var("CFGS").unwrap_or_else(|_| "base=".into())).expect("CFGS")
}

/// The non-expert matmuls of a full-dims layer (attn_qkv Q6_K 2048×8192, attn_gate Q4_K
/// 2048×4096, ssm_out Q4_K 4096×2048) at few tokens, `LAYERS` copies cycled (streamed),
/// the knob sets interleaved call by call.
#[test]
#[ignore]
fn matmul_few_tokens() {
    let be = CpuBackend::new(env("THREADS", 2));
    let layers = env("LAYERS", 8);
    let reps = env("REPS", 24);
    let cf = cfgs();
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let ns: Vec<usize> = std::env::var("NS")
        .ok()
        .map(|v| v.split(',').filter_map(|s| s.parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 2, 3, 4, 8, 16]);
    let mut shapes = vec![(GgmlType::Q6K, 2048, 8192), (GgmlType::Q6K, 512, 16384), (GgmlType::Q4K, 2048, 4096), (GgmlType::Q4K, 4096, 2048), (GgmlType::Q8_0, 2048, 4096), (GgmlType::Q8_0, 4096, 2048)];
    // `KN=k,n`: that one shape instead, as Q4_K and Q6_K (a small model's matmuls), or as
    // the types `TYPES` names (e.g. `TYPES=IQ4_XS,Q4_K`)
    if let Some((k, n)) = std::env::var("KN").ok().and_then(|v| v.split_once(',').and_then(|(k, n)| Some((k.parse().ok()?, n.parse().ok()?)))) {
        let types = std::env::var("TYPES").unwrap_or_else(|_| "Q4_K,Q6_K".into());
        let all = [GgmlType::Q4K, GgmlType::Q5K, GgmlType::Q6K, GgmlType::IQ4XS, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::IQ4NL, GgmlType::F32];
        shapes = types.split(',').map(|t| (*all.iter().find(|ty| ty.to_string() == t).expect("TYPES: Q4_K, Q5_K, Q6_K, IQ4_XS, Q8_0, Q4_0, IQ4_NL or F32"), k, n)).collect();
    }
    let only = std::env::var("SHAPES").ok();
    for (si, (ty, k, n)) in shapes.into_iter().enumerate() {
        if only.as_ref().is_some_and(|o| !o.split(',').any(|s| s == si.to_string())) {
            continue;
        }
        let ws: Vec<Vec<u8>> = (0..layers).map(|_| weights(ty, k, n, &mut rng)).collect();
        let ws16: Vec<Vec<u8>> = ws.iter().map(|w| rows16_of(ty, k, n, w)).collect();
        let bytes = ws[0].len() as f64;
        for &t in &ns {
            let x = Tensor::f32(Shape::d2(k, t), pn_ops::testing::uniform(k * t, 3, 99991));
            let mut times = vec![Vec::new(); cf.len()];
            let mut call = 0;
            for rep in 0..reps + 2 {
                for (c, (_, kn)) in cf.iter().enumerate() {
                    pn_ops::quant::set_knobs(kn);
                    let rows16 = copy(&ws16[call % layers]);
                    let w = WeightView { name: "w", ty, shape: Shape::d2(k, n), bytes: &ws[call % layers], rows16 };
                    call += 1;
                    let ins = [Value::Weight(w), Value::Act(&x)];
                    let metas: Vec<TensorMeta> = ins.iter().map(meta_of).collect();
                    let out = Op::MatMul.infer(&metas).unwrap();
                    let t0 = Instant::now();
                    be.execute(&Op::MatMul, &ins, &out, None).unwrap();
                    if rep >= 2 {
                        times[c].push(t0.elapsed().as_secs_f64() * 1e3);
                    }
                }
            }
            let mut line = format!("{ty} {k}x{n} n={t:3}");
            for (c, (name, _)) in cf.iter().enumerate() {
                times[c].sort_by(f64::total_cmp);
                let (b, m) = (times[c][0], times[c][times[c].len() / 2]);
                line += &format!(" | {name} {b:6.3}/{m:6.3} ms {:5.1} GB/s", bytes / b / 1e6);
            }
            eprintln!("{line}");
        }
    }
}

//! The MoE's two schedules give the same bits: one task per expert's whole FFN (few tokens
//! per expert, enough experts) and one parallel loop per projection (knob 15,
//! `KNOB_MOE_FUSED_UPTO`, at 0 forces it). Both must equal the reference bit for bit, with
//! and without the weights' `rows16` copies, split and merged gate/up, 1–3 threads.
#![cfg(target_arch = "x86_64")]

use pn_cpu::CpuBackend;
use pn_engine::HostKernels;
use pn_ops::quant::{KNOB_MOE_FUSED_UPTO, N_KNOBS};
use pn_ops::reference::common::meta_of;
use pn_ops::*;

mod common;
use common::{bits, rows16_copy as rows16, weights};

/// A weight, with its `rows16` copy when `with16`.
fn view<'a>(ty: GgmlType, shape: Shape, bytes: &'a [u8], p: &'a Option<Vec<u8>>, with16: bool) -> Value<'a> {
    let rows16 = if with16 { p.as_deref() } else { None };
    Value::Weight(WeightView { name: "w", ty, shape, bytes, rows16 })
}

#[test]
fn per_expert_tasks_and_projection_loops_agree_with_the_reference() {
    let (kd, f, e) = (256, 512, 16);
    let bes = [1, 2, 3].map(CpuBackend::new);
    for (gty, dty) in [(GgmlType::Q4K, GgmlType::Q6K), (GgmlType::Q8_0, GgmlType::Q8_0)] {
        let (g, u, gu, d) = (weights(gty, kd, f * e, 1), weights(gty, kd, f * e, 2), weights(gty, kd, 2 * f * e, 3), weights(dty, f, kd * e, 4));
        let (g16, u16, gu16, d16) = (rows16(gty, kd, f * e, &g), rows16(gty, kd, f * e, &u), rows16(gty, kd, 2 * f * e, &gu), rows16(dty, f, kd * e, &d));
        // 1 token × top 8 (decode), 12 × 3, 20 × 2: at most 8 tokens per expert, ≥ 6 experts
        for (t, top, seed) in [(1, 8, 10), (12, 3, 11), (20, 2, 12)] {
            let x = Tensor::f32(Shape::d2(kd, t), pn_ops::testing::uniform(kd * t, seed, 99991));
            let logits = Tensor::f32(Shape::d2(e, t), pn_ops::testing::uniform(e * t, seed + 100, 99991));
            let ids = pn_ops::reference::execute(&Op::TopK { k: top }, &[Value::Act(&logits)], &TensorMeta::i32(Shape::d2(top, t)), None).unwrap();
            let mut per = vec![0; e];
            ids.as_i32().iter().for_each(|&i| per[i as usize] += 1);
            let active = per.iter().filter(|&&n| n > 0).count();
            assert!(per.iter().all(|&n| n <= 8) && active >= 6, "t {t}: {per:?} would not take the per-expert path");
            let w = Tensor::f32(Shape::d2(top, t), pn_ops::testing::uniform(top * t, seed + 200, 99991));
            for with16 in [false, true] {
                let v = |ty, shape, b, p| view(ty, shape, b, p, with16);
                let (split, merged) = (
                    [Value::Act(&x), Value::Act(&ids), Value::Act(&w), v(gty, Shape::d3(kd, f, e), &g, &g16), v(gty, Shape::d3(kd, f, e), &u, &u16), v(dty, Shape::d3(f, kd, e), &d, &d16)],
                    [Value::Act(&x), Value::Act(&ids), Value::Act(&w), v(gty, Shape::d3(kd, 2 * f, e), &gu, &gu16), v(dty, Shape::d3(f, kd, e), &d, &d16)],
                );
                for (ins, m) in [(&split[..], false), (&merged[..], true)] {
                    let op = Op::MoeExperts { merged_gate_up: m };
                    let out = op.infer(&ins.iter().map(meta_of).collect::<Vec<_>>()).unwrap();
                    let want = bits(&pn_ops::reference::execute(&op, ins, &out, None).unwrap());
                    assert!(want.iter().filter(|&&b| b != 0).count() > want.len() / 2, "mostly zero reference output");
                    for be in &bes {
                        for upto in [usize::MAX, 0] {
                            let mut kn = [usize::MAX; N_KNOBS];
                            kn[KNOB_MOE_FUSED_UPTO] = upto;
                            pn_ops::quant::set_knobs(&kn);
                            // inside the pool (as a pass runs it), so the loops go parallel
                            let mut got = Tensor::f32(out.shape, vec![0.0; out.shape.numel()]);
                            let mut step = || be.kernel_into(&op, ins, &out, None, &mut got).unwrap();
                            be.run_pass(&mut step);
                            pn_ops::quant::set_knobs(&[usize::MAX; N_KNOBS]);
                            eprintln!("{gty} t {t} m {m} th {} upto {upto} eq {}", be.threads(), bits(&got) == want); assert!(bits(&got) == want, "{gty}/{dty} t {t} top {top} merged {m} rows16 {with16} threads {} knob {upto}", be.threads());
                        }
                    }
                }
            }
        }
    }
}

/// The same test through the plain-AVX2 kernels (`PN_NO_AVX512`, read once per process:
/// a child process) on a machine with AVX-512: there the weights' copies are the 8-row
/// layout (`x86_rows8`).
#[test]
fn the_avx2_kernels_agree_too() {
    if std::env::var_os("PN_NO_AVX512").is_some() {
        return;
    }
    let t = "per_expert_tasks_and_projection_loops_agree_with_the_reference";
    let exe = std::env::current_exe().expect("the test binary");
    let out = std::process::Command::new(exe).env("PN_NO_AVX512", "1").args([t, "--exact"]).output().expect("run the test binary");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains(&format!("{t} ... ok")), "{text}{}", String::from_utf8_lossy(&out.stderr));
}

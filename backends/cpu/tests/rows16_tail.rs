//! A matrix whose row count is not a multiple of 16 (an LM head of 4099 rows) has a
//! `rows16` copy of its whole 16-row groups only; its matmul reads those rows from the
//! copy and the last `rows % 16` from the plain bytes. Bitwise the reference, whatever
//! the tokens (one, a few, enough for the AMX tiles), the type and the thread count.
#![cfg(target_arch = "x86_64")]

use pn_cpu::CpuBackend;
use pn_engine::HostKernels;
use pn_ops::quant::{KNOB_ROW_BLOCK, KNOB_ROW_BLOCK_BATCH, KNOB_TOKEN_MAJOR, N_KNOBS};
use pn_ops::reference::common::meta_of;
use pn_ops::*;

mod common;
use common::{bits, rows16_copy, weights};

#[test]
fn a_partial_rows16_copy_gives_the_reference_bits() {
    let k = 512;
    let bes = [1, 2, 3].map(CpuBackend::new);
    let mut checked = 0;
    for ty in [GgmlType::Q4K, GgmlType::Q5K, GgmlType::Q6K, GgmlType::IQ4XS, GgmlType::Q8_0, GgmlType::Q4_0] {
        // 16-row groups + a tail; 4099 rows as the synthetic files' LM head
        for rows in [19, 75, 4099] {
            if !pn_ops::quant::rows16::available(ty, k, rows / 16 * 16) {
                continue;
            }
            let w = weights(ty, k, rows, rows as u32);
            let p = rows16_copy(ty, k, rows, &w).expect("a copy where the layout is available");
            assert_eq!(p.len(), rows / 16 * 16 * ty.row_bytes(k).unwrap(), "whole 16-row groups");
            for t in [1, 3, 40] {
                if rows == 4099 && t == 40 {
                    continue; // the big product once is enough (t = 1, 3)
                }
                let x = Tensor::f32(Shape::d2(k, t), pn_ops::testing::uniform(k * t, 7 + t as u32, 99991));
                let plain = Value::Weight(WeightView { name: "w", ty, shape: Shape::d2(k, rows), bytes: &w, rows16: None });
                let part = Value::Weight(WeightView { name: "w", ty, shape: Shape::d2(k, rows), bytes: &w, rows16: Some(&p) });
                let out = Op::MatMul.infer(&[meta_of(&plain), meta_of(&Value::Act(&x))]).unwrap();
                let want = bits(&pn_ops::reference::execute(&Op::MatMul, &[plain, Value::Act(&x)], &out, None).unwrap());
                assert!(want.iter().all(|&b| f32::from_bits(b).is_finite()) && want.iter().any(|&b| b != 0));
                // the kernels' own paths; the row-major kernels then a transpose (knob 24
                // off: a block's copied rows and plain rows in one `dot_rows`); 48-row
                // tasks, one token or more (blocks that straddle the copy's end: 48..75 is
                // 16 copied + 11)
                for (knob, v) in [(KNOB_TOKEN_MAJOR, usize::MAX), (KNOB_TOKEN_MAJOR, 0), (KNOB_ROW_BLOCK_BATCH, 48), (KNOB_ROW_BLOCK, 48)] {
                    for be in &bes {
                        let mut kn = [usize::MAX; N_KNOBS];
                        kn[knob] = v;
                        pn_ops::quant::set_knobs(&kn);
                        // inside the pool, as a pass runs it, so the row blocks go parallel
                        let mut got = Tensor::f32(out.shape, vec![0.0; out.shape.numel()]);
                        let mut step = || be.kernel_into(&Op::MatMul, &[part, Value::Act(&x)], &out, None, &mut got).unwrap();
                        be.run_pass(&mut step);
                        pn_ops::quant::set_knobs(&[usize::MAX; N_KNOBS]);
                        let g = bits(&got);
                        let bad = (0..g.len()).find(|&i| g[i] != want[i]);
                        assert!(bad.is_none(), "{ty} rows {rows} tokens {t} threads {} knob {knob}={v}: first differing output {bad:?} (row {:?})", be.threads(), bad.map(|i| i % rows));
                        checked += 1;
                    }
                }
            }
        }
    }
    // every CPU this runs on has AVX2 (the 8-row layout) or AVX-512 VNNI (the 16-row one)
    if pn_ops::quant::rows16::available(GgmlType::Q4K, 256, 16) {
        assert!(checked >= 120, "only {checked} cases took a copy");
    }
}

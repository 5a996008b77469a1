//! RoPE: angles once per token, then every head rotated (parallel over tokens). Normal
//! or NEOX pairing, optional per-pair freq factors (third input).

use crate::par;
use pn_ops::reference::common::{act_f32, act_i32, out_f32, rope_angles, rope_rotate};
use pn_ops::{OpError, RopeMode, Tensor, TensorMeta, Value};
use std::cell::RefCell;

thread_local! {
    static ANGLES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

pub fn rope(
    ins: &[Value<'_>],
    out: &TensorMeta,
    n_rot: usize,
    mode: RopeMode,
    freq_base: f32,
    freq_scale: f32,
) -> Result<Tensor, OpError> {
    let mut y = vec![0.0f32; out.shape.numel()];
    rope_into(ins, out, n_rot, mode, freq_base, freq_scale, &mut y)?;
    out_f32("Rope", out, y)
}

/// `rope` into `y` (every element written).
pub fn rope_into(
    ins: &[Value<'_>],
    out: &TensorMeta,
    n_rot: usize,
    mode: RopeMode,
    freq_base: f32,
    freq_scale: f32,
    y: &mut [f32],
) -> Result<(), OpError> {
    match ins.get(2) {
        Some(f) => crate::norm::with_f32("Rope", f, |ff, _| rope_rows(ins, out, n_rot, mode, (freq_base, freq_scale), Some(ff), y)),
        None => rope_rows(ins, out, n_rot, mode, (freq_base, freq_scale), None, y),
    }
}

fn rope_rows(
    ins: &[Value<'_>],
    out: &TensorMeta,
    n_rot: usize,
    mode: RopeMode,
    (freq_base, freq_scale): (f32, f32),
    factors: Option<&[f32]>,
    y: &mut [f32],
) -> Result<(), OpError> {
    const OP: &str = "Rope";
    let x = act_f32(OP, &ins[0])?;
    let pos = act_i32(OP, &ins[1])?;
    let [d, h, t, _] = out.shape.0;
    if pos.len() != t {
        return Err(OpError::Invalid {
            op: OP,
            msg: format!("{} positions for {t} tokens", pos.len()),
        });
    }
    // Validate the mode once (angles for position 0) so the parallel loop cannot fail.
    ANGLES.with(|cs| {
        let mut cs = cs.borrow_mut();
        cs.resize(n_rot, 0.0);
        rope_angles(OP, mode, n_rot, freq_base, freq_scale, factors, 0, &mut cs)
    })?;
    crate::norm::len_check(OP, x.len(), y.len())?;
    // One row = all heads of one token (of one ne3 slice), copied where it is rotated.
    par::rows(y, d * h, d * h + 8 * n_rot, |r, row| {
        row.copy_from_slice(&x[r * d * h..r * d * h + row.len()]);
        let p = pos[r % t.max(1)];
        ANGLES.with(|cs| {
            let mut cs = cs.borrow_mut();
            cs.resize(n_rot, 0.0);
            // Cannot fail: the mode was validated above.
            let _ = rope_angles(OP, mode, n_rot, freq_base, freq_scale, factors, p, &mut cs);
            for head in row.chunks_mut(d) {
                rope_rotate(head, n_rot, mode, &cs);
            }
        });
    });
    Ok(())
}

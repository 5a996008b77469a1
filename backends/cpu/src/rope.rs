//! RoPE: angles once per token, then every head rotated (parallel over tokens).

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
    let mut probe = vec![0.0f32; n_rot];
    rope_angles(OP, mode, n_rot, freq_base, freq_scale, 0, &mut probe)?;
    let mut y = x.to_vec();
    // One row = all heads of one token (of one ne3 slice).
    par::rows(&mut y, d * h, d * h + 8 * n_rot, |r, row| {
        let p = pos[r % t.max(1)];
        ANGLES.with(|cs| {
            let mut cs = cs.borrow_mut();
            cs.resize(n_rot, 0.0);
            // Cannot fail: the mode was validated above.
            let _ = rope_angles(OP, mode, n_rot, freq_base, freq_scale, p, &mut cs);
            for head in row.chunks_mut(d) {
                rope_rotate(head, n_rot, &cs);
            }
        });
    });
    out_f32(OP, out, y)
}

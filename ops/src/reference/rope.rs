//! Rotary embedding (spec §4.3.3): normal or NEOX pairing, iterative f32 theta, optional
//! per-pair freq factors, IMRope sections.

use super::common::{act_f32, act_i32, f32_any, out_f32, rope_angles, rope_rotate};
use crate::{OpError, RopeMode, Tensor, TensorMeta, Value};

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
    let [d, h, t, b] = out.shape.0;
    if pos.len() != t {
        return Err(OpError::Invalid {
            op: OP,
            msg: format!("{} positions for {t} tokens", pos.len()),
        });
    }
    let factors = match ins.get(2) {
        Some(v) => Some(f32_any(OP, v)?.0),
        None => None,
    };
    let mut y = x.to_vec();
    let mut cs = vec![0.0f32; n_rot];
    for bi in 0..b {
        for ti in 0..t {
            rope_angles(OP, mode, n_rot, freq_base, freq_scale, factors.as_deref(), pos[ti], &mut cs)?;
            for hi in 0..h {
                let o = ((bi * t + ti) * h + hi) * d;
                rope_rotate(&mut y[o..o + d], n_rot, mode, &cs);
            }
        }
    }
    out_f32(OP, out, y)
}

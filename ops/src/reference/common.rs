//! Helpers shared by the reference kernels and by backends: input validation, typed access
//! to inputs, state access, and the scalar functions of spec §5.
//!
//! Backends call [`validate`] first so that a kernel never panics on a malformed call
//! (wrong arity or dtype, inconsistent tensor lengths, short weight bytes); op-level
//! entry points also [`validate_state`].

use crate::quant::{self, QuantError};
use crate::{
    DType, GgmlType, LayerState, Op, OpError, RecurrentState, Shape, Tensor,
    TensorData, TensorMeta, Value, WeightView,
};
use std::borrow::Cow;

/// The meta of a run-time input (activations: shape + dtype; weights: shape + block type).
pub fn meta_of(v: &Value<'_>) -> TensorMeta {
    match v {
        Value::Act(t) => TensorMeta {
            shape: t.shape,
            dtype: t.dtype(),
        },
        Value::Weight(w) => TensorMeta {
            shape: w.shape,
            dtype: DType::Weight(w.ty),
        },
    }
}

/// A weight view holds whole rows of its block format (`ne0` a multiple of the block,
/// bytes for every row) in a format the kernels take.
pub fn check_weight(op: &'static str, w: &WeightView<'_>) -> Result<(), OpError> {
    let rb = w.ty.row_bytes(w.shape.0[0]).ok_or_else(|| OpError::Invalid {
        op,
        msg: format!("weight {}: row of {} is not a multiple of the {} block", w.name, w.shape.0[0], w.ty),
    })?;
    if rb.checked_mul(w.shape.rows()).is_none_or(|need| w.bytes.len() < need) {
        return Err(OpError::Invalid {
            op,
            msg: format!("weight {}: {} bytes for {} {:?}", w.name, w.bytes.len(), w.ty, w.shape),
        });
    }
    if !w.ty.is_supported_weight() {
        return Err(OpError::UnsupportedType { op, ty: w.ty.name().into() });
    }
    Ok(())
}

/// Check a call before running a kernel: not a leaf, `Op::infer` accepts the inputs and
/// gives `out`, activations hold `numel` elements, weights hold all their row bytes.
pub fn validate(op: &Op, ins: &[Value<'_>], out: &TensorMeta) -> Result<(), OpError> {
    let k = op.kind();
    if op.is_leaf() {
        return Err(OpError::Invalid {
            op: k,
            msg: "leaves are provided by the runner, not executed".into(),
        });
    }
    for (i, v) in ins.iter().enumerate() {
        match v {
            Value::Act(t) => {
                let n = match &t.data {
                    TensorData::F32(d) => d.len(),
                    TensorData::I32(d) => d.len(),
                };
                if n != t.shape.numel() {
                    return Err(OpError::Invalid {
                        op: k,
                        msg: format!("input {i}: {n} elements for shape {:?}", t.shape),
                    });
                }
            }
            Value::Weight(w) => check_weight(k, w)?,
        }
    }
    // On the stack for the usual ≤ 8 inputs: no allocation per call (backends validate
    // every op of every step).
    let mut stack = [TensorMeta { shape: Shape([0; 4]), dtype: DType::F32 }; 8];
    let heap: Vec<TensorMeta>;
    let metas: &[TensorMeta] = if ins.len() <= stack.len() {
        for (m, v) in stack.iter_mut().zip(ins) {
            *m = meta_of(v);
        }
        &stack[..ins.len()]
    } else {
        heap = ins.iter().map(meta_of).collect();
        &heap
    };
    let got = op.infer(metas)?;
    if got != *out {
        return Err(OpError::Shape {
            op: k,
            expected: got.to_string(),
            found: out.to_string(),
        });
    }
    Ok(())
}

/// The state check of an op-level call ([`crate::Op::check_state`] on the inputs'
/// metas): what the single-op entry points run besides [`validate`]; a pass's states
/// were checked once by the runner.
pub fn validate_state(op: &Op, ins: &[Value<'_>], state: Option<&LayerState>) -> Result<(), OpError> {
    if op.state().is_none() {
        return Ok(());
    }
    let metas: Vec<TensorMeta> = ins.iter().map(meta_of).collect();
    op.check_state(&metas, state)
}

/// Map a quant error to an op error.
pub fn qerr(op: &'static str, e: QuantError) -> OpError {
    OpError::Invalid {
        op,
        msg: e.to_string(),
    }
}

/// An f32 activation input.
pub fn act_f32<'a>(op: &'static str, v: &Value<'a>) -> Result<&'a [f32], OpError> {
    match v {
        Value::Act(Tensor {
            data: TensorData::F32(d),
            ..
        }) => Ok(d),
        _ => Err(OpError::Invalid {
            op,
            msg: "expected an f32 activation".into(),
        }),
    }
}

/// An i32 activation input.
pub fn act_i32<'a>(op: &'static str, v: &Value<'a>) -> Result<&'a [i32], OpError> {
    match v {
        Value::Act(Tensor {
            data: TensorData::I32(d),
            ..
        }) => Ok(d),
        _ => Err(OpError::Invalid {
            op,
            msg: "expected an i32 activation".into(),
        }),
    }
}

/// A weight input.
pub fn weight<'a>(op: &'static str, v: &Value<'a>) -> Result<WeightView<'a>, OpError> {
    match v {
        Value::Weight(w) => Ok(*w),
        Value::Act(_) => Err(OpError::Invalid {
            op,
            msg: "expected a weight".into(),
        }),
    }
}

/// A whole (small) weight dequantized to f32, errors reported instead of panics.
pub fn weight_f32(op: &'static str, w: &WeightView<'_>) -> Result<Vec<f32>, OpError> {
    let n = w.shape.numel();
    if w.ty == GgmlType::F32 {
        if w.bytes.len() < 4 * n {
            return Err(OpError::Invalid {
                op,
                msg: format!("weight {}: too few bytes", w.name),
            });
        }
        return Ok(w.bytes[..4 * n]
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect());
    }
    let ne0 = w.shape.0[0];
    let mut out = vec![0.0f32; n];
    if ne0 == 0 {
        return Ok(out);
    }
    for (r, chunk) in out.chunks_mut(ne0).enumerate() {
        quant::dequantize_row(w.ty, w.row(r), chunk).map_err(|e| qerr(op, e))?;
    }
    Ok(out)
}

/// An f32 input that may be an activation or a (small) weight, with its shape.
pub fn f32_any<'a>(
    op: &'static str,
    v: &Value<'a>,
) -> Result<(Cow<'a, [f32]>, crate::Shape), OpError> {
    match v {
        Value::Act(t) => Ok((Cow::Borrowed(act_f32(op, v)?), t.shape)),
        Value::Weight(w) => Ok((Cow::Owned(weight_f32(op, w)?), w.shape)),
    }
}

/// Build the f32 output tensor, checking its length against the inferred meta.
pub fn out_f32(op: &'static str, out: &TensorMeta, data: Vec<f32>) -> Result<Tensor, OpError> {
    if data.len() != out.shape.numel() || out.dtype != DType::F32 {
        return Err(OpError::Invalid {
            op,
            msg: format!("computed {} f32 elements for output {out}", data.len()),
        });
    }
    Ok(Tensor {
        shape: out.shape,
        data: TensorData::F32(data),
    })
}

/// Build the i32 output tensor, checking its length against the inferred meta.
pub fn out_i32(op: &'static str, out: &TensorMeta, data: Vec<i32>) -> Result<Tensor, OpError> {
    if data.len() != out.shape.numel() || out.dtype != DType::I32 {
        return Err(OpError::Invalid {
            op,
            msg: format!("computed {} i32 elements for output {out}", data.len()),
        });
    }
    Ok(Tensor {
        shape: out.shape,
        data: TensorData::I32(data),
    })
}

/// The activation format for a dot with weight type `w` over rows of `k` elements, and
/// the byte length of one converted activation row.
pub fn act_format(op: &'static str, w: GgmlType, k: usize) -> Result<(GgmlType, usize), OpError> {
    if !w.is_supported_weight() {
        return Err(OpError::UnsupportedType {
            op,
            ty: w.name().into(),
        });
    }
    let at = quant::vec_dot_type(w);
    let rb = at.row_bytes(k).ok_or_else(|| OpError::Invalid {
        op,
        msg: format!(
            "row of {k} elements cannot be converted to {at} (block {})",
            at.block_size()
        ),
    })?;
    Ok((at, rb))
}

/// The layer's recurrent state (its shapes checked by [`crate::StateShape::check`]).
pub fn recurrent_state<'s>(
    op: &'static str,
    state: Option<&'s mut LayerState>,
) -> Result<&'s mut RecurrentState, OpError> {
    match state {
        Some(LayerState::Recurrent(r)) => Ok(r),
        _ => Err(OpError::Invalid {
            op,
            msg: "needs a recurrent layer state".into(),
        }),
    }
}

/// The first `t` positions of a stateful op's position input (it must have at least `t`).
pub fn token_positions<'a>(op: &'static str, pos: &'a [i32], t: usize) -> Result<&'a [i32], OpError> {
    if pos.len() < t {
        return Err(OpError::Invalid {
            op,
            msg: format!("{} positions for {t} tokens", pos.len()),
        });
    }
    Ok(&pos[..t])
}

/// The clamp of the MoE weight normalisation: the smallest normal f16, 2^-14.
#[allow(clippy::excessive_precision)]
pub const MOE_MIN_WEIGHT_SUM: f32 = 6.103515625e-5;

/// x / (1 + exp(-x)) ([`crate::math::exp`]: the same bits as every backend's).
pub use crate::math::silu;
/// 1 / (1 + exp(-x)).
pub use crate::math::sigmoid;

/// x > 20 ? x : ln(1 + exp(x))
#[inline]
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        (1.0 + crate::math::exp(x)).ln()
    }
}

/// Apply a unary op to one value.
#[inline]
pub fn unary(op: crate::UnaryOp, x: f32) -> f32 {
    match op {
        crate::UnaryOp::Silu => silu(x),
        crate::UnaryOp::Sigmoid => sigmoid(x),
        crate::UnaryOp::Softplus => softplus(x),
        crate::UnaryOp::Exp => crate::math::exp(x),
        crate::UnaryOp::Scale(s) => x * s,
    }
}

/// Apply a binary op to one pair.
#[inline]
pub fn binary(op: crate::BinaryOp, a: f32, b: f32) -> f32 {
    match op {
        crate::BinaryOp::Add => a + b,
        crate::BinaryOp::Mul => a * b,
        crate::BinaryOp::SwiGlu => silu(a) * b,
    }
}

/// TopK order: value descending, ties (and ±0) by lower index; NaN sorts as the largest
/// (so the order is total and sorting never misbehaves).
#[inline]
pub fn topk_before(a: (f32, usize), b: (f32, usize)) -> std::cmp::Ordering {
    let key = |v: f32| if v == 0.0 { 0.0f32 } else { v };
    key(b.0).total_cmp(&key(a.0)).then(a.1.cmp(&b.1))
}

/// RoPE angles for one position: `cs[2i] = cos θ_i`, `cs[2i+1] = sin θ_i` for the
/// `n_rot/2` pairs (spec §4.3.3): θ built by the iterative f32 product from `(float)p`,
/// divided by the pair's freq factor when given, then `freq_scale·θ` (ggml
/// `ggml_rope_cache_init` + `rope_yarn` with ext_factor 0, mscale 1). IMRope picks the
/// section's source position: (p, p, p, 0) for text.
#[allow(clippy::too_many_arguments)]
pub fn rope_angles(
    op: &'static str,
    mode: crate::RopeMode,
    n_rot: usize,
    freq_base: f32,
    freq_scale: f32,
    factors: Option<&[f32]>,
    p: i32,
    cs: &mut [f32],
) -> Result<(), OpError> {
    let theta_scale = freq_base.powf(-2.0f32 / n_rot as f32);
    if factors.is_some_and(|f| f.len() < n_rot / 2) {
        return Err(OpError::Invalid { op, msg: format!("expected {} freq factors", n_rot / 2) });
    }
    let sect_sum: u32 = match mode {
        crate::RopeMode::Normal | crate::RopeMode::Neox => 0,
        crate::RopeMode::IMRope { sections } => {
            let s: u32 = sections.iter().sum();
            if s == 0 {
                return Err(OpError::Invalid {
                    op,
                    msg: "IMRope sections sum to 0".into(),
                });
            }
            s
        }
    };
    let mut theta_p = p as f32; // t = h = w = p
    let mut theta_e = 0.0f32; // e = 0
    for i in 0..n_rot / 2 {
        let theta = match mode {
            crate::RopeMode::Normal | crate::RopeMode::Neox => theta_p,
            crate::RopeMode::IMRope { sections } => {
                let sector = (i as u32) % sect_sum;
                let pick_p = (sector % 3 == 1 && sector < 3 * sections[1])
                    || (sector % 3 == 2 && sector < 3 * sections[2])
                    || (sector.is_multiple_of(3) && sector < 3 * sections[0]);
                if pick_p {
                    theta_p
                } else {
                    theta_e
                }
            }
        };
        let th = match factors {
            Some(f) => freq_scale * (theta / f[i]),
            None => freq_scale * theta,
        };
        cs[2 * i] = th.cos();
        cs[2 * i + 1] = th.sin();
        theta_p *= theta_scale;
        theta_e *= theta_scale;
    }
    Ok(())
}

/// Rotate one head vector in place: pair i is (2i, 2i+1) in `Normal` mode, else
/// (i, i + n_rot/2) (NEOX pairing); dims ≥ n_rot stay.
#[inline]
pub fn rope_rotate(x: &mut [f32], n_rot: usize, mode: crate::RopeMode, cs: &[f32]) {
    let half = n_rot / 2;
    let (step, off) = match mode {
        crate::RopeMode::Normal => (2, 1),
        _ => (1, half),
    };
    for i in 0..half {
        let (c, s) = (cs[2 * i], cs[2 * i + 1]);
        let j = i * step;
        let a = x[j];
        let b = x[j + off];
        x[j] = a * c - b * s;
        x[j + off] = a * s + b * c;
    }
}

//! A stateful op over every sequence of a pass, one sequence at a time: each sequence's
//! slice of the token axis with its own layer state, the outputs concatenated. The
//! reference form of a multi-sequence call (the oracle of the backends' own
//! multi-sequence kernels, and what a backend without one runs).

use crate::state::check_spans;
use crate::{LayerState, Op, OpError, SeqSpan, Shape, Tensor, TensorData, TensorMeta, Value};

/// The token axis of a tensor of a pass of `t` tokens: its outermost dim ≠ 1 (any, for
/// `t == 1`: the whole tensor is the one token).
fn token_axis(s: &Shape, t: usize) -> Result<usize, String> {
    if t == 1 {
        return Ok(3);
    }
    match (0..4).rev().find(|&i| s.0[i] != 1) {
        Some(a) if s.0[a] == t => Ok(a),
        _ => Err(format!("{s:?} has no token axis of {t}")),
    }
}

/// Tokens `sp` of `x` (a pass of `t` tokens): contiguous, the token axis outermost.
fn slice_tokens(x: &Tensor, t: usize, sp: SeqSpan) -> Result<Tensor, String> {
    let a = token_axis(&x.shape, t)?;
    let per = x.shape.numel() / t;
    let mut shape = x.shape;
    shape.0[a] = sp.len;
    let r = sp.start * per..(sp.start + sp.len) * per;
    Ok(match &x.data {
        TensorData::F32(v) => Tensor::f32(shape, v[r].to_vec()),
        TensorData::I32(v) => Tensor::i32(shape, v[r].to_vec()),
    })
}

/// One sequence's run of a stateful op: its inputs, its output's meta, its state.
pub type SeqExec<'a> = dyn FnMut(&[Value<'_>], &TensorMeta, &mut LayerState) -> Result<Tensor, OpError> + 'a;

/// Runs `exec` (one sequence's op: inputs, output meta, state) for every sequence of
/// `spans` on its tokens and state `states[i]`; returns the outputs of `meta`, sequence
/// after sequence.
pub fn per_sequence(
    op: &Op,
    ins: &[Value<'_>],
    meta: &TensorMeta,
    spans: &[SeqSpan],
    states: &mut [&mut LayerState],
    exec: &mut SeqExec<'_>,
) -> Result<Tensor, OpError> {
    let bad = |msg: String| OpError::Invalid { op: op.kind(), msg };
    let t: usize = spans.iter().map(|s| s.len).sum();
    check_spans(op.kind(), spans, states.len(), t)?;
    let axis = token_axis(&meta.shape, t).map_err(bad)?;
    let mut data: Vec<f32> = Vec::with_capacity(meta.shape.numel());
    for (&sp, st) in spans.iter().zip(states.iter_mut()) {
        let parts: Vec<Tensor> = ins
            .iter()
            .filter_map(|v| match v {
                Value::Act(x) => Some(slice_tokens(x, t, sp)),
                Value::Weight(_) => None,
            })
            .collect::<Result<_, _>>()
            .map_err(bad)?;
        let mut acts = parts.iter();
        let sub: Vec<Value<'_>> = ins
            .iter()
            .map(|v| match v {
                Value::Act(_) => Value::Act(acts.next().expect("one slice per activation")),
                Value::Weight(w) => Value::Weight(*w),
            })
            .collect();
        let mut shape = meta.shape;
        shape.0[axis] = sp.len;
        let y = exec(&sub, &TensorMeta { shape, dtype: meta.dtype }, st)?;
        data.extend_from_slice(y.as_f32());
    }
    Ok(Tensor::f32(meta.shape, data))
}

/// The reference kernels over every sequence of a pass ([`per_sequence`] of
/// [`super::execute`]).
pub fn execute_seqs(op: &Op, ins: &[Value<'_>], meta: &TensorMeta, spans: &[SeqSpan], states: &mut [&mut LayerState]) -> Result<Tensor, OpError> {
    per_sequence(op, ins, meta, spans, states, &mut |ins, m, st| super::execute(op, ins, m, Some(st)))
}

/// `Op::LastRows`: the last row of each sequence of `spans` (rows of `n` floats of `x`,
/// the pass's `[n, T]` activations) into `y` `[n, spans.len()]`.
pub fn last_rows(x: &[f32], n: usize, spans: &[SeqSpan], y: &mut [f32]) -> Result<(), OpError> {
    const OP: &str = "LastRows";
    let t = spans.last().map_or(0, |s| s.start + s.len);
    if x.len() != n * t || y.len() != n * spans.len() || spans.iter().any(|s| s.len == 0) {
        return Err(OpError::Invalid {
            op: OP,
            msg: format!("x has {} floats and y {}, expected {n}×{t} and {n}×{} for {} non-empty sequences", x.len(), y.len(), spans.len(), spans.len()),
        });
    }
    for (yr, s) in y.chunks_exact_mut(n.max(1)).zip(spans) {
        let r = s.start + s.len - 1;
        yr.copy_from_slice(&x[r * n..(r + 1) * n]);
    }
    Ok(())
}

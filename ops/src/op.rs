//! The op vocabulary. Every op documents its math and its shape contract; [`Op::infer`]
//! checks the inputs and gives the output's shape and dtype.
//!
//! Shapes are ggml order (`ne0` innermost). `T` is the number of tokens in the batch.

use crate::state::{LayerState, StateShape};
use crate::tensor::{DType, Shape, TensorMeta};
use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq)]
pub enum OpError {
    #[error("{op}: expected {expected}, found {found}")]
    Shape { op: &'static str, expected: String, found: String },
    #[error("{op}: {msg}")]
    Invalid { op: &'static str, msg: String },
    #[error("context full: position {pos} needs {need} cells but the KV cache holds {capacity} (raise --max-seq)")]
    ContextFull { pos: usize, need: usize, capacity: usize },
    #[error("{op}: weight type {ty} is not supported")]
    UnsupportedType { op: &'static str, ty: String },
}

/// Element-wise unary ops (spec §5).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum UnaryOp {
    /// x / (1 + exp(-x))
    Silu,
    /// 1 / (1 + exp(-x))
    Sigmoid,
    /// x > 20 ? x : ln(1 + exp(x))
    Softplus,
    /// exp(x)
    Exp,
    /// s * x
    Scale(f32),
}

/// Element-wise binary ops. `b` is broadcast over `a` by tiling (ggml's modulo rule):
/// `out[i0,i1,i2,i3] = f(a[i0,i1,i2,i3], b[i0 % b.ne0, i1 % b.ne1, ...])`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BinaryOp {
    Add,
    Mul,
    /// silu(a) * b (ggml swiglu_split, a is the gate)
    SwiGlu,
}

/// Rotary embedding flavours.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeMode {
    /// adjacent pairs (2i, 2i + 1): ggml's "normal" mode (Llama)
    Normal,
    /// pairs (i, i + n_rot/2)
    Neox,
    /// interleaved multi-section RoPE (qwen3.5): NEOX pairing, the position of pair `i`
    /// taken from section `i mod Σsections` (text tokens use (p, p, p, 0)).
    IMRope { sections: [u32; 4] },
}

/// One operation of the graph.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// Graph input: token ids, i32 [T].
    Tokens,
    /// Graph input: absolute positions of the tokens in their sequence, i32 [T].
    Positions,
    /// Leaf: a GGUF tensor, zero-copy. Its meta is the tensor's ggml shape and type.
    Weight { name: String },
    /// Embedding lookup: (table weight [K, V], ids i32 [T]) -> f32 [K, T], rows dequantized.
    GetRows,
    /// y = W x: (W weight [K, N] of any type, x f32 [K, T]) -> f32 [N, T].
    /// Activations are rounded to the weight's vec-dot type as llama.cpp does (spec §8).
    MatMul,
    /// y = x / sqrt(mean(x²) + eps) ⊙ w over each `ne0` row: (x f32 [n, ...], w f32 [n])
    /// or (x) alone. The mean is accumulated in f64 (spec §4.2).
    RmsNorm { eps: f32 },
    /// y = x / sqrt(Σx² + eps) over each `ne0` row (the Gated-DeltaNet form, spec §4.4.3).
    L2Norm { eps: f32 },
    /// Rotary embedding of the first `n_rot` dims of each head: (x f32 [D, H, T],
    /// pos i32 [T], optional freq factors f32 [n_rot/2]) -> f32 [D, H, T];
    /// theta_i = freq_scale · (p · base^(−2i/n_rot)) / factor_i, the power built
    /// iteratively in f32 as ggml does (factors: `rope_freqs.weight`, llama3 scaling).
    Rope { n_rot: usize, mode: RopeMode, freq_base: f32, freq_scale: f32 },
    /// Causal GQA attention over the layer's KV cache (`state` = layer index):
    /// (q f32 [D, H, T], k f32 [D, Hkv, T], v f32 [D, Hkv, T], pos i32 [T]) -> f32 [D·H, T].
    /// Writes k, v at cells `pos`, then query t attends to cells 0..=pos[t];
    /// q head h reads kv head h / (H/Hkv) (grouped).
    Attention { n_head: usize, n_head_kv: usize, head_dim: usize, scale: f32, state: usize },
    /// Depthwise causal conv with state (`state` = layer index): (x f32 [C, T],
    /// w weight f32 [d_conv, C]) -> f32 [C, T]; out[t][c] = Σ_i X_c[t+i]·w[c][i] over the
    /// window [state(d_conv−1) | x]; the state keeps the last d_conv−1 inputs.
    Conv1dCausal { d_conv: usize, state: usize },
    /// Gated delta rule with state (`state` = layer index), spec §4.4.4:
    /// (q f32 [Dk, Hk, T], k f32 [Dk, Hk, T], v f32 [Dv, Hv, T], g f32 [Hv, T],
    /// beta f32 [Hv, T]) -> f32 [Dv, Hv, T]. V head h uses K head h mod Hk.
    /// S ← e^g S; S += k ⊗ β(v − Sᵀk); o = Sᵀq / √Dk.
    DeltaRule { state: usize },
    /// Softmax over each `ne0` row: max-subtracted, sum in f64.
    Softmax,
    /// Indices of the `k` largest values of each `ne0` row, descending (ties: lower index
    /// first): f32 [E, T] -> i32 [k, T].
    TopK { k: usize },
    /// MoE weights: (probs f32 [E, T], ids i32 [k, T]) -> f32 [k, T], the selected
    /// probabilities, divided by max(Σ, 6.103515625e-5) when `normalize`.
    MoeWeights { normalize: bool },
    /// Routed experts with SwiGLU: for each token and each selected expert r,
    /// out += w_r · down_e(silu(gate_e x) ⊙ up_e x).
    /// Inputs (x f32 [K, T], ids i32 [k, T], weights f32 [k, T], gate [K, F, E],
    /// up [K, F, E], down [F, K, E]) -> f32 [K, T]; or, when `merged_gate_up`,
    /// (x, ids, weights, gate_up [K, 2F, E] (gate rows first), down [F, K, E]).
    /// Experts are summed in selection order.
    MoeExperts { merged_gate_up: bool },
    Unary(UnaryOp),
    Binary(BinaryOp),
    /// Strided slice of `ne0`: each row is seen as groups of `group` elements, and
    /// elements [offset, offset+len) of every group are kept, contiguously:
    /// f32 [n·group, R...] -> f32 [n·len, R...].
    SliceCols { group: usize, offset: usize, len: usize },
    /// Rows [start, start+len) along ne1: f32 [n, T] -> f32 [n, len].
    SliceRows { start: usize, len: usize },
    /// The last row of each of the pass's `seqs` sequences (the pass's sequence table,
    /// which the runner hands to the executor): f32 [n, T] -> f32 [n, seqs]. The logits
    /// of a multi-sequence prefill need no other rows.
    LastRows { seqs: usize },
    /// Same data, new shape (same element count).
    Reshape(Shape),
}

fn shape_err(op: &'static str, expected: impl Into<String>, found: impl std::fmt::Display) -> OpError {
    OpError::Shape { op, expected: expected.into(), found: found.to_string() }
}

fn want_f32(op: &'static str, what: &str, m: &TensorMeta) -> Result<(), OpError> {
    if m.dtype != DType::F32 {
        return Err(shape_err(op, format!("{what} f32"), m));
    }
    Ok(())
}

fn want_weight(op: &'static str, what: &str, m: &TensorMeta) -> Result<(), OpError> {
    match m.dtype {
        DType::Weight(_) => Ok(()),
        _ => Err(shape_err(op, format!("{what} a weight"), m)),
    }
}

impl Op {
    /// Short name of the op kind (for dumps and errors).
    pub fn kind(&self) -> &'static str {
        match self {
            Op::Tokens => "Tokens",
            Op::Positions => "Positions",
            Op::Weight { .. } => "Weight",
            Op::GetRows => "GetRows",
            Op::MatMul => "MatMul",
            Op::RmsNorm { .. } => "RmsNorm",
            Op::L2Norm { .. } => "L2Norm",
            Op::Rope { .. } => "Rope",
            Op::Attention { .. } => "Attention",
            Op::Conv1dCausal { .. } => "Conv1dCausal",
            Op::DeltaRule { .. } => "DeltaRule",
            Op::Softmax => "Softmax",
            Op::TopK { .. } => "TopK",
            Op::MoeWeights { .. } => "MoeWeights",
            Op::MoeExperts { .. } => "MoeExperts",
            Op::Unary(_) => "Unary",
            Op::Binary(_) => "Binary",
            Op::SliceCols { .. } => "SliceCols",
            Op::SliceRows { .. } => "SliceRows",
            Op::LastRows { .. } => "LastRows",
            Op::Reshape(_) => "Reshape",
        }
    }

    /// The layer-state index this op reads and updates, if any.
    pub fn state(&self) -> Option<usize> {
        match self {
            Op::Attention { state, .. } | Op::Conv1dCausal { state, .. } | Op::DeltaRule { state } => {
                Some(*state)
            }
            _ => None,
        }
    }

    /// The layer state this op reads and updates, inferred from its inputs (checked by
    /// [`Op::infer`]) as its output is: what every sequence's layer state must be.
    pub fn state_shape(&self, ins: &[TensorMeta]) -> Option<StateShape> {
        let ne = |i: usize, d: usize| ins.get(i).map_or(0, |m| m.shape.0[d]);
        match self {
            Op::Attention { n_head_kv, head_dim, .. } => Some(StateShape::Kv { n_head_kv: *n_head_kv, head_dim: *head_dim }),
            Op::Conv1dCausal { d_conv, .. } => Some(StateShape::Conv { d_conv: *d_conv, channels: ne(0, 0) }),
            Op::DeltaRule { .. } => Some(StateShape::Delta { hv: ne(2, 1), dk: ne(0, 0), dv: ne(2, 0) }),
            _ => None,
        }
    }

    /// The state check of one call (an op-level entry point: no runner checked it):
    /// a stateful op needs a layer state of [`Op::state_shape`].
    pub fn check_state(&self, ins: &[TensorMeta], state: Option<&LayerState>) -> Result<(), OpError> {
        match (self.state_shape(ins), state) {
            (None, _) => Ok(()),
            (Some(want), Some(st)) => want.check(self.kind(), st),
            (Some(want), None) => Err(OpError::Invalid { op: self.kind(), msg: format!("needs a layer state: {want}") }),
        }
    }

    /// Whether this op is a leaf (graph input or weight).
    pub fn is_leaf(&self) -> bool {
        matches!(self, Op::Tokens | Op::Positions | Op::Weight { .. })
    }

    /// Check the inputs and compute the output meta. Leaves are given their meta by the
    /// builder and are not inferred here.
    pub fn infer(&self, ins: &[TensorMeta]) -> Result<TensorMeta, OpError> {
        let k = self.kind();
        let arity = |n: usize| -> Result<(), OpError> {
            if ins.len() != n {
                return Err(shape_err(k, format!("{n} inputs"), ins.len()));
            }
            Ok(())
        };
        match self {
            Op::Tokens | Op::Positions | Op::Weight { .. } => {
                Err(OpError::Invalid { op: k, msg: "leaves have no inputs to infer from".into() })
            }
            Op::GetRows => {
                arity(2)?;
                want_weight(k, "table", &ins[0])?;
                if ins[1].dtype != DType::I32 || ins[1].shape.rank() > 1 {
                    return Err(shape_err(k, "ids i32 [T]", ins[1]));
                }
                Ok(TensorMeta::f32(Shape::d2(ins[0].shape.0[0], ins[1].shape.0[0])))
            }
            Op::MatMul => {
                arity(2)?;
                want_weight(k, "W", &ins[0])?;
                want_f32(k, "x", &ins[1])?;
                let [kw, n, e, _] = ins[0].shape.0;
                if e != 1 || ins[1].shape.0[0] != kw || ins[1].shape.0[2] != 1 {
                    return Err(shape_err(k, format!("x [{kw}, T] for W [{kw}, {n}]"), ins[1].shape));
                }
                Ok(TensorMeta::f32(Shape::d2(n, ins[1].shape.0[1])))
            }
            Op::RmsNorm { .. } | Op::L2Norm { .. } => {
                if ins.is_empty() || ins.len() > 2 || (matches!(self, Op::L2Norm { .. }) && ins.len() != 1) {
                    return Err(shape_err(k, "x (and for RmsNorm an optional weight)", ins.len()));
                }
                want_f32(k, "x", &ins[0])?;
                if let Some(w) = ins.get(1) {
                    if w.shape.numel() != ins[0].shape.0[0] {
                        return Err(shape_err(k, format!("weight of {} elements", ins[0].shape.0[0]), w.shape));
                    }
                }
                Ok(ins[0])
            }
            Op::Rope { n_rot, .. } => {
                if ins.len() != 2 && ins.len() != 3 {
                    return Err(shape_err(k, "2 inputs (x, pos) or 3 (x, pos, freq factors)", ins.len()));
                }
                if let Some(f) = ins.get(2) {
                    let f32ish = matches!(f.dtype, DType::F32 | DType::Weight(crate::GgmlType::F32));
                    if !f32ish || f.shape.numel() != n_rot / 2 {
                        return Err(shape_err(k, format!("freq factors f32 [{}]", n_rot / 2), f));
                    }
                }
                want_f32(k, "x", &ins[0])?;
                let [d, _h, t, _] = ins[0].shape.0;
                if *n_rot > d || n_rot % 2 != 0 {
                    return Err(shape_err(k, format!("even n_rot ≤ head dim {d}"), n_rot));
                }
                if ins[1].dtype != DType::I32 || ins[1].shape.0[0] != t {
                    return Err(shape_err(k, format!("pos i32 [{t}]"), ins[1]));
                }
                Ok(ins[0])
            }
            Op::Attention { n_head, n_head_kv, head_dim, .. } => {
                arity(4)?;
                let t = ins[0].shape.0[2];
                let q = Shape::d3(*head_dim, *n_head, t);
                let kv = Shape::d3(*head_dim, *n_head_kv, t);
                if ins[0].shape != q || ins[1].shape != kv || ins[2].shape != kv {
                    return Err(shape_err(
                        k,
                        format!("q {q:?}, k {kv:?}, v {kv:?}"),
                        format!("{:?}, {:?}, {:?}", ins[0].shape, ins[1].shape, ins[2].shape),
                    ));
                }
                if *n_head_kv == 0 || n_head % n_head_kv != 0 {
                    return Err(shape_err(k, "n_head a multiple of n_head_kv", format!("{n_head}/{n_head_kv}")));
                }
                if ins[3].dtype != DType::I32 || ins[3].shape.0[0] != t {
                    return Err(shape_err(k, format!("pos i32 [{t}]"), ins[3]));
                }
                Ok(TensorMeta::f32(Shape::d2(head_dim * n_head, t)))
            }
            Op::Conv1dCausal { d_conv, .. } => {
                arity(2)?;
                want_f32(k, "x", &ins[0])?;
                let c = ins[0].shape.0[0];
                if ins[1].dtype != DType::Weight(crate::GgmlType::F32) || ins[1].shape != Shape::d2(*d_conv, c) {
                    return Err(shape_err(k, format!("conv weight f32[{d_conv},{c}]"), ins[1]));
                }
                Ok(ins[0])
            }
            Op::DeltaRule { .. } => {
                arity(5)?;
                for m in ins {
                    want_f32(k, "inputs", m)?;
                }
                let [dk, hk, t, _] = ins[0].shape.0;
                let [dv, hv, tv, _] = ins[2].shape.0;
                let ok = ins[1].shape == ins[0].shape
                    && tv == t
                    && hk > 0
                    && hv % hk == 0
                    && ins[3].shape == Shape::d2(hv, t)
                    && ins[4].shape == Shape::d2(hv, t);
                if !ok {
                    return Err(shape_err(
                        k,
                        format!("q,k [{dk},{hk},{t}], v [Dv,Hv,{t}] with Hv % {hk} == 0, g and beta [Hv,{t}]"),
                        format!("{:?} {:?} {:?} {:?} {:?}", ins[0].shape, ins[1].shape, ins[2].shape, ins[3].shape, ins[4].shape),
                    ));
                }
                Ok(TensorMeta::f32(Shape::d3(dv, hv, t)))
            }
            Op::Softmax => {
                arity(1)?;
                want_f32(k, "x", &ins[0])?;
                Ok(ins[0])
            }
            Op::TopK { k: kk } => {
                arity(1)?;
                want_f32(k, "x", &ins[0])?;
                if *kk == 0 || *kk > ins[0].shape.0[0] {
                    return Err(shape_err(k, format!("1 ≤ k ≤ {}", ins[0].shape.0[0]), kk));
                }
                let mut s = ins[0].shape;
                s.0[0] = *kk;
                Ok(TensorMeta::i32(s))
            }
            Op::MoeWeights { .. } => {
                arity(2)?;
                want_f32(k, "probs", &ins[0])?;
                if ins[1].dtype != DType::I32 || ins[1].shape.0[1] != ins[0].shape.0[1] {
                    return Err(shape_err(k, "ids i32 [k, T]", ins[1]));
                }
                Ok(TensorMeta::f32(ins[1].shape))
            }
            Op::MoeExperts { merged_gate_up } => {
                let n = if *merged_gate_up { 5 } else { 6 };
                arity(n)?;
                want_f32(k, "x", &ins[0])?;
                let [kd, t, _, _] = ins[0].shape.0;
                let top = ins[1].shape.0[0];
                if ins[1].dtype != DType::I32 || ins[1].shape != Shape::d2(top, t) || ins[2].shape != ins[1].shape {
                    return Err(shape_err(k, format!("ids i32 and weights f32 [k, {t}]"), format!("{} {}", ins[1], ins[2])));
                }
                for w in &ins[3..] {
                    want_weight(k, "expert tensors", w)?;
                }
                let down = &ins[n - 1];
                let [f, kout, e, _] = down.shape.0;
                let f_up = if *merged_gate_up { 2 * f } else { f };
                for w in &ins[3..n - 1] {
                    if w.shape != Shape::d3(kd, f_up, e) {
                        return Err(shape_err(k, format!("gate/up [{kd}, {f_up}, {e}]"), w.shape));
                    }
                }
                if kout != kd {
                    return Err(shape_err(k, format!("down [{f}, {kd}, {e}]"), down.shape));
                }
                Ok(TensorMeta::f32(Shape::d2(kd, t)))
            }
            Op::Unary(_) => {
                arity(1)?;
                want_f32(k, "x", &ins[0])?;
                Ok(ins[0])
            }
            Op::Binary(_) => {
                arity(2)?;
                want_f32(k, "a", &ins[0])?;
                let b = &ins[1];
                let tiles = match b.dtype {
                    DType::F32 | DType::Weight(crate::GgmlType::F32) => {
                        (0..4).all(|i| b.shape.0[i] > 0 && ins[0].shape.0[i].is_multiple_of(b.shape.0[i]))
                    }
                    _ => false,
                };
                if !tiles {
                    return Err(shape_err(k, format!("f32 b whose shape tiles {:?}", ins[0].shape), b));
                }
                Ok(ins[0])
            }
            Op::SliceCols { group, offset, len } => {
                arity(1)?;
                want_f32(k, "x", &ins[0])?;
                let ne0 = ins[0].shape.0[0];
                if *group == 0 || !ne0.is_multiple_of(*group) || offset + len > *group {
                    return Err(shape_err(k, format!("ne0 a multiple of {group}, slice [{offset}, {}) inside it", offset + len), ins[0].shape));
                }
                let mut s = ins[0].shape;
                s.0[0] = ne0 / group * len;
                Ok(TensorMeta::f32(s))
            }
            Op::SliceRows { start, len } => {
                arity(1)?;
                want_f32(k, "x", &ins[0])?;
                let s = ins[0].shape;
                if s.0[2] != 1 || start + len > s.0[1] {
                    return Err(shape_err(k, format!("[n, ≥{}]", start + len), s));
                }
                Ok(TensorMeta::f32(Shape::d2(s.0[0], *len)))
            }
            Op::LastRows { seqs } => {
                arity(1)?;
                want_f32(k, "x", &ins[0])?;
                let s = ins[0].shape;
                if s.0[2] != 1 || s.0[3] != 1 || *seqs == 0 || *seqs > s.0[1] {
                    return Err(shape_err(k, format!("[n, ≥{}] with {} sequences", (*seqs).max(1), seqs), s));
                }
                Ok(TensorMeta::f32(Shape::d2(s.0[0], *seqs)))
            }
            Op::Reshape(to) => {
                arity(1)?;
                if to.numel() != ins[0].shape.numel() || matches!(ins[0].dtype, DType::Weight(_)) {
                    return Err(shape_err(k, format!("an activation of {} elements", to.numel()), ins[0]));
                }
                Ok(TensorMeta { shape: *to, dtype: ins[0].dtype })
            }
        }
    }
}

//! Building blocks shared by the model files: norms, linear layers, GQA self-attention
//! (q/k norm → RoPE → attention), SwiGLU and routed experts. Each adds named nodes to
//! the graph (names follow llama.cpp's callbacks).

use crate::meta::{ConfigError, Meta};
use crate::weights::Weights;
use pn_engine::graph::{GraphBuilder, GraphError, NodeId};
use pn_engine::model::Geometry;
use pn_ops::{BinaryOp, Op, RopeMode, Shape};

/// Largest accepted model width / head count / per-head dim (bounds what a file can make
/// the loader allocate).
const MAX_DIM: usize = 1 << 24;
const MAX_HEAD_DIM: usize = 1 << 12;

/// GQA attention hyper-parameters: `{arch}.attention.*`, `{arch}.rope.*`.
#[derive(Clone, Debug, PartialEq)]
pub struct AttnDims {
    pub n_embd: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    /// D: head dim of Q, K and V.
    pub head_dim: usize,
    pub n_rot: usize,
    pub rope: RopeMode,
    pub rope_base: f32,
    /// 1 / `rope.scaling.factor` (linear scaling), else 1.
    pub rope_scale: f32,
    pub eps: f32,
}

impl AttnDims {
    /// Reads and checks the attention keys; `rope` is the architecture's RoPE pairing.
    pub fn load(m: &Meta<'_>, rope: RopeMode) -> Result<AttnDims, ConfigError> {
        let n_embd = m.usize("embedding_length")?;
        let n_head = m.usize("attention.head_count")?;
        if n_head == 0 || n_head > MAX_DIM || n_embd > MAX_DIM {
            return Err(ConfigError::Invalid(format!("{}: expected 1..={MAX_DIM} heads, found {n_head}", m.key("attention.head_count"))));
        }
        let n_head_kv = m.usize_or("attention.head_count_kv", n_head)?;
        let head_dim = m.usize_or("attention.key_length", n_embd / n_head)?;
        let v_dim = m.usize_or("attention.value_length", head_dim)?;
        let n_rot = m.usize_or("rope.dimension_count", head_dim)?;
        if n_head_kv == 0 || n_head % n_head_kv != 0 || head_dim == 0 || head_dim > MAX_HEAD_DIM || v_dim != head_dim || n_rot > head_dim || n_rot % 2 != 0 {
            return Err(ConfigError::Invalid(format!(
                "{} attention: heads {n_head}/{n_head_kv} (kv must divide), head dims K {head_dim} V {v_dim} (equal, ≤ {MAX_HEAD_DIM}), rope dims {n_rot} (even, ≤ head dim)",
                m.arch
            )));
        }
        match m.g.get(&m.key("rope.scaling.type")) {
            None => {}
            Some(pn_engine::MetaValue::String(s)) if s == "none" || s == "linear" => {}
            Some(v) => return Err(ConfigError::Invalid(format!("{}: expected \"none\" or \"linear\" (yarn and longrope are not supported), found {v:?}", m.key("rope.scaling.type")))),
        }
        let factor = m.opt_f32("rope.scaling.factor")?.or(m.opt_f32("rope.scale_linear")?).unwrap_or(0.0);
        Ok(AttnDims {
            n_embd,
            n_head,
            n_head_kv,
            head_dim,
            n_rot,
            rope,
            rope_base: m.opt_f32("rope.freq_base")?.unwrap_or(10000.0),
            rope_scale: if factor == 0.0 { 1.0 } else { 1.0 / factor },
            eps: m.f32("attention.layer_norm_rms_epsilon")?,
        })
    }

    pub fn describe(&self) -> String {
        format!(
            "{} heads × {} ({} KV heads), {:?} rope {} dims base {} scale {}",
            self.n_head, self.head_dim, self.n_head_kv, self.rope, self.n_rot, self.rope_base, self.rope_scale
        )
    }
}

/// Per-head Q/K RMSNorm (when the layer has `attn_{q,k}_norm`), RoPE (with the per-pair
/// factors `rope_freqs.weight` when the file has them), then causal attention over the
/// layer's KV cache. q [D, H, T], k, v [D, Hkv, T] → [D·H, T] named `out`.
pub fn qk_rope_attend(b: &mut GraphBuilder, ws: &Weights, il: usize, (q, k, v): (NodeId, NodeId, NodeId), pos: NodeId, a: &AttnDims, out: &str) -> Result<NodeId, GraphError> {
    let d = a.head_dim;
    let (qn, kn) = (format!("blk.{il}.attn_q_norm.weight"), format!("blk.{il}.attn_k_norm.weight"));
    let q = if ws.has(&qn) { rms_norm(b, ws, q, &qn, d, a.eps, "Qcur_normed")? } else { q };
    let k = if ws.has(&kn) { rms_norm(b, ws, k, &kn, d, a.eps, "Kcur_normed")? } else { k };
    let rope = Op::Rope { n_rot: a.n_rot, mode: a.rope, freq_base: a.rope_base, freq_scale: a.rope_scale };
    let (q, k) = match ws.opt_node(b, "rope_freqs.weight", &[a.n_rot / 2])? {
        Some(ff) => (b.op(rope.clone(), &[q, pos, ff], "Qcur")?, b.op(rope, &[k, pos, ff], "Kcur")?),
        None => (b.op(rope.clone(), &[q, pos], "Qcur")?, b.op(rope, &[k, pos], "Kcur")?),
    };
    let scale = 1.0 / (d as f32).sqrt();
    b.op(Op::Attention { n_head: a.n_head, n_head_kv: a.n_head_kv, head_dim: d, scale, state: il }, &[q, k, v, pos], out)
}

/// GQA self-attention: Q, K, V projections (with their biases when present), heads,
/// [`qk_rope_attend`], W_o. x [n_embd, T] → [n_embd, T].
pub fn self_attention(b: &mut GraphBuilder, ws: &Weights, il: usize, x: NodeId, pos: NodeId, t: usize, a: &AttnDims) -> Result<NodeId, GraphError> {
    let (d, h, hkv, e) = (a.head_dim, a.n_head, a.n_head_kv, a.n_embd);
    let w = |s: &str| format!("blk.{il}.{s}.weight");
    let q = linear(b, ws, x, &w("attn_q"), e, d * h, "Qcur_proj")?;
    let k = linear(b, ws, x, &w("attn_k"), e, d * hkv, "Kcur_proj")?;
    let v = linear(b, ws, x, &w("attn_v"), e, d * hkv, "Vcur_proj")?;
    let q = b.op(Op::Reshape(Shape::d3(d, h, t)), &[q], "Qcur_heads")?;
    let k = b.op(Op::Reshape(Shape::d3(d, hkv, t)), &[k], "Kcur_heads")?;
    let v = b.op(Op::Reshape(Shape::d3(d, hkv, t)), &[v], "Vcur")?;
    let o = qk_rope_attend(b, ws, il, (q, k, v), pos, a, "kqv_out")?;
    linear(b, ws, o, &w("attn_output"), d * h, e, "attn_out")
}

/// RMSN(x, w) over ne0 rows; `w` is a norm weight of `n` elements.
pub fn rms_norm(b: &mut GraphBuilder, ws: &Weights, x: NodeId, w: &str, n: usize, eps: f32, name: &str) -> Result<NodeId, GraphError> {
    let w = ws.node(b, w, &[n])?;
    b.op(Op::RmsNorm { eps }, &[x, w], name)
}

/// y = W x ([k] → [n] per token), with the optional bias `<w without .weight>.bias`.
pub fn linear(b: &mut GraphBuilder, ws: &Weights, x: NodeId, w: &str, k: usize, n: usize, name: &str) -> Result<NodeId, GraphError> {
    let wn = ws.node(b, w, &[k, n])?;
    let y = b.op(Op::MatMul, &[wn, x], name)?;
    match w.strip_suffix(".weight").map(|s| format!("{s}.bias")) {
        Some(bn) if ws.has(&bn) => {
            let bias = ws.node(b, &bn, &[n])?;
            b.op(Op::Binary(BinaryOp::Add), &[y, bias], &format!("{name}_b"))
        }
        _ => Ok(y),
    }
}

/// SwiGLU MLP `down(silu(gate·y) ⊙ up·y)` with tensors `blk.{il}.ffn_{gate,up,down}{suffix}`.
#[allow(clippy::too_many_arguments)]
pub fn swiglu(b: &mut GraphBuilder, ws: &Weights, il: usize, y: NodeId, suffix: &str, n_embd: usize, n_ff: usize, name: &str) -> Result<NodeId, GraphError> {
    let t = |s: &str| format!("blk.{il}.ffn_{s}{suffix}.weight");
    let g = linear(b, ws, y, &t("gate"), n_embd, n_ff, &format!("ffn_gate{suffix}"))?;
    let u = linear(b, ws, y, &t("up"), n_embd, n_ff, &format!("ffn_up{suffix}"))?;
    let h = b.op(Op::Binary(BinaryOp::SwiGlu), &[g, u], &format!("ffn_swiglu{suffix}"))?;
    linear(b, ws, h, &t("down"), n_ff, n_embd, name)
}

/// Routed experts, softmax gating: p = softmax(W_router y); the top-k experts by p, with
/// weights p[sel] / Σ p[sel]; Σ_r w_r · down_e(silu(gate_e y) ⊙ up_e y). y: [n_embd, T].
pub fn routed_experts(
    b: &mut GraphBuilder,
    ws: &Weights,
    il: usize,
    y: NodeId,
    (n_embd, n_expert, n_used, n_ff): (usize, usize, usize, usize),
) -> Result<NodeId, GraphError> {
    let t = |s: &str| format!("blk.{il}.{s}.weight");
    let logits = linear(b, ws, y, &t("ffn_gate_inp"), n_embd, n_expert, "ffn_moe_logits")?;
    let probs = b.op(Op::Softmax, &[logits], "ffn_moe_probs")?;
    let ids = b.op(Op::TopK { k: n_used }, &[probs], "ffn_moe_topk")?;
    let weights = b.op(Op::MoeWeights { normalize: true }, &[probs, ids], "ffn_moe_weights_norm")?;
    let down = ws.node(b, &t("ffn_down_exps"), &[n_ff, n_embd, n_expert])?;
    if ws.has(&t("ffn_gate_up_exps")) {
        let gate_up = ws.node(b, &t("ffn_gate_up_exps"), &[n_embd, 2 * n_ff, n_expert])?;
        b.op(Op::MoeExperts { merged_gate_up: true }, &[y, ids, weights, gate_up, down], "ffn_moe_out")
    } else {
        let gate = ws.node(b, &t("ffn_gate_exps"), &[n_embd, n_ff, n_expert])?;
        let up = ws.node(b, &t("ffn_up_exps"), &[n_embd, n_ff, n_expert])?;
        b.op(Op::MoeExperts { merged_gate_up: false }, &[y, ids, weights, gate, up, down], "ffn_moe_out")
    }
}

/// Final norm and LM head (`output.weight`, or tied to `token_embd.weight`). Without
/// `geom.all_logits` only each sequence's last row goes through the head (a decode step's
/// rows all are).
pub fn head(b: &mut GraphBuilder, ws: &Weights, h: NodeId, (n_embd, n_vocab): (usize, usize), geom: Geometry, eps: f32) -> Result<NodeId, GraphError> {
    b.set_layer(None);
    let mut h = rms_norm(b, ws, h, "output_norm.weight", n_embd, eps, "result_norm")?;
    let (t, seqs) = (geom.n_tokens, geom.seqs.max(1));
    if !geom.all_logits && seqs == 1 && t > 1 {
        h = b.op(Op::SliceRows { start: t - 1, len: 1 }, &[h], "result_norm_last")?;
    } else if !geom.all_logits && seqs > 1 && seqs < t {
        h = b.op(Op::LastRows { seqs }, &[h], "result_norm_last")?;
    }
    let w = if ws.has("output.weight") { "output.weight" } else { "token_embd.weight" };
    let logits = linear(b, ws, h, w, n_embd, n_vocab, "result_output")?;
    b.output(logits);
    Ok(logits)
}

//! Building blocks shared by the model files: norms, linear layers, SwiGLU and routed
//! experts. Each adds named nodes to the graph (names follow llama.cpp's callbacks).

use crate::weights::Weights;
use pn_engine::graph::{GraphBuilder, GraphError, NodeId};
use pn_ops::{BinaryOp, Op};

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

/// Final norm and LM head (`output.weight`, or tied to `token_embd.weight`). With
/// `last_only`, only the last row goes through the head.
pub fn head(b: &mut GraphBuilder, ws: &Weights, h: NodeId, (n_embd, n_vocab, n_tokens): (usize, usize, usize), eps: f32, last_only: bool) -> Result<NodeId, GraphError> {
    b.set_layer(None);
    let mut h = rms_norm(b, ws, h, "output_norm.weight", n_embd, eps, "result_norm")?;
    if last_only && n_tokens > 1 {
        h = b.op(Op::SliceRows { start: n_tokens - 1, len: 1 }, &[h], "result_norm_last")?;
    }
    let w = if ws.has("output.weight") { "output.weight" } else { "token_embd.weight" };
    let logits = linear(b, ws, h, w, n_embd, n_vocab, "result_output")?;
    b.output(logits);
    Ok(logits)
}

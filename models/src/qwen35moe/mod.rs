//! Qwen3.5 (`qwen35moe`, and the dense `qwen35`) as a graph: spec §4.
//!
//! Per layer: `h += mixer(RMSN(h, attn_norm))` where the mixer is gated full attention
//! (every `full_attention_interval`-th layer) or a Gated DeltaNet, then
//! `h += ffn(RMSN(h, post_attention_norm))` with a routed MoE + gated shared expert
//! (qwen35moe) or a SwiGLU FFN (qwen35). Node names are llama.cpp's callback names.
//! Shapes in comments are ggml order; T = tokens in the micro-batch.

mod config;
pub mod mtp;

pub use config::Config;

use crate::blocks;
use crate::meta::ConfigError;
use crate::weights::Weights;
use pn_engine::graph::{GraphBuilder, GraphError, NodeId};
use pn_engine::{Geometry, Gguf, LayerInfo, Model};
use pn_ops::{BinaryOp, KvCache, KvType, LayerState, Op, RecurrentState, Shape, UnaryOp};

/// The feed-forward flavour of a Qwen3.5 file.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Ffn {
    /// Routed experts (softmax top-k, renormalized) + sigmoid-gated shared expert.
    Moe,
    /// One SwiGLU MLP (`ffn_gate`, `ffn_up`, `ffn_down`).
    Dense,
}

pub struct Qwen35 {
    pub cfg: Config,
    pub ffn: Ffn,
    pub(crate) w: Weights,
}

impl Qwen35 {
    pub fn load(g: &Gguf, arch: &str, ffn: Ffn) -> Result<Qwen35, ConfigError> {
        let cfg = Config::from_gguf(g, arch, ffn == Ffn::Moe)?;
        let w = Weights::from_gguf(g);
        for il in 0..cfg.n_layer {
            // the causal conv reads its taps as f32 rows (ggml_ssm_conv asserts the same)
            w.require_f32(&format!("blk.{il}.ssm_conv1d.weight")).map_err(|e| ConfigError::Invalid(e.to_string()))?;
        }
        Ok(Qwen35 { cfg, ffn, w })
    }

    fn t(il: usize, name: &str) -> String {
        format!("blk.{il}.{name}")
    }

    fn rms_norm(&self, b: &mut GraphBuilder, x: NodeId, w: &str, n: usize, name: &str) -> Result<NodeId, GraphError> {
        blocks::rms_norm(b, &self.w, x, w, n, self.cfg.eps, name)
    }

    fn linear(&self, b: &mut GraphBuilder, x: NodeId, w: &str, k: usize, n: usize, name: &str) -> Result<NodeId, GraphError> {
        blocks::linear(b, &self.w, x, w, k, n, name)
    }

    /// Gated full attention, spec §4.3. x: [n_embd, T] → [n_embd, T].
    fn attention(&self, b: &mut GraphBuilder, il: usize, x: NodeId, pos: NodeId, t: usize) -> Result<NodeId, GraphError> {
        let c = &self.cfg;
        let (d, h, hkv, e) = (c.head_dim, c.n_head, c.n_head_kv, c.n_embd);
        let (qg_rows, kv_rows) = (2 * d * h, d * hkv);
        // QG = [q_0 | gate_0 | q_1 | gate_1 | …] per head (interleaved), then K, V
        let (qg, k, v) = if self.w.has(&Self::t(il, "attn_qkv.weight")) {
            let all = qg_rows + 2 * kv_rows;
            let qkv = self.linear(b, x, &Self::t(il, "attn_qkv.weight"), e, all, "Qcur_full_qkv")?;
            let qg = b.op(Op::SliceCols { group: all, offset: 0, len: qg_rows }, &[qkv], "Qcur_full")?;
            let k = b.op(Op::SliceCols { group: all, offset: qg_rows, len: kv_rows }, &[qkv], "Kcur_raw")?;
            let v = b.op(Op::SliceCols { group: all, offset: qg_rows + kv_rows, len: kv_rows }, &[qkv], "Vcur_raw")?;
            (qg, k, v)
        } else {
            let qg = self.linear(b, x, &Self::t(il, "attn_q.weight"), e, qg_rows, "Qcur_full")?;
            let k = self.linear(b, x, &Self::t(il, "attn_k.weight"), e, kv_rows, "Kcur_raw")?;
            let v = self.linear(b, x, &Self::t(il, "attn_v.weight"), e, kv_rows, "Vcur_raw")?;
            (qg, k, v)
        };
        let q = b.op(Op::SliceCols { group: 2 * d, offset: 0, len: d }, &[qg], "Qcur_split")?;
        let gate = b.op(Op::SliceCols { group: 2 * d, offset: d, len: d }, &[qg], "gate_reshaped")?;
        let q = b.op(Op::Reshape(Shape::d3(d, h, t)), &[q], "Qcur_heads")?;
        let k = b.op(Op::Reshape(Shape::d3(d, hkv, t)), &[k], "Kcur_heads")?;
        let v = b.op(Op::Reshape(Shape::d3(d, hkv, t)), &[v], "Vcur")?;
        // per-head RMSNorm, IMRoPE, softmax(q·Kᵀ/√D) V over the KV cache
        let o = blocks::qk_rope_attend(b, &self.w, il, (q, k, v), pos, &c.attn(), "attn_pregate")?;
        // o ⊙ sigmoid(gate), then W_o
        let g = b.op(Op::Unary(UnaryOp::Sigmoid), &[gate], "gate_sigmoid")?;
        let o = b.op(Op::Binary(BinaryOp::Mul), &[o, g], "attn_gated")?;
        self.linear(b, o, &Self::t(il, "attn_output.weight"), d * h, e, "attn_output")
    }

    /// Gated DeltaNet, spec §4.4. x: [n_embd, T] → [n_embd, T].
    fn deltanet(&self, b: &mut GraphBuilder, il: usize, x: NodeId, t: usize) -> Result<NodeId, GraphError> {
        let c = &self.cfg;
        let (e, hk, hv, dk, dv) = (c.n_embd, c.n_k_heads, c.n_v_heads, c.d_state, c.head_v_dim);
        let conv_dim = c.conv_dim();
        // mixed = [q (Hk·Dk) ; k (Hk·Dk) ; v (Hv·Dv)], z = output gate input
        let mixed = self.linear(b, x, &Self::t(il, "attn_qkv.weight"), e, conv_dim, "linear_attn_qkv_mixed")?;
        let z = self.linear(b, x, &Self::t(il, "attn_gate.weight"), e, hv * dv, "z")?;
        // β = sigmoid(W_β x);  g = ssm_a ⊙ softplus(W_α x + dt_bias)  (ssm_a = −exp(A_log))
        let beta = self.linear(b, x, &Self::t(il, "ssm_beta.weight"), e, hv, "beta")?;
        let beta = b.op(Op::Unary(UnaryOp::Sigmoid), &[beta], "beta_sigmoid")?;
        let alpha = self.linear(b, x, &Self::t(il, "ssm_alpha.weight"), e, hv, "alpha")?;
        let dt_bias = self.w.node(b, &Self::t(il, "ssm_dt.bias"), &[hv])?;
        let alpha = b.op(Op::Binary(BinaryOp::Add), &[alpha, dt_bias], "a_biased")?;
        let sp = b.op(Op::Unary(UnaryOp::Softplus), &[alpha], "a_softplus")?;
        let ssm_a = self.w.node(b, &Self::t(il, "ssm_a"), &[hv])?;
        let g = b.op(Op::Binary(BinaryOp::Mul), &[sp, ssm_a], "gate")?;
        // causal depthwise conv over [conv state | mixed], then SiLU
        let conv_w = self.w.node(b, &Self::t(il, "ssm_conv1d.weight"), &[c.d_conv, conv_dim])?;
        let conv = b.op(Op::Conv1dCausal { d_conv: c.d_conv, state: il }, &[mixed, conv_w], "conv_output_raw")?;
        let conv = b.op(Op::Unary(UnaryOp::Silu), &[conv], "conv_output_silu")?;
        let q = b.op(Op::SliceCols { group: conv_dim, offset: 0, len: hk * dk }, &[conv], "q_conv")?;
        let k = b.op(Op::SliceCols { group: conv_dim, offset: hk * dk, len: hk * dk }, &[conv], "k_conv")?;
        let v = b.op(Op::SliceCols { group: conv_dim, offset: 2 * hk * dk, len: hv * dv }, &[conv], "v_conv")?;
        let q = b.op(Op::Reshape(Shape::d3(dk, hk, t)), &[q], "q_heads")?;
        let k = b.op(Op::Reshape(Shape::d3(dk, hk, t)), &[k], "k_heads")?;
        let v = b.op(Op::Reshape(Shape::d3(dv, hv, t)), &[v], "v_conv_predelta")?;
        // L2 norm of q and k per head (not v)
        let q = b.op(Op::L2Norm { eps: c.eps }, &[q], "q_conv_predelta")?;
        let k = b.op(Op::L2Norm { eps: c.eps }, &[k], "k_conv_predelta")?;
        // the gated delta rule (V head h reads K head h mod Hk), state carried
        let o = b.op(Op::DeltaRule { state: il }, &[q, k, v, g, beta], "attn_output")?;
        // RMSN(o_h, ssm_norm) ⊙ silu(z_h) per V head, then W_out
        let o = self.rms_norm(b, o, &Self::t(il, "ssm_norm.weight"), dv, "attn_output_normed")?;
        let z = b.op(Op::Reshape(Shape::d3(dv, hv, t)), &[z], "z_heads")?;
        let z = b.op(Op::Unary(UnaryOp::Silu), &[z], "z_silu")?;
        let o = b.op(Op::Binary(BinaryOp::Mul), &[o, z], "final_output")?;
        let o = b.op(Op::Reshape(Shape::d2(hv * dv, t)), &[o], "final_output_flat")?;
        self.linear(b, o, &Self::t(il, "ssm_out.weight"), hv * dv, e, "linear_attn_out")
    }

    /// Routed experts + gated shared expert, spec §4.5. y: [n_embd, T] → [n_embd, T].
    fn moe(&self, b: &mut GraphBuilder, il: usize, y: NodeId) -> Result<NodeId, GraphError> {
        let c = &self.cfg;
        let e = c.n_embd;
        let moe = blocks::routed_experts(b, &self.w, il, y, (e, c.n_expert, c.n_expert_used, c.n_ff_exp))?;
        // shared expert, scaled by one sigmoid gate per token
        let sh = blocks::swiglu(b, &self.w, il, y, "_shexp", e, c.n_ff_shexp, "ffn_shexp")?;
        let sg = self.linear(b, y, &Self::t(il, "ffn_gate_inp_shexp.weight"), e, 1, "shared_expert_gate")?;
        let sg = b.op(Op::Unary(UnaryOp::Sigmoid), &[sg], "shared_expert_gate_sigmoid")?;
        let sh = b.op(Op::Binary(BinaryOp::Mul), &[sh, sg], "ffn_shexp_gated")?;
        b.op(Op::Binary(BinaryOp::Add), &[moe, sh], "ffn_out")
    }
}

impl Model for Qwen35 {
    fn arch(&self) -> &str {
        &self.cfg.arch
    }
    fn n_vocab(&self) -> usize {
        self.cfg.n_vocab
    }
    fn n_layer(&self) -> usize {
        self.cfg.n_layer
    }
    fn context_length(&self) -> usize {
        self.cfg.context_length
    }
    fn layers(&self) -> Vec<LayerInfo> {
        let ffn = match self.ffn {
            Ffn::Moe => "moe",
            Ffn::Dense => "mlp",
        };
        (0..self.cfg.n_layer)
            .map(|i| LayerInfo { index: i, kind: format!("{} + {ffn}", if self.cfg.recurrent[i] { "deltanet" } else { "attention" }) })
            .collect()
    }

    fn build(&self, geom: Geometry, b: &mut GraphBuilder) -> Result<(), GraphError> {
        let c = &self.cfg;
        let t = geom.n_tokens;
        let tokens = b.input(Op::Tokens, t, "inp_tokens")?;
        let pos = b.input(Op::Positions, t, "inp_pos")?;
        let embd = self.w.node(b, "token_embd.weight", &[c.n_embd, c.n_vocab])?;
        let mut h = b.op(Op::GetRows, &[embd, tokens], "inp_embd")?; // [n_embd, T]
        for il in 0..c.n_layer {
            b.set_layer(Some(il));
            let x = self.rms_norm(b, h, &Self::t(il, "attn_norm.weight"), c.n_embd, "attn_norm")?;
            let a = if c.recurrent[il] { self.deltanet(b, il, x, t)? } else { self.attention(b, il, x, pos, t)? };
            h = b.op(Op::Binary(BinaryOp::Add), &[a, h], "attn_residual")?;
            let y = self.rms_norm(b, h, &Self::t(il, "post_attention_norm.weight"), c.n_embd, "attn_post_norm")?;
            let f = match self.ffn {
                Ffn::Moe => self.moe(b, il, y)?,
                Ffn::Dense => blocks::swiglu(b, &self.w, il, y, "", c.n_embd, c.n_ff, "ffn_out")?,
            };
            h = b.op(Op::Binary(BinaryOp::Add), &[f, h], "l_out")?;
        }
        blocks::head(b, &self.w, h, (c.n_embd, c.n_vocab), geom, c.eps)?;
        Ok(())
    }

    fn new_state(&self, max_seq: usize) -> Vec<LayerState> {
        self.new_state_with(max_seq, KvType::F32)
    }

    fn new_state_with(&self, max_seq: usize, kv: KvType) -> Vec<LayerState> {
        let c = &self.cfg;
        (0..c.n_layer)
            .map(|il| {
                if c.recurrent[il] {
                    LayerState::Recurrent(RecurrentState::new(c.d_conv, c.conv_dim(), c.n_v_heads, c.d_state, c.head_v_dim))
                } else {
                    LayerState::Kv(KvCache::with_type(c.n_head_kv, c.head_dim, max_seq, kv))
                }
            })
            .collect()
    }

    fn describe(&self) -> Vec<(String, String)> {
        let c = &self.cfg;
        let mut d = vec![
            ("architecture".into(), c.arch.clone()),
            ("layers".into(), format!("{} main + {} MTP (block_count {})", c.n_layer, c.n_nextn, c.n_layer_all)),
            ("n_embd".into(), c.n_embd.to_string()),
            ("n_vocab".into(), c.n_vocab.to_string()),
            ("context_length".into(), c.context_length.to_string()),
            ("attention".into(), format!("{} heads × {} ({} KV heads), rope {} dims base {} sections {:?}", c.n_head, c.head_dim, c.n_head_kv, c.n_rot, c.rope_base, c.rope_sections)),
            ("deltanet".into(), format!("{} K heads × {}, {} V heads × {}, conv {}", c.n_k_heads, c.d_state, c.n_v_heads, c.head_v_dim, c.d_conv)),
        ];
        match self.ffn {
            Ffn::Moe => d.push(("moe".into(), format!("{} experts, top-{}, width {}, shared expert width {}", c.n_expert, c.n_expert_used, c.n_ff_exp, c.n_ff_shexp))),
            Ffn::Dense => d.push(("ffn".into(), format!("SwiGLU width {}", c.n_ff))),
        }
        d.push(("rms_eps".into(), format!("{:e}", c.eps)));
        d
    }
}

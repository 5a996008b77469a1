//! Qwen3-MoE (`qwen3moe`, e.g. Qwen3-30B-A3B) as a graph: every layer is plain GQA
//! attention (per-head Q/K RMSNorm, NEOX RoPE over the rotary dims, no output gate)
//! followed by softmax-routed experts (top-k renormalized) and no shared expert.
//! The same ops and blocks as qwen35moe — a second architecture is one short file.

use crate::blocks::{self, head, linear, rms_norm};
use crate::meta::{ConfigError, Meta};
use crate::weights::Weights;
use pn_engine::graph::{GraphBuilder, GraphError, NodeId};
use pn_engine::{Geometry, Gguf, LayerInfo, Model};
use pn_ops::{BinaryOp, KvCache, LayerState, Op, RopeMode, Shape};

#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub n_layer: usize,
    pub n_vocab: usize,
    pub n_embd: usize,
    pub context_length: usize,
    pub eps: f32,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_rot: usize,
    pub rope_base: f32,
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub n_ff_exp: usize,
}

pub struct Qwen3Moe {
    pub cfg: Config,
    w: Weights,
}

impl Qwen3Moe {
    pub fn load(g: &Gguf) -> Result<Qwen3Moe, ConfigError> {
        let m = Meta::new(g, "qwen3moe");
        let n_embd = m.usize("embedding_length")?;
        let n_head = m.usize("attention.head_count")?;
        if n_head == 0 {
            return Err(ConfigError::Invalid(format!("{}: expected ≥ 1, found 0", m.key("attention.head_count"))));
        }
        let n_head_kv = m.usize_or("attention.head_count_kv", n_head)?;
        let head_dim = m.usize_or("attention.key_length", n_embd / n_head)?;
        let n_rot = m.usize_or("rope.dimension_count", head_dim)?;
        let n_expert = m.usize("expert_count")?;
        let n_expert_used = m.usize("expert_used_count")?;
        if n_head_kv == 0 || n_head % n_head_kv != 0 || n_rot > head_dim || n_rot % 2 != 0 || n_expert_used == 0 || n_expert_used > n_expert {
            return Err(ConfigError::Invalid(format!(
                "qwen3moe dims: heads {n_head}/{n_head_kv} (kv must divide), rope dims {n_rot} (even, ≤ head dim {head_dim}), experts top-{n_expert_used} of {n_expert}"
            )));
        }
        let n_vocab = g
            .tensor("token_embd.weight")
            .map(|t| t.ne[1] as usize)
            .ok_or_else(|| ConfigError::Tensor { name: "token_embd.weight".into(), msg: "required tensor is missing from the GGUF".into() })?;
        let n_ff = m.usize_or("feed_forward_length", 0)?;
        let cfg = Config {
            n_layer: m.usize("block_count")?,
            n_vocab,
            n_embd,
            context_length: m.usize("context_length")?,
            eps: m.f32("attention.layer_norm_rms_epsilon")?,
            n_head,
            n_head_kv,
            head_dim,
            n_rot,
            rope_base: m.opt_f32("rope.freq_base")?.unwrap_or(10000.0),
            n_expert,
            n_expert_used,
            n_ff_exp: match m.usize_or("expert_feed_forward_length", 0)? {
                0 => n_ff / n_expert_used,
                x => x,
            },
        };
        Ok(Qwen3Moe { cfg, w: Weights::from_gguf(g) })
    }

    /// softmax(q·Kᵀ/√D) V with per-head Q/K norms and NEOX RoPE. x: [n_embd, T].
    fn attention(&self, b: &mut GraphBuilder, il: usize, x: NodeId, pos: NodeId, t: usize) -> Result<NodeId, GraphError> {
        let c = &self.cfg;
        let (d, h, hkv, e) = (c.head_dim, c.n_head, c.n_head_kv, c.n_embd);
        let w = |s: &str| format!("blk.{il}.{s}.weight");
        let q = linear(b, &self.w, x, &w("attn_q"), e, d * h, "Qcur")?;
        let k = linear(b, &self.w, x, &w("attn_k"), e, d * hkv, "Kcur")?;
        let v = linear(b, &self.w, x, &w("attn_v"), e, d * hkv, "Vcur")?;
        let q = b.op(Op::Reshape(Shape::d3(d, h, t)), &[q], "Qcur_heads")?;
        let k = b.op(Op::Reshape(Shape::d3(d, hkv, t)), &[k], "Kcur_heads")?;
        let v = b.op(Op::Reshape(Shape::d3(d, hkv, t)), &[v], "Vcur_heads")?;
        let q = rms_norm(b, &self.w, q, &w("attn_q_norm"), d, c.eps, "Qcur_normed")?;
        let k = rms_norm(b, &self.w, k, &w("attn_k_norm"), d, c.eps, "Kcur_normed")?;
        let rope = Op::Rope { n_rot: c.n_rot, mode: RopeMode::Neox, freq_base: c.rope_base, freq_scale: 1.0 };
        let q = b.op(rope.clone(), &[q, pos], "Qcur_rope")?;
        let k = b.op(rope, &[k, pos], "Kcur_rope")?;
        let scale = 1.0 / (d as f32).sqrt();
        let o = b.op(Op::Attention { n_head: h, n_head_kv: hkv, head_dim: d, scale, state: il }, &[q, k, v, pos], "kqv_out")?;
        linear(b, &self.w, o, &w("attn_output"), d * h, e, "attn_out")
    }
}

impl Model for Qwen3Moe {
    fn arch(&self) -> &str {
        "qwen3moe"
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
        (0..self.cfg.n_layer).map(|i| LayerInfo { index: i, kind: "attention + moe".into() }).collect()
    }

    fn build(&self, geom: Geometry, b: &mut GraphBuilder) -> Result<(), GraphError> {
        let c = &self.cfg;
        let t = geom.n_tokens;
        let tokens = b.input(Op::Tokens, t, "inp_tokens")?;
        let pos = b.input(Op::Positions, t, "inp_pos")?;
        let embd = self.w.node(b, "token_embd.weight", &[c.n_embd, c.n_vocab])?;
        let mut h = b.op(Op::GetRows, &[embd, tokens], "inp_embd")?;
        for il in 0..c.n_layer {
            b.set_layer(Some(il));
            let x = rms_norm(b, &self.w, h, &format!("blk.{il}.attn_norm.weight"), c.n_embd, c.eps, "attn_norm")?;
            let a = self.attention(b, il, x, pos, t)?;
            h = b.op(Op::Binary(BinaryOp::Add), &[a, h], "ffn_inp")?;
            let y = rms_norm(b, &self.w, h, &format!("blk.{il}.ffn_norm.weight"), c.n_embd, c.eps, "ffn_norm")?;
            let f = blocks::routed_experts(b, &self.w, il, y, (c.n_embd, c.n_expert, c.n_expert_used, c.n_ff_exp))?;
            h = b.op(Op::Binary(BinaryOp::Add), &[f, h], "l_out")?;
        }
        head(b, &self.w, h, (c.n_embd, c.n_vocab, t), c.eps, !geom.all_logits)?;
        Ok(())
    }

    fn new_state(&self, max_seq: usize) -> Vec<LayerState> {
        (0..self.cfg.n_layer).map(|_| LayerState::Kv(KvCache::new(self.cfg.n_head_kv, self.cfg.head_dim, max_seq))).collect()
    }

    fn describe(&self) -> Vec<(String, String)> {
        let c = &self.cfg;
        vec![
            ("architecture".into(), "qwen3moe".into()),
            ("layers".into(), c.n_layer.to_string()),
            ("n_embd".into(), c.n_embd.to_string()),
            ("n_vocab".into(), c.n_vocab.to_string()),
            ("context_length".into(), c.context_length.to_string()),
            ("attention".into(), format!("{} heads × {} ({} KV heads), NEOX rope {} dims base {}", c.n_head, c.head_dim, c.n_head_kv, c.n_rot, c.rope_base)),
            ("moe".into(), format!("{} experts, top-{}, width {}", c.n_expert, c.n_expert_used, c.n_ff_exp)),
            ("rms_eps".into(), format!("{:e}", c.eps)),
        ]
    }
}

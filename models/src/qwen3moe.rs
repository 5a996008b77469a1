//! Qwen3-MoE (`qwen3moe`, e.g. Qwen3-30B-A3B) as a graph: every layer is plain GQA
//! attention (per-head Q/K RMSNorm, NEOX RoPE over the rotary dims, no output gate)
//! followed by softmax-routed experts (top-k renormalized) and no shared expert.
//! The same ops and blocks as qwen35moe — a second architecture is one short file.

use crate::blocks::{self, head, rms_norm, AttnDims};
use crate::meta::{ConfigError, Meta};
use crate::weights::Weights;
use pn_engine::graph::{GraphBuilder, GraphError};
use pn_engine::{Geometry, Gguf, LayerInfo, Model};
use pn_ops::{BinaryOp, KvCache, LayerState, Op, RopeMode};

#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub n_layer: usize,
    pub n_vocab: usize,
    pub context_length: usize,
    pub attn: AttnDims,
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
        let attn = AttnDims::load(&m, RopeMode::Neox)?;
        let n_expert = m.usize("expert_count")?;
        let n_expert_used = m.usize("expert_used_count")?;
        if n_expert_used == 0 || n_expert_used > n_expert {
            return Err(ConfigError::Invalid(format!("qwen3moe experts: top-{n_expert_used} of {n_expert}")));
        }
        let n_vocab = g
            .tensor("token_embd.weight")
            .map(|t| t.ne[1] as usize)
            .ok_or_else(|| ConfigError::Tensor { name: "token_embd.weight".into(), msg: "required tensor is missing from the GGUF".into() })?;
        let n_ff = m.usize_or("feed_forward_length", 0)?;
        let cfg = Config {
            n_layer: m.usize("block_count")?,
            n_vocab,
            context_length: m.usize("context_length")?,
            attn,
            n_expert,
            n_expert_used,
            n_ff_exp: match m.usize_or("expert_feed_forward_length", 0)? {
                0 => n_ff / n_expert_used,
                x => x,
            },
        };
        Ok(Qwen3Moe { cfg, w: Weights::from_gguf(g) })
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
        let (c, a) = (&self.cfg, &self.cfg.attn);
        let t = geom.n_tokens;
        let tokens = b.input(Op::Tokens, t, "inp_tokens")?;
        let pos = b.input(Op::Positions, t, "inp_pos")?;
        let embd = self.w.node(b, "token_embd.weight", &[a.n_embd, c.n_vocab])?;
        let mut h = b.op(Op::GetRows, &[embd, tokens], "inp_embd")?;
        for il in 0..c.n_layer {
            b.set_layer(Some(il));
            let x = rms_norm(b, &self.w, h, &format!("blk.{il}.attn_norm.weight"), a.n_embd, a.eps, "attn_norm")?;
            let o = blocks::self_attention(b, &self.w, il, x, pos, t, a)?;
            h = b.op(Op::Binary(BinaryOp::Add), &[o, h], "ffn_inp")?;
            let y = rms_norm(b, &self.w, h, &format!("blk.{il}.ffn_norm.weight"), a.n_embd, a.eps, "ffn_norm")?;
            let f = blocks::routed_experts(b, &self.w, il, y, (a.n_embd, c.n_expert, c.n_expert_used, c.n_ff_exp))?;
            h = b.op(Op::Binary(BinaryOp::Add), &[f, h], "l_out")?;
        }
        head(b, &self.w, h, (a.n_embd, c.n_vocab, t), a.eps, !geom.all_logits)?;
        Ok(())
    }

    fn new_state(&self, max_seq: usize) -> Vec<LayerState> {
        (0..self.cfg.n_layer).map(|_| LayerState::Kv(KvCache::new(self.cfg.attn.n_head_kv, self.cfg.attn.head_dim, max_seq))).collect()
    }

    fn describe(&self) -> Vec<(String, String)> {
        let c = &self.cfg;
        vec![
            ("architecture".into(), "qwen3moe".into()),
            ("layers".into(), c.n_layer.to_string()),
            ("n_embd".into(), c.attn.n_embd.to_string()),
            ("n_vocab".into(), c.n_vocab.to_string()),
            ("context_length".into(), c.context_length.to_string()),
            ("attention".into(), c.attn.describe()),
            ("moe".into(), format!("{} experts, top-{}, width {}", c.n_expert, c.n_expert_used, c.n_ff_exp)),
            ("rms_eps".into(), format!("{:e}", c.attn.eps)),
        ]
    }
}

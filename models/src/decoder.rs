//! The pre-norm GQA decoder that Llama, Qwen2, Qwen3 and Qwen3-MoE share: per layer
//! `h += W_o·attn(RMSN(h, attn_norm))`, `h += ffn(RMSN(h, ffn_norm))` with a SwiGLU MLP
//! or (Qwen3-MoE) softmax-routed experts, then the head. What differs between
//! them is what the architecture file states and checks: the RoPE pairing, whether Q/K
//! norms and Q/K/V biases are required, whether experts are. The graph itself reads
//! only tensor presence.

use crate::blocks::{self, head, rms_norm, AttnDims};
use crate::meta::{ConfigError, Meta};
use crate::weights::Weights;
use pn_engine::graph::{GraphBuilder, GraphError};
use pn_engine::{Geometry, Gguf, LayerInfo, Model};
use pn_ops::{BinaryOp, KvCache, KvType, LayerState, Op, RopeMode};

/// What an architecture asks of the decoder.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Flavor {
    pub arch: &'static str,
    pub rope: RopeMode,
    /// Every layer has `attn_q_norm` / `attn_k_norm` (Qwen3).
    pub qk_norm: bool,
    /// Every layer has `attn_{q,k,v}.bias` (Qwen2).
    pub qkv_bias: bool,
    /// The FFN is routed experts (`expert_count`, `expert_used_count`), not an MLP.
    pub moe: bool,
}

/// The feed-forward block of every layer.
#[derive(Clone, Debug, PartialEq)]
pub enum Ffn {
    /// SwiGLU of this width.
    Mlp(usize),
    /// Softmax top-k experts: (experts, used per token, expert width).
    Moe(usize, usize, usize),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub n_layer: usize,
    pub n_vocab: usize,
    pub context_length: usize,
    pub ffn: Ffn,
    pub attn: AttnDims,
}

pub struct Decoder {
    pub flavor: Flavor,
    pub cfg: Config,
    w: Weights,
}

impl Decoder {
    pub fn load(g: &Gguf, flavor: Flavor) -> Result<Decoder, ConfigError> {
        let m = Meta::new(g, flavor.arch);
        let attn = AttnDims::load(&m, flavor.rope)?;
        let n_vocab = g
            .tensor("token_embd.weight")
            .map(|t| t.ne[1] as usize)
            .ok_or_else(|| ConfigError::Tensor { name: "token_embd.weight".into(), msg: "required tensor is missing from the GGUF".into() })?;
        let n_layer = m.usize("block_count")?;
        if n_layer > g.tensors.len() {
            return Err(ConfigError::Invalid(format!("{}: {n_layer} blocks but {} tensors", m.key("block_count"), g.tensors.len())));
        }
        let w = Weights::from_gguf(g);
        let mut required: Vec<&str> = Vec::new();
        if flavor.qk_norm {
            required.extend(["attn_q_norm.weight", "attn_k_norm.weight"]);
        }
        if flavor.qkv_bias {
            required.extend(["attn_q.bias", "attn_k.bias", "attn_v.bias"]);
        }
        for il in 0..n_layer {
            for r in &required {
                let name = format!("blk.{il}.{r}");
                if !w.has(&name) {
                    return Err(ConfigError::Tensor { name, msg: format!("required by {} and missing from the GGUF", flavor.arch) });
                }
            }
        }
        let ffn = if flavor.moe {
            let (n_expert, n_used) = (m.usize("expert_count")?, m.usize("expert_used_count")?);
            if n_used == 0 || n_used > n_expert {
                return Err(ConfigError::Invalid(format!("{}: expected 1..={n_expert}, found {n_used}", m.key("expert_used_count"))));
            }
            let width = match m.usize_or("expert_feed_forward_length", 0)? {
                0 => m.usize("feed_forward_length")? / n_used,
                x => x,
            };
            Ffn::Moe(n_expert, n_used, width)
        } else {
            Ffn::Mlp(m.usize("feed_forward_length")?)
        };
        let cfg = Config { n_layer, n_vocab, context_length: m.usize("context_length")?, ffn, attn };
        Ok(Decoder { flavor, cfg, w })
    }
}

impl Model for Decoder {
    fn arch(&self) -> &str {
        self.flavor.arch
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
        let ffn = if self.flavor.moe { "moe" } else { "mlp" };
        (0..self.cfg.n_layer).map(|i| LayerInfo { index: i, kind: format!("attention + {ffn}") }).collect()
    }

    fn build(&self, geom: Geometry, b: &mut GraphBuilder) -> Result<(), GraphError> {
        let (c, a) = (&self.cfg, &self.cfg.attn);
        let t = geom.n_tokens;
        let tokens = b.input(Op::Tokens, t, "inp_tokens")?;
        let pos = b.input(Op::Positions, t, "inp_pos")?;
        let embd = self.w.node(b, "token_embd.weight", &[a.n_embd, c.n_vocab])?;
        let mut h = b.op(Op::GetRows, &[embd, tokens], "inp_embd")?; // [n_embd, T]
        for il in 0..c.n_layer {
            b.set_layer(Some(il));
            let x = rms_norm(b, &self.w, h, &format!("blk.{il}.attn_norm.weight"), a.n_embd, a.eps, "attn_norm")?;
            let o = blocks::self_attention(b, &self.w, il, x, pos, t, a)?;
            h = b.op(Op::Binary(BinaryOp::Add), &[o, h], "ffn_inp")?;
            let y = rms_norm(b, &self.w, h, &format!("blk.{il}.ffn_norm.weight"), a.n_embd, a.eps, "ffn_norm")?;
            let f = match c.ffn {
                Ffn::Mlp(n_ff) => blocks::swiglu(b, &self.w, il, y, "", a.n_embd, n_ff, "ffn_out")?,
                Ffn::Moe(n, k, width) => blocks::routed_experts(b, &self.w, il, y, (a.n_embd, n, k, width))?,
            };
            h = b.op(Op::Binary(BinaryOp::Add), &[f, h], "l_out")?;
        }
        head(b, &self.w, h, (a.n_embd, c.n_vocab), geom, a.eps)?;
        Ok(())
    }

    fn new_state(&self, max_seq: usize) -> Vec<LayerState> {
        self.new_state_with(max_seq, KvType::F32)
    }

    fn new_state_with(&self, max_seq: usize, kv: KvType) -> Vec<LayerState> {
        let a = &self.cfg.attn;
        (0..self.cfg.n_layer).map(|_| LayerState::Kv(KvCache::with_type(a.n_head_kv, a.head_dim, max_seq, kv))).collect()
    }

    fn describe(&self) -> Vec<(String, String)> {
        let c = &self.cfg;
        let mut d = vec![
            ("architecture".into(), self.flavor.arch.into()),
            ("layers".into(), c.n_layer.to_string()),
            ("n_embd".into(), c.attn.n_embd.to_string()),
            ("n_vocab".into(), c.n_vocab.to_string()),
            ("context_length".into(), c.context_length.to_string()),
            ("attention".into(), c.attn.describe()),
            match c.ffn {
                Ffn::Mlp(n_ff) => ("ffn".into(), format!("SwiGLU width {n_ff}")),
                Ffn::Moe(n, k, width) => ("moe".into(), format!("{n} experts, top-{k}, width {width}")),
            },
            ("rms_eps".into(), format!("{:e}", c.attn.eps)),
        ];
        if self.w.has("rope_freqs.weight") {
            d.push(("rope_freqs".into(), format!("{} per-pair factors", c.attn.n_rot / 2)));
        }
        d
    }
}

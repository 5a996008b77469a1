//! qwen35moe hyper-parameters from GGUF metadata (spec §2).

use crate::meta::{ConfigError, Meta};
use pn_engine::Gguf;

#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub arch: String,
    /// `block_count`, MTP blocks included.
    pub n_layer_all: usize,
    /// Layers run by the main forward pass: `block_count − nextn_predict_layers`.
    pub n_layer: usize,
    pub n_nextn: usize,
    pub n_vocab: usize,
    pub n_embd: usize,
    pub context_length: usize,
    pub eps: f32,
    // gated attention
    pub n_head: usize,
    pub n_head_kv: usize,
    /// D: head dim of Q, K and V.
    pub head_dim: usize,
    pub n_rot: usize,
    pub rope_sections: [u32; 4],
    pub rope_base: f32,
    pub rope_freq_scale: f32,
    // MoE
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub n_ff_exp: usize,
    pub n_ff_shexp: usize,
    /// Dense FFN width (the qwen35 dense variant).
    pub n_ff: usize,
    // Gated DeltaNet
    pub d_conv: usize,
    /// Dk (also the key head dim).
    pub d_state: usize,
    /// Hk: key/query heads.
    pub n_k_heads: usize,
    /// Hv: value heads.
    pub n_v_heads: usize,
    /// Dv = d_inner / Hv.
    pub head_v_dim: usize,
    pub d_inner: usize,
    /// Per main layer: true = Gated DeltaNet ("recurrent"), false = full attention.
    pub recurrent: Vec<bool>,
}

/// Largest accepted model dimension (widths, head and expert counts).
const MAX_DIM: usize = 1 << 24;
/// Largest accepted per-head dimension (attention head dim, DeltaNet state size, conv taps).
const MAX_HEAD_DIM: usize = 1 << 12;

impl Config {
    /// Channels of the causal conv: q, k and v of the DeltaNet (2·Hk·Dk + Hv·Dv).
    pub fn conv_dim(&self) -> usize {
        2 * self.n_k_heads * self.d_state + self.d_inner
    }

    /// The gated attention's Q/K-norm → IMRoPE → attention settings.
    pub fn attn(&self) -> crate::blocks::AttnDims {
        crate::blocks::AttnDims {
            n_embd: self.n_embd,
            n_head: self.n_head,
            n_head_kv: self.n_head_kv,
            head_dim: self.head_dim,
            n_rot: self.n_rot,
            rope: pn_ops::RopeMode::IMRope { sections: self.rope_sections },
            rope_base: self.rope_base,
            rope_scale: self.rope_freq_scale,
            eps: self.eps,
        }
    }

    pub fn from_gguf(g: &Gguf, arch: &str, moe: bool) -> Result<Config, ConfigError> {
        let m = Meta::new(g, arch);
        let n_layer_all = m.usize("block_count")?;
        let n_nextn = m.usize_or("nextn_predict_layers", 0)?;
        if n_nextn >= n_layer_all {
            return Err(ConfigError::Invalid(format!(
                "{}: {n_nextn} MTP layers leave no main layers out of block_count {n_layer_all}",
                m.key("nextn_predict_layers")
            )));
        }
        let n_layer = n_layer_all - n_nextn;
        // every block has several tensors: this bounds what is allocated per layer by the file
        if n_layer_all > g.tensors.len() {
            return Err(ConfigError::Invalid(format!(
                "{}: expected at most one block per tensor, found {n_layer_all} blocks but {} tensors",
                m.key("block_count"),
                g.tensors.len()
            )));
        }
        let n_embd = m.usize("embedding_length")?;
        let n_head = m.usize_or("attention.head_count", 0)?;
        if n_head == 0 {
            return Err(ConfigError::Missing(m.key("attention.head_count")));
        }
        let n_head_kv = m.usize_or("attention.head_count_kv", n_head)?;
        let head_dim = m.usize_or("attention.key_length", n_embd / n_head)?;
        if head_dim == 0 || head_dim > MAX_HEAD_DIM {
            return Err(ConfigError::Invalid(format!("{}: expected a head dim in 1..={MAX_HEAD_DIM}, found {head_dim}", m.key("attention.key_length"))));
        }
        let v_len = m.usize_or("attention.value_length", head_dim)?;
        if v_len != head_dim {
            return Err(ConfigError::Invalid(format!("attention.value_length {v_len} must equal key_length {head_dim}")));
        }
        if n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(ConfigError::Invalid(format!("head_count {n_head} must be a multiple of head_count_kv {n_head_kv}")));
        }
        let n_rot = m.usize_or("rope.dimension_count", head_dim)?;
        if n_rot > head_dim || n_rot % 2 != 0 {
            return Err(ConfigError::Invalid(format!("rope.dimension_count {n_rot}: expected an even number ≤ head dim {head_dim}")));
        }
        let sections = m.opt_int_array("rope.dimension_sections")?;
        let rope_sections = match sections {
            // IMRope cycles through the sections: they must not all be 0, and each is at
            // most n_rot (so kernels can sum and scale them without overflow)
            Some(s) if s.len() == 4 && s.iter().all(|&x| (0..=n_rot as i64).contains(&x)) && s.iter().any(|&x| x > 0) => {
                [s[0] as u32, s[1] as u32, s[2] as u32, s[3] as u32]
            }
            Some(s) => {
                return Err(ConfigError::Invalid(format!(
                    "{}: expected 4 values in 0..={n_rot} (rope.dimension_count), not all 0, found {s:?}",
                    m.key("rope.dimension_sections")
                )))
            }
            None => return Err(ConfigError::Missing(m.key("rope.dimension_sections"))),
        };
        let rope_freq_scale = match m.opt_str("rope.scaling.type")? {
            None | Some("none") | Some("linear") => match m.opt_f32("rope.scaling.factor")? {
                Some(f) if f != 0.0 => 1.0 / f,
                _ => 1.0,
            },
            Some(other) => {
                return Err(ConfigError::Invalid(format!("{}: {other:?} is not supported (expected none or linear)", m.key("rope.scaling.type"))))
            }
        };
        let n_ff = m.usize_or("feed_forward_length", 0)?;
        let (n_expert, n_expert_used, n_ff_exp, n_ff_shexp) = if moe {
            let n_expert = m.usize_or("expert_count", 0)?;
            let used = m.usize_or("expert_used_count", 0)?;
            if n_expert == 0 || used == 0 || used > n_expert {
                return Err(ConfigError::Invalid(format!("expert_count {n_expert} / expert_used_count {used}: expected 1 ≤ used ≤ count")));
            }
            let ff_exp = match m.usize_or("expert_feed_forward_length", 0)? {
                0 => n_ff / used,
                x => x,
            };
            let ff_sh = match m.usize_or("expert_shared_feed_forward_length", 0)? {
                0 => n_ff,
                x => x,
            };
            (n_expert, used, ff_exp, ff_sh)
        } else {
            (0, 0, 0, 0)
        };
        let d_conv = m.usize("ssm.conv_kernel")?;
        let d_inner = m.usize("ssm.inner_size")?;
        let d_state = m.usize("ssm.state_size")?;
        let n_v_heads = m.usize("ssm.time_step_rank")?;
        let n_k_heads = m.usize("ssm.group_count")?;
        if d_conv < 1 || n_v_heads == 0 || n_k_heads == 0 || d_inner % n_v_heads != 0 || n_v_heads % n_k_heads != 0 {
            return Err(ConfigError::Invalid(format!(
                "ssm dims: conv_kernel {d_conv}, inner_size {d_inner}, time_step_rank {n_v_heads}, group_count {n_k_heads}: expected inner_size divisible by time_step_rank, time_step_rank by group_count"
            )));
        }
        let head_v_dim = d_inner / n_v_heads;
        if head_v_dim != d_state {
            return Err(ConfigError::Invalid(format!(
                "ssm: value head dim inner_size/time_step_rank = {head_v_dim} must equal state_size {d_state}"
            )));
        }
        let recurrent = match m.opt_int_array("attention.recurrent_layers")? {
            Some(flags) => {
                if flags.len() < n_layer {
                    return Err(ConfigError::Invalid(format!("{}: expected {n_layer_all} flags, found {}", m.key("attention.recurrent_layers"), flags.len())));
                }
                flags[..n_layer].iter().map(|&f| f != 0).collect()
            }
            None => {
                let interval = m.usize_or("full_attention_interval", 4)?;
                if interval == 0 {
                    return Err(ConfigError::Invalid(format!("{}: expected ≥ 1, found 0", m.key("full_attention_interval"))));
                }
                (0..n_layer).map(|i| (i + 1) % interval != 0).collect()
            }
        };
        let n_vocab = match g.tensor("token_embd.weight") {
            Some(t) => t.ne[1] as usize,
            None => return Err(ConfigError::Tensor { name: "token_embd.weight".into(), msg: "required tensor is missing from the GGUF".into() }),
        };
        // Bounds that keep every product of dimensions (tensor shapes, state sizes) far from
        // overflow; shapes are then checked against the tensors, which bounds allocation by
        // the file size. Head dims also size the per-head DeltaNet state (Dk × Dv).
        let dims: [(&str, usize, usize); 12] = [
            ("embedding_length", n_embd, MAX_DIM),
            ("attention.head_count", n_head, MAX_DIM),
            ("attention.head_count_kv", n_head_kv, MAX_DIM),
            ("attention.key_length", head_dim, MAX_HEAD_DIM),
            ("expert_count", n_expert.max(1), MAX_DIM),
            ("expert_feed_forward_length", n_ff_exp.max(!moe as usize), MAX_DIM),
            ("expert_shared_feed_forward_length", n_ff_shexp.max(!moe as usize), MAX_DIM),
            ("feed_forward_length", n_ff.max(moe as usize), MAX_DIM),
            ("ssm.conv_kernel", d_conv, MAX_HEAD_DIM),
            ("ssm.state_size", d_state, MAX_HEAD_DIM),
            ("ssm.group_count", n_k_heads, MAX_DIM),
            ("ssm.time_step_rank", n_v_heads, MAX_DIM),
        ];
        for (suffix, v, max) in dims {
            if v == 0 || v > max {
                return Err(ConfigError::Invalid(format!("{}: expected a value in 1..={max}, found {v}", m.key(suffix))));
            }
        }
        Ok(Config {
            arch: arch.to_string(),
            n_layer_all,
            n_layer,
            n_nextn,
            n_vocab,
            n_embd,
            context_length: m.usize("context_length")?,
            eps: m.f32("attention.layer_norm_rms_epsilon")?,
            n_head,
            n_head_kv,
            head_dim,
            n_rot,
            rope_sections,
            rope_base: m.opt_f32("rope.freq_base")?.unwrap_or(10000.0),
            rope_freq_scale,
            n_expert,
            n_expert_used,
            n_ff_exp,
            n_ff_shexp,
            n_ff,
            d_conv,
            d_state,
            n_k_heads,
            n_v_heads,
            head_v_dim,
            d_inner,
            recurrent,
        })
    }
}

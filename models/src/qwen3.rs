//! Qwen3 (`qwen3`, the dense models: Qwen3-0.6B … 32B): the dense decoder with NEOX
//! RoPE and per-head RMSNorm of Q and K before RoPE (`attn_q_norm`, `attn_k_norm`).

use crate::decoder::{Decoder, Flavor};
use crate::meta::ConfigError;
use pn_engine::Gguf;
use pn_ops::RopeMode;

pub const FLAVOR: Flavor = Flavor { arch: "qwen3", rope: RopeMode::Neox, qk_norm: true, qkv_bias: false, moe: false };

pub fn load(g: &Gguf) -> Result<Decoder, ConfigError> {
    Decoder::load(g, FLAVOR)
}

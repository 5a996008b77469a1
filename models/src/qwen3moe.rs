//! Qwen3-MoE (`qwen3moe`, e.g. Qwen3-30B-A3B): the decoder with NEOX RoPE, per-head
//! Q/K RMSNorm, and softmax-routed experts (top-k renormalized, no shared expert) as
//! every layer's FFN. The same ops and blocks as qwen35moe.

use crate::decoder::{Decoder, Flavor};
use crate::meta::ConfigError;
use pn_engine::Gguf;
use pn_ops::RopeMode;

pub const FLAVOR: Flavor = Flavor { arch: "qwen3moe", rope: RopeMode::Neox, qk_norm: true, qkv_bias: false, moe: true };

pub fn load(g: &Gguf) -> Result<Decoder, ConfigError> {
    Decoder::load(g, FLAVOR)
}

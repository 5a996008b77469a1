//! Qwen2 / Qwen2.5 (`qwen2`): the dense decoder with NEOX RoPE and biases on the Q, K
//! and V projections (`attn_{q,k,v}.bias`, added after each matmul by `blocks::linear`).

use crate::decoder::{Decoder, Flavor};
use crate::meta::ConfigError;
use pn_engine::Gguf;
use pn_ops::RopeMode;

pub const FLAVOR: Flavor = Flavor { arch: "qwen2", rope: RopeMode::Neox, qk_norm: false, qkv_bias: true, moe: false };

pub fn load(g: &Gguf) -> Result<Decoder, ConfigError> {
    Decoder::load(g, FLAVOR)
}

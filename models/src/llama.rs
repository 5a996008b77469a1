//! Llama (`llama`: Llama 2/3/3.1/3.2, Mistral-7B and other files converted as llama):
//! the dense decoder with adjacent-pair ("normal") RoPE. Llama 3.1/3.2 files carry the
//! llama3 rope scaling as per-pair frequency factors (`rope_freqs.weight`, n_rot/2 f32),
//! which the RoPE op divides θ by; linear scaling comes from `rope.scaling.factor`.

use crate::decoder::{Decoder, Flavor};
use crate::meta::{ConfigError, Meta};
use crate::weights::Weights;
use pn_engine::Gguf;
use pn_ops::RopeMode;

pub const FLAVOR: Flavor = Flavor { arch: "llama", rope: RopeMode::Normal, qk_norm: false, qkv_bias: false, moe: false };

pub fn load(g: &Gguf) -> Result<Decoder, ConfigError> {
    let m = Meta::new(g, FLAVOR.arch);
    if m.usize_or("expert_count", 0)? > 0 {
        return Err(ConfigError::Invalid(format!("{}: llama files with experts (Mixtral) are not supported", m.key("expert_count"))));
    }
    if m.opt_f32("attention.scale")?.is_some_and(|s| s != 0.0) {
        return Err(ConfigError::Invalid(format!("{}: a custom attention scale (granite) is not supported", m.key("attention.scale"))));
    }
    // the factors are read as f32 rows by every backend (the converter writes them F32)
    Weights::from_gguf(g).require_f32("rope_freqs.weight").map_err(|e| ConfigError::Invalid(e.to_string()))?;
    Decoder::load(g, FLAVOR)
}

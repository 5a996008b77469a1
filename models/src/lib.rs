//! pn-models: one file per architecture; [`load`] picks the builder from
//! `general.architecture`.
#![forbid(unsafe_code)]

pub mod blocks;
pub mod decoder;
pub mod llama;
pub mod meta;
pub mod qwen2;
pub mod qwen3;
pub mod qwen35moe;
pub mod qwen3moe;
pub mod weights;

pub use meta::ConfigError;

use pn_engine::{Gguf, Model};
use std::sync::Arc;

/// Architectures this build can run.
pub const SUPPORTED: &[&str] = &["qwen35moe", "qwen35", "qwen3moe", "qwen3", "qwen2", "llama"];

/// The model for a GGUF, chosen by `general.architecture`.
pub fn load(g: &Gguf) -> Result<Arc<dyn Model>, ConfigError> {
    let arch = meta::architecture(g)?;
    match arch {
        "qwen35moe" => Ok(Arc::new(qwen35moe::Qwen35::load(g, arch, qwen35moe::Ffn::Moe)?)),
        "qwen35" => Ok(Arc::new(qwen35moe::Qwen35::load(g, arch, qwen35moe::Ffn::Dense)?)),
        "qwen3moe" => Ok(Arc::new(qwen3moe::load(g)?)),
        "qwen3" => Ok(Arc::new(qwen3::load(g)?)),
        "qwen2" => Ok(Arc::new(qwen2::load(g)?)),
        "llama" => Ok(Arc::new(llama::load(g)?)),
        other => Err(ConfigError::UnknownArch { found: other.to_string(), supported: SUPPORTED.join(", ") }),
    }
}

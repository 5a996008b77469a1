//! pn-models: one file per architecture; [`load`] picks the builder from
//! `general.architecture`.

pub mod meta;
pub mod qwen35moe;
pub mod weights;

pub use meta::ConfigError;

use pn_engine::{Gguf, Model};
use std::sync::Arc;

/// Architectures this build can run.
pub const SUPPORTED: &[&str] = &["qwen35moe", "qwen35"];

/// The model for a GGUF, chosen by `general.architecture`.
pub fn load(g: &Gguf) -> Result<Arc<dyn Model>, ConfigError> {
    let arch = meta::architecture(g)?;
    match arch {
        "qwen35moe" => Ok(Arc::new(qwen35moe::Qwen35::load(g, arch, qwen35moe::Ffn::Moe)?)),
        "qwen35" => Ok(Arc::new(qwen35moe::Qwen35::load(g, arch, qwen35moe::Ffn::Dense)?)),
        other => Err(ConfigError::UnknownArch { found: other.to_string(), supported: SUPPORTED.join(", ") }),
    }
}

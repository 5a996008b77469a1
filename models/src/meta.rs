//! Typed access to GGUF metadata for config loaders, with errors that name the key, the
//! expected type and what was found.

use pn_engine::{Gguf, MetaValue};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("missing required metadata key {0}")]
    Missing(String),
    #[error("metadata key {key}: expected {expected}, found {found}")]
    Type { key: String, expected: String, found: String },
    #[error("{0}")]
    Invalid(String),
    #[error("unknown architecture {found:?}: supported architectures are {supported}")]
    UnknownArch { found: String, supported: String },
    #[error("tensor {name}: {msg}")]
    Tensor { name: String, msg: String },
}

fn describe(v: &MetaValue) -> String {
    match v {
        MetaValue::Array(a) => format!("array of {} values", a.len()),
        MetaValue::String(s) => format!("string {s:?}"),
        other => format!("{other:?}"),
    }
}

/// An integer of any GGUF integer type that fits in i64 (`MetaValue::as_i64`'s rule), or a
/// BOOL as 0/1 (per-layer flag arrays).
fn as_int(v: &MetaValue) -> Option<i64> {
    v.as_i64().or_else(|| v.as_bool().map(i64::from))
}

/// Metadata of one architecture: keys are looked up as `{arch}.{suffix}`.
pub struct Meta<'a> {
    pub g: &'a Gguf,
    pub arch: String,
}

impl<'a> Meta<'a> {
    pub fn new(g: &'a Gguf, arch: &str) -> Meta<'a> {
        Meta { g, arch: arch.to_string() }
    }
    pub fn key(&self, suffix: &str) -> String {
        format!("{}.{}", self.arch, suffix)
    }
    fn type_err(&self, key: &str, expected: &str, v: &MetaValue) -> ConfigError {
        ConfigError::Type { key: key.into(), expected: expected.into(), found: describe(v) }
    }

    /// A non-negative integer (any integer type), or — for per-layer keys stored as
    /// arrays — the array's value when all entries agree.
    pub fn opt_usize(&self, suffix: &str) -> Result<Option<usize>, ConfigError> {
        let key = self.key(suffix);
        let Some(v) = self.g.get(&key) else { return Ok(None) };
        let n = match v {
            MetaValue::Array(a) => {
                let vals: Vec<i64> = a.iter().map(as_int).collect::<Option<_>>().ok_or_else(|| self.type_err(&key, "an integer or integer array", v))?;
                let nonzero: Vec<i64> = vals.iter().copied().filter(|&x| x != 0).collect();
                match nonzero.first() {
                    None => 0,
                    Some(&f) if nonzero.iter().all(|&x| x == f) => f,
                    Some(_) => {
                        return Err(ConfigError::Invalid(format!(
                            "metadata key {key}: per-layer values that differ ({vals:?}) are not supported"
                        )))
                    }
                }
            }
            _ => as_int(v).ok_or_else(|| self.type_err(&key, "an unsigned integer", v))?,
        };
        usize::try_from(n).map(Some).map_err(|_| self.type_err(&key, "a non-negative integer", v))
    }
    pub fn usize(&self, suffix: &str) -> Result<usize, ConfigError> {
        self.opt_usize(suffix)?.ok_or_else(|| ConfigError::Missing(self.key(suffix)))
    }
    pub fn usize_or(&self, suffix: &str, default: usize) -> Result<usize, ConfigError> {
        Ok(self.opt_usize(suffix)?.unwrap_or(default))
    }
    pub fn opt_f32(&self, suffix: &str) -> Result<Option<f32>, ConfigError> {
        let key = self.key(suffix);
        match self.g.get(&key) {
            None => Ok(None),
            Some(MetaValue::F32(x)) => Ok(Some(*x)),
            Some(MetaValue::F64(x)) => Ok(Some(*x as f32)),
            Some(v) => Err(self.type_err(&key, "a float", v)),
        }
    }
    pub fn f32(&self, suffix: &str) -> Result<f32, ConfigError> {
        self.opt_f32(suffix)?.ok_or_else(|| ConfigError::Missing(self.key(suffix)))
    }
    pub fn opt_str(&self, suffix: &str) -> Result<Option<&'a str>, ConfigError> {
        let key = self.key(suffix);
        match self.g.get(&key) {
            None => Ok(None),
            Some(MetaValue::String(s)) => Ok(Some(s.as_str())),
            Some(v) => Err(self.type_err(&key, "a string", v)),
        }
    }
    /// An integer (or bool) array.
    pub fn opt_int_array(&self, suffix: &str) -> Result<Option<Vec<i64>>, ConfigError> {
        let key = self.key(suffix);
        match self.g.get(&key) {
            None => Ok(None),
            Some(v @ MetaValue::Array(a)) => {
                a.iter().map(as_int).collect::<Option<Vec<_>>>().map(Some).ok_or_else(|| self.type_err(&key, "an integer array", v))
            }
            Some(v) => Err(self.type_err(&key, "an array", v)),
        }
    }
}

/// `general.architecture`.
pub fn architecture(g: &Gguf) -> Result<&str, ConfigError> {
    match g.get("general.architecture") {
        Some(MetaValue::String(s)) => Ok(s),
        Some(v) => Err(ConfigError::Type { key: "general.architecture".into(), expected: "a string".into(), found: describe(v) }),
        None => Err(ConfigError::Missing("general.architecture".into())),
    }
}

//! Opening a model: a GGUF path or the built-in default model, then the runner.

use anyhow::{bail, Context, Result};
use pn_cpu::CpuBackend;
use pn_engine::tokenizer::Tokenizer;
use pn_engine::{Gguf, Runner};
use std::path::Path;
use std::sync::Arc;

/// The built-in default model (a small qwen35moe trained on Python code, q4_k_m, with
/// an MTP block the main forward skips); see models/default/README.md.
static DEFAULT_MODEL: &[u8] = include_bytes!("../../models/default/pn-default-code-q4_k_m.gguf");
pub const DEFAULT_MODEL_NAME: &str = "pn-default-code-q4_k_m (built in)";

/// Flags shared by every command that runs a model.
#[derive(clap::Args, Clone, Debug)]
pub struct ModelOpts {
    /// GGUF model (default: the built-in model)
    #[arg(long)]
    pub model: Option<std::path::PathBuf>,
    /// Threads (0 = all cores)
    #[arg(long, short = 't', default_value_t = 0)]
    pub threads: usize,
    /// Tokens per forward pass (longer inputs run in several passes)
    #[arg(long, default_value_t = 512)]
    pub ubatch: usize,
}

pub struct Loaded {
    pub name: String,
    pub is_default: bool,
    pub gguf: Arc<Gguf>,
    pub runner: Runner,
}

pub fn open_gguf(model: Option<&Path>) -> Result<(String, bool, Arc<Gguf>)> {
    match model {
        None => {
            let g = Gguf::from_static(DEFAULT_MODEL).context("the built-in default model")?;
            Ok((DEFAULT_MODEL_NAME.to_string(), true, Arc::new(g)))
        }
        Some(p) => {
            if p.is_dir() {
                bail!("{}: expected a GGUF file, found a directory", p.display());
            }
            let g = Gguf::open(p).with_context(|| format!("cannot load model {}", p.display()))?;
            Ok((p.display().to_string(), false, Arc::new(g)))
        }
    }
}

pub fn load(o: &ModelOpts) -> Result<Loaded> {
    let (threads, ubatch) = (o.threads, o.ubatch);
    let (name, is_default, gguf) = open_gguf(o.model.as_deref())?;
    let m = pn_models::load(&gguf).with_context(|| format!("cannot load model {name}"))?;
    let backend = Arc::new(CpuBackend::new(threads));
    let mut runner = Runner::new(m, gguf.clone(), backend).with_context(|| format!("cannot load model {name}"))?;
    if ubatch == 0 {
        bail!("--ubatch: expected a value ≥ 1, found 0");
    }
    runner.ubatch = ubatch;
    Ok(Loaded { name, is_default, gguf, runner })
}

pub fn tokenizer(l: &Loaded) -> Result<Tokenizer> {
    Tokenizer::from_gguf(&l.gguf).with_context(|| format!("cannot build the tokenizer of {}", l.name))
}

/// Parse `--tokens 1,2,3`.
pub fn parse_tokens(s: &str) -> Result<Vec<u32>> {
    let ids: Result<Vec<u32>> = s
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| t.parse::<u32>().map_err(|_| anyhow::anyhow!("--tokens: expected comma-separated non-negative token ids, found {t:?}")))
        .collect();
    let ids = ids?;
    if ids.is_empty() {
        bail!("--tokens: expected at least one token id, found none");
    }
    Ok(ids)
}

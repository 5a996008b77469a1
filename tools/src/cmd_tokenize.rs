//! `pn tokenize`: token ids for text, as the oracle's `llama_oracle.py tokenize` JSON.

use crate::load;
use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::PathBuf;

#[derive(Args)]
pub struct TokenizeArgs {
    /// GGUF model (default: the built-in model)
    #[arg(long)]
    model: Option<PathBuf>,
    /// Text to tokenize
    #[arg(long, conflicts_with = "text_file")]
    text: Option<String>,
    /// File with one case per non-empty line
    #[arg(long)]
    text_file: Option<PathBuf>,
    /// Write {"cases":[{"text","ids"}]} here instead of printing ids
    #[arg(long)]
    out: Option<PathBuf>,
}

pub fn run(a: TokenizeArgs) -> Result<()> {
    let (name, _, g) = load::open_gguf(a.model.as_deref(), pn_engine::LoadMode::Mmap)?;
    let tok = pn_engine::tokenizer::Tokenizer::from_gguf(&g).with_context(|| format!("cannot build the tokenizer of {name}"))?;
    let texts: Vec<String> = match (&a.text, &a.text_file) {
        (Some(t), _) => vec![t.clone()],
        (None, Some(f)) => {
            let s = std::fs::read_to_string(f).with_context(|| format!("cannot read {}", f.display()))?;
            s.lines().filter(|l| !l.is_empty()).map(str::to_string).collect()
        }
        (None, None) => bail!("expected --text or --text-file"),
    };
    let cases: Vec<serde_json::Value> = texts
        .iter()
        .map(|t| serde_json::json!({"text": t, "ids": tok.encode(t, true)}))
        .collect();
    match &a.out {
        Some(p) => {
            let json = serde_json::json!({"model": name, "cases": cases});
            std::fs::write(p, serde_json::to_string(&json)? + "\n").with_context(|| format!("cannot write {}", p.display()))?;
        }
        None => {
            for c in &cases {
                println!("{}", c["ids"]);
            }
        }
    }
    Ok(())
}

//! `pn tokenize`: token ids for text, as the oracle's `llama_oracle.py tokenize` JSON.

use crate::{load, output};
use anyhow::{bail, Context, Result};
use clap::Args;
use pn_engine::tokenizer::Tokenizer;
use std::path::PathBuf;

#[derive(Args)]
pub struct TokenizeArgs {
    /// GGUF model (default: the built-in model)
    #[arg(long, short = 'm')]
    model: Option<PathBuf>,
    /// Text to tokenize
    #[arg(long, conflicts_with = "text_file", allow_hyphen_values = true)]
    text: Option<String>,
    /// File with one case per non-empty line (`-` = stdin)
    #[arg(long, short = 'f')]
    text_file: Option<PathBuf>,
    /// Write {"cases":[{"text","ids"}]} here instead of printing ids (`-` = stdout)
    #[arg(long)]
    out: Option<PathBuf>,
    /// Also show each token's text (printed: one `id  "piece"` line per token; JSON: a
    /// "pieces" array per case)
    #[arg(long)]
    pieces: bool,
}

/// A token's text as llama.cpp's `token_to_piece(special = true)` renders it.
fn piece(tok: &Tokenizer, id: u32) -> String {
    String::from_utf8_lossy(tok.token_piece(id, true)).into_owned()
}

pub fn run(a: TokenizeArgs) -> Result<()> {
    if a.text.is_none() && a.text_file.is_none() {
        bail!("expected --text or --text-file");
    }
    let out = a.out.as_deref().map(|p| output::OutFile::create(p, "--out")).transpose()?;
    let texts: Vec<String> = match (&a.text, &a.text_file) {
        (Some(t), _) => vec![t.clone()],
        (None, Some(f)) => output::read_text(f, "--text-file")?.lines().filter(|l| !l.is_empty()).map(str::to_string).collect(),
        (None, None) => unreachable!("checked above"),
    };
    let (name, _, g) = load::open_gguf(a.model.as_deref(), pn_engine::LoadMode::Mmap)?;
    let tok = Tokenizer::from_gguf(&g).with_context(|| format!("cannot build the tokenizer of {name}"))?;
    let cases: Vec<serde_json::Value> = texts
        .iter()
        .map(|t| {
            let ids = tok.encode(t, true);
            let mut c = serde_json::json!({"text": t, "ids": ids});
            if a.pieces {
                c["pieces"] = ids.iter().map(|&i| piece(&tok, i)).collect();
            }
            c
        })
        .collect();
    match out {
        Some(f) => {
            let json = serde_json::json!({"model": name, "cases": cases});
            f.commit((serde_json::to_string(&json)? + "\n").as_bytes())
        }
        None => {
            let mut s = String::new();
            for c in &cases {
                s.push_str(&format!("{}\n", c["ids"]));
                if a.pieces {
                    for (id, p) in c["ids"].as_array().into_iter().flatten().zip(c["pieces"].as_array().into_iter().flatten()) {
                        s.push_str(&format!("{:>8}  {p}\n", id.as_u64().unwrap_or(0)));
                    }
                }
            }
            output::print(&mut std::io::stdout().lock(), &s)
        }
    }
}

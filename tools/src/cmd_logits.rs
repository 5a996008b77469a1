//! `pn logits`: every position's logits as the oracle's JSON.

use crate::load;
use anyhow::{bail, Context, Result};
use clap::Args;
use pn_engine::sampler::argmax;
use std::io::Write;
use std::path::PathBuf;

#[derive(Args)]
pub struct LogitsArgs {
    #[command(flatten)]
    opts: load::ModelOpts,
    #[command(flatten)]
    dump: crate::tensor_opts::DumpOpts,
    /// Comma-separated token ids
    #[arg(long, conflicts_with = "prompt", allow_hyphen_values = true)]
    tokens: Option<String>,
    /// Text to tokenize (special tokens parsed, BOS added if the model asks for it)
    #[arg(long)]
    prompt: Option<String>,
    /// Output JSON file
    #[arg(long)]
    out: PathBuf,
    /// Only the last position's logits
    #[arg(long)]
    last: bool,
}

/// The oracle's logits JSON (`llama_oracle.py logits`), plus model / KV / ubatch fields.
#[derive(serde::Serialize)]
struct LogitsFile<'a> {
    model: &'a str,
    tokens: &'a [u32],
    kv_type: String,
    ubatch: usize,
    logits: Vec<&'a [f32]>,
    argmax: Vec<usize>,
}

pub fn run(a: LogitsArgs) -> Result<()> {
    let l = load::load(&a.opts)?;
    let tokens = match (&a.tokens, &a.prompt) {
        (Some(t), _) => load::parse_tokens(t)?,
        (None, Some(p)) => {
            let tok = load::tokenizer(&l)?;
            let mut ids = Vec::new();
            if tok.add_bos() {
                ids.extend(tok.bos());
            }
            ids.extend(tok.encode(p, true));
            if ids.is_empty() {
                bail!("--prompt: the text tokenized to no tokens");
            }
            ids
        }
        (None, None) => bail!("expected --tokens or --prompt"),
    };
    // f32 KV unless asked otherwise: the oracle's default (llama_oracle.py --kv-type f32)
    let state_cfg = load::state_config(&a.opts, Some(tokens.len().max(16)), Some(pn_ops::KvType::F32))?;
    let mut st = load::alloc_state(&l, &state_cfg)?;
    let mut rec = a.dump.recorder()?;
    let logits = match rec.as_mut() {
        Some(r) => l.runner.forward_observed(&mut st, &tokens, !a.last, Some(&mut |n, t| r.record(n, t)))?,
        None => l.runner.forward(&mut st, &tokens, !a.last)?,
    };
    a.dump.finish(rec)?;
    let rows: Vec<&[f32]> = (0..logits.rows()).map(|i| logits.row(i)).collect();
    // a typed record: f32 logits are written in their shortest f32 form (not widened to f64)
    let json = LogitsFile {
        model: &l.name,
        tokens: &tokens,
        kv_type: state_cfg.kv.to_string(),
        ubatch: a.opts.ubatch,
        argmax: rows.iter().map(|r| argmax(r)).collect(),
        logits: rows,
    };
    let mut f = std::fs::File::create(&a.out).with_context(|| format!("cannot create {}", a.out.display()))?;
    serde_json::to_writer(&mut f, &json)?;
    f.write_all(b"\n")?;
    eprintln!("wrote {} × {} logits to {}", json.logits.len(), logits.n_vocab, a.out.display());
    // written as null in the JSON, but a failure: the caller expected numbers
    load::finite(&logits.data).with_context(|| format!("{} (written as null)", a.out.display()))?;
    Ok(())
}

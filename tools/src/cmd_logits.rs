//! `pn logits`: every position's logits as the oracle's JSON.

use crate::{load, output};
use anyhow::{bail, Context, Result};
use clap::Args;
use pn_engine::sampler::argmax;
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
    /// Output JSON file (`-` = stdout)
    #[arg(long)]
    out: PathBuf,
    /// Context size (default: the number of tokens; $PN_MAX_SEQ)
    #[arg(long, short = 'c', visible_alias = "ctx-size")]
    max_seq: Option<usize>,
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
    let given = match (&a.tokens, &a.prompt) {
        (Some(t), _) => Some(load::parse_tokens(t)?),
        (None, Some(p)) if p.is_empty() => bail!("--prompt: expected text, found an empty string"),
        (None, Some(_)) => None,
        (None, None) => bail!("expected --tokens or --prompt"),
    };
    // f32 KV unless asked otherwise: the oracle's default (llama_oracle.py --kv-type f32);
    // checked here (the size again below, once the prompt's length is known)
    let max_seq = |n: usize| a.max_seq.or_else(|| ["PN_MAX_SEQ", "QWEN35_MAX_SEQ"].iter().all(|k| std::env::var_os(k).is_none()).then_some(n.max(16)));
    load::state_config(&a.opts, max_seq(16), Some(pn_ops::KvType::F32))?;
    let mut rec = a.dump.recorder()?;
    let out = output::OutFile::create(&a.out, "--out")?;
    let l = load::load(&a.opts)?;
    let tokens = match (given, &a.prompt) {
        (Some(t), _) => t,
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
        (None, None) => unreachable!("checked above"),
    };
    let state_cfg = load::state_config(&a.opts, max_seq(tokens.len()), Some(pn_ops::KvType::F32))?;
    let mut st = load::first_state(&l, &state_cfg)?;
    let logits = crate::generate::prefill(&l.runner, &mut st, &tokens, !a.last, rec.as_mut())?;
    a.dump.finish(rec)?;
    let rows: Vec<&[f32]> = (0..logits.rows()).map(|i| logits.row(i)).collect();
    // a typed record: f32 logits are written in their shortest f32 form (not widened to f64)
    let json = LogitsFile {
        model: &l.name,
        tokens: &tokens,
        kv_type: state_cfg.kv.to_string(),
        ubatch: l.runner.ubatch,
        argmax: rows.iter().map(|r| argmax(r)).collect(),
        logits: rows,
    };
    let mut bytes = serde_json::to_vec(&json)?;
    bytes.push(b'\n');
    let shown = if out.is_stdout() { "stdout".to_string() } else { out.path().display().to_string() };
    out.commit(&bytes)?;
    eprintln!("wrote {} × {} logits to {shown}", json.logits.len(), logits.n_vocab);
    // written as null in the JSON, but a failure: the caller expected numbers
    load::finite(&logits.data).with_context(|| format!("{shown} (written as null)"))?;
    Ok(())
}

//! `pn diff`: run the model and compare every named tensor with a reference dump
//! (`reference.py --dump` or `llama_dump.py`), naming the first that diverges.

use crate::load;
use anyhow::{bail, Result};
use clap::Args;
use pn_engine::tensor_dump::{diff_against, first_divergence, TensorRecorder};
use std::path::PathBuf;

#[derive(Args)]
pub struct DiffArgs {
    #[command(flatten)]
    opts: load::ModelOpts,
    /// Comma-separated token ids (the same the reference dump was made with)
    #[arg(long)]
    tokens: String,
    /// Directory of NAME.npy reference tensors
    #[arg(long)]
    against: PathBuf,
    /// Relative L2 error above which a tensor counts as diverged
    #[arg(long, default_value_t = 1e-2)]
    tol: f64,
}

pub fn run(a: DiffArgs) -> Result<()> {
    if !a.against.is_dir() {
        bail!("--against: expected a directory of .npy files, found {}", a.against.display());
    }
    if a.tol.is_nan() || a.tol < 0.0 {
        bail!("--tol: expected a value ≥ 0, found {}", a.tol);
    }
    let tokens = load::parse_tokens(&a.tokens)?;
    let l = load::load(&a.opts)?;
    let mut rec = TensorRecorder::new(".*").expect("valid regex");
    let mut st = l.runner.new_state(tokens.len().max(16));
    l.runner.forward_observed(&mut st, &tokens, true, Some(&mut |n, t| rec.record(n, t)))?;
    let rows = diff_against(&rec, &a.against);
    if rows.is_empty() {
        bail!("no tensor of {} has a reference in {} (expected files like attn_norm-0.npy)", l.name, a.against.display());
    }
    let mut o = format!("{:<36} {:>12} {:>12}  note\n", "tensor", "rel err", "max |Δ|");
    for r in &rows {
        let rel = r.rel_err.map_or("-".into(), |e| format!("{e:.3e}"));
        let max = r.max_abs.map_or("-".into(), |e| format!("{e:.3e}"));
        let flag = if r.rel_err.is_none_or(|e| e.is_nan() || e > a.tol) { " !" } else { "" };
        o.push_str(&format!("{:<36} {rel:>12} {max:>12}{flag} {}\n", r.name, r.note));
    }
    o.push_str(&format!("compared {} tensors (tolerance {:e})\n", rows.len(), a.tol));
    let first = first_divergence(&rows, a.tol);
    o.push_str(&first.map_or("no divergence\n".to_string(), |r| format!("first divergence: {}\n", r.name)));
    crate::output::print(&mut std::io::stdout().lock(), &o)?;
    if first.is_some() {
        std::process::exit(2);
    }
    Ok(())
}

//! Recording named intermediate tensors (`--dump-tensors`) and comparing them with a
//! reference dump (`pn diff`), to find the first op where two implementations diverge.
//!
//! Tensors are stored token-major, like `reference.py --dump` and `llama_dump.py`: a
//! ggml-order `[n_embd, T]` activation is NumPy `(T, n_embd)`, `[D, H, T]` is `(T, H, D)`;
//! successive micro-batches and decode steps are appended along the token axis.

use crate::dump::summary;
use crate::graph::Node;
use crate::npy;
use pn_ops::{Tensor, TensorData};
use regex::Regex;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// One recorded tensor: NumPy inner shape (without the token axis) and token-major rows.
#[derive(Clone, Debug, Default)]
pub struct Recorded {
    pub inner: Vec<usize>,
    pub rows: usize,
    pub data: Vec<f32>,
}

/// Collects the values of every node whose name matches a regex, in first-seen order.
pub struct TensorRecorder {
    re: Regex,
    pub order: Vec<String>,
    pub tensors: HashMap<String, Recorded>,
    /// One summary line per recorded node and step.
    pub summaries: Vec<String>,
    /// Nodes whose shape changed between steps (not appendable); their later steps are skipped.
    pub skipped: Vec<String>,
    /// Tokens of the pass being observed (taken from its `Tokens` input node).
    n_tokens: usize,
}

impl TensorRecorder {
    pub fn new(pattern: &str) -> Result<TensorRecorder, regex::Error> {
        // anchored: `blk\.3\..*`-style patterns match whole names
        let re = Regex::new(&format!("^(?:{pattern})$"))?;
        Ok(TensorRecorder { re, order: Vec::new(), tensors: HashMap::new(), summaries: Vec::new(), skipped: Vec::new(), n_tokens: 1 })
    }

    /// Record a node's output (use as the runner's observer).
    pub fn record(&mut self, node: &Node, t: &Tensor) {
        if matches!(node.op, pn_ops::Op::Tokens) {
            self.n_tokens = t.shape.numel().max(1);
        }
        let n_tokens = self.n_tokens;
        if node.op.is_leaf() || !self.re.is_match(&node.name) {
            return;
        }
        self.summaries.push(summary(&node.name, t));
        let dims = t.shape.0;
        let rank = t.shape.rank();
        let axis = if n_tokens > 1 && dims[rank - 1] == n_tokens { rank - 1 } else { rank };
        let inner: Vec<usize> = dims[..axis].iter().rev().copied().collect();
        let rows: usize = dims[axis.min(4)..].iter().product();
        let vals: Vec<f32> = match &t.data {
            TensorData::F32(v) => v.clone(),
            TensorData::I32(v) => v.iter().map(|&x| x as f32).collect(),
        };
        let entry = self.tensors.entry(node.name.clone()).or_insert_with(|| {
            self.order.push(node.name.clone());
            Recorded { inner: inner.clone(), rows: 0, data: Vec::new() }
        });
        if entry.inner != inner {
            if !self.skipped.contains(&node.name) {
                self.skipped.push(node.name.clone());
            }
            return;
        }
        entry.rows += rows;
        entry.data.extend_from_slice(&vals);
    }

    /// Write every recorded tensor as `DIR/NAME.npy`.
    pub fn write(&self, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
        std::fs::create_dir_all(dir)?;
        let mut out = Vec::new();
        for name in &self.order {
            let r = &self.tensors[name];
            let mut shape = vec![r.rows];
            shape.extend_from_slice(&r.inner);
            let p = dir.join(format!("{}.npy", name.replace('/', "_")));
            npy::write_f32(&p, &shape, &r.data)?;
            out.push(p);
        }
        Ok(out)
    }
}

/// One row of a `pn diff` table.
#[derive(Clone, Debug)]
pub struct DiffRow {
    pub name: String,
    /// File compared against (None: no reference tensor of that name).
    pub reference: Option<PathBuf>,
    /// ‖ours − ref‖₂ / ‖ref‖₂, or None on a shape mismatch / missing file.
    pub rel_err: Option<f64>,
    pub max_abs: Option<f32>,
    pub note: String,
}

/// Reference names to try for one of our node names (reference.py calls the attention
/// block output `attn_out-N` where llama.cpp says `attn_output-N`).
fn candidates(name: &str) -> Vec<String> {
    let mut c = vec![name.to_string()];
    if let Some(l) = name.strip_prefix("attn_output-") {
        c.push(format!("attn_out-{l}"));
    }
    c
}

/// Compare recorded tensors with `.npy` files in `dir`, in recording (graph) order.
pub fn diff_against(rec: &TensorRecorder, dir: &Path) -> Vec<DiffRow> {
    let mut rows = Vec::new();
    for name in &rec.order {
        let r = &rec.tensors[name];
        let file = candidates(name).into_iter().map(|c| dir.join(format!("{c}.npy"))).find(|p| p.exists());
        let Some(file) = file else { continue };
        let row = match npy::read_f32(&file) {
            Err(e) => DiffRow { name: name.clone(), reference: Some(file), rel_err: None, max_abs: None, note: e },
            Ok((_, refd)) if refd.len() != r.data.len() => DiffRow {
                name: name.clone(),
                reference: Some(file),
                rel_err: None,
                max_abs: None,
                note: format!("size mismatch: ours {} values, reference {}", r.data.len(), refd.len()),
            },
            Ok((_, refd)) => {
                let (mut num, mut den, mut max_abs) = (0f64, 0f64, 0f32);
                for (&a, &b) in r.data.iter().zip(&refd) {
                    let d = a as f64 - b as f64;
                    num += d * d;
                    den += b as f64 * b as f64;
                    max_abs = max_abs.max((a - b).abs());
                }
                let rel = if den > 0.0 { (num / den).sqrt() } else { num.sqrt() };
                DiffRow { name: name.clone(), reference: Some(file), rel_err: Some(rel), max_abs: Some(max_abs), note: String::new() }
            }
        };
        rows.push(row);
    }
    rows
}

/// The first row whose relative error exceeds `tol` (or that could not be compared).
pub fn first_divergence(rows: &[DiffRow], tol: f64) -> Option<&DiffRow> {
    rows.iter().find(|r| r.rel_err.is_none_or(|e| e.is_nan() || e > tol))
}

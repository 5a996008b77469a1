//! `pn info`: metadata, layer map, tensor table, parameter count.

use crate::load;
use anyhow::Result;
use clap::Args;
use pn_engine::MetaValue;
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Args)]
pub struct InfoArgs {
    /// GGUF model (default: the built-in model)
    model: Option<PathBuf>,
    /// Also with --model
    #[arg(long = "model", conflicts_with = "model")]
    model_flag: Option<PathBuf>,
    /// List every tensor (default: a summary by type plus the first 24)
    #[arg(long)]
    tensors: bool,
    /// Sequence-state size for this many positions (default: $PN_MAX_SEQ, else 4096)
    #[arg(long)]
    max_seq: Option<usize>,
    /// Sequence-state size for this KV format (default: all formats)
    #[arg(long)]
    kv_type: Option<String>,
}

fn show(v: &MetaValue) -> String {
    match v {
        MetaValue::String(s) if s.chars().count() > 80 => format!("{:?}… ({} chars)", s.chars().take(60).collect::<String>(), s.chars().count()),
        MetaValue::String(s) => format!("{s:?}"),
        MetaValue::Array(a) if a.len() > 8 => {
            let head: Vec<String> = a.iter().take(4).map(show).collect();
            format!("[{}, …] ({} values)", head.join(", "), a.len())
        }
        MetaValue::Array(a) => format!("[{}]", a.iter().map(show).collect::<Vec<_>>().join(", ")),
        MetaValue::U8(x) => x.to_string(),
        MetaValue::I8(x) => x.to_string(),
        MetaValue::U16(x) => x.to_string(),
        MetaValue::I16(x) => x.to_string(),
        MetaValue::U32(x) => x.to_string(),
        MetaValue::I32(x) => x.to_string(),
        MetaValue::U64(x) => x.to_string(),
        MetaValue::I64(x) => x.to_string(),
        MetaValue::F32(x) => x.to_string(),
        MetaValue::F64(x) => x.to_string(),
        MetaValue::Bool(x) => x.to_string(),
    }
}

fn human(bytes: u64) -> String {
    let b = bytes as f64;
    if b >= 1e9 {
        format!("{:.2} GB", b / 1e9)
    } else if b >= 1e6 {
        format!("{:.2} MB", b / 1e6)
    } else if b >= 1e3 {
        format!("{:.1} kB", b / 1e3)
    } else {
        format!("{bytes} B")
    }
}

/// KV + recurrent state bytes for one sequence (docs/kv-cache.md): linear in max_seq.
fn state_section(m: &dyn pn_engine::Model, max_seq: Option<usize>, kv_type: Option<&str>) -> Result<()> {
    use pn_engine::state::kv;
    let (max_seq, clamped) = kv::resolve_max_seq(max_seq)?;
    if let Some(w) = clamped {
        eprintln!("{w}");
    }
    let types = match kv_type {
        Some(t) => vec![kv::resolve_kv_type(Some(t))?],
        None => pn_ops::KvType::ALL.to_vec(),
    };
    println!("\n== sequence state for max_seq {max_seq} (per sequence)");
    for ty in types {
        let b = kv::state_bytes(m, max_seq, ty);
        println!("  KV {:<5} {:>10} KV ({} attention layers) + {} recurrent = {}", ty.name(), human(b.kv), b.kv_layers, human(b.recurrent), human(b.total()));
    }
    if let Some(avail) = kv::mem_available() {
        println!("  memory available: {}", human(avail));
    }
    Ok(())
}

pub fn run(a: InfoArgs) -> Result<()> {
    let path = a.model.or(a.model_flag);
    let (name, _, g) = load::open_gguf(path.as_deref(), pn_engine::LoadMode::Mmap)?;
    println!("model: {name}");
    println!("GGUF v{}, {} metadata keys, {} tensors, alignment {}, data at byte {}", g.version, g.metadata.len(), g.tensors.len(), g.alignment, g.data_start);
    println!("\n== metadata");
    for (k, v) in &g.metadata {
        println!("  {k} = {}", show(v));
    }
    println!("\n== model (supported architectures: {})", pn_models::SUPPORTED.join(", "));
    match pn_models::load(&g) {
        Ok(m) => {
            for (k, v) in m.describe() {
                println!("  {k}: {v}");
            }
            println!("\n== layers");
            for l in m.layers() {
                println!("  {:>3}  {}", l.index, l.kind);
            }
            state_section(&*m, a.max_seq, a.kv_type.as_deref())?;
        }
        Err(e) => println!("  cannot run this model: {e}"),
    }
    let params: u64 = g.tensors.iter().map(|t| t.ne.iter().product::<u64>()).sum();
    let bytes: u64 = g.tensors.iter().map(|t| t.n_bytes).sum();
    let mut by_type: BTreeMap<String, (usize, u64)> = BTreeMap::new();
    for t in &g.tensors {
        let e = by_type.entry(t.ty.name().to_string()).or_default();
        e.0 += 1;
        e.1 += t.n_bytes;
    }
    println!("\n== tensors: {} parameters ({:.2} M), {}", params, params as f64 / 1e6, human(bytes));
    for (ty, (n, b)) in &by_type {
        println!("  {ty:<8} {n:>5} tensors  {}", human(*b));
    }
    let shown = if a.tensors { g.tensors.len() } else { g.tensors.len().min(24) };
    println!();
    for t in &g.tensors[..shown] {
        let dims: Vec<String> = t.ne[..t.n_dims.max(1) as usize].iter().map(|d| d.to_string()).collect();
        println!("  {:<40} {:<8} [{}]  {}", t.name, t.ty.name(), dims.join(", "), human(t.n_bytes));
    }
    if shown < g.tensors.len() {
        println!("  … {} more (--tensors lists all)", g.tensors.len() - shown);
    }
    Ok(())
}

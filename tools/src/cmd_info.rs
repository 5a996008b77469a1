//! `pn info`: metadata, layer map, tensor table, parameter count.

use crate::load::{self, human_bytes as human};
use anyhow::Result;
use clap::Args;
use pn_engine::state::kv;
use pn_engine::{Gguf, MetaValue, Model};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Args)]
pub struct InfoArgs {
    /// GGUF model (default: the built-in model)
    model: Option<PathBuf>,
    /// Also with --model / -m
    #[arg(long = "model", short = 'm', conflicts_with = "model")]
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

/// llama.cpp's `general.file_type` (`enum llama_ftype` in llama.h) names.
fn file_type_name(id: u64) -> Option<&'static str> {
    const NAMES: [(u64, &str); 36] = [
        (0, "all F32"), (1, "mostly F16"), (2, "mostly Q4_0"), (3, "mostly Q4_1"), (7, "mostly Q8_0"),
        (8, "mostly Q5_0"), (9, "mostly Q5_1"), (10, "mostly Q2_K"), (11, "mostly Q3_K_S"), (12, "mostly Q3_K_M"),
        (13, "mostly Q3_K_L"), (14, "mostly Q4_K_S"), (15, "mostly Q4_K_M"), (16, "mostly Q5_K_S"), (17, "mostly Q5_K_M"),
        (18, "mostly Q6_K"), (19, "mostly IQ2_XXS"), (20, "mostly IQ2_XS"), (21, "mostly Q2_K_S"), (22, "mostly IQ3_XS"),
        (23, "mostly IQ3_XXS"), (24, "mostly IQ1_S"), (25, "mostly IQ4_NL"), (26, "mostly IQ3_S"), (27, "mostly IQ3_M"),
        (28, "mostly IQ2_S"), (29, "mostly IQ2_M"), (30, "mostly IQ4_XS"), (31, "mostly IQ1_M"), (32, "mostly BF16"),
        (36, "mostly TQ1_0"), (37, "mostly TQ2_0"), (38, "mostly MXFP4 (MoE)"), (39, "mostly NVFP4"), (40, "mostly Q1_0"), (41, "mostly Q2_0"),
    ];
    NAMES.iter().find(|(i, _)| *i == id).map(|(_, n)| *n)
}

/// A count as people read it: 1.91 B, 36.20 M, 12.3 k.
pub fn human_count(n: u64) -> String {
    let x = n as f64;
    match n {
        1_000_000_000.. => format!("{:.2} B", x / 1e9),
        1_000_000.. => format!("{:.2} M", x / 1e6),
        1_000.. => format!("{:.1} k", x / 1e3),
        _ => n.to_string(),
    }
}

/// The state flags, checked before anything is printed.
fn state_flags(max_seq: Option<usize>, kv_type: Option<&str>) -> Result<(usize, Vec<pn_ops::KvType>)> {
    let (max_seq, clamped) = kv::resolve_max_seq(max_seq)?;
    if let Some(w) = clamped {
        eprintln!("{w}");
    }
    let types = match kv_type {
        Some(t) => vec![kv::resolve_kv_type(Some(t))?],
        None => pn_ops::KvType::ALL.to_vec(),
    };
    Ok((max_seq, types))
}

/// KV + recurrent state bytes for one sequence (docs/kv-cache.md): linear in max_seq.
fn state_section(o: &mut String, m: &dyn Model, max_seq: usize, types: &[pn_ops::KvType]) -> std::fmt::Result {
    writeln!(o, "\n== sequence state for max_seq {max_seq} (per sequence)")?;
    for &ty in types {
        let b = kv::state_bytes(m, max_seq, ty);
        writeln!(o, "  KV {:<5} {:>10} KV ({} attention layers) + {} recurrent = {}", ty.name(), human(b.kv), b.kv_layers, human(b.recurrent), human(b.total()))?;
    }
    if let Some(avail) = kv::mem_available() {
        writeln!(o, "  memory available: {}", human(avail))?;
    }
    Ok(())
}

/// The load-time validation `pn run` does: the model's configuration, then its decode
/// graph planned on one CPU die, which checks every tensor's presence, shape and type.
fn validate(g: &Arc<Gguf>) -> Result<Arc<dyn Model>> {
    let m = pn_models::load(g)?;
    let cpu = pn_cpu::CpuBackend::try_new(1).map_err(anyhow::Error::msg)?;
    pn_engine::Runner::new(m.clone(), g.clone(), Arc::new(cpu))?;
    Ok(m)
}

pub fn run(a: InfoArgs) -> Result<()> {
    let (max_seq, types) = state_flags(a.max_seq, a.kv_type.as_deref())?;
    let path = a.model.or(a.model_flag);
    let (name, _, g) = load::open_gguf(path.as_deref(), pn_engine::LoadMode::Mmap)?;
    let mut o = String::new();
    let verdict = report(&mut o, &name, &g, max_seq, &types, a.tensors)?;
    crate::output::print(&mut std::io::stdout().lock(), &o)?;
    verdict.map_err(|e| anyhow::anyhow!("cannot run this model: {}", crate::output::error_line(&e)))
}

/// Everything `pn info` prints, ending with `loads: yes`; the inner error says why the
/// model cannot run.
fn report(o: &mut String, name: &str, g: &Arc<Gguf>, max_seq: usize, types: &[pn_ops::KvType], all_tensors: bool) -> Result<Result<()>> {
    writeln!(o, "model: {name}")?;
    writeln!(o, "GGUF v{}, {} metadata keys, {} tensors, alignment {}, data at byte {}", g.version, g.metadata.len(), g.tensors.len(), g.alignment, g.data_start)?;
    writeln!(o, "\n== metadata")?;
    for (k, v) in &g.metadata {
        let decoded = match (k.as_str(), v.as_u64().and_then(file_type_name)) {
            ("general.file_type", Some(n)) => format!(" ({n})"),
            _ => String::new(),
        };
        writeln!(o, "  {k} = {}{decoded}", show(v))?;
    }
    let params: u64 = g.tensors.iter().map(|t| t.ne.iter().product::<u64>()).sum();
    let bytes: u64 = g.tensors.iter().map(|t| t.n_bytes).sum();
    let mut by_type: BTreeMap<String, (usize, u64)> = BTreeMap::new();
    for t in &g.tensors {
        let e = by_type.entry(t.ty.name().to_string()).or_default();
        e.0 += 1;
        e.1 += t.n_bytes;
    }
    let bits = if params > 0 { bytes as f64 * 8.0 / params as f64 } else { 0.0 };
    writeln!(o, "\n== tensors: {} parameters ({params}), {} ({bits:.2} bits per weight)", human_count(params), human(bytes))?;
    for (ty, (n, b)) in &by_type {
        writeln!(o, "  {ty:<8} {n:>5} tensors  {}", human(*b))?;
    }
    let shown = if all_tensors { g.tensors.len() } else { g.tensors.len().min(24) };
    writeln!(o)?;
    for t in &g.tensors[..shown] {
        let dims: Vec<String> = t.ne[..t.n_dims.max(1) as usize].iter().map(|d| d.to_string()).collect();
        writeln!(o, "  {:<40} {:<8} [{}]  {}", t.name, t.ty.name(), dims.join(", "), human(t.n_bytes))?;
    }
    if shown < g.tensors.len() {
        writeln!(o, "  … {} more (--tensors lists all)", g.tensors.len() - shown)?;
    }
    writeln!(o, "\n== model (supported architectures: {})", pn_models::SUPPORTED.join(", "))?;
    // the model section is printed as far as its config parses, then the verdict
    if let Ok(m) = pn_models::load(g) {
        for (k, v) in m.describe() {
            writeln!(o, "  {k}: {v}")?;
        }
        writeln!(o, "\n== layers")?;
        for l in m.layers() {
            writeln!(o, "  {:>3}  {}", l.index, l.kind)?;
        }
        state_section(o, &*m, max_seq, types)?;
    }
    let verdict = validate(g).map(|_| ());
    if verdict.is_ok() {
        writeln!(o, "\nloads: yes")?;
    }
    Ok(verdict)
}

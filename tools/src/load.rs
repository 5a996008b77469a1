//! Opening a model: a GGUF path or the built-in default model, then the runner.

use anyhow::{bail, Context, Result};
use pn_cpu::CpuBackend;
use pn_engine::planner::{DeviceKind, Placement, PlacementError};
use pn_engine::runner::Die;
use pn_engine::state::kv;
use pn_engine::tokenizer::Tokenizer;
use pn_engine::{Gguf, LoadMode, Runner};
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
    #[arg(long, short = 'm')]
    pub model: Option<std::path::PathBuf>,
    /// Threads per die (0 or -1 = all cores)
    #[arg(long, short = 't', default_value_t = 0, allow_negative_numbers = true)]
    pub threads: i64,
    /// Tokens per forward pass (longer inputs run in several passes). Default 512: with
    /// 256 experts a pass then gives each expert ~16 tokens (docs/perf.md "Session 14");
    /// `pn serve` 256 (it compiles every pass length up to it before serving)
    #[arg(long)]
    pub ubatch: Option<usize>,
    /// Dies to run on: one (`cpu:0`) or two (`cpu:0,cpu:1`: die A, die B, each its own
    /// backend and thread pool). Default: $PN_DIE_A / $PN_DIE_B, else cpu:0
    #[arg(long)]
    pub dies: Option<String>,
    /// Layers [0, L) + embedding on die A, the rest + head on die B (default:
    /// $PN_SPLIT_LAYER, else n_layer/2 with two dies)
    #[arg(long)]
    pub split_layer: Option<usize>,
    /// KV cache format: f32, f16, q8_0 or q4_0 (q4_0 keeps f16 shadows of the first and the
    /// most recent positions; docs/kv-cache.md). Default: $PN_KV_TYPE, $QWEN35_KV_Q4=0 → f32,
    /// else q4_0. Falls back to q4_0 when the state would not fit in memory
    #[arg(long)]
    pub kv_type: Option<String>,
    /// Past --max-seq: `error` ("context full", the default) or `ring` (cell = pos % max_seq:
    /// attention over the last max_seq positions only, a sliding window, not exact
    /// attention). Default: $PN_CONTEXT_OVERFLOW, else error
    #[arg(long)]
    pub context_overflow: Option<String>,
    /// How the model file gets into memory: `mmap` (lazy, reclaimable pages), `copy`
    /// (read into huge pages: faster decode, all read up front) or `auto` (copy when the
    /// file takes at most half of the available memory). Default: $PN_LOAD, else auto
    #[arg(long)]
    pub load: Option<String>,
}

/// The context size (`-c`), for the commands that keep a sequence state.
#[derive(clap::Args, Clone, Debug)]
pub struct ContextOpts {
    /// Context size in tokens (KV cache capacity). Default: $PN_MAX_SEQ, $QWEN35_MAX_SEQ,
    /// else 4096; clamped to [16, 262144]
    #[arg(long, short = 'c', visible_alias = "ctx-size")]
    pub max_seq: Option<usize>,
}

/// The placement asked for by `--dies` / `--split-layer`, then the environment. An
/// explicit `--split-layer` needs two named dies (it would otherwise invent die B).
pub fn placement(o: &ModelOpts) -> Result<Placement> {
    let p = Placement::resolve(o.dies.as_deref(), o.split_layer)?;
    let env_b = ["PN_DIE_B", "QWEN35_GPU_DIE_B"].iter().any(|k| std::env::var(k).is_ok_and(|v| !v.trim().is_empty()));
    let two_named = o.dies.as_deref().is_some_and(|d| d.contains(',')) || (o.dies.is_none() && env_b);
    if let (Some(s), false) = (o.split_layer, two_named) {
        bail!("--split-layer {s}: expected two dies (--dies A,B), found one ({}); drop --split-layer or name die B", p.die_a);
    }
    Ok(p)
}

/// The split layer checked against the model: 1 to n_layer (n_layer = all on die A).
fn check_split(o: &ModelOpts, p: &Placement, n_layer: usize) -> Result<()> {
    let Some(s) = p.split.filter(|_| p.die_b.is_some()) else { return Ok(()) };
    if s > n_layer {
        let flag = if o.split_layer.is_some() { "--split-layer" } else { "PN_SPLIT_LAYER" };
        bail!("{flag} {s}: expected 1 to {n_layer} (the model has {n_layer} layers)");
    }
    Ok(())
}

/// `--threads`: 0 and -1 mean every core; the concrete count.
pub fn resolve_threads(t: i64) -> Result<usize> {
    match t {
        0 | -1 => Ok(std::thread::available_parallelism().map_or(1, |n| n.get())),
        t if t < -1 || t as u64 > MAX_THREADS as u64 => bail!("--threads: expected 0 or -1 (all cores) to {MAX_THREADS}, found {t}"),
        t => Ok(t as usize),
    }
}

/// One backend instance per die named by the placement (`threads` threads each).
pub fn dies(p: &Placement, threads: usize) -> Result<Vec<Die>> {
    p.named_dies()
        .into_iter()
        .map(|device| match device.kind {
            DeviceKind::Cpu => {
                let b = CpuBackend::try_new(threads).map_err(anyhow::Error::msg)?;
                Ok(Die { device, backend: Arc::new(b) as Arc<dyn pn_engine::Backend> })
            }
            // CUDA is loaded at run time: a machine without a driver or device gets a clear error
            DeviceKind::Cuda => match pn_cuda::CudaBackend::new(device.index) {
                Ok(b) => Ok(Die { device, backend: Arc::new(b) as Arc<dyn pn_engine::Backend> }),
                Err(e) => Err(PlacementError::NotAvailable { device: device.to_string(), reason: e.to_string() }.into()),
            },
        })
        .collect()
}

pub struct Loaded {
    pub name: String,
    pub is_default: bool,
    pub gguf: Arc<Gguf>,
    pub runner: Runner,
    pub threads: usize,
    pub load_secs: f64,
}

/// The model file (loaded as `mode` says) or the built-in default model.
pub fn open_gguf(model: Option<&Path>, mode: LoadMode) -> Result<(String, bool, Arc<Gguf>)> {
    open_gguf_with_progress(model, mode, &mut |_, _| {})
}

/// `open_gguf`, reporting the bytes read so far (a `copy` load) to `progress`.
fn open_gguf_with_progress(model: Option<&Path>, mode: LoadMode, progress: &mut dyn FnMut(u64, u64)) -> Result<(String, bool, Arc<Gguf>)> {
    match model {
        None => {
            let g = Gguf::from_static(DEFAULT_MODEL).context("the built-in default model")?;
            Ok((DEFAULT_MODEL_NAME.to_string(), true, Arc::new(g)))
        }
        Some(p) => {
            if p.is_dir() {
                bail!("{}: expected a GGUF file, found a directory", p.display());
            }
            let g = Gguf::open_with_progress(p, mode, progress).with_context(|| format!("cannot load model {}", p.display()))?;
            Ok((p.display().to_string(), false, Arc::new(g)))
        }
    }
}

/// Tokens per forward pass where `--ubatch` is not given (`pn serve`: [`SERVE_UBATCH`]).
pub const DEFAULT_UBATCH: usize = 512;
/// `pn serve`'s default `--ubatch`: it compiles every pass length up to it before it
/// serves (time and memory grow with it), and its passes end at the prefix cache's
/// 256-token snapshots anyway.
pub const SERVE_UBATCH: usize = 256;

/// Every model flag checked (all before the file is opened): threads, load mode, ubatch,
/// placement.
pub fn check(o: &ModelOpts) -> Result<(usize, LoadMode, Placement)> {
    let threads = resolve_threads(o.threads)?;
    let mode = match o.load.clone().or_else(|| std::env::var("PN_LOAD").ok()) {
        Some(m) => m.parse::<LoadMode>().map_err(|e| anyhow::anyhow!("--load: {e}"))?,
        None => LoadMode::Auto,
    };
    if o.ubatch == Some(0) {
        bail!("--ubatch: expected a value ≥ 1, found 0");
    }
    Ok((threads, mode, placement(o)?))
}

pub fn load(o: &ModelOpts) -> Result<Loaded> {
    let (threads, mode, place) = check(o)?;
    let t0 = std::time::Instant::now();
    let size = o.model.as_deref().and_then(|p| std::fs::metadata(p).ok()).map_or(DEFAULT_MODEL.len() as u64, |m| m.len());
    let how = if mode == LoadMode::Mmap { "mapping" } else { "reading" };
    let pb = crate::progress::spinner(format!("{how} the model ({})", human_bytes(size)));
    // a copy load shows the bytes read so far
    let (name, is_default, gguf) = open_gguf_with_progress(o.model.as_deref(), mode, &mut |done, len| {
        pb.set_message(format!("{how} the model: {} of {}", human_bytes(done), human_bytes(len)));
    })?;
    pb.set_message(format!("checking {} tensors", gguf.tensors.len()));
    let m = pn_models::load(&gguf).with_context(|| format!("cannot load model {name}"))?;
    check_split(o, &place, m.n_layer())?;
    let dies = dies(&place, threads)?;
    let n_lanes = lanes(&place, threads, size)?;
    let mut runner = Runner::with_dies(m, gguf.clone(), dies, place).with_context(|| format!("cannot load model {name}"))?;
    pb.finish_and_clear();
    runner.ubatch = o.ubatch.unwrap_or(DEFAULT_UBATCH);
    if n_lanes > 1 {
        pn_cpu::add_lanes(&mut runner, n_lanes).map_err(|e| anyhow::anyhow!("cannot load model {name}: {e}"))?;
    }
    geometry_cache(&runner)?;
    Ok(Loaded { name, is_default, gguf, runner, threads, load_secs: t0.elapsed().as_secs_f64() })
}

/// The runner's bound on compiled geometries (`pn_engine` runner/bounded.rs):
/// `$PN_GEOMETRIES` (a count) or `$PN_GEOMETRY_CACHE_MB` (a budget in MiB; default 256).
fn geometry_cache(runner: &Runner) -> Result<()> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let whole = |name: &str, v: &str| -> Result<usize> {
        match v.trim().parse::<usize>() {
            Ok(n) if n >= 1 => Ok(n),
            _ => bail!("{name}: expected a whole number of at least 1, found {v:?}"),
        }
    };
    if let Some(v) = var("PN_GEOMETRIES") {
        runner.set_max_geometries(whole("PN_GEOMETRIES", &v)?);
    } else if let Some(v) = var("PN_GEOMETRY_CACHE_MB") {
        runner.set_geometry_budget_mb(whole("PN_GEOMETRY_CACHE_MB", &v)?);
    }
    Ok(())
}

/// Model files up to which a pass of several sequences runs as one lane per thread
/// (`pn_engine` runner/lanes.rs: each thread its own group of sequences, no fork/join
/// inside the pass): weights that stay in the caches cost little to read once per
/// lane. The built-in model (13 MB), default slots 16, Xeon 6/207, 2 threads: two
/// one-thread passes of 8 sequences gave 8300 tok/s beside one two-thread pass of 16 at
/// 6200 (docs/serving.md "Lanes"); a 38 MB `small` file +23%; full-dims-wide files of
/// 89 and 219 MB level; the 1.2 GB full-dims file 9% slower (read from memory twice).
const LANES_MAX_FILE_BYTES: u64 = 64 << 20;

/// Lanes for a multi-sequence pass: `$PN_LANES` (0 or 1: off; N: N lanes, at most the
/// threads), else one per thread for a CPU model of at most [`LANES_MAX_FILE_BYTES`].
fn lanes(place: &Placement, threads: usize, file_bytes: u64) -> Result<usize> {
    let one_cpu = matches!(place.named_dies()[..], [d] if d.kind == DeviceKind::Cpu);
    match std::env::var("PN_LANES").ok().filter(|v| !v.trim().is_empty() && v.trim() != "auto") {
        Some(v) => match v.trim().parse::<usize>() {
            Ok(n) if n >= 2 && n <= threads.max(1) && !one_cpu => {
                let dies: Vec<String> = place.named_dies().iter().map(|d| d.to_string()).collect();
                bail!("PN_LANES={n}: lanes run on one CPU die, this run uses {} (unset PN_LANES or set it to 0)", dies.join(","))
            }
            Ok(n) if n <= threads.max(1) => Ok(if one_cpu { n } else { 1 }),
            _ => bail!("PN_LANES: expected auto, 0 (off) or a lane count up to the {threads} threads, found {v:?}"),
        },
        None => Ok(if one_cpu && threads >= 2 && file_bytes <= LANES_MAX_FILE_BYTES { threads } else { 1 }),
    }
}

/// Bytes as people read them: 1.16 GB, 36.2 MB, 512 B.
pub fn human_bytes(bytes: u64) -> String {
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

/// The one line after load (stderr, unless --quiet): model, size, load time, threads, KV
/// type, context.
pub fn announce(l: &Loaded, kv: pn_ops::KvType, max_seq: usize) {
    if crate::progress::quiet() {
        return;
    }
    let size = human_bytes(l.gguf.file_bytes().len() as u64);
    let dies = l.runner.dies().iter().map(|d| d.device.to_string()).collect::<Vec<_>>().join(",");
    let lanes = match l.runner.lanes() {
        1 => String::new(),
        n => format!(" ({n} lanes for several sequences)"),
    };
    eprintln!("{}: {size}, loaded in {:.2} s, {} threads on {dies}{lanes}, KV {kv}, context {max_seq}", l.name, l.load_secs, l.threads);
}

pub fn tokenizer(l: &Loaded) -> Result<Tokenizer> {
    Tokenizer::from_gguf(&l.gguf).with_context(|| format!("cannot build the tokenizer of {}", l.name))
}

/// Most worker threads `--threads` accepts (more would only fail to spawn).
pub const MAX_THREADS: usize = 1024;

/// A row of logits, or a clear error if the model produced NaN/Inf (e.g. NaN weights).
pub fn finite(logits: &[f32]) -> Result<&[f32]> {
    let bad = logits.iter().filter(|x| !x.is_finite()).count();
    if bad > 0 {
        bail!("the model produced {bad} non-finite logits (NaN/Inf) out of {}: expected finite values; the weights may contain NaN/Inf", logits.len());
    }
    Ok(logits)
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

/// The sequence-state configuration from the flags and environment: `--max-seq`
/// (`PN_MAX_SEQ`, clamped with a warning), `--kv-type` (`PN_KV_TYPE`; `kv_default` when
/// neither is given, else the engine default q4_0), `--context-overflow`.
pub fn state_config(o: &ModelOpts, max_seq: Option<usize>, kv_default: Option<pn_ops::KvType>) -> Result<kv::StateConfig> {
    let (max_seq, clamped) = kv::resolve_max_seq(max_seq)?;
    if let Some(w) = clamped {
        eprintln!("{w}");
    }
    let kv_type = match (o.kv_type.as_deref(), kv_default) {
        (None, Some(d)) if std::env::var_os("PN_KV_TYPE").is_none() && std::env::var_os("QWEN35_KV_Q4").is_none() => d,
        (flag, _) => kv::resolve_kv_type(flag)?,
    };
    Ok(kv::StateConfig { max_seq, kv: kv_type, overflow: kv::resolve_overflow(o.context_overflow.as_deref())? })
}

/// A fresh sequence state through the memory ladder, printing its notes.
pub fn alloc_state(l: &Loaded, cfg: &kv::StateConfig) -> Result<pn_engine::SeqState> {
    alloc_state_on(&l.runner, cfg)
}

/// [`alloc_state`] on a runner already taken out of its [`Loaded`] (e.g. shared in an `Arc`).
pub fn alloc_state_on(r: &pn_engine::Runner, cfg: &kv::StateConfig) -> Result<pn_engine::SeqState> {
    let (st, notes) = r.alloc_state(cfg)?;
    for n in notes {
        eprintln!("{n}");
    }
    Ok(st)
}

/// The first state of a command: allocated, then the load line with its KV type.
pub fn first_state(l: &Loaded, cfg: &kv::StateConfig) -> Result<pn_engine::SeqState> {
    let st = alloc_state(l, cfg)?;
    announce(l, st.kv_type().unwrap_or(cfg.kv), cfg.max_seq);
    Ok(st)
}

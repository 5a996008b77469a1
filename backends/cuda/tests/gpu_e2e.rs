//! End to end, CUDA vs CPU: for every model fixture, the logits of a short prompt (every
//! position) and of a few greedy decode steps on a `cuda:0` die and on a `cpu:0` die,
//! compared by argmax agreement, Pearson r and max |Δ|. Fails when the argmax agrees on
//! fewer than 95% of the rows or a row's r is below 0.999.
//!
//! Without a device the CUDA test prints "no CUDA device: skipped"; the same comparison
//! then runs with the reference backend in CUDA's place, so the harness (fixture scan,
//! runners, decode loop, metrics, thresholds) is exercised in CI.
//!
//! Models: `$PN_E2E_MODELS` (`:`-separated files or folders of `*.gguf`), else the
//! repository's tests/fixtures and models/default. Files that do not load as a model
//! (the vocabulary-only fixture) are skipped; the hostile fixtures live in sub-folders
//! and are never read.

use pn_cpu::CpuBackend;
use pn_cuda::CudaBackend;
use pn_engine::planner::{Device, Placement};
use pn_engine::runner::Die;
use pn_engine::sampler::argmax;
use pn_engine::{Backend, Gguf, ReferenceBackend, Runner};
use std::path::{Path, PathBuf};
use std::sync::Arc;

const PROMPT: usize = 8;
const DECODE: usize = 4;
const MIN_ARGMAX: f64 = 0.95;
const MIN_PEARSON: f64 = 0.999;

fn model_files() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let places: Vec<PathBuf> = match std::env::var("PN_E2E_MODELS") {
        Ok(s) if !s.is_empty() => s.split(':').map(PathBuf::from).collect(),
        _ => vec![root.join("tests/fixtures"), root.join("models/default")],
    };
    let mut out = Vec::new();
    for p in places {
        if p.is_file() {
            out.push(p);
        } else if let Ok(rd) = std::fs::read_dir(&p) {
            let mut v: Vec<PathBuf> = rd.flatten().map(|e| e.path()).filter(|f| f.is_file() && f.extension().is_some_and(|x| x == "gguf")).collect();
            v.sort();
            out.extend(v);
        }
    }
    out
}

/// How one backend's logits compare with another's on one model.
#[derive(Debug, Clone)]
struct Report {
    name: String,
    rows: usize,
    argmax: f64,
    min_pearson: f64,
    max_abs: f32,
}

impl Report {
    fn ok(&self) -> bool {
        self.argmax >= MIN_ARGMAX && self.min_pearson >= MIN_PEARSON
    }
    fn line(&self) -> String {
        format!(
            "{:<32} rows {:>2}  argmax {:>5.1}%  r_min {:.6}  max|Δ| {:.3e}  {}",
            self.name,
            self.rows,
            100.0 * self.argmax,
            self.min_pearson,
            self.max_abs,
            if self.ok() { "ok" } else { "FAIL" }
        )
    }
}

fn pearson(a: &[f32], b: &[f32]) -> f64 {
    let n = a.len() as f64;
    let (ma, mb) = (a.iter().map(|&x| x as f64).sum::<f64>() / n, b.iter().map(|&x| x as f64).sum::<f64>() / n);
    let (mut ab, mut aa, mut bb) = (0.0, 0.0, 0.0);
    for (&x, &y) in a.iter().zip(b) {
        let (dx, dy) = (x as f64 - ma, y as f64 - mb);
        ab += dx * dy;
        aa += dx * dx;
        bb += dy * dy;
    }
    if aa == 0.0 && bb == 0.0 {
        return 1.0; // two constant rows
    }
    ab / (aa.sqrt() * bb.sqrt()).max(1e-300)
}

/// Metrics over rows of logits; non-finite values count as r = NaN (a failure).
fn metrics(name: &str, test: &[Vec<f32>], base: &[Vec<f32>]) -> Report {
    assert_eq!(test.len(), base.len(), "{name}: row count");
    let (mut agree, mut min_r, mut max_abs) = (0usize, f64::INFINITY, 0f32);
    for (a, b) in test.iter().zip(base) {
        assert_eq!(a.len(), b.len(), "{name}: vocabulary");
        agree += (argmax(a) == argmax(b)) as usize;
        let finite = a.iter().chain(b).all(|x| x.is_finite());
        let r = if finite { pearson(a, b) } else { f64::NAN };
        min_r = if r.is_nan() || min_r.is_nan() { f64::NAN } else { min_r.min(r) };
        for (x, y) in a.iter().zip(b) {
            max_abs = max_abs.max((x - y).abs());
        }
    }
    Report { name: name.to_string(), rows: test.len(), argmax: agree as f64 / test.len().max(1) as f64, min_pearson: min_r, max_abs }
}

/// The dies a runner gets and where the layers go.
type Dies = (Vec<Die>, Placement);

/// Everything on one die.
fn one(device: Device, backend: Arc<dyn Backend>) -> Dies {
    (vec![Die { device, backend }], Placement::single(device))
}

/// A runner of `path` on `dies`; `Ok(None)` when the file is not a model.
fn runner(path: &Path, (dies, place): Dies) -> Result<Option<Runner>, String> {
    let g = Arc::new(Gguf::open(path).map_err(|e| format!("open: {e}"))?);
    let Ok(m) = pn_models::load(&g) else { return Ok(None) };
    let names: Vec<String> = dies.iter().map(|d| d.device.to_string()).collect();
    Runner::with_dies(m, g, dies, place).map(Some).map_err(|e| format!("runner on {}: {e}", names.join(",")))
}

/// The prompt's logits (every position) then `DECODE` greedy steps, both runners fed the
/// same tokens (the base's choices). `Ok(None)`: not a model.
fn compare(path: &Path, test: Dies, base: Dies) -> Result<Option<Report>, String> {
    let name = path.file_name().map_or(String::new(), |n| n.to_string_lossy().into_owned());
    let Some(rb) = runner(path, base)? else { return Ok(None) };
    let rt = runner(path, test)?.ok_or("loads on one die but not the other")?;
    let v = rb.model().n_vocab();
    let prompt: Vec<u32> = (0..PROMPT).map(|i| ((i * 7919 + 13) % v.saturating_sub(8).max(1)) as u32).collect();
    let max_seq = PROMPT + DECODE + 8;
    let (mut sb, mut st) = (rb.new_state(max_seq), rt.new_state(max_seq));
    let err = |who: &str, e: pn_engine::RunError| format!("{who}: {e}");
    let lb = rb.forward(&mut sb, &prompt, true).map_err(|e| err("base", e))?;
    let lt = rt.forward(&mut st, &prompt, true).map_err(|e| err("test", e))?;
    let mut base_rows: Vec<Vec<f32>> = (0..lb.rows()).map(|i| lb.row(i).to_vec()).collect();
    let mut test_rows: Vec<Vec<f32>> = (0..lt.rows()).map(|i| lt.row(i).to_vec()).collect();
    for _ in 0..DECODE {
        let tok = argmax(base_rows.last().expect("rows")) as u32;
        let lb = rb.forward(&mut sb, &[tok], false).map_err(|e| err("base", e))?;
        let lt = rt.forward(&mut st, &[tok], false).map_err(|e| err("test", e))?;
        base_rows.push(lb.row(0).to_vec());
        test_rows.push(lt.row(0).to_vec());
    }
    Ok(Some(metrics(&name, &test_rows, &base_rows)))
}

/// Compare on every model file; print one line each; the failures.
fn compare_all(test: &dyn Fn() -> Dies, label: &str) -> Vec<String> {
    let files = model_files();
    assert!(!files.is_empty(), "no model files found: set PN_E2E_MODELS (checked {:?})", std::env::var("PN_E2E_MODELS"));
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get().min(16));
    let cpu: Arc<dyn Backend> = Arc::new(CpuBackend::new(threads));
    println!("e2e {label} vs cpu:0: prompt {PROMPT} tokens + {DECODE} decode steps, f32 KV; pass: argmax ≥ {MIN_ARGMAX}, r ≥ {MIN_PEARSON}");
    let mut failures = Vec::new();
    let (mut n, t0) = (0, std::time::Instant::now());
    for f in &files {
        match compare(f, test(), one(Device::cpu(0), cpu.clone())) {
            Ok(Some(r)) => {
                n += 1;
                println!("  {}", r.line());
                if !r.ok() {
                    failures.push(r.line());
                }
            }
            Ok(None) => println!("  {:<32} skipped (not a model)", f.file_name().unwrap_or_default().to_string_lossy()),
            Err(e) => {
                println!("  {:<32} ERROR {e}", f.file_name().unwrap_or_default().to_string_lossy());
                failures.push(format!("{}: {e}", f.display()));
            }
        }
    }
    println!("e2e {label}: {n} models, {} failed, {:.1} s", failures.len(), t0.elapsed().as_secs_f64());
    assert!(n > 0, "no file loaded as a model");
    failures
}

#[test]
fn cuda_matches_cpu_on_every_fixture() {
    let Some(b) = pn_cuda::start::for_test(0, "cuda_matches_cpu_on_every_fixture") else { return };
    let cuda: Arc<dyn Backend> = Arc::new(b);
    let failures = compare_all(&|| one(Device::cuda(0), cuda.clone()), "cuda:0");
    assert!(failures.is_empty(), "CUDA vs CPU failed on:\n{}", failures.join("\n"));
}

/// The split on one GPU: layers [0, n/2) on die cuda:0, the rest on die cuda:1, both
/// backends on device 0 (two streams, one context): the die-to-die copy path and the
/// two-phase step run on a one-GPU machine.
#[test]
fn cuda_split_on_one_device_matches_cpu() {
    let Some(a) = pn_cuda::start::for_test(0, "cuda_split_on_one_device_matches_cpu") else { return };
    let b = CudaBackend::on_device(1, 0).expect("a second backend on device 0");
    let (a, b): (Arc<dyn Backend>, Arc<dyn Backend>) = (Arc::new(a), Arc::new(b));
    let (da, db) = (Device::cuda(0), Device::cuda(1));
    let dies = || (vec![Die { device: da, backend: a.clone() }, Die { device: db, backend: b.clone() }], Placement::two(da, db));
    let failures = compare_all(&dies, "cuda:0+cuda:1 on device 0");
    assert!(failures.is_empty(), "CUDA split vs CPU failed on:\n{}", failures.join("\n"));
}

/// The same harness with the reference backend in CUDA's place: runs everywhere.
#[test]
fn harness_runs_without_a_device() {
    let failures = compare_all(&|| one(Device::cpu(0), Arc::new(ReferenceBackend) as Arc<dyn Backend>), "reference");
    assert!(failures.is_empty(), "reference vs CPU failed on:\n{}", failures.join("\n"));
}

#[test]
fn metrics_flag_disagreement() {
    let a = vec![vec![0.0, 1.0, 2.0, 3.0], vec![3.0, 2.0, 1.0, 0.0]];
    let same = metrics("same", &a, &a);
    assert!(same.ok() && same.argmax == 1.0 && same.max_abs == 0.0 && (same.min_pearson - 1.0).abs() < 1e-12);
    let flipped = vec![a[0].clone(), vec![0.0, 1.0, 2.0, 3.0]];
    let r = metrics("flipped", &flipped, &a);
    assert!(!r.ok() && r.argmax == 0.5 && r.max_abs == 3.0 && r.min_pearson < 0.0);
    let nan = vec![a[0].clone(), vec![f32::NAN, 2.0, 1.0, 0.0]];
    assert!(!metrics("nan", &nan, &a).ok(), "non-finite logits fail");
    assert!(r.line().contains("FAIL") && same.line().contains("ok"));
}

//! Streaming GGUF writer for `pn synth`: the header and tensor table first, then every
//! tensor's data generated and quantized in chunks of rows by all threads and written
//! in order. At most `2 × threads` chunks (~1 M values each) are in memory. Values
//! depend only on (seed, tensor name, chunk), never on the thread count.

use anyhow::{bail, Context, Result};
use pn_engine::gguf_writer::GgufWriter;
use pn_engine::MetaValue;
use pn_ops::quant::quantize_weights::quantize_weights;
use pn_ops::GgmlType;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Condvar, Mutex};

const ALIGN: usize = 32;
/// Values per chunk (rounded to whole rows).
const CHUNK: usize = 1 << 20;

/// How a tensor's values are drawn (uniform noise of the stated standard deviation).
#[derive(Clone, Copy, Debug)]
pub enum Init {
    /// σ = s.
    Normal(f32),
    /// σ = s / √ne0 (a linear layer).
    Mat(f32),
    /// 1 + 0.1·noise (RMSNorm weights).
    Norm,
    /// softplus⁻¹ of dt ∈ [1e-3, 1e-1] log-uniform (ssm_dt.bias).
    DtBias,
    /// −U(1, 16) (ssm_a = −exp(A_log)).
    SsmA,
    /// The llama3 rope frequency factors of a head of 2·ne0 dims (`rope_freqs.weight`).
    Llama3Freqs { base: f32 },
}

pub struct TensorPlan {
    pub name: String,
    /// ggml order (ne[0] = row length).
    pub ne: Vec<usize>,
    pub ty: GgmlType,
    pub init: Init,
}

impl TensorPlan {
    fn rows(&self) -> usize {
        self.ne[1..].iter().product()
    }
    fn row_bytes(&self) -> usize {
        self.ty.row_bytes(self.ne[0]).expect("the plan fits every type to its rows")
    }
    pub fn bytes(&self) -> usize {
        self.row_bytes() * self.rows()
    }
}

/// splitmix64: seeds and a fast stream of values.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
    /// Uniform with mean 0 and standard deviation 1.
    fn noise(&mut self) -> f32 {
        (self.unit() * 2.0 - 1.0) * 1.732_050_8
    }
}

fn chunk_seed(seed: u64, name: &str, chunk: usize) -> u64 {
    // FNV-1a of the name, mixed with the seed and the chunk index
    let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
    let mut r = Rng(seed ^ h.rotate_left(17) ^ (chunk as u64).wrapping_mul(0xd1b5_4a32_d192_ed03));
    r.next()
}

fn fill(init: Init, ne0: usize, rng: &mut Rng, x: &mut [f32]) {
    match init {
        Init::Normal(s) => x.iter_mut().for_each(|v| *v = rng.noise() * s),
        Init::Mat(s) => {
            let s = s / (ne0 as f32).sqrt();
            x.iter_mut().for_each(|v| *v = rng.noise() * s)
        }
        Init::Norm => x.iter_mut().for_each(|v| *v = 1.0 + 0.1 * rng.noise()),
        Init::DtBias => x.iter_mut().for_each(|v| {
            let (lo, hi) = (1e-3f32.ln(), 1e-1f32.ln());
            let dt = (lo + (hi - lo) * rng.unit()).exp();
            *v = dt + (-(-dt).exp_m1()).ln();
        }),
        Init::SsmA => x.iter_mut().for_each(|v| *v = -(1.0 + 15.0 * rng.unit())),
        Init::Llama3Freqs { base } => x.copy_from_slice(&crate::synth_arch::llama3_factors(base, 2 * ne0)[..x.len()]),
    }
}

/// One unit of work: rows [r0, r1) of tensor `t`.
struct Job {
    t: usize,
    chunk: usize,
    r0: usize,
    r1: usize,
}

fn jobs(tensors: &[TensorPlan]) -> Vec<Job> {
    let mut out = Vec::new();
    for (t, p) in tensors.iter().enumerate() {
        let per = (CHUNK / p.ne[0]).max(1);
        let rows = p.rows();
        for (chunk, r0) in (0..rows).step_by(per).enumerate() {
            out.push(Job { t, chunk, r0, r1: (r0 + per).min(rows) });
        }
    }
    out
}

fn make_chunk(p: &TensorPlan, j: &Job, seed: u64) -> Result<Vec<u8>> {
    let ne0 = p.ne[0];
    let mut x = vec![0f32; ne0 * (j.r1 - j.r0)];
    fill(p.init, ne0, &mut Rng(chunk_seed(seed, &p.name, j.chunk)), &mut x);
    let rb = p.row_bytes();
    let mut out = vec![0u8; rb * (j.r1 - j.r0)];
    for (xr, or) in x.chunks_exact(ne0).zip(out.chunks_exact_mut(rb)) {
        quantize_weights(p.ty, xr, or).with_context(|| format!("quantizing {} as {}", p.name, p.ty))?;
    }
    Ok(out)
}

/// The header: metadata (through GgufWriter), then the tensor table, padded.
fn header(meta: &[(String, MetaValue)], tensors: &[TensorPlan]) -> Vec<u8> {
    let mut w = GgufWriter::new();
    for (k, v) in meta {
        w = w.kv(k.clone(), v.clone());
    }
    // a file with no tensors is the magic, version, counts and the key/values: add the table
    let mut h = w.to_bytes();
    h[8..16].copy_from_slice(&(tensors.len() as i64).to_le_bytes());
    let mut off = 0usize;
    for t in tensors {
        h.extend_from_slice(&(t.name.len() as u64).to_le_bytes());
        h.extend_from_slice(t.name.as_bytes());
        h.extend_from_slice(&(t.ne.len() as u32).to_le_bytes());
        for &d in &t.ne {
            h.extend_from_slice(&(d as i64).to_le_bytes());
        }
        h.extend_from_slice(&t.ty.id().to_le_bytes());
        h.extend_from_slice(&(off as u64).to_le_bytes());
        off += t.bytes().next_multiple_of(ALIGN);
    }
    h.resize(h.len().next_multiple_of(ALIGN), 0);
    h
}

/// Write the file with `threads` workers; returns its size in bytes. On error the
/// partial file is removed.
pub fn write_gguf(path: &Path, meta: &[(String, MetaValue)], tensors: &[TensorPlan], seed: u64, threads: usize) -> Result<u64> {
    let res = write_inner(path, meta, tensors, seed, threads.max(1));
    if res.is_err() {
        let _ = std::fs::remove_file(path);
    }
    res
}

fn write_inner(path: &Path, meta: &[(String, MetaValue)], tensors: &[TensorPlan], seed: u64, threads: usize) -> Result<u64> {
    let file = std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    let mut w = std::io::BufWriter::with_capacity(1 << 22, file);
    let head = header(meta, tensors);
    w.write_all(&head)?;
    let mut total = head.len() as u64;
    let jobs = jobs(tensors);
    let bar = crate::progress::bar(tensors.iter().map(|t| t.bytes() as u64).sum(), "synth", "bytes");
    let window = 2 * threads;
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    // the number of chunks written: workers wait until their chunk is within the window
    let written = (Mutex::new(0usize), Condvar::new());
    let (tx, rx) = mpsc::channel::<(usize, Result<Vec<u8>>)>();
    std::thread::scope(|s| -> Result<()> {
        for _ in 0..threads {
            let tx = tx.clone();
            let (jobs, next, stop, written) = (&jobs, &next, &stop, &written);
            s.spawn(move || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= jobs.len() || stop.load(Ordering::Relaxed) {
                    return;
                }
                {
                    let mut n = written.0.lock().unwrap_or_else(|e| e.into_inner());
                    while i >= *n + window && !stop.load(Ordering::Relaxed) {
                        n = written.1.wait(n).unwrap_or_else(|e| e.into_inner());
                    }
                }
                let j = &jobs[i];
                if tx.send((i, make_chunk(&tensors[j.t], j, seed))).is_err() {
                    return;
                }
            });
        }
        drop(tx);
        let res = (|| -> Result<()> {
            let mut pending = BTreeMap::new();
            let mut done = 0usize;
            while done < jobs.len() {
                let Ok((i, chunk)) = rx.recv() else { bail!("a synth worker stopped early") };
                pending.insert(i, chunk?);
                while let Some(c) = pending.remove(&done) {
                    w.write_all(&c)?;
                    total += c.len() as u64;
                    bar.inc(c.len() as u64);
                    let j = &jobs[done];
                    if j.r1 == tensors[j.t].rows() {
                        let pad = tensors[j.t].bytes().next_multiple_of(ALIGN) - tensors[j.t].bytes();
                        w.write_all(&[0u8; ALIGN][..pad])?;
                        total += pad as u64;
                    }
                    done += 1;
                    *written.0.lock().unwrap_or_else(|e| e.into_inner()) = done;
                    written.1.notify_all();
                }
            }
            Ok(())
        })();
        if res.is_err() {
            let _n = written.0.lock().unwrap_or_else(|e| e.into_inner());
            stop.store(true, Ordering::Relaxed);
            written.1.notify_all();
        }
        drop(rx);
        res
    })
    .with_context(|| format!("cannot write {}", path.display()))?;
    w.flush().with_context(|| format!("cannot write {}", path.display()))?;
    bar.finish_and_clear();
    Ok(total)
}

//! Attention over the KV cache on the device, every `pn_ops::KvType` (f32, f16, q8_0,
//! q4_0), with the Hadamard rotation, the f16 sink / window shadows and the ring mode of
//! `pn_ops::KvCache` (kernels/attention.cu).
//!
//! The host cache stays the source of truth under today's Backend trait: per call the
//! cells a query can read (`[Hkv][ncells][row bytes]`) and the shadows are uploaded; per
//! run of the batch (`KvCache::runs`, as the reference) `kv_store` rotates, encodes and
//! stores the run's k/v on the device, then `attn_kv` attends; finally the encoded cells
//! written (staging rows, byte-identical to `KvCache::write`) and the shadows are copied
//! back into the host cache.

use crate::device::{go, Device};
use crate::ops_linear::{host_i32, up_f32};
use crate::CudaError;
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use pn_ops::{KvCache, KvType, LayerState, OpError, Tensor, TensorMeta, Value};

#[derive(Clone, Copy)]
pub struct AttnGeom {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub d: usize,
    pub scale: f32,
}

/// Scores scratch of one attention launch, in floats (chunks of tokens above it).
const SCORES_MAX: usize = 1 << 26;
/// Threads per block of `kv_store` / `attn_kv`.
const THREADS: u32 = 128;
/// Dynamic shared memory the kernels may take without opting in (one row of D floats).
const SHARED_MAX: usize = 48 * 1024;

/// `KvType` as the kernels number it (kernels/attention.cu `KV_*`).
fn ty_code(ty: KvType) -> i32 {
    match ty {
        KvType::F32 => 0,
        KvType::F16 => 1,
        KvType::Q8_0 => 2,
        KvType::Q4_0 => 3,
    }
}

/// 1/sqrt(n) as `pn_ops::state::kv::hadamard` computes it (0 when there is no rotation).
fn rot_scale(n: usize) -> f32 {
    if n == 0 {
        0.0
    } else {
        1.0 / (n as f32).sqrt()
    }
}

/// The device copy of the part of a cache a batch reads and writes: cells
/// `[Hkv][ncells][rb]` (ncells = max position + 1, or the capacity once a ring wraps)
/// and the shadows whole.
struct DevKv {
    kc: CudaSlice<u8>,
    vc: CudaSlice<u8>,
    ksink: CudaSlice<u16>,
    vsink: CudaSlice<u16>,
    kwin: CudaSlice<u16>,
    vwin: CudaSlice<u16>,
    rb: usize,
}

/// Cell bytes of heads `0..Hkv`, cells `0..ncells` of each (f32 caches as LE bytes).
fn cell_bytes(kv: &KvCache, key: bool, ncells: usize) -> Vec<u8> {
    let rb = kv.ty.row_bytes(kv.head_dim);
    let mut out = Vec::with_capacity(kv.n_head_kv * ncells * rb);
    for g in 0..kv.n_head_kv {
        let c = g * kv.capacity;
        if kv.ty == KvType::F32 {
            let src = if key { &kv.k } else { &kv.v };
            let d = kv.head_dim;
            for x in &src[c * d..(c + ncells) * d] {
                out.extend_from_slice(&x.to_le_bytes());
            }
        } else {
            let src = if key { &kv.kq } else { &kv.vq };
            out.extend_from_slice(&src[c * rb..(c + ncells) * rb]);
        }
    }
    out
}

fn upload_kv(d: &Device, kv: &KvCache, ncells: usize) -> Result<DevKv, CudaError> {
    let sh = &kv.shadow;
    Ok(DevKv {
        kc: d.upload(&cell_bytes(kv, true, ncells))?,
        vc: d.upload(&cell_bytes(kv, false, ncells))?,
        ksink: d.upload(&sh.k_sink)?,
        vsink: d.upload(&sh.v_sink)?,
        kwin: d.upload(&sh.k_win)?,
        vwin: d.upload(&sh.v_win)?,
        rb: kv.ty.row_bytes(kv.head_dim),
    })
}

/// Copy what the device wrote back into the host cache: token `t`'s encoded k/v cells
/// (staging rows `[T][Hkv][rb]`, in token order so a ring's later write wins, as on
/// the host) and the shadows (small; downloaded whole).
fn write_back(
    d: &Device,
    kv: &mut KvCache,
    dk: &DevKv,
    pos: &[i32],
    kst: &[u8],
    vst: &[u8],
) -> Result<(), CudaError> {
    let (hkv, rb, dd) = (kv.n_head_kv, dk.rb, kv.head_dim);
    for (t, &p) in pos.iter().enumerate() {
        let p = p as usize;
        let cell = if kv.ring { p % kv.capacity } else { p };
        for g in 0..hkv {
            let s = (t * hkv + g) * rb;
            let c = g * kv.capacity + cell;
            if kv.ty == KvType::F32 {
                for (i, b) in kst[s..s + rb].chunks_exact(4).enumerate() {
                    kv.k[c * dd + i] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
                for (i, b) in vst[s..s + rb].chunks_exact(4).enumerate() {
                    kv.v[c * dd + i] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            } else {
                kv.kq[c * rb..(c + 1) * rb].copy_from_slice(&kst[s..s + rb]);
                kv.vq[c * rb..(c + 1) * rb].copy_from_slice(&vst[s..s + rb]);
            }
        }
    }
    let sh = &mut kv.shadow;
    for (dst, src) in [
        (&mut sh.k_sink, &dk.ksink),
        (&mut sh.v_sink, &dk.vsink),
        (&mut sh.k_win, &dk.kwin),
        (&mut sh.v_win, &dk.vwin),
    ] {
        let n = dst.len();
        if n > 0 {
            dst.copy_from_slice(&d.download(src, n)?);
        }
    }
    Ok(())
}

fn cuda(e: CudaError) -> OpError {
    OpError::Invalid {
        op: "Attention",
        msg: format!("cuda: {e}"),
    }
}

/// Causal GQA attention over any KV cache: see the module doc. Errors (no KV state, a
/// cache of another geometry, positions past a non-ring cache) are the CPU backend's.
pub fn attention(
    d: &Device,
    ins: &[Value<'_>],
    out: &TensorMeta,
    state: Option<&mut LayerState>,
    g: AttnGeom,
) -> Result<Tensor, OpError> {
    const OP: &str = "Attention";
    let t = out.shape.0[1];
    let pos = host_i32(&ins[3]).map_err(cuda)?;
    let pos = pn_ops::reference::common::token_positions(OP, pos, t)?;
    let kv = pn_ops::reference::attention::kv_cache(OP, state, g.n_head_kv, g.d)?;
    kv.check_positions(OP, pos)?;
    if t == 0 || g.n_head == 0 {
        return Ok(Tensor::zeros(out.shape));
    }
    if g.d * 4 > SHARED_MAX {
        return Err(cuda(CudaError::Unsupported(format!(
            "head_dim {} (the kernels keep one head row in shared memory)",
            g.d
        ))));
    }
    let max_p = pos.iter().map(|&p| p as usize).max().unwrap_or(0);
    let ncells = if kv.ring && max_p >= kv.capacity {
        kv.capacity
    } else {
        max_p + 1
    };
    let runs = kv.runs(pos);
    let (y, kst, vst, dk) = run(d, ins, kv, pos, &runs, ncells, g).map_err(cuda)?;
    write_back(d, kv, &dk, pos, &kst, &vst).map_err(cuda)?;
    Ok(Tensor::f32(out.shape, y))
}

type Ran = (Vec<f32>, Vec<u8>, Vec<u8>, DevKv);

fn run(
    d: &Device,
    ins: &[Value<'_>],
    kv: &KvCache,
    pos: &[i32],
    runs: &[(usize, usize)],
    ncells: usize,
    g: AttnGeom,
) -> Result<Ran, CudaError> {
    let (dd, hkv, h, t) = (g.d, g.n_head_kv, g.n_head, pos.len());
    let mut dk = upload_kv(d, kv, ncells)?;
    let q = up_f32(d, &ins[0])?;
    let k = up_f32(d, &ins[1])?;
    let v = up_f32(d, &ins[2])?;
    let dpos = d.upload(pos)?;
    let rb = dk.rb;
    let mut kst = d.alloc::<u8>(t * hkv * rb)?;
    let mut vst = d.alloc::<u8>(t * hkv * rb)?;
    let mut y = d.alloc::<f32>(dd * h * t)?;
    let sh = &kv.shadow;
    let i = |x: usize| x as i32;
    let (ty, di, hi, hkvi, rbi, nci, capi) = (
        ty_code(kv.ty),
        i(dd),
        i(h),
        i(hkv),
        i(rb),
        i(ncells),
        i(kv.capacity),
    );
    let (ring, sink, window, slots) = (kv.ring as i32, i(sh.sink), i(sh.window), i(sh.slots));
    let (rk, rv) = (i(kv.rot_k), i(kv.rot_v));
    let (rsk, rsv) = (rot_scale(kv.rot_k), rot_scale(kv.rot_v));
    let shared = (dd * 4) as u32;
    let visible = |p: i32| p as usize + 1 - kv.first_visible(p as usize);
    let span_max = pos.iter().map(|&p| visible(p)).max().unwrap_or(1);
    let chunk = (SCORES_MAX / (h * span_max)).clamp(1, 65535);
    let mut scores = d.alloc::<f32>(h * chunk.min(t) * span_max)?;
    for &(a, b) in runs {
        let ai = i(a);
        let mut s = d.launch("kv_store")?;
        s.arg(&mut dk.kc)
            .arg(&mut dk.vc)
            .arg(&mut dk.ksink)
            .arg(&mut dk.vsink)
            .arg(&mut dk.kwin)
            .arg(&mut dk.vwin)
            .arg(&mut kst)
            .arg(&mut vst);
        s.arg(&k).arg(&v).arg(&dpos).arg(&ai);
        s.arg(&ty)
            .arg(&di)
            .arg(&hkvi)
            .arg(&rbi)
            .arg(&nci)
            .arg(&capi)
            .arg(&ring)
            .arg(&sink)
            .arg(&slots)
            .arg(&rk)
            .arg(&rsk)
            .arg(&rv)
            .arg(&rsv);
        go(s, cfg((b - a) as u32, hkv as u32, shared))?;
        for t0 in (a..b).step_by(chunk) {
            let n = chunk.min(b - t0);
            let span = pos[t0..t0 + n]
                .iter()
                .map(|&p| visible(p))
                .max()
                .unwrap_or(1);
            let (t0i, spi) = (i(t0), i(span));
            let mut c = d.launch("attn_kv")?;
            c.arg(&q)
                .arg(&dk.kc)
                .arg(&dk.vc)
                .arg(&dk.ksink)
                .arg(&dk.vsink)
                .arg(&dk.kwin)
                .arg(&dk.vwin)
                .arg(&dpos)
                .arg(&mut scores)
                .arg(&mut y);
            c.arg(&t0i)
                .arg(&ty)
                .arg(&di)
                .arg(&hi)
                .arg(&hkvi)
                .arg(&rbi)
                .arg(&nci)
                .arg(&capi)
                .arg(&ring)
                .arg(&sink)
                .arg(&window)
                .arg(&slots)
                .arg(&spi)
                .arg(&rk)
                .arg(&rsk)
                .arg(&rv)
                .arg(&rsv)
                .arg(&g.scale);
            go(c, cfg(h as u32, n as u32, shared))?;
        }
    }
    let yh = d.download(&y, dd * h * t)?;
    let ksh = d.download(&kst, t * hkv * rb)?;
    let vsh = d.download(&vst, t * hkv * rb)?;
    Ok((yh, ksh, vsh, dk))
}

fn cfg(x: u32, y: u32, shared: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (x.max(1), y.max(1), 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: shared,
    }
}

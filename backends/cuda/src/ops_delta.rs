//! The gated delta rule on the device (kernels/delta.cu `delta_rule`, the recurrent form;
//! kernels/delta_chunk.cu, the chunked form), picked by token count like the CPU's
//! `PN_DELTA_CHUNKED_FROM`: from [`CHUNKED_FROM`] tokens (`PN_CUDA_DELTA_CHUNKED_FROM`
//! overrides it) the chunked form, below it the recurrence. Both tile Dv over blocks
//! (rows of S are independent), so any Dv runs on the device. The ssm state is uploaded
//! and downloaded per call (host state is the source of truth, docs/cuda.md).

use crate::device::{go, Device};
use crate::ops_linear::up_f32;
use crate::ops_state::cuda;
use crate::CudaError;
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use pn_ops::{LayerState, OpError, Tensor, TensorMeta, Value};

/// Tokens from which the chunked form runs. On the device the recurrence is one
/// sequential step per token (a block per head walks all T), while the chunked form does
/// one step per 64 tokens with the work inside a chunk spread over the block, so prefill
/// goes chunked; decode and short batches stay recurrent (bitwise the reference's sums).
/// The two differ by float reassociation only (≤ 1e-4 relative, tests/gpu_parity.rs).
pub const CHUNKED_FROM: usize = 64;

/// Tokens per chunk and V rows per block of the chunked kernels (kernels/delta_chunk.cu).
const DC: usize = 64;
const DTJ: usize = 32;
/// Scratch of one group of chunks prepared together, in floats (256 MB).
const SCRATCH_MAX: usize = 1 << 26;
/// Most rows of S per block of the recurrent kernel.
const REC_THREADS: usize = 256;
/// Dynamic shared memory without opting in.
const SHARED_MAX: usize = 48 * 1024;

/// [`CHUNKED_FROM`], or `PN_CUDA_DELTA_CHUNKED_FROM` when set (read once).
pub fn chunked_from() -> usize {
    static V: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *V.get_or_init(|| {
        std::env::var("PN_CUDA_DELTA_CHUNKED_FROM")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(CHUNKED_FROM)
    })
}

#[derive(Clone, Copy)]
struct Geom {
    dk: usize,
    hk: usize,
    dv: usize,
    hv: usize,
    t: usize,
    scale: f32,
}

/// Gated delta rule: state uploaded, updated on the device, downloaded.
pub fn delta_rule(
    d: &Device,
    ins: &[Value<'_>],
    out: &TensorMeta,
    state: Option<&mut LayerState>,
) -> Result<Tensor, OpError> {
    const OP: &str = "DeltaRule";
    let [dk, hk, _, _] = match &ins[0] {
        Value::Act(a) => a.shape.0,
        Value::Weight(_) => {
            return Err(OpError::Invalid {
                op: OP,
                msg: "expected an activation".into(),
            })
        }
    };
    let [dv, hv, t, _] = out.shape.0;
    let st = pn_ops::reference::common::recurrent_state(OP, state)?;
    if st.n_v_heads != hv
        || st.head_k_dim != dk
        || st.head_v_dim != dv
        || st.ssm.len() != hv * dv * dk
    {
        return Err(OpError::Invalid {
            op: OP,
            msg: format!(
                "ssm state [{} heads, Dk {}, Dv {}] does not fit Hv {hv}, Dk {dk}, Dv {dv}",
                st.n_v_heads, st.head_k_dim, st.head_v_dim
            ),
        });
    }
    if dk * dv * hv == 0 || t == 0 {
        return Ok(Tensor::zeros(out.shape));
    }
    let g = Geom {
        dk,
        hk,
        dv,
        hv,
        t,
        scale: 1.0f32 / (dk as f32).sqrt(),
    };
    let run = || -> Result<(Vec<f32>, Vec<f32>), CudaError> {
        let mut s = d.upload(&st.ssm)?;
        let ups: Vec<_> = ins[..5]
            .iter()
            .map(|v| up_f32(d, v))
            .collect::<Result<_, _>>()?;
        let mut y = d.alloc::<f32>(dv * hv * t)?;
        if t >= chunked_from() {
            chunked(d, g, &mut s, &ups, &mut y)?;
        } else {
            recurrent(d, g, &mut s, &ups, &mut y)?;
        }
        Ok((d.download(&y, dv * hv * t)?, d.download(&s, hv * dv * dk)?))
    };
    let (y, s) = run().map_err(cuda(OP))?;
    st.ssm.copy_from_slice(&s);
    Ok(Tensor::f32(out.shape, y))
}

fn i(x: usize) -> i32 {
    x as i32
}

/// `ups`: q, k, v, g, β on the device.
fn recurrent(
    d: &Device,
    g: Geom,
    s: &mut CudaSlice<f32>,
    ups: &[CudaSlice<f32>],
    y: &mut CudaSlice<f32>,
) -> Result<(), CudaError> {
    let threads = g.dv.div_ceil(32).min(REC_THREADS / 32) * 32;
    let use_sh = 2 * g.dk * 4 <= SHARED_MAX;
    let mut b = d.launch("delta_rule")?;
    b.arg(s)
        .arg(&ups[0])
        .arg(&ups[1])
        .arg(&ups[2])
        .arg(&ups[3])
        .arg(&ups[4])
        .arg(y);
    let (dki, hki, dvi, hvi, ti, shi) = (i(g.dk), i(g.hk), i(g.dv), i(g.hv), i(g.t), use_sh as i32);
    b.arg(&dki)
        .arg(&hki)
        .arg(&dvi)
        .arg(&hvi)
        .arg(&ti)
        .arg(&g.scale)
        .arg(&shi);
    let cfg = LaunchConfig {
        grid_dim: (g.hv as u32, g.dv.div_ceil(threads) as u32, 1),
        block_dim: (threads as u32, 1, 1),
        shared_mem_bytes: if use_sh { (2 * g.dk * 4) as u32 } else { 0 },
    };
    go(b, cfg)
}

/// Chunks in groups that fit [`SCRATCH_MAX`]: `delta_chunk_prep` for every chunk of the
/// group at once, then `delta_chunk_apply` through them in order.
fn chunked(
    d: &Device,
    g: Geom,
    s: &mut CudaSlice<f32>,
    ups: &[CudaSlice<f32>],
    y: &mut CudaSlice<f32>,
) -> Result<(), CudaError> {
    let n_chunks = g.t.div_ceil(DC);
    let stride = 2 * DC * DC + DC * g.dk + DC;
    let group = (SCRATCH_MAX / (g.hv * stride)).clamp(1, n_chunks.min(65535));
    let mut scr = d.alloc::<f32>(g.hv * group * stride)?;
    let (dki, hki, dvi, hvi, ti) = (i(g.dk), i(g.hk), i(g.dv), i(g.hv), i(g.t));
    for c0 in (0..n_chunks).step_by(group) {
        let n = group.min(n_chunks - c0);
        let (c0i, ni) = (i(c0), i(n));
        let mut p = d.launch("delta_chunk_prep")?;
        p.arg(&ups[0])
            .arg(&ups[1])
            .arg(&ups[3])
            .arg(&ups[4])
            .arg(&mut scr);
        p.arg(&dki)
            .arg(&hki)
            .arg(&hvi)
            .arg(&ti)
            .arg(&c0i)
            .arg(&g.scale);
        let cfg = LaunchConfig {
            grid_dim: (g.hv as u32, n as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: ((2 * DC * DC + 2 * DC) * 4) as u32,
        };
        go(p, cfg)?;
        let mut a = d.launch("delta_chunk_apply")?;
        a.arg(&mut *s)
            .arg(&ups[0])
            .arg(&ups[1])
            .arg(&ups[2])
            .arg(&scr)
            .arg(&mut *y);
        a.arg(&dki)
            .arg(&hki)
            .arg(&dvi)
            .arg(&hvi)
            .arg(&ti)
            .arg(&c0i)
            .arg(&ni)
            .arg(&g.scale);
        let cfg = LaunchConfig {
            grid_dim: (g.hv as u32, g.dv.div_ceil(DTJ) as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        go(a, cfg)?;
    }
    Ok(())
}

//! The gated delta rule on the device (kernels/delta.cu `delta_rule`, the recurrence;
//! kernels/delta_chunk.cu, the chunked form). The recurrence runs at every length by
//! default, the CPU's numeric policy (backends/cpu/src/delta.rs): the reference's sums in
//! its order, so a prompt gives the same bits in one pass or in chunks of any size, on
//! every backend. The chunked form (≤ 1e-4 relative to it) runs from
//! `PN_CUDA_DELTA_CHUNKED_FROM` tokens when set (or [`set_chunked_from`]), to measure it
//! on a device. Both tile Dv over blocks (rows of S are independent), so any Dv runs on
//! the device. The ssm state is the layer state's device copy (devstate.rs), updated in
//! place.

use crate::device::dynamic_shared_max;
use crate::devstate::RecBufs;
use crate::exec::{Buf, Cx};
use crate::seqtab::SeqTab;
use crate::opnd::Opnd;
use crate::ops_state::cuda;
use crate::CudaError;
use cudarc::driver::LaunchConfig;
use pn_ops::{OpError, TensorMeta};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Tokens from which the chunked form runs by default: never (see the module doc). On the
/// device the recurrence is one sequential step per token (a block per head walks all
/// T), the chunked form one per 64 tokens with the work inside a chunk spread over the
/// block: faster for long prefills, unmeasured on a device so far (docs/cuda.md).
pub const CHUNKED_FROM: usize = usize::MAX;

/// Tokens per chunk and V rows per block of the chunked kernels (kernels/delta_chunk.cu).
const DC: usize = 64;
const DTJ: usize = 32;
/// Scratch of one group of chunks prepared together, in floats (256 MB).
const SCRATCH_MAX: usize = 1 << 26;
/// Most rows of S per block of the recurrent kernel.
const REC_THREADS: usize = 256;

/// The threshold in force (0: not read from the environment yet).
static FROM: AtomicUsize = AtomicUsize::new(0);

/// [`CHUNKED_FROM`], or `PN_CUDA_DELTA_CHUNKED_FROM` when set (read once), or what
/// [`set_chunked_from`] set.
pub fn chunked_from() -> usize {
    match FROM.load(Ordering::Relaxed) {
        0 => {
            let v = std::env::var("PN_CUDA_DELTA_CHUNKED_FROM")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(CHUNKED_FROM)
                .max(1);
            FROM.store(v, Ordering::Relaxed);
            v
        }
        v => v,
    }
}

/// The chunked form from `n` tokens on, process-wide (the parity tests of the chunked
/// kernels; `usize::MAX`: never).
pub fn set_chunked_from(n: usize) {
    FROM.store(n.max(1), Ordering::Relaxed);
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

/// Gated delta rule over the state's device copy (updated in place).
pub fn delta_rule(
    cx: &mut Cx<'_>,
    ins: &[Opnd<'_>],
    y: Buf,
    out: &TensorMeta,
    st: &RecBufs,
) -> Result<(), OpError> {
    let t = out.shape.0[2];
    delta_rule_in(cx, ins, y, out, &[st.ssm], &[t]).map(|_| ())
}

/// [`delta_rule`] for every sequence of a pass at once (`states[z]` sequence z's ssm,
/// `lens[z]` its tokens, in order on the token axis), the recurrence: one launch per
/// [`SeqTab`] of up to 16 sequences. False (nothing run) when a sequence is long enough
/// for the chunked form: the caller runs them one by one.
pub fn delta_rule_seqs(
    cx: &mut Cx<'_>,
    ins: &[Opnd<'_>],
    y: Buf,
    out: &TensorMeta,
    states: &[RecBufs],
    lens: &[usize],
) -> Result<bool, OpError> {
    let ssm: Vec<Buf> = states.iter().map(|s| s.ssm).collect();
    delta_rule_in(cx, ins, y, out, &ssm, lens)
}

/// The sequences `lens` (states `ssm`) of the pass: the recurrence for all of them, or
/// for a single sequence long enough for it, the chunked form. False: a sequence of
/// several is long enough for the chunked form, nothing run.
fn delta_rule_in(cx: &mut Cx<'_>, ins: &[Opnd<'_>], y: Buf, out: &TensorMeta, ssm: &[Buf], lens: &[usize]) -> Result<bool, OpError> {
    const OP: &str = "DeltaRule";
    let chunked = lens.iter().any(|&n| n >= chunked_from());
    if chunked && ssm.len() > 1 {
        return Ok(false);
    }
    let [dk, hk, _, _] = ins[0].act().map_err(cuda(OP))?.1 .0;
    let [dv, hv, t, _] = out.shape.0;
    // the state's shape was checked once (pn_ops::StateShape::check) before its upload
    if dk * dv * hv == 0 || t == 0 {
        return Ok(true);
    }
    let g = Geom {
        dk,
        hk,
        dv,
        hv,
        t,
        scale: 1.0f32 / (dk as f32).sqrt(),
    };
    let run = |cx: &mut Cx<'_>| -> Result<(), CudaError> {
        let mut ups = [Buf::NULL; 5];
        for (u, o) in ups.iter_mut().zip(&ins[..5]) {
            *u = o.f32()?;
        }
        if chunked {
            chunked_form(cx, g, ssm[0], &ups, y)
        } else {
            recurrent(cx, g, ssm, lens, &ups, y)
        }
    };
    run(cx).map_err(cuda(OP))?;
    Ok(true)
}

fn i(x: usize) -> i32 {
    x as i32
}

/// `ups`: q, k, v, g, β on the device. One launch per [`SeqTab`] (grid: V head, row tile,
/// sequence), each block what it computes for its sequence alone.
fn recurrent(cx: &mut Cx<'_>, g: Geom, ssm: &[Buf], lens: &[usize], ups: &[Buf; 5], y: Buf) -> Result<(), CudaError> {
    let threads = g.dv.div_ceil(32).min(REC_THREADS / 32) * 32;
    let use_sh = 2 * g.dk * 4 <= dynamic_shared_max(cx.d.static_shared("delta_rule_seqs"));
    for tab in SeqTab::groups(ssm, lens) {
        let mut b = cx.d.k("delta_rule_seqs")?.val(&tab);
        for u in ups {
            b = b.p(*u);
        }
        let b = b.p(y).i(i(g.dk)).i(i(g.hk)).i(i(g.dv)).i(i(g.hv)).f(g.scale).i(use_sh as i32);
        cx.go(b.cfg(LaunchConfig {
            grid_dim: (g.hv as u32, g.dv.div_ceil(threads) as u32, tab.n as u32),
            block_dim: (threads as u32, 1, 1),
            shared_mem_bytes: if use_sh { (2 * g.dk * 4) as u32 } else { 0 },
        }))?;
    }
    Ok(())
}

/// Chunks in groups that fit [`SCRATCH_MAX`]: `delta_chunk_prep` for every chunk of the
/// group at once, then `delta_chunk_apply` through them in order.
fn chunked_form(cx: &mut Cx<'_>, g: Geom, s: Buf, ups: &[Buf; 5], y: Buf) -> Result<(), CudaError> {
    let n_chunks = g.t.div_ceil(DC);
    let stride = 2 * DC * DC + DC * g.dk + DC;
    let group = (SCRATCH_MAX / (g.hv * stride)).clamp(1, n_chunks.min(65535));
    let scr = cx.tmp4(g.hv * group * stride)?;
    let d = cx.d;
    for c0 in (0..n_chunks).step_by(group) {
        let n = group.min(n_chunks - c0);
        let p = d
            .k("delta_chunk_prep")?
            .p(ups[0])
            .p(ups[1])
            .p(ups[3])
            .p(ups[4])
            .p(scr);
        let p = p
            .i(i(g.dk))
            .i(i(g.hk))
            .i(i(g.hv))
            .i(i(g.t))
            .i(i(c0))
            .f(g.scale);
        cx.go(p.cfg(LaunchConfig {
            grid_dim: (g.hv as u32, n as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: ((2 * DC * DC + 2 * DC) * 4) as u32,
        }))?;
        let a = d
            .k("delta_chunk_apply")?
            .p(s)
            .p(ups[0])
            .p(ups[1])
            .p(ups[2])
            .p(scr)
            .p(y);
        let a = a
            .i(i(g.dk))
            .i(i(g.hk))
            .i(i(g.dv))
            .i(i(g.hv))
            .i(i(g.t))
            .i(i(c0))
            .i(i(n))
            .f(g.scale);
        cx.go(a.cfg(LaunchConfig {
            grid_dim: (g.hv as u32, g.dv.div_ceil(DTJ) as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        }))?;
    }
    Ok(())
}

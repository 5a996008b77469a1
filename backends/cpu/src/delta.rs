//! Gated-DeltaNet state ops: causal conv (parallel over tokens × channel blocks) and the
//! gated delta rule (parallel over V heads; per head the chunked form for prefill, the
//! vectorized recurrence for short batches — see `delta_chunk`).

use crate::par;
use pn_ops::reference::common::{act_f32, out_f32, recurrent_state, weight, weight_f32};
use pn_ops::{LayerState, OpError, RecurrentState, Tensor, TensorMeta, Value};
use crate::delta_chunk::{self, HeadIn, Scratch};
use rayon::prelude::*;
use std::cell::RefCell;

pub fn conv1d_causal(
    ins: &[Value<'_>],
    out: &TensorMeta,
    state: Option<&mut LayerState>,
    d_conv: usize,
) -> Result<Tensor, OpError> {
    const OP: &str = "Conv1dCausal";
    let x = act_f32(OP, &ins[0])?;
    let w = weight_f32(OP, &weight(OP, &ins[1])?)?;
    let c = out.shape.0[0];
    let t = out.shape.rows();
    let st = recurrent_state(OP, state)?;
    let ns = d_conv.saturating_sub(1);
    if d_conv == 0 || st.conv_channels != c || st.conv.len() != ns * c {
        return Err(OpError::Invalid {
            op: OP,
            msg: format!(
                "conv state of {} channels × {} does not fit d_conv {d_conv}, {c} channels",
                st.conv_channels,
                st.conv.len()
            ),
        });
    }
    let conv = &st.conv;
    // Window row r: state row r for r < ns, else token r - ns.
    let win = |r: usize| -> &[f32] {
        if r < ns {
            &conv[r * c..(r + 1) * c]
        } else {
            &x[(r - ns) * c..(r - ns + 1) * c]
        }
    };
    // Taps transposed to [d_conv][c] so the loops run along channels (vectorized); each
    // output still sums its taps in order i = 0.. from 0.0, as the reference.
    let mut wt = vec![0.0f32; d_conv * c];
    for ch in 0..c {
        for i in 0..d_conv {
            wt[i * c + ch] = w[ch * d_conv + i];
        }
    }
    let mut y = vec![0.0f32; t * c];
    par::rows(&mut y, c, 2 * c * d_conv, |ti, yr| {
        for i in 0..d_conv {
            let (xr, wr) = (win(ti + i), &wt[i * c..(i + 1) * c]);
            for ((v, &xv), &tap) in yr.iter_mut().zip(xr).zip(wr) {
                *v += xv * tap;
            }
        }
    });
    // New state: the last ns window rows.
    let mut new_state = Vec::with_capacity(ns * c);
    for r in t..t + ns {
        new_state.extend_from_slice(win(r));
    }
    st.conv.copy_from_slice(&new_state);
    out_f32(OP, out, y)
}

/// Geometry and inputs of one delta-rule call.
struct Delta<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    g: &'a [f32],
    beta: &'a [f32],
    dk: usize,
    hk: usize,
    dv: usize,
    hv: usize,
    t: usize,
}

fn delta_inputs<'a>(
    ins: &[Value<'a>],
    out: &TensorMeta,
    st: &RecurrentState,
) -> Result<Delta<'a>, OpError> {
    const OP: &str = "DeltaRule";
    let [dk, hk, _, _] = ins[0].act().shape.0;
    let [dv, hv, t, _] = out.shape.0;
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
    Ok(Delta {
        q: act_f32(OP, &ins[0])?,
        k: act_f32(OP, &ins[1])?,
        v: act_f32(OP, &ins[2])?,
        g: act_f32(OP, &ins[3])?,
        beta: act_f32(OP, &ins[4])?,
        dk,
        hk,
        dv,
        hv,
        t,
    })
}

/// Tokens from which the chunked form is used (below: the vectorized recurrence). Off by
/// default: the chunked form rounds differently from the recurrence, so a prompt fed in
/// one batch and token by token would differ by ~1e-6 before the quantized matmuls,
/// which their activation rounding amplifies to ~1e-2 in the logits (tests/state.rs and
/// tests/chat.rs ask for 1e-3 on q4_k_m models); and on this machine it is no faster than
/// the vectorized recurrence (docs/perf.md). `PN_DELTA_CHUNKED_FROM=N` turns it on.
pub const CHUNKED_FROM_T: usize = usize::MAX;

/// `CHUNKED_FROM_T`, or `PN_DELTA_CHUNKED_FROM` when set (experiments; read once).
fn chunked_from() -> usize {
    static V: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *V.get_or_init(|| {
        std::env::var("PN_DELTA_CHUNKED_FROM")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(CHUNKED_FROM_T)
    })
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// One V head over all tokens: `s` is the head's state [Dv][Dk], `o` its output [T][Dv].
fn delta_head(p: &Delta<'_>, h: usize, s: &mut [f32], o: &mut [f32]) {
    let kh = h % p.hk;
    let hi = HeadIn {
        q: &p.q[kh * p.dk..],
        k: &p.k[kh * p.dk..],
        v: &p.v[h * p.dv..],
        g: &p.g[h..],
        beta: &p.beta[h..],
        qk_stride: p.hk * p.dk,
        v_stride: p.hv * p.dv,
        gb_stride: p.hv,
        dk: p.dk,
        dv: p.dv,
        t: p.t,
    };
    if p.t >= chunked_from() {
        SCRATCH.with(|sc| delta_chunk::chunked(&hi, s, o, &mut sc.borrow_mut()))
    } else {
        delta_chunk::recurrent(&hi, s, o)
    }
}

pub fn delta_rule(
    ins: &[Value<'_>],
    out: &TensorMeta,
    state: Option<&mut LayerState>,
) -> Result<Tensor, OpError> {
    const OP: &str = "DeltaRule";
    let st = recurrent_state(OP, state)?;
    let p = delta_inputs(ins, out, st)?;
    let (dk, dv, hv, t) = (p.dk, p.dv, p.hv, p.t);
    // Per-head outputs [Hv][T][Dv], then transposed to [T][Hv][Dv].
    let mut oh = vec![0.0f32; hv * t * dv];
    if dk * dv == 0 || t == 0 {
        return out_f32(OP, out, vec![0.0; dv * hv * t]);
    }
    if hv * t * dk * dv < par::SERIAL_WORK || par::outside_pool() {
        st.ssm
            .chunks_mut(dk * dv)
            .zip(oh.chunks_mut(t * dv))
            .enumerate()
            .for_each(|(h, (s, o))| delta_head(&p, h, s, o));
    } else {
        st.ssm
            .par_chunks_mut(dk * dv)
            .zip(oh.par_chunks_mut(t * dv))
            .enumerate()
            .for_each(|(h, (s, o))| delta_head(&p, h, s, o));
    }
    let mut y = vec![0.0f32; dv * hv * t];
    par::rows(&mut y, hv * dv, hv * dv, |ti, yr| {
        for h in 0..hv {
            yr[h * dv..(h + 1) * dv].copy_from_slice(&oh[(h * t + ti) * dv..(h * t + ti + 1) * dv]);
        }
    });
    out_f32(OP, out, y)
}

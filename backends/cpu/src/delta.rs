//! Gated-DeltaNet state ops: causal conv (parallel over tokens × channel blocks) and the
//! gated delta rule (parallel over V heads, sequential over tokens, as in the reference).

use crate::par;
use pn_ops::reference::common::{act_f32, out_f32, recurrent_state, weight, weight_f32};
use pn_ops::{LayerState, OpError, RecurrentState, Tensor, TensorMeta, Value};
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
    let mut y = vec![0.0f32; t * c];
    par::rows(&mut y, c, 2 * c * d_conv, |ti, yr| {
        for (ch, v) in yr.iter_mut().enumerate() {
            let taps = &w[ch * d_conv..(ch + 1) * d_conv];
            let mut sum = 0.0f32;
            for (i, &tap) in taps.iter().enumerate() {
                sum += win(ti + i)[ch] * tap;
            }
            *v = sum;
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

/// Rows of S processed together in the row kernel: independent sums, interleaved for ILP.
const JB: usize = 4;

/// Tokens from which the transposed kernel pays off (it transposes the state twice).
const TRANSPOSE_FROM_T: usize = 4;

/// One V head, state in place ([Dv][Dk]): rows j in groups of JB, each row's sums
/// sequential in i exactly as the reference. Best for decode (no transposition).
fn delta_head_rows(p: &Delta<'_>, h: usize, s: &mut [f32], o: &mut [f32]) {
    let (dk, dv) = (p.dk, p.dv);
    let kh = h % p.hk;
    let scale = 1.0f32 / (dk as f32).sqrt();
    for ti in 0..p.t {
        let qt = &p.q[(ti * p.hk + kh) * dk..][..dk];
        let kt = &p.k[(ti * p.hk + kh) * dk..][..dk];
        let vt = &p.v[(ti * p.hv + h) * dv..][..dv];
        let decay = p.g[ti * p.hv + h].exp();
        let bt = p.beta[ti * p.hv + h];
        let ot = &mut o[ti * dv..(ti + 1) * dv];
        let mut j0 = 0;
        while j0 < dv {
            let nj = JB.min(dv - j0);
            let blk = &mut s[j0 * dk..(j0 + nj) * dk];
            if nj == JB {
                let (r0, rest) = blk.split_at_mut(dk);
                let (r1, rest) = rest.split_at_mut(dk);
                let (r2, r3) = rest.split_at_mut(dk);
                let (mut a0, mut a1, mut a2, mut a3) = (0.0f32, 0.0f32, 0.0f32, 0.0f32);
                for i in 0..dk {
                    let ki = kt[i];
                    r0[i] *= decay;
                    r1[i] *= decay;
                    r2[i] *= decay;
                    r3[i] *= decay;
                    a0 += r0[i] * ki;
                    a1 += r1[i] * ki;
                    a2 += r2[i] * ki;
                    a3 += r3[i] * ki;
                }
                let d0 = (vt[j0] - a0) * bt;
                let d1 = (vt[j0 + 1] - a1) * bt;
                let d2 = (vt[j0 + 2] - a2) * bt;
                let d3 = (vt[j0 + 3] - a3) * bt;
                let (mut b0, mut b1, mut b2, mut b3) = (0.0f32, 0.0f32, 0.0f32, 0.0f32);
                for i in 0..dk {
                    let (ki, qi) = (kt[i], qt[i]);
                    r0[i] += ki * d0;
                    r1[i] += ki * d1;
                    r2[i] += ki * d2;
                    r3[i] += ki * d3;
                    b0 += r0[i] * qi;
                    b1 += r1[i] * qi;
                    b2 += r2[i] * qi;
                    b3 += r3[i] * qi;
                }
                ot[j0] = b0 * scale;
                ot[j0 + 1] = b1 * scale;
                ot[j0 + 2] = b2 * scale;
                ot[j0 + 3] = b3 * scale;
            } else {
                for jj in 0..nj {
                    let r = &mut blk[jj * dk..(jj + 1) * dk];
                    let mut a = 0.0f32;
                    for i in 0..dk {
                        r[i] *= decay;
                        a += r[i] * kt[i];
                    }
                    let dj = (vt[j0 + jj] - a) * bt;
                    let mut b = 0.0f32;
                    for i in 0..dk {
                        r[i] += kt[i] * dj;
                        b += r[i] * qt[i];
                    }
                    ot[j0 + jj] = b * scale;
                }
            }
            j0 += nj;
        }
    }
}

thread_local! {
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// One V head over all tokens. `s` is the head's state [Dv][Dk] (ssm[j][i] = S[i][j]),
/// `o` its output [T][Dv]. The state is worked on transposed, [Dk][Dv], so every loop runs
/// along j (independent outputs) and vectorizes, while each element still sees exactly the
/// reference's float ops in the reference's order: decay, kv_j = Σ_i S[i][j] k_i (i
/// ascending from 0.0), δ_j = (v_j − kv_j)·β, S[i][j] += k_i δ_j, o_j = (Σ_i S[i][j] q_i)·scale.
fn delta_head_transposed(p: &Delta<'_>, h: usize, s: &mut [f32], o: &mut [f32]) {
    let (dk, dv) = (p.dk, p.dv);
    let kh = h % p.hk;
    let scale = 1.0f32 / (dk as f32).sqrt();
    SCRATCH.with(|buf| {
        let mut buf = buf.borrow_mut();
        buf.resize(dk * dv + 3 * dv, 0.0);
        let (st, rest) = buf.split_at_mut(dk * dv);
        let (kv, rest) = rest.split_at_mut(dv);
        let (delta, acc) = rest.split_at_mut(dv);
        for j in 0..dv {
            for i in 0..dk {
                st[i * dv + j] = s[j * dk + i];
            }
        }
        for ti in 0..p.t {
            let qt = &p.q[(ti * p.hk + kh) * dk..][..dk];
            let kt = &p.k[(ti * p.hk + kh) * dk..][..dk];
            let vt = &p.v[(ti * p.hv + h) * dv..][..dv];
            let decay = p.g[ti * p.hv + h].exp();
            let bt = p.beta[ti * p.hv + h];
            kv.fill(0.0);
            for (row, &ki) in st.chunks_exact_mut(dv).zip(kt) {
                for (x, a) in row.iter_mut().zip(kv.iter_mut()) {
                    *x *= decay;
                    *a += *x * ki;
                }
            }
            for ((d, &v), &a) in delta.iter_mut().zip(vt).zip(kv.iter()) {
                *d = (v - a) * bt;
            }
            acc.fill(0.0);
            for ((row, &ki), &qi) in st.chunks_exact_mut(dv).zip(kt).zip(qt) {
                for ((x, &d), a) in row.iter_mut().zip(delta.iter()).zip(acc.iter_mut()) {
                    *x += ki * d;
                    *a += *x * qi;
                }
            }
            for (y, &a) in o[ti * dv..(ti + 1) * dv].iter_mut().zip(acc.iter()) {
                *y = a * scale;
            }
        }
        for j in 0..dv {
            for i in 0..dk {
                s[j * dk + i] = st[i * dv + j];
            }
        }
    });
}

fn delta_head(p: &Delta<'_>, h: usize, s: &mut [f32], o: &mut [f32]) {
    if p.t >= TRANSPOSE_FROM_T {
        delta_head_transposed(p, h, s, o)
    } else {
        delta_head_rows(p, h, s, o)
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
    if hv * t * dk * dv < par::SERIAL_WORK {
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

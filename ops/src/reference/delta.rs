//! Gated-DeltaNet state ops: causal depthwise conv (spec §4.4.2) and the gated delta
//! rule recurrence (§4.4.4), both sequential over tokens.

use super::common::{act_f32, out_f32, recurrent_state, weight, weight_f32};
use crate::state::history;
use crate::{LayerState, OpError, Tensor, TensorMeta, Value};

/// out[t][c] = Σ_{i<d_conv} X_c[t+i]·w[c][i] over X_c = [state | x]; the state keeps the
/// last d_conv−1 entries of the window.
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
    let ns = d_conv - 1;
    // window[r][c], r in 0..ns+t
    let mut win = Vec::with_capacity((ns + t) * c);
    win.extend_from_slice(&st.conv);
    win.extend_from_slice(x);
    let mut y = vec![0.0f32; t * c];
    for ti in 0..t {
        for ch in 0..c {
            let mut sum = 0.0f32;
            for i in 0..d_conv {
                sum += win[(ti + i) * c + ch] * w[ch * d_conv + i];
            }
            y[ti * c + ch] = sum;
        }
    }
    if let Some(mut h) = history::take(st) {
        history::write_conv(&mut h, t, ns, c, &|r| &win[r * c..(r + 1) * c]);
        history::put(st, h);
    }
    st.conv.copy_from_slice(&win[t * c..]);
    out_f32(OP, out, y)
}

/// Spec §4.4.4, per V head h (K head h mod Hk), strictly sequential over tokens:
/// S *= expf(g); kv_j = Σ_i S[i][j] k_i; δ_j = (v_j − kv_j)·β; S[i][j] += k_i δ_j;
/// o_j = (Σ_i S[i][j] q_i) · 1/sqrtf(Dk). State layout ssm[h][j][i] = S_h[i][j].
pub fn delta_rule(
    ins: &[Value<'_>],
    out: &TensorMeta,
    state: Option<&mut LayerState>,
) -> Result<Tensor, OpError> {
    const OP: &str = "DeltaRule";
    let q = act_f32(OP, &ins[0])?;
    let k = act_f32(OP, &ins[1])?;
    let v = act_f32(OP, &ins[2])?;
    let g = act_f32(OP, &ins[3])?;
    let beta = act_f32(OP, &ins[4])?;
    let [dk, hk, _, _] = ins[0].act().shape.0;
    let [dv, hv, t, _] = out.shape.0;
    let st = recurrent_state(OP, state)?;
    let scale = 1.0f32 / (dk as f32).sqrt();
    let mut y = vec![0.0f32; dv * hv * t];
    let mut kv = vec![0.0f32; dv];
    let mut delta = vec![0.0f32; dv];
    // per-token history for a rollback (state/history.rs): states after tokens first..
    let mut hist = history::take(st);
    let (first, n_keep) = hist.as_ref().map_or((t, 0), |h| h.span(t));
    let per = dv * dk;
    for h in 0..hv {
        let kh = h % hk;
        let s = &mut st.ssm[h * dv * dk..(h + 1) * dv * dk];
        for ti in 0..t {
            let qt = &q[(ti * hk + kh) * dk..][..dk];
            let kt = &k[(ti * hk + kh) * dk..][..dk];
            let vt = &v[(ti * hv + h) * dv..][..dv];
            let gt = g[ti * hv + h];
            let bt = beta[ti * hv + h];
            let decay = gt.exp();
            for x in s.iter_mut() {
                *x *= decay;
            }
            for j in 0..dv {
                let mut acc = 0.0f32;
                for i in 0..dk {
                    acc += s[j * dk + i] * kt[i];
                }
                kv[j] = acc;
            }
            for j in 0..dv {
                delta[j] = (vt[j] - kv[j]) * bt;
            }
            for j in 0..dv {
                for i in 0..dk {
                    s[j * dk + i] += kt[i] * delta[j];
                }
            }
            let o = &mut y[(ti * hv + h) * dv..][..dv];
            for j in 0..dv {
                let mut acc = 0.0f32;
                for i in 0..dk {
                    acc += s[j * dk + i] * qt[i];
                }
                o[j] = acc * scale;
            }
            if let Some(hs) = hist.as_mut().filter(|_| ti >= first && ti < first + n_keep) {
                hs.ssm[ti - first][h * per..(h + 1) * per].copy_from_slice(s);
            }
        }
    }
    if let Some(mut hs) = hist {
        hs.wrote_ssm(t);
        history::put(st, hs);
    }
    out_f32(OP, out, y)
}

//! Stateful ops: attention over the KV cache, causal conv, gated delta rule.
//!
//! The layer state lives in host memory (`pn_ops::LayerState`) under today's Backend
//! trait, and stays the source of truth: each call uploads the part of the state it
//! reads, runs on the device, and writes the updated state back (docs/cuda.md).
//! Configurations the kernels do not take are handed back to the caller
//! ([`Outcome::OnCpu`]), which runs them on the CPU backend.

use crate::device::{go, grid1, Device};
use crate::ops_linear::{host_i32, up_f32, weight};
use crate::CudaError;
use cudarc::driver::{LaunchConfig, PushKernelArg};
use pn_ops::{KvType, LayerState, OpError, Tensor, TensorMeta, Value};

pub enum Outcome<'s> {
    Done(Tensor),
    /// Not for the device kernels: run it on the CPU with this state.
    OnCpu(Option<&'s mut LayerState>),
}

#[derive(Clone, Copy)]
pub struct AttnGeom {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub d: usize,
    pub scale: f32,
}

/// Scores scratch of one attention launch, in floats (chunks of tokens above it).
const SCORES_MAX: usize = 1 << 26;

fn cuda(op: &'static str) -> impl Fn(CudaError) -> OpError {
    move |e| OpError::Invalid {
        op,
        msg: format!("cuda: {e}"),
    }
}

/// Causal GQA attention over an f32 KV cache (no shadows, no rotation, no wrapped
/// ring): the cells `0..=max(pos)` are uploaded, k/v stored on the device, attention
/// computed there, and k/v written to the host cache as well.
pub fn attention<'s>(
    d: &Device,
    ins: &[Value<'_>],
    out: &TensorMeta,
    state: Option<&'s mut LayerState>,
    g: AttnGeom,
) -> Result<Outcome<'s>, OpError> {
    const OP: &str = "Attention";
    let err = cuda(OP);
    let t = out.shape.0[1];
    let pos = host_i32(&ins[3]).map_err(&err)?;
    let Some(st) = state else {
        return Ok(Outcome::OnCpu(None));
    }; // the CPU reports it
    let pos = pn_ops::reference::common::token_positions(OP, pos, t)?;
    let max_p = pos.iter().copied().max().unwrap_or(0).max(0) as usize;
    let device_ok = match &*st {
        LayerState::Kv(kv) => {
            kv.check(OP, g.n_head_kv, g.d)?;
            kv.check_positions(OP, pos)?;
            let sh = &kv.shadow;
            kv.ty == KvType::F32
                && sh.sink == 0
                && sh.window == 0
                && kv.rot_k == 0
                && kv.rot_v == 0
                && max_p < kv.capacity
                && g.d <= 1024
                && t > 0
        }
        _ => false,
    };
    if !device_ok {
        return Ok(Outcome::OnCpu(Some(st)));
    }
    let LayerState::Kv(kv) = st else {
        return Ok(Outcome::OnCpu(None));
    };
    let (dd, hkv, h) = (g.d, g.n_head_kv, g.n_head);
    let ctx = max_p + 1;
    let (mut kh, mut vh) = (
        Vec::with_capacity(hkv * ctx * dd),
        Vec::with_capacity(hkv * ctx * dd),
    );
    for gi in 0..hkv {
        let c = kv.cell(gi, 0);
        kh.extend_from_slice(&kv.k[c..c + ctx * dd]);
        vh.extend_from_slice(&kv.v[c..c + ctx * dd]);
    }
    let run = || -> Result<Vec<f32>, CudaError> {
        let (mut kc, mut vc) = (d.upload(&kh)?, d.upload(&vh)?);
        let q = up_f32(d, &ins[0])?;
        let k = up_f32(d, &ins[1])?;
        let v = up_f32(d, &ins[2])?;
        let dpos = d.upload(pos)?;
        let (di, hkvi, ti, hi, ci) = (dd as i32, hkv as i32, t as i32, h as i32, ctx as i32);
        let mut b = d.launch("kv_store")?;
        b.arg(&mut kc)
            .arg(&mut vc)
            .arg(&k)
            .arg(&v)
            .arg(&dpos)
            .arg(&di)
            .arg(&hkvi)
            .arg(&ti)
            .arg(&ci);
        go(b, grid1(dd * hkv * t, 256))?;
        let mut y = d.alloc::<f32>(dd * h * t)?;
        let chunk = (SCORES_MAX / (h * ctx)).clamp(1, 65535);
        let mut scores = d.alloc::<f32>(h * chunk.min(t) * ctx)?;
        for t0 in (0..t).step_by(chunk) {
            let n = chunk.min(t - t0);
            let (qv, pv) = (q.slice(t0 * h * dd..), dpos.slice(t0..));
            let mut yv = y.slice_mut(t0 * h * dd..);
            let ni = n as i32;
            let mut b = d.launch("attn_f32")?;
            b.arg(&qv)
                .arg(&kc)
                .arg(&vc)
                .arg(&pv)
                .arg(&mut scores)
                .arg(&mut yv);
            b.arg(&di)
                .arg(&hi)
                .arg(&hkvi)
                .arg(&ni)
                .arg(&ci)
                .arg(&ci)
                .arg(&g.scale);
            let cfg = LaunchConfig {
                grid_dim: (h as u32, n as u32, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            };
            go(b, cfg)?;
        }
        d.download(&y, dd * h * t)
    };
    let y = run().map_err(&err)?;
    // keep the host cache (the source of truth) up to date
    let (kx, vx) = (act_f32(&ins[1])?, act_f32(&ins[2])?);
    for (ti, &p) in pos.iter().enumerate() {
        for gi in 0..hkv {
            let s = (ti * hkv + gi) * dd;
            kv.write(gi, p as usize, &kx[s..s + dd], &vx[s..s + dd]);
        }
    }
    Ok(Outcome::Done(Tensor::f32(out.shape, y)))
}

fn act_f32<'a>(v: &Value<'a>) -> Result<&'a [f32], OpError> {
    pn_ops::reference::common::act_f32("Attention", v)
}

/// Depthwise causal conv with its window state: state and x uploaded, output and the
/// new state (the last d_conv−1 window rows) computed on the device and downloaded.
pub fn conv1d(
    d: &Device,
    ins: &[Value<'_>],
    out: &TensorMeta,
    state: Option<&mut LayerState>,
    d_conv: usize,
) -> Result<Tensor, OpError> {
    const OP: &str = "Conv1dCausal";
    let c = out.shape.0[0];
    let t = out.shape.rows();
    let st = pn_ops::reference::common::conv_state(OP, state, d_conv, c)?;
    let ns = d_conv - 1;
    let run = || -> Result<(Vec<f32>, Vec<f32>), CudaError> {
        let w = d.weight_f32(&weight(&ins[1])?)?;
        let s0 = d.upload(&st.conv)?;
        let x = up_f32(d, &ins[0])?;
        let mut y = d.alloc::<f32>(c * t)?;
        let mut s1 = d.alloc::<f32>(ns * c)?;
        let (ci, ti, di) = (c as i32, t as i32, d_conv as i32);
        let mut b = d.launch("conv1d_causal")?;
        b.arg(&s0)
            .arg(&x)
            .arg(&w.buf)
            .arg(&mut y)
            .arg(&ci)
            .arg(&ti)
            .arg(&di);
        go(b, grid1(c * t, 256))?;
        let mut b = d.launch("conv_state_update")?;
        b.arg(&s0).arg(&x).arg(&mut s1).arg(&ci).arg(&ti).arg(&di);
        go(b, grid1(ns * c, 256))?;
        Ok((d.download(&y, c * t)?, d.download(&s1, ns * c)?))
    };
    let (y, s1) = run().map_err(cuda(OP))?;
    st.conv.copy_from_slice(&s1);
    Ok(Tensor::f32(out.shape, y))
}

/// Gated delta rule: the ssm state uploaded, updated on the device (one block per V
/// head, sequential over tokens) and downloaded.
pub fn delta_rule<'s>(
    d: &Device,
    ins: &[Value<'_>],
    out: &TensorMeta,
    state: Option<&'s mut LayerState>,
) -> Result<Outcome<'s>, OpError> {
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
    if dv > 1024 || 2 * dk * 4 > 48 * 1024 {
        return Ok(Outcome::OnCpu(state));
    }
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
    let scale = 1.0f32 / (dk as f32).sqrt();
    let run = || -> Result<(Vec<f32>, Vec<f32>), CudaError> {
        let mut s = d.upload(&st.ssm)?;
        let ups: Vec<_> = ins[..5]
            .iter()
            .map(|v| up_f32(d, v))
            .collect::<Result<_, _>>()?;
        let mut y = d.alloc::<f32>(dv * hv * t)?;
        let (dki, hki, dvi, hvi, ti) = (dk as i32, hk as i32, dv as i32, hv as i32, t as i32);
        let mut b = d.launch("delta_rule")?;
        b.arg(&mut s)
            .arg(&ups[0])
            .arg(&ups[1])
            .arg(&ups[2])
            .arg(&ups[3])
            .arg(&ups[4])
            .arg(&mut y);
        b.arg(&dki)
            .arg(&hki)
            .arg(&dvi)
            .arg(&hvi)
            .arg(&ti)
            .arg(&scale);
        let threads = dv.div_ceil(32).max(1) as u32 * 32;
        let cfg = LaunchConfig {
            grid_dim: (hv.max(1) as u32, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: (2 * dk * 4) as u32,
        };
        if hv > 0 {
            go(b, cfg)?;
        }
        Ok((d.download(&y, dv * hv * t)?, d.download(&s, hv * dv * dk)?))
    };
    let (y, s) = run().map_err(cuda(OP))?;
    st.ssm.copy_from_slice(&s);
    Ok(Outcome::Done(Tensor::f32(out.shape, y)))
}

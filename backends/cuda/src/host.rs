//! The host protocol (`Backend::execute`): the same ops as the resident path
//! (dispatch.rs), with every activation input uploaded into a temporary, the output
//! downloaded, and a stateful op's layer state copied to the device around the call
//! (the part it reads; what it changed copied back).

use crate::device::Device;
use crate::devstate::{DevKv, DevRec, DevState};
use crate::dispatch::{run, to_op_error};
use crate::exec::Cx;
use crate::opnd::{value_bytes, Opnd};
use crate::ops_attn::cells_read;
use pn_ops::reference::common::{recurrent_state, token_positions};
use pn_ops::{DType, LayerState, Op, OpError, Tensor, TensorData, TensorMeta, Value};

/// One op with host tensors in and out (`validate`d, its state `validate_state`d by the
/// caller).
pub fn execute(
    d: &Device,
    op: &Op,
    ins: &[Value<'_>],
    out: &TensorMeta,
    state: Option<&mut LayerState>,
) -> Result<Tensor, OpError> {
    let k = op.kind();
    let ce = |e| to_op_error(k, e);
    if let Op::Reshape(_) = op {
        // same data, new shape: no device work
        return pn_ops::reference::elementwise::reshape(ins, out);
    }
    let mut cx = Cx::host(d);
    let mut opnds = Vec::with_capacity(ins.len());
    for v in ins {
        opnds.push(match v {
            Value::Weight(w) => Opnd::Weight(*w),
            Value::Act(t) => {
                let (buf, host) = match &t.data {
                    TensorData::F32(x) => (cx.upload(x).map_err(ce)?, None),
                    TensorData::I32(x) => (cx.upload(x).map_err(ce)?, Some(&x[..])),
                };
                let meta = TensorMeta {
                    shape: t.shape,
                    dtype: t.dtype(),
                };
                Opnd::Act { buf, meta, host }
            }
        });
    }
    let bytes = value_bytes(out).map_err(|msg| OpError::Invalid { op: k, msg })?;
    let y = cx.tmp(bytes).map_err(ce)?;
    match op {
        Op::Attention { .. } => {
            let kv = pn_ops::reference::attention::kv_cache(k, state)?;
            let t = out.shape.0[1];
            let pos = opnds[3].host().ok_or_else(|| OpError::Invalid {
                op: k,
                msg: "positions must be i32".into(),
            })?;
            let pos = token_positions(k, pos, t)?;
            kv.check_positions(k, pos)?;
            let mut ds = DevState::Kv(Box::new(
                DevKv::host_temp(d, kv, cells_read(kv, pos), t).map_err(ce)?,
            ));
            run(&mut cx, op, &opnds, y, out, Some(&mut ds))?;
            if let DevState::Kv(dk) = &ds {
                dk.write_back(d, kv, pos).map_err(ce)?;
            }
        }
        Op::Conv1dCausal { .. } => {
            let st = recurrent_state(k, state)?;
            let mut ds = DevState::Rec(DevRec::host_temp(d, st, true).map_err(ce)?);
            run(&mut cx, op, &opnds, y, out, Some(&mut ds))?;
            if let DevState::Rec(r) = &ds {
                r.write_back(d, st, true).map_err(ce)?;
            }
        }
        Op::DeltaRule { .. } => {
            let st = recurrent_state(k, state)?;
            let mut ds = DevState::Rec(DevRec::host_temp(d, st, false).map_err(ce)?);
            run(&mut cx, op, &opnds, y, out, Some(&mut ds))?;
            if let DevState::Rec(r) = &ds {
                r.write_back(d, st, false).map_err(ce)?;
            }
        }
        _ => run(&mut cx, op, &opnds, y, out, None)?,
    }
    let n = out.shape.numel();
    let data = if out.dtype == DType::I32 {
        let mut v = vec![0i32; n];
        d.dtoh(&mut v, y).map_err(ce)?;
        TensorData::I32(v)
    } else {
        let mut v = vec![0f32; n];
        d.dtoh(&mut v, y).map_err(ce)?;
        TensorData::F32(v)
    };
    Ok(Tensor {
        shape: out.shape,
        data,
    })
}

//! Causal conv with its window state (attention: ops_attn.rs; delta rule: ops_delta.rs),
//! over the state's device copy (devstate.rs): the output and the new window are
//! computed on the device, the window updated in place (through a temporary).

use crate::device::grid1;
use cudarc::driver::LaunchConfig;
use crate::devstate::RecBufs;
use crate::exec::{Buf, Cx};
use crate::seqtab::SeqTab;
use crate::opnd::Opnd;
use crate::CudaError;
use pn_ops::{OpError, TensorMeta};

pub(crate) fn cuda(op: &'static str) -> impl Fn(CudaError) -> OpError {
    move |e| OpError::Invalid {
        op,
        msg: format!("cuda: {e}"),
    }
}

/// Depthwise causal conv with its window state.
pub fn conv1d(
    cx: &mut Cx<'_>,
    ins: &[Opnd<'_>],
    y: Buf,
    out: &TensorMeta,
    st: &RecBufs,
    d_conv: usize,
) -> Result<(), OpError> {
    conv1d_seqs(cx, ins, y, out, std::slice::from_ref(st), &[out.shape.rows()], d_conv)
}

/// [`conv1d`] for every sequence of a pass at once (`states[z]` sequence z's window,
/// `lens[z]` its tokens, in order on the token axis): one launch per [`SeqTab`] of up to 16
/// sequences for the output, one for the new windows and one storing them back, each
/// thread computing what it computes for its sequence alone.
pub fn conv1d_seqs(
    cx: &mut Cx<'_>,
    ins: &[Opnd<'_>],
    y: Buf,
    out: &TensorMeta,
    states: &[RecBufs],
    lens: &[usize],
    d_conv: usize,
) -> Result<(), OpError> {
    const OP: &str = "Conv1dCausal";
    let c = out.shape.0[0];
    let t = out.shape.rows();
    let ns = d_conv.saturating_sub(1);
    // the states' shapes were checked once (pn_ops::StateShape::check) before their upload
    if c * t == 0 {
        return Ok(());
    }
    let conv: Vec<Buf> = states.iter().map(|s| s.conv).collect();
    let run = |cx: &mut Cx<'_>| -> Result<(), CudaError> {
        let d = cx.d;
        let w = d.weight_f32(&ins[1].weight()?)?;
        let x = ins[0].f32()?;
        let (ci, di) = (c as i32, d_conv as i32);
        for tab in SeqTab::groups(&conv, lens) {
            cx.go(d.k("conv1d_causal_seqs")?.val(&tab).p(x).p(w.ptr).p(y).i(ci).i(di).cfg(grid1(c * tab.tokens(), 256)))?;
            if ns * c == 0 {
                continue;
            }
            let s1 = cx.tmp4(tab.n as usize * ns * c)?;
            let per_seq = |blocks: LaunchConfig| LaunchConfig { grid_dim: (blocks.grid_dim.0, tab.n as u32, 1), ..blocks };
            cx.go(d.k("conv_state_update_seqs")?.val(&tab).p(x).p(s1).i(ci).i(di).cfg(per_seq(grid1(ns * c, 256))))?;
            cx.go(d.k("conv_state_store_seqs")?.val(&tab).p(s1).i(ci).i(di).cfg(per_seq(grid1(ns * c, 256))))?;
        }
        Ok(())
    };
    run(cx).map_err(cuda(OP))
}

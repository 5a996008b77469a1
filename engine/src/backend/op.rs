//! One op through the protocol on any backend ([`execute_op`]): what the op-level parity
//! harnesses run, so every backend (reference, CPU, CUDA, the mock) is tested the same way.

use super::*;
use pn_ops::Value;
use std::sync::atomic::{AtomicU64, Ordering};

static NEXT_ARENA: AtomicU64 = AtomicU64::new(1);

/// A process-unique arena id ([`SlotId::arena`]).
pub fn new_arena() -> u64 {
    NEXT_ARENA.fetch_add(1, Ordering::Relaxed)
}

/// Runs `op` on `b` as a one-op segment of a private arena: the activation inputs
/// uploaded into fresh slots, the segment compiled and run, the result of `meta`
/// downloaded; `state` (a stateful op) computed in place on the host copy (host memory)
/// or uploaded, updated there and downloaded back (a device). The arena and the device
/// copy of the state are released afterwards, also on failure. The state is checked
/// first ([`Op::check_state`]), as the runner checks a pass's.
pub fn execute_op(
    b: &Arc<dyn Backend>,
    op: &Op,
    ins: &[Value<'_>],
    meta: &TensorMeta,
    state: Option<&mut LayerState>,
) -> Result<Tensor, OpError> {
    let metas: SmallVec<[TensorMeta; 6]> = ins.iter().map(pn_ops::reference::common::meta_of).collect();
    op.check_state(&metas, state.as_deref())?;
    let arena = new_arena();
    let slot = |i: usize| SlotId { arena, class: 0, slot: i as u32 };
    let res = run_in(b, arena, &slot, op, ins, meta, state);
    b.release(arena);
    res
}

fn run_in(
    b: &Arc<dyn Backend>,
    arena: u64,
    slot: &dyn Fn(usize) -> SlotId,
    op: &Op,
    ins: &[Value<'_>],
    meta: &TensorMeta,
    state: Option<&mut LayerState>,
) -> Result<Tensor, OpError> {
    let mut specs: Vec<SlotSpec> = ins
        .iter()
        .enumerate()
        .filter_map(|(i, v)| match v {
            Value::Act(t) => Some(SlotSpec { id: slot(i), dtype: t.dtype(), bytes: 4 * t.shape.numel() }),
            Value::Weight(_) => None,
        })
        .collect();
    let out = slot(ins.len());
    specs.push(SlotSpec { id: out, dtype: meta.dtype, bytes: 4 * meta.shape.numel() });
    b.reserve(&specs)?;
    let mut weights = Vec::new();
    let mut inputs = SmallVec::new();
    for (i, v) in ins.iter().enumerate() {
        match v {
            Value::Act(t) => {
                b.upload(slot(i), t)?;
                inputs.push(OpInput::Slot(slot(i), TensorMeta { dtype: t.dtype(), shape: t.shape }));
            }
            Value::Weight(w) => {
                inputs.push(OpInput::Weight(weights.len() as u32));
                weights.push(*w);
            }
        }
    }
    let code = OpCode { op: op.clone(), inputs, meta: *meta, out, state: state.as_ref().map(|_| 0) };
    let seg = SegmentCode { arena, segment: 0, n_tokens: 0, seqs: 1, all_logits: false, stable: false, ops: vec![code] };
    let exe = b.clone().compile(seg)?;
    let key = StateKey { seq: arena, layer: 0 };
    let device = b.memory() == Memory::Device;
    let mut host: Option<&mut LayerState> = None;
    if let Some(st) = state {
        if device {
            b.state(StateOp::Upload(key, &mut *st))?;
        }
        host = Some(st);
    }
    let spans = [SeqSpan { start: 0, len: 0 }];
    let ran = {
        let mut one: SmallVec<[&mut [LayerState]; 1]> = SmallVec::new();
        if let (Some(st), false) = (host.as_mut(), device) {
            one.push(std::slice::from_mut(&mut **st));
        }
        let mut io = PassIo { weights: &weights, spans: &spans, ids: &[key.seq], layers: &mut one, timing: None, observe: None };
        exe.run(&mut io).map_err(|e| e.source)
    };
    let back = match (host, device) {
        (Some(st), true) => {
            let r = b.state(StateOp::Download(key, st)).map(|_| ());
            let _ = b.state(StateOp::Release(key));
            r
        }
        _ => Ok(()),
    };
    ran?;
    back?;
    let mut t = Tensor { shape: pn_ops::Shape::d1(0), data: TensorData::F32(Vec::new()) };
    b.download(out, meta, &mut t)?;
    Ok(t)
}

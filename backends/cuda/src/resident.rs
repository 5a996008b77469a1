//! The resident protocol (`pn_engine::Backend::resident`, docs/cuda.md) on the device:
//! one device buffer per runner slot, layer states on the device by key, ops on slots.
//!
//! Per decode step the runner uploads the token ids and positions (pinned staging,
//! asynchronous), every op runs on slot buffers and device states (no host round trip),
//! and the logits are downloaded: the download is the step's only wait for the device.
//! Segments and CUDA graphs: segment.rs.

use crate::capture::{OpenSeg, ResidentStats};
use crate::device::{drv, ptr_of, Device};
use crate::devstate::DevState;
use crate::dispatch::{self, to_op_error};
use crate::exec::{launch, Buf, Cmd, Cx, Scratch};
use crate::opnd::{slice_opnd, token_slice, validate, Opnd};
use crate::tables::{Keyed, SlotMem, SlotTable};
use crate::{CudaBackend, CudaError};
use cudarc::driver::{result, CudaEvent, CudaSlice, PinnedHostSlice};
use pn_engine::{Backend, ResidentInput, SlotId, SlotSpec, StateKey};
use pn_ops::{DType, LayerSnapshot, LayerState, Op, OpError, Tensor, TensorData, TensorMeta};
use std::sync::MutexGuard;

/// A slot's device buffer, and its pinned staging for uploads (made on first upload;
/// the event says when the last copy out of it is done).
pub struct DevSlot {
    pub mem: CudaSlice<u8>,
    staging: Option<(PinnedHostSlice<u8>, CudaEvent)>,
}

impl SlotMem for DevSlot {
    fn bytes(&self) -> usize {
        self.mem.len()
    }
}

/// Everything the resident path keeps (behind the backend's `res` mutex).
#[derive(Default)]
pub struct ResState {
    pub slots: SlotTable<DevSlot>,
    pub states: Keyed<DevState>,
    pub scratch: Scratch<CudaSlice<u8>>,
    pub seg: Option<OpenSeg>,
    pub policy: crate::capture::CapturePolicy,
    pub stats: ResidentStats,
}

fn err(op: &'static str) -> impl Fn(String) -> OpError {
    move |msg| OpError::Invalid { op, msg }
}

fn host_bytes(t: &Tensor) -> &[u8] {
    match &t.data {
        // SAFETY: f32 / i32 have no padding; the byte view covers exactly the vector.
        TensorData::F32(v) => unsafe {
            std::slice::from_raw_parts(v.as_ptr() as *const u8, 4 * v.len())
        },
        TensorData::I32(v) => unsafe {
            std::slice::from_raw_parts(v.as_ptr() as *const u8, 4 * v.len())
        },
    }
}

impl ResState {
    /// Launches deferred commands now (something needs the stream mid-segment); the rest
    /// of the segment runs directly.
    pub fn flush(&mut self, d: &Device) -> Result<(), CudaError> {
        let Some(s) = self.seg.as_mut() else {
            return Ok(());
        };
        let cmds = s.take_for_flush();
        if !cmds.is_empty() {
            self.stats.flushes += 1;
        }
        cmds.iter().try_for_each(|c| launch(d, c))
    }

    /// One op (`lens: None`) or a stateful op per sequence (`lens`: tokens per sequence,
    /// `keys[i]` its state).
    #[allow(clippy::too_many_arguments)]
    pub fn exec(
        &mut self,
        d: &Device,
        op: &Op,
        inputs: &[ResidentInput<'_>],
        meta: &TensorMeta,
        keys: &[StateKey],
        lens: Option<&[usize]>,
        out: SlotId,
    ) -> Result<(), OpError> {
        let k = op.kind();
        let e = err(k);
        let ResState {
            slots,
            states,
            scratch,
            seg,
            stats,
            ..
        } = self;
        let mut ins = Vec::with_capacity(inputs.len());
        for i in inputs {
            ins.push(match i {
                ResidentInput::Weight(w) => Opnd::Weight(*w),
                ResidentInput::Slot(id, m) => {
                    if *id == out {
                        return Err(e(format!("{id} is both an input and the output")));
                    }
                    let (s, bytes) = slots.value(*id, m).map_err(&e)?;
                    Opnd::Act {
                        buf: ptr_of(&s.mem.mem).at(0, bytes),
                        meta: *m,
                        host: slots.mirror(*id, m),
                    }
                }
            });
        }
        validate(op, &ins, meta)?;
        let (o, bytes) = slots.value(out, meta).map_err(&e)?;
        let y = ptr_of(&o.mem.mem).at(0, bytes);
        let defer = seg.as_mut().filter(|s| s.defer).map(|s| &mut s.pending);
        let mut cx = Cx::resident(d, scratch, defer);
        let res = match lens {
            None => {
                cx.new_op();
                let st = match (op.state(), keys.first()) {
                    (None, _) => None,
                    (Some(_), Some(&key)) => Some(states.get_mut(key).map_err(&e)?),
                    (Some(_), None) => return Err(e("a stateful op without a layer state".into())),
                };
                dispatch::run(&mut cx, op, &ins, y, meta, st)
            }
            Some(lens) if matches!(op, Op::LastRows { .. }) => {
                cx.new_op();
                crate::ops_misc::last_rows(&mut cx, &ins, y, meta, lens).map_err(|x| to_op_error(k, x))
            }
            Some(lens) => multi(&mut cx, op, &ins, y, meta, states, keys, lens),
        };
        let issued = cx.issued;
        drop(cx);
        stats.ops += 1;
        stats.commands += issued as u64;
        if let Some(s) = seg.as_mut() {
            s.issued += issued;
        }
        res?;
        slots.written(out);
        Ok(())
    }
}

/// The stateful `op` once per sequence on its slice of the token axis (the host
/// reference is `pn_ops::reference::seqs::per_sequence`, the default `HostKernels::kernel_seqs`).
#[allow(clippy::too_many_arguments)]
fn multi(
    cx: &mut Cx<'_>,
    op: &Op,
    ins: &[Opnd<'_>],
    y: Buf,
    meta: &TensorMeta,
    states: &mut Keyed<DevState>,
    keys: &[StateKey],
    lens: &[usize],
) -> Result<(), OpError> {
    let e = err(op.kind());
    if keys.len() != lens.len() {
        return Err(e(format!(
            "{} states for {} sequences",
            keys.len(),
            lens.len()
        )));
    }
    let t: usize = lens.iter().sum();
    // the operands hold the pass's t tokens on their token axis (the offsets of the
    // all-sequence kernels below, and the slices of the per-sequence launches)
    for o in ins {
        slice_opnd(o, t, 0, t).map_err(&e)?;
    }
    token_slice(&meta.shape, t, 0, t).map_err(&e)?;
    if matches!(op, Op::DeltaRule { .. } | Op::Conv1dCausal { .. }) && lens.len() > 1 {
        // every sequence in one launch (per 16), each on its row's state in place
        let mut bufs = Vec::with_capacity(keys.len());
        for &key in keys {
            match states.get_mut(key).map_err(&e)? {
                DevState::Rec(r) => bufs.push(r.bufs()),
                _ => return Err(e(format!("{} needs a recurrent layer state", op.kind()))),
            }
        }
        cx.new_op();
        match op {
            Op::Conv1dCausal { d_conv, .. } => return crate::ops_state::conv1d_seqs(cx, ins, y, meta, &bufs, lens, *d_conv),
            _ => {
                if crate::ops_delta::delta_rule_seqs(cx, ins, y, meta, &bufs, lens)? {
                    return Ok(());
                }
            }
        }
    }
    // Attention: the sequences with one token (a decode pass, or the decode part of a
    // mixed pass) in one launch pair per 16, each over its own cache
    // (ops_attn.rs `attention_decode_seqs`); the others one by one below
    let mut done = vec![false; lens.len()];
    if let Op::Attention { n_head, n_head_kv, head_dim, scale, .. } = op {
        let ones: Vec<usize> = (0..lens.len()).filter(|&z| lens[z] == 1).collect();
        if ones.len() > 1 {
            let mut kvs = Vec::with_capacity(ones.len());
            for &z in &ones {
                match states.get_mut(keys[z]).map_err(&e)? {
                    DevState::Kv(kv) => kvs.push((kv.geo.clone(), kv.bufs(), lens[..z].iter().sum::<usize>())),
                    _ => return Err(e("Attention needs a KV-cache layer state".into())),
                }
            }
            let kvs: Vec<_> = kvs.iter().map(|(k, b, tok)| (k, *b, *tok)).collect();
            let g = crate::ops_attn::AttnGeom { n_head: *n_head, n_head_kv: *n_head_kv, d: *head_dim, scale: *scale };
            cx.new_op();
            if crate::ops_attn::attention_decode_seqs(cx, ins, y, meta, &kvs, g)? {
                ones.iter().for_each(|&z| done[z] = true);
            }
        }
    }
    let mut t0 = 0;
    for (z, (&key, &n)) in keys.iter().zip(lens).enumerate() {
        if done[z] {
            t0 += n;
            continue;
        }
        let sub: Vec<Opnd<'_>> = ins
            .iter()
            .map(|o| slice_opnd(o, t, t0, n))
            .collect::<Result<_, _>>()
            .map_err(&e)?;
        let (shape, off, len) = token_slice(&meta.shape, t, t0, n).map_err(&e)?;
        let m = TensorMeta {
            shape,
            dtype: meta.dtype,
        };
        cx.new_op();
        let st = states.get_mut(key).map_err(&e)?;
        dispatch::run(cx, op, &sub, y.at(4 * off, 4 * len), &m, Some(st))?;
        t0 += n;
    }
    Ok(())
}

impl CudaBackend {
    /// The op lock (one user of the stream at a time) and the resident tables, with the
    /// context bound to this thread. Lock order: op lock, `res`, `graphs`.
    pub(crate) fn res(
        &self,
        op: &'static str,
    ) -> Result<(MutexGuard<'_, ()>, MutexGuard<'_, ResState>), OpError> {
        let e = |m: &str| OpError::Invalid {
            op,
            msg: format!("cuda: {m}"),
        };
        let g = self.lock.lock().map_err(|_| e("backend lock poisoned"))?;
        self.dev
            .ctx
            .bind_to_thread()
            .map_err(|x| e(&format!("{x:?}")))?;
        let r = self
            .res
            .lock()
            .map_err(|_| e("resident state lock poisoned"))?;
        Ok((g, r))
    }

    /// Counters of the resident path, with the current slot / state / scratch sizes.
    pub fn resident_stats(&self) -> ResidentStats {
        let Ok(r) = self.res.lock() else {
            return ResidentStats::default();
        };
        ResidentStats {
            slots: r.slots.len() as u64,
            slot_bytes: r.slots.bytes() as u64,
            states: r.states.len() as u64,
            state_bytes: r.states.values().map(|s| s.bytes() as u64).sum(),
            scratch_bytes: r.scratch.bytes() as u64,
            ..r.stats
        }
    }

    pub(crate) fn reserve(&self, specs: &[SlotSpec]) -> Result<(), OpError> {
        const OP: &str = "reserve_slots";
        let (_g, mut r) = self.res(OP)?;
        r.flush(&self.dev).map_err(|e| to_op_error(OP, e))?;
        let d = &self.dev;
        r.slots
            .reserve(specs, |bytes| {
                d.alloc::<u8>(bytes)
                    .map(|mem| DevSlot { mem, staging: None })
            })
            .map_err(|e| to_op_error(OP, e))?;
        Ok(())
    }

    pub(crate) fn release(&self, arena: u64) {
        let Ok((_g, mut r)) = self.res("release_slots") else {
            return;
        };
        let _ = r.flush(&self.dev);
        r.slots.release(arena);
        let keys = r.policy.forget_arena(arena);
        drop(r);
        for k in keys {
            self.invalidate_graph(k);
        }
    }

    /// Host → slot through the slot's pinned staging buffer: asynchronous (waits only
    /// if the previous upload out of that buffer has not been copied yet).
    pub(crate) fn upload_slot(&self, slot: SlotId, t: &Tensor) -> Result<(), OpError> {
        const OP: &str = "upload";
        let (_g, mut r) = self.res(OP)?;
        let ce = |e| to_op_error(OP, e);
        let d = &self.dev;
        r.flush(d).map_err(ce)?;
        let meta = TensorMeta {
            shape: t.shape,
            dtype: t.dtype(),
        };
        let bytes = r.slots.value(slot, &meta).map_err(err(OP))?.1;
        let src = host_bytes(t);
        if src.len() != bytes {
            return Err(err(OP)(format!(
                "{} bytes for a value of {meta}",
                src.len()
            )));
        }
        let s = r.slots.get_mut(slot).map_err(err(OP))?;
        let dst = ptr_of(&s.mem.mem);
        let cap = s.reserved.max(1);
        if s.mem.staging.as_ref().is_none_or(|(h, _)| h.len() < bytes) {
            // SAFETY: the pinned buffer is written below before any copy reads it.
            let h = unsafe { d.ctx.alloc_pinned::<u8>(cap) }.map_err(|e| ce(drv(e)))?;
            let ev = d.ctx.new_event(None).map_err(|e| ce(drv(e)))?;
            s.mem.staging = Some((h, ev));
        }
        let (h, ev) = s.mem.staging.as_mut().expect("made above");
        ev.synchronize().map_err(|e| ce(drv(e)))?;
        let hs = h.as_mut_slice().map_err(|e| ce(drv(e)))?;
        hs[..bytes].copy_from_slice(src);
        if bytes > 0 {
            // SAFETY: `dst` holds at least `bytes` bytes (the slot's value check above);
            // the pinned source stays untouched until `ev` (recorded next) has passed.
            unsafe { result::memcpy_htod_async(dst.ptr, &hs[..bytes], d.stream.cu_stream()) }
                .map_err(|e| ce(drv(e)))?;
        }
        ev.record(&d.stream).map_err(|e| ce(drv(e)))?;
        s.mirror = match &t.data {
            TensorData::I32(v) => Some(v.clone()),
            TensorData::F32(_) => None,
        };
        r.stats.uploads += 1;
        r.stats.upload_bytes += bytes as u64;
        Ok(())
    }

    /// Slot → host; synchronous (the step's one wait for the device).
    pub(crate) fn download_slot(
        &self,
        slot: SlotId,
        meta: &TensorMeta,
        out: &mut Tensor,
    ) -> Result<(), OpError> {
        const OP: &str = "download";
        let (_g, mut r) = self.res(OP)?;
        let ce = |e| to_op_error(OP, e);
        let d = &self.dev;
        r.flush(d).map_err(ce)?;
        let (s, bytes) = r.slots.value(slot, meta).map_err(err(OP))?;
        let src = ptr_of(&s.mem.mem).at(0, bytes);
        match meta.dtype {
            DType::I32 => d.dtoh(pn_engine::i32_out(out, meta), src),
            _ => d.dtoh(pn_engine::f32_out(out, meta), src),
        }
        .map_err(ce)?;
        r.stats.downloads += 1;
        r.stats.download_bytes += bytes as u64;
        r.stats.syncs += 1;
        Ok(())
    }

    /// Die-to-die: slot `from` of `src` (a `CudaBackend`) into slot `to`, on the device
    /// (the same context: a device copy; another device: a peer copy), ordered after the
    /// source's work by an event, and the source's later work after the copy.
    pub(crate) fn copy_slot(
        &self,
        src: &dyn Backend,
        from: SlotId,
        to: SlotId,
        meta: &TensorMeta,
    ) -> Result<bool, OpError> {
        const OP: &str = "copy_from";
        let src: &dyn std::any::Any = src;
        let Some(peer) = src.downcast_ref::<CudaBackend>() else {
            return Ok(false);
        };
        let ce = |e| to_op_error(OP, e);
        if std::ptr::eq(peer, self) {
            let (_g, mut r) = self.res(OP)?;
            r.flush(&self.dev).map_err(ce)?;
            let (s, bytes) = r.slots.value(from, meta).map_err(err(OP))?;
            let (sp, mirror) = (ptr_of(&s.mem.mem).ptr, s.mirror.clone());
            let dp = ptr_of(&r.slots.value(to, meta).map_err(err(OP))?.0.mem.mem).ptr;
            launch(
                &self.dev,
                &Cmd::Copy {
                    dst: dp,
                    src: sp,
                    bytes,
                },
            )
            .map_err(ce)?;
            finish_copy(&mut r, to, mirror, bytes);
            return Ok(true);
        }
        // the source: its work so far, then an event
        let (sp, sctx, mirror, bytes, ev) = {
            let (_g, mut r) = peer.res(OP)?;
            r.flush(&peer.dev).map_err(ce)?;
            let (s, bytes) = r.slots.value(from, meta).map_err(err(OP))?;
            let ev = peer.dev.stream.record_event(None).map_err(|e| ce(drv(e)))?;
            (
                ptr_of(&s.mem.mem).ptr,
                peer.dev.ctx.cu_ctx(),
                s.mirror.clone(),
                bytes,
                ev,
            )
        };
        let (_g, mut r) = self.res(OP)?;
        let d = &self.dev;
        r.flush(d).map_err(ce)?;
        let dp = ptr_of(&r.slots.value(to, meta).map_err(err(OP))?.0.mem.mem).ptr;
        d.stream.wait(&ev).map_err(|e| ce(drv(e)))?;
        let s = d.stream.cu_stream();
        // SAFETY: both buffers hold at least `bytes` bytes (slot value checks); the copy is
        // ordered after the source's writes (event above) and before its later work
        // (the source waits on `done` below).
        let res = if sctx == d.ctx.cu_ctx() {
            unsafe { result::memcpy_dtod_async(dp, sp, bytes, s) }
        } else {
            unsafe { result::memcpy_peer_async(d.ctx.cu_ctx(), dp, sctx, sp, bytes, s) }
        };
        res.map_err(|e| ce(drv(e)))?;
        let done = d.stream.record_event(None).map_err(|e| ce(drv(e)))?;
        finish_copy(&mut r, to, mirror, bytes);
        drop((_g, r));
        let (_pg, _pr) = peer.res(OP)?;
        peer.dev.stream.wait(&done).map_err(|e| ce(drv(e)))?;
        Ok(true)
    }

    pub(crate) fn state_up(&self, key: StateKey, st: &LayerState) -> Result<(), OpError> {
        const OP: &str = "state_upload";
        let (_g, mut r) = self.res(OP)?;
        let ce = |e| to_op_error(OP, e);
        r.flush(&self.dev).map_err(ce)?;
        // into the buffers the key holds where the geometry is the same (a slot's row
        // keeps its addresses), else new ones
        let in_place = match r.states.get_mut(key) {
            Ok(ds) => ds.upload_into(&self.dev, st).map_err(ce)?,
            Err(_) => false,
        };
        if !in_place {
            let ds = DevState::upload(&self.dev, st).map_err(ce)?;
            r.states.put(key, ds);
        }
        r.stats.state_uploads += 1;
        Ok(())
    }

    pub(crate) fn state_down(&self, key: StateKey, st: &mut LayerState) -> Result<(), OpError> {
        const OP: &str = "state_download";
        let (_g, mut r) = self.res(OP)?;
        let ce = |e| to_op_error(OP, e);
        r.flush(&self.dev).map_err(ce)?;
        r.states
            .get(key)
            .map_err(err(OP))?
            .download(&self.dev, st)
            .map_err(ce)?;
        r.stats.state_downloads += 1;
        r.stats.syncs += 1;
        Ok(())
    }

    pub(crate) fn state_fork(&self, from: StateKey, to: StateKey) -> Result<bool, OpError> {
        const OP: &str = "state_copy";
        let (_g, mut r) = self.res(OP)?;
        let ce = |e| to_op_error(OP, e);
        r.flush(&self.dev).map_err(ce)?;
        let d = &self.dev;
        r.states
            .fork(from, to, |s, t| s.copy_into(d, t).map_err(|e| e.to_string()), |s| s.fork(d).map_err(|e| e.to_string()))
            .map_err(err(OP))?;
        r.stats.state_copies += 1;
        Ok(true)
    }

    pub(crate) fn state_zero(&self, key: StateKey) -> Result<bool, OpError> {
        const OP: &str = "state_reset";
        let (_g, mut r) = self.res(OP)?;
        let ce = |e| to_op_error(OP, e);
        r.flush(&self.dev).map_err(ce)?;
        r.states
            .get_mut(key)
            .map_err(err(OP))?
            .reset(&self.dev)
            .map_err(ce)?;
        r.stats.state_resets += 1;
        Ok(true)
    }

    pub(crate) fn state_snap(
        &self,
        key: StateKey,
        pos: usize,
    ) -> Result<Option<LayerSnapshot>, OpError> {
        const OP: &str = "state_snapshot";
        let (_g, mut r) = self.res(OP)?;
        let ce = |e| to_op_error(OP, e);
        r.flush(&self.dev).map_err(ce)?;
        let s = r
            .states
            .get(key)
            .map_err(err(OP))?
            .snapshot(&self.dev, pos)
            .map_err(ce)?;
        r.stats.state_snapshots += 1;
        r.stats.state_snapshot_bytes += s.bytes() as u64;
        r.stats.syncs += 1;
        Ok(Some(s))
    }

    pub(crate) fn state_drop(&self, key: StateKey) {
        let Ok((_g, mut r)) = self.res("state_release") else {
            return;
        };
        // deferred commands may name the buffers: launch them before the (stream-ordered) free
        let _ = r.flush(&self.dev);
        if r.states.release(key) {
            r.stats.state_releases += 1;
        }
    }

    pub(crate) fn exec_resident(
        &self,
        op: &Op,
        inputs: &[ResidentInput<'_>],
        meta: &TensorMeta,
        keys: &[StateKey],
        lens: Option<&[usize]>,
        out: SlotId,
    ) -> Result<(), OpError> {
        let (_g, mut r) = self.res(op.kind())?;
        let res = r.exec(&self.dev, op, inputs, meta, keys, lens, out);
        if res.is_err() {
            if let Some(s) = r.seg.as_mut() {
                s.failed = true;
            }
        }
        res
    }
}

fn finish_copy(r: &mut ResState, to: SlotId, mirror: Option<Vec<i32>>, bytes: usize) {
    if let Ok(s) = r.slots.get_mut(to) {
        s.mirror = mirror;
    }
    r.stats.device_copies += 1;
    r.stats.device_copy_bytes += bytes as u64;
}

//! Test support, not API: [`ResidentMock`], a device backend ([`Memory::Device`] in
//! crate::backend's protocol) over host kernels, with its own storage for slots and layer
//! states.
//!
//! It stands in for a device backend in tests: every host ↔ "device" copy is counted
//! ([`MockCounts`]); the host copy of a layer state it owns is poisoned (NaN / all-ones
//! bytes, [`poison`]) so a path that reads host state without bringing it home gives
//! NaN logits; slots must be reserved before use and never grow past the reservation
//! (their buffers never move: [`MockCounts::moved_buffers`]); failures can be injected
//! ([`ResidentMock::fail_next`]).

use crate::backend::{
    copy_tensor, Backend, ExecError, Executable, HostKernels, Memory, OpCode, PassIo, ResidentInput, SegmentCode,
    SlotId, SlotSpec, StateKey, StateOp, StateReply, Support, Transfer,
};
use crate::graph::Node;
use pn_ops::{DType, LayerState, OpError, SeqSpan, Shape, Tensor, TensorData, TensorMeta, Value};
use smallvec::SmallVec;
use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// What the mock did since creation (or [`ResidentMock::reset_counts`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MockCounts {
    pub uploads: u64,
    pub upload_bytes: u64,
    pub downloads: u64,
    pub download_bytes: u64,
    pub state_uploads: u64,
    pub state_upload_bytes: u64,
    pub state_downloads: u64,
    pub state_download_bytes: u64,
    pub state_copies: u64,
    /// State keys an upload or a copy created (not an in-place overwrite of one held).
    pub state_allocs: u64,
    pub state_releases: u64,
    /// In-place resets (`state_reset`: nothing crosses to or from the host).
    pub state_resets: u64,
    /// Ranged snapshot copies (`state_snapshot`) and the bytes they moved to the host.
    pub state_snapshots: u64,
    pub state_snapshot_bytes: u64,
    /// Die-to-die copies received through `copy_from`.
    pub device_copies: u64,
    pub device_copy_bytes: u64,
    pub executes: u64,
    pub multi_executes: u64,
    /// Slots reserved (a grown slot counts again).
    pub reservations: u64,
    /// Times a slot's buffer changed address after its reservation (must stay 0).
    pub moved_buffers: u64,
    pub segments: u64,
    pub replays: u64,
}

/// A failure to inject into the next matching call.
#[derive(Clone, Debug, PartialEq)]
pub enum Fail {
    Reserve,
    Upload,
    Download,
    /// An op of this kind in a segment's executable.
    Execute(&'static str),
    StateUpload,
    StateDownload,
    StateCopy,
    StateReset,
    StateSnapshot,
}

struct Slot {
    t: Tensor,
    reserved: usize,
    addr: usize,
}

#[derive(Default)]
struct Store {
    slots: HashMap<SlotId, Slot>,
    states: HashMap<StateKey, LayerState>,
    counts: MockCounts,
    fail: Option<Fail>,
    /// The state ids (sequence table) of the last segment run.
    last_ids: Vec<u64>,
}

/// A device backend over `host`'s kernels (e.g. `CpuBackend`): bitwise the host's results.
pub struct ResidentMock {
    host: Arc<dyn HostKernels>,
    name: String,
    store: Mutex<Store>,
}

fn err(msg: String) -> OpError {
    OpError::Invalid { op: "mock", msg }
}

fn addr(t: &Tensor) -> usize {
    match &t.data {
        TensorData::F32(v) => v.as_ptr() as usize,
        TensorData::I32(v) => v.as_ptr() as usize,
    }
}

fn bytes(t: &Tensor) -> u64 {
    4 * match &t.data {
        TensorData::F32(v) => v.len(),
        TensorData::I32(v) => v.len(),
    } as u64
}

/// Fills a layer state's buffers with NaN (f32), 0xFF bytes (encoded cells: an f16 NaN
/// scale) and 0xFFFF (f16 NaN shadows): any read gives NaN.
pub fn poison(st: &mut LayerState) {
    match st {
        LayerState::Kv(k) => {
            k.k.fill(f32::NAN);
            k.v.fill(f32::NAN);
            k.kq.fill(0xFF);
            k.vq.fill(0xFF);
            let s = &mut k.shadow;
            for b in [&mut s.k_sink, &mut s.v_sink, &mut s.k_win, &mut s.v_win] {
                b.fill(0xFFFF);
            }
        }
        LayerState::Recurrent(r) => {
            r.conv.fill(f32::NAN);
            r.ssm.fill(f32::NAN);
        }
        LayerState::None => {}
    }
}

impl Store {
    fn fail(&mut self, what: &Fail) -> Result<(), OpError> {
        if self.fail.as_ref() == Some(what) {
            self.fail = None;
            return Err(err(format!("injected failure: {what:?}")));
        }
        Ok(())
    }
    /// Checks slot `id` after a write: within its reservation, buffer not moved.
    fn written(&mut self, id: SlotId) -> Result<(), OpError> {
        let s = self.slots.get_mut(&id).expect("checked by the caller");
        let (b, a) = (bytes(&s.t) as usize, addr(&s.t));
        if a != s.addr {
            self.counts.moved_buffers += 1;
            s.addr = a;
        }
        if b > s.reserved {
            return Err(err(format!("{id}: {b} bytes written, {} reserved", s.reserved)));
        }
        Ok(())
    }
    fn slot(&self, id: &SlotId) -> Result<&Slot, OpError> {
        self.slots.get(id).ok_or_else(|| err(format!("{id} is not reserved")))
    }
    fn input<'a>(&'a self, i: &ResidentInput<'a>) -> Result<Value<'a>, OpError> {
        match i {
            ResidentInput::Weight(w) => Ok(Value::Weight(*w)),
            ResidentInput::Slot(id, meta) => {
                let t = &self.slot(id)?.t;
                if t.shape != meta.shape || t.dtype() != meta.dtype {
                    return Err(err(format!("{id} holds {}{:?}, the op expects {meta}", t.dtype(), t.shape)));
                }
                Ok(Value::Act(t))
            }
        }
    }
    fn take_state(&mut self, k: StateKey) -> Result<LayerState, OpError> {
        self.states.remove(&k).ok_or_else(|| err(format!("state {k:?} is not held")))
    }
}

impl ResidentMock {
    pub fn new(host: Arc<dyn HostKernels>) -> ResidentMock {
        let name = format!("mock({})", host.label());
        ResidentMock { host, name, store: Mutex::new(Store::default()) }
    }
    fn lock(&self) -> MutexGuard<'_, Store> {
        self.store.lock().expect("mock store lock")
    }
    pub fn counts(&self) -> MockCounts {
        self.lock().counts
    }
    pub fn reset_counts(&self) {
        self.lock().counts = MockCounts::default();
    }
    /// The state ids the last segment ran on, one per sequence of its pass (a device
    /// keys its layer states by them).
    pub fn last_ids(&self) -> Vec<u64> {
        self.lock().last_ids.clone()
    }
    /// Layer states held now.
    pub fn held_states(&self) -> usize {
        self.lock().states.len()
    }
    /// Slots reserved now.
    pub fn reserved_slots(&self) -> usize {
        self.lock().slots.len()
    }
    /// The next call matching `f` fails (once).
    pub fn fail_next(&self, f: Fail) {
        self.lock().fail = Some(f);
    }

    /// One op: its states `keys` (one per sequence of `spans`; none for a stateless op).
    fn exec(&self, oc: &OpCode, inputs: &[ResidentInput<'_>], keys: &[StateKey], spans: &[SeqSpan]) -> Result<(), OpError> {
        let (op, meta, out) = (&oc.op, &oc.meta, oc.out);
        let mut g = self.lock();
        let s = &mut *g;
        s.fail(&Fail::Execute(op.kind()))?;
        let mut o = s.slots.remove(&out).ok_or_else(|| err(format!("{out} (output) is not reserved")))?;
        let mut states = Vec::with_capacity(keys.len());
        let mut res = Ok(());
        for &k in keys {
            match s.take_state(k) {
                Ok(st) => states.push((k, st)),
                Err(e) => res = Err(e),
            }
        }
        let multi = keys.len() > 1;
        if res.is_ok() {
            res = inputs.iter().map(|i| s.input(i)).collect::<Result<Vec<_>, _>>().and_then(|vals| {
                if multi {
                    let mut refs: Vec<&mut LayerState> = states.iter_mut().map(|(_, st)| st).collect();
                    self.host.kernel_seqs(op, &vals, meta, spans, &mut refs, &mut o.t)
                } else {
                    let st = states.first_mut().map(|(_, st)| st);
                    self.host.kernel_into(op, &vals, meta, st, &mut o.t)
                }
            });
        }
        for (k, st) in states {
            s.states.insert(k, st);
        }
        s.slots.insert(out, o);
        res?;
        if multi {
            s.counts.multi_executes += 1;
        } else {
            s.counts.executes += 1;
        }
        s.written(out)
    }

    fn state_op(&self, op: StateOp<'_>) -> Result<StateReply, OpError> {
        let mut s = self.lock();
        let held = |k: &StateKey| err(format!("state {k:?} is not held"));
        match op {
            StateOp::Upload(key, st) => {
                s.fail(&Fail::StateUpload)?;
                if s.states.insert(key, st.clone()).is_none() {
                    s.counts.state_allocs += 1;
                }
                s.counts.state_uploads += 1;
                s.counts.state_upload_bytes += st.bytes() as u64;
                poison(st);
            }
            StateOp::Download(key, st) => {
                s.fail(&Fail::StateDownload)?;
                let src = s.states.get(&key).ok_or_else(|| held(&key))?;
                if src.bytes() != st.bytes() {
                    return Err(err(format!("state {key:?}: {} bytes held, the host copy has {}", src.bytes(), st.bytes())));
                }
                st.clone_from(src);
                s.counts.state_downloads += 1;
                s.counts.state_download_bytes += st.bytes() as u64;
            }
            StateOp::Copy(from, to) => {
                s.fail(&Fail::StateCopy)?;
                let st = s.states.get(&from).ok_or_else(|| held(&from))?.clone();
                if s.states.insert(to, st).is_none() {
                    s.counts.state_allocs += 1;
                }
                s.counts.state_copies += 1;
            }
            // in place (the host copy stays poisoned: the mock still owns the state)
            StateOp::Reset(key) => {
                s.fail(&Fail::StateReset)?;
                s.states.get_mut(&key).ok_or_else(|| held(&key))?.reset();
                s.counts.state_resets += 1;
            }
            // only the snapshot's part crosses (its bytes are counted)
            StateOp::Snapshot(key, pos) => {
                s.fail(&Fail::StateSnapshot)?;
                let snap = s.states.get(&key).ok_or_else(|| held(&key))?.snapshot(pos);
                s.counts.state_snapshots += 1;
                s.counts.state_snapshot_bytes += snap.bytes() as u64;
                return Ok(StateReply::Snapshot(snap));
            }
            StateOp::Release(key) => {
                if s.states.remove(&key).is_some() {
                    s.counts.state_releases += 1;
                }
            }
        }
        Ok(StateReply::Done)
    }
}

/// A segment on the mock: its ops in order; a stable segment that ran before counts as a
/// replay (a device would replay its captured graph).
struct MockExec {
    mock: Arc<ResidentMock>,
    seg: SegmentCode,
    ran: AtomicBool,
}

impl Executable for MockExec {
    fn run(&self, io: &mut PassIo<'_, '_>) -> Result<(), ExecError> {
        let replay = self.seg.stable && self.ran.swap(true, Ordering::Relaxed);
        {
            let mut s = self.mock.lock();
            s.counts.segments += 1;
            s.counts.replays += replay as u64;
        }
        self.mock.lock().last_ids = io.ids.to_vec();
        let mut keys: SmallVec<[StateKey; 16]> = SmallVec::new();
        for (i, oc) in self.seg.ops.iter().enumerate() {
            let inputs = oc.resolve(io.weights);
            keys.clear();
            if let Some(l) = oc.state {
                keys.extend(io.ids.iter().map(|&seq| StateKey { seq, layer: l as u32 }));
            }
            self.mock.exec(oc, &inputs, &keys, io.spans).map_err(ExecError::at(i))?;
            if let Some(t) = io.timing.as_mut() {
                t(i);
            }
            if let Some(obs) = io.observe.as_mut() {
                // the observer gets a downloaded copy
                let mut t = Tensor { shape: Shape::d1(0), data: TensorData::F32(Vec::new()) };
                self.mock.download_slot(oc.out, &oc.meta, &mut t).map_err(ExecError::at(i))?;
                obs(i, &t);
            }
        }
        Ok(())
    }
}

impl ResidentMock {
    fn upload_slot(&self, slot: SlotId, t: &Tensor) -> Result<(), OpError> {
        let mut s = self.lock();
        s.fail(&Fail::Upload)?;
        let dst = s.slots.get_mut(&slot).ok_or_else(|| err(format!("{slot} is not reserved")))?;
        copy_tensor(&mut dst.t, t);
        s.counts.uploads += 1;
        s.counts.upload_bytes += bytes(t);
        s.written(slot)
    }
    fn download_slot(&self, slot: SlotId, meta: &TensorMeta, out: &mut Tensor) -> Result<(), OpError> {
        let mut s = self.lock();
        s.fail(&Fail::Download)?;
        let src = &s.slot(&slot)?.t;
        if src.shape != meta.shape || src.dtype() != meta.dtype {
            return Err(err(format!("{slot} holds {}{:?}, expected {meta}", src.dtype(), src.shape)));
        }
        copy_tensor(out, src);
        s.counts.downloads += 1;
        s.counts.download_bytes += bytes(out);
        Ok(())
    }
    fn copy_slot(&self, src: &dyn Backend, from: SlotId, to: SlotId, meta: &TensorMeta) -> Result<bool, OpError> {
        let src: &dyn Any = src;
        let Some(peer) = src.downcast_ref::<ResidentMock>() else {
            return Ok(false);
        };
        let t = {
            let p = peer.lock();
            let t = &p.slot(&from)?.t;
            if t.shape != meta.shape {
                return Err(err(format!("{from} holds {:?}, expected {meta}", t.shape)));
            }
            t.clone()
        };
        let mut s = self.lock();
        let dst = s.slots.get_mut(&to).ok_or_else(|| err(format!("{to} is not reserved")))?;
        copy_tensor(&mut dst.t, &t);
        s.counts.device_copies += 1;
        s.counts.device_copy_bytes += bytes(&t);
        s.written(to).map(|_| true)
    }
}

impl Backend for ResidentMock {
    fn name(&self) -> &str {
        &self.name
    }
    fn supports(&self, node: &Node) -> Support {
        self.host.can_run(node)
    }
    fn memory(&self) -> Memory {
        Memory::Device
    }
    fn reserve(&self, specs: &[SlotSpec]) -> Result<(), OpError> {
        let mut s = self.lock();
        s.fail(&Fail::Reserve)?;
        for sp in specs {
            let elems = sp.bytes.div_ceil(4);
            let e = s.slots.entry(sp.id).or_insert_with(|| {
                let data = match sp.dtype {
                    DType::I32 => TensorData::I32(Vec::with_capacity(elems)),
                    _ => TensorData::F32(Vec::with_capacity(elems)),
                };
                let t = Tensor { shape: Shape::d1(0), data };
                Slot { addr: addr(&t), t, reserved: 0 }
            });
            match &mut e.t.data {
                TensorData::F32(v) => v.reserve_exact(elems.saturating_sub(v.len())),
                TensorData::I32(v) => v.reserve_exact(elems.saturating_sub(v.len())),
            }
            e.addr = addr(&e.t);
            e.reserved = e.reserved.max(sp.bytes);
            s.counts.reservations += 1;
        }
        Ok(())
    }
    fn release(&self, arena: u64) {
        self.lock().slots.retain(|id, _| id.arena != arena);
    }
    fn transfer(&self, t: Transfer<'_>) -> Result<bool, OpError> {
        match t {
            Transfer::Upload(slot, t) => self.upload_slot(slot, t).map(|_| true),
            Transfer::Download(slot, meta, out) => self.download_slot(slot, meta, out).map(|_| true),
            Transfer::Copy { src, from, to, meta } => self.copy_slot(src, from, to, meta),
        }
    }
    fn compile(self: Arc<Self>, seg: SegmentCode) -> Result<Box<dyn Executable>, OpError> {
        Ok(Box::new(MockExec { mock: self, seg, ran: AtomicBool::new(false) }))
    }
    fn state(&self, op: StateOp<'_>) -> Result<StateReply, OpError> {
        self.state_op(op)
    }
}

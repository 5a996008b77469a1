//! Test support, not API: [`ResidentMock`], a resident backend (crate::backend's resident
//! protocol) over a host backend, with its own storage for slots and layer states.
//!
//! It stands in for a device backend in tests: every host ↔ "device" copy is counted
//! ([`MockCounts`]); the host copy of a layer state it owns is poisoned (NaN / all-ones
//! bytes, [`poison`]) so a path that reads host state without bringing it home gives
//! NaN logits; slots must be reserved before use and never grow past the reservation
//! (their buffers never move: [`MockCounts::moved_buffers`]); the host protocol
//! (`execute`) is refused, so a resident die's op run through it is an error; failures
//! can be injected ([`ResidentMock::fail_next`]).

use crate::backend::{Backend, ResidentInput, SegmentRun, SlotId, SlotSpec, StateKey, Support};
use crate::graph::Node;
use pn_ops::{DType, LayerSnapshot, LayerState, Op, OpError, Shape, Tensor, TensorData, TensorMeta, Value};
use std::any::Any;
use std::collections::HashMap;
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
    /// `execute_resident` / `execute_multi_resident` of this op kind.
    Execute(&'static str),
    StateUpload,
    StateDownload,
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
    open: Option<SegmentRun>,
    counts: MockCounts,
    fail: Option<Fail>,
}

/// A resident backend over `host` (e.g. `CpuBackend`): bitwise the host's results.
pub struct ResidentMock {
    host: Arc<dyn Backend>,
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

/// `dst` = `src` in `dst`'s buffer when the element type matches (no reallocation within
/// its capacity), else `src`'s data cloned.
fn copy_tensor(dst: &mut Tensor, src: &Tensor) {
    dst.shape = src.shape;
    match (&mut dst.data, &src.data) {
        (TensorData::F32(a), TensorData::F32(b)) => {
            a.clear();
            a.extend_from_slice(b);
        }
        (TensorData::I32(a), TensorData::I32(b)) => {
            a.clear();
            a.extend_from_slice(b);
        }
        (d, s) => *d = s.clone(),
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
    pub fn new(host: Arc<dyn Backend>) -> ResidentMock {
        let name = format!("mock({})", host.name());
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

    fn exec(
        &self,
        op: &Op,
        inputs: &[ResidentInput<'_>],
        meta: &TensorMeta,
        keys: &[StateKey],
        lens: Option<&[usize]>,
        out: SlotId,
    ) -> Result<(), OpError> {
        let mut g = self.lock();
        let s = &mut *g;
        s.fail(&Fail::Execute(op.kind()))?;
        if s.open.is_none() {
            return Err(err(format!("{} outside a segment", op.kind())));
        }
        let mut o = s.slots.remove(&out).ok_or_else(|| err(format!("{out} (output) is not reserved")))?;
        let mut states = Vec::with_capacity(keys.len());
        let mut res = Ok(());
        for &k in keys {
            match s.take_state(k) {
                Ok(st) => states.push((k, st)),
                Err(e) => res = Err(e),
            }
        }
        if res.is_ok() {
            res = inputs.iter().map(|i| s.input(i)).collect::<Result<Vec<_>, _>>().and_then(|vals| match lens {
                None => {
                    let st = states.first_mut().map(|(_, st)| st);
                    self.host.execute_into(op, &vals, meta, st, &mut o.t)
                }
                Some(lens) => {
                    let mut refs: Vec<&mut LayerState> = states.iter_mut().map(|(_, st)| st).collect();
                    self.host.execute_seqs(op, &vals, meta, &pn_ops::SeqSpan::table(lens), &mut refs, &mut o.t)
                }
            });
        }
        for (k, st) in states {
            s.states.insert(k, st);
        }
        s.slots.insert(out, o);
        res?;
        if lens.is_some() {
            s.counts.multi_executes += 1;
        } else {
            s.counts.executes += 1;
        }
        s.written(out)
    }
}

impl Backend for ResidentMock {
    fn name(&self) -> &str {
        &self.name
    }
    fn supports(&self, node: &Node) -> Support {
        self.host.supports(node)
    }
    /// Refused: a resident die's ops must go through `execute_resident`.
    fn execute(&self, op: &Op, _: &[Value<'_>], _: &TensorMeta, _: Option<&mut LayerState>) -> Result<Tensor, OpError> {
        Err(err(format!("{}: host-protocol execute on a resident backend", op.kind())))
    }
    fn run_pass(&self, f: &mut (dyn FnMut() + Send)) {
        self.host.run_pass(f)
    }
    fn resident(&self) -> bool {
        true
    }
    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }
    fn reserve_slots(&self, specs: &[SlotSpec]) -> Result<(), OpError> {
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
    fn release_slots(&self, arena: u64) {
        self.lock().slots.retain(|id, _| id.arena != arena);
    }
    fn upload(&self, slot: SlotId, t: &Tensor) -> Result<(), OpError> {
        let mut s = self.lock();
        s.fail(&Fail::Upload)?;
        let dst = s.slots.get_mut(&slot).ok_or_else(|| err(format!("{slot} is not reserved")))?;
        copy_tensor(&mut dst.t, t);
        s.counts.uploads += 1;
        s.counts.upload_bytes += bytes(t);
        s.written(slot)
    }
    fn download(&self, slot: SlotId, meta: &TensorMeta, out: &mut Tensor) -> Result<(), OpError> {
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
    fn copy_from(&self, src: &dyn Backend, from: SlotId, to: SlotId, meta: &TensorMeta) -> Result<bool, OpError> {
        let Some(peer) = src.as_any().and_then(|a| a.downcast_ref::<ResidentMock>()) else {
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
    fn execute_resident(
        &self,
        op: &Op,
        inputs: &[ResidentInput<'_>],
        meta: &TensorMeta,
        state: Option<StateKey>,
        out: SlotId,
    ) -> Result<(), OpError> {
        self.exec(op, inputs, meta, state.as_slice(), None, out)
    }
    fn execute_multi_resident(
        &self,
        op: &Op,
        inputs: &[ResidentInput<'_>],
        meta: &TensorMeta,
        states: &[StateKey],
        lens: &[usize],
        out: SlotId,
    ) -> Result<(), OpError> {
        self.exec(op, inputs, meta, states, Some(lens), out)
    }
    fn state_upload(&self, key: StateKey, st: &mut LayerState) -> Result<(), OpError> {
        let mut s = self.lock();
        s.fail(&Fail::StateUpload)?;
        s.states.insert(key, st.clone());
        s.counts.state_uploads += 1;
        s.counts.state_upload_bytes += st.bytes() as u64;
        poison(st);
        Ok(())
    }
    fn state_download(&self, key: StateKey, st: &mut LayerState) -> Result<(), OpError> {
        let mut s = self.lock();
        s.fail(&Fail::StateDownload)?;
        let src = s.states.get(&key).ok_or_else(|| err(format!("state {key:?} is not held")))?;
        if src.bytes() != st.bytes() {
            return Err(err(format!("state {key:?}: {} bytes held, the host copy has {}", src.bytes(), st.bytes())));
        }
        st.clone_from(src);
        s.counts.state_downloads += 1;
        s.counts.state_download_bytes += st.bytes() as u64;
        Ok(())
    }
    fn state_copy(&self, from: StateKey, to: StateKey) -> Result<bool, OpError> {
        let mut s = self.lock();
        let st = s.states.get(&from).ok_or_else(|| err(format!("state {from:?} is not held")))?.clone();
        s.states.insert(to, st);
        s.counts.state_copies += 1;
        Ok(true)
    }
    /// In place (the host copy stays poisoned: the mock still owns the state).
    fn state_reset(&self, key: StateKey) -> Result<bool, OpError> {
        let mut s = self.lock();
        s.fail(&Fail::StateReset)?;
        s.states.get_mut(&key).ok_or_else(|| err(format!("state {key:?} is not held")))?.reset();
        s.counts.state_resets += 1;
        Ok(true)
    }
    /// Only the snapshot's part crosses (its bytes are counted).
    fn state_snapshot(&self, key: StateKey, pos: usize) -> Result<Option<LayerSnapshot>, OpError> {
        let mut s = self.lock();
        s.fail(&Fail::StateSnapshot)?;
        let snap = s.states.get(&key).ok_or_else(|| err(format!("state {key:?} is not held")))?.snapshot(pos);
        s.counts.state_snapshots += 1;
        s.counts.state_snapshot_bytes += snap.bytes() as u64;
        Ok(Some(snap))
    }
    fn state_release(&self, key: StateKey) {
        let mut s = self.lock();
        if s.states.remove(&key).is_some() {
            s.counts.state_releases += 1;
        }
    }
    fn begin_segment(&self, seg: &SegmentRun) -> Result<(), OpError> {
        let mut s = self.lock();
        if let Some(o) = s.open {
            return Err(err(format!("segment {} begins while segment {} is open", seg.segment, o.segment)));
        }
        s.open = Some(*seg);
        s.counts.segments += 1;
        s.counts.replays += seg.replay as u64;
        Ok(())
    }
    fn end_segment(&self, seg: &SegmentRun) -> Result<(), OpError> {
        let mut s = self.lock();
        match s.open.take() {
            Some(o) if o == *seg => Ok(()),
            o => Err(err(format!("segment {} ends, open: {o:?}", seg.segment))),
        }
    }
}

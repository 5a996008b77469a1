//! The protocol over host memory ([`Memory::Host`]): a backend whose kernels take host
//! tensors (CPU, reference, test wrappers) implements [`HostKernels`] and is a
//! [`Backend`]: its buffer slots are host tensors in its [`HostMem`], uploads and
//! downloads are copies, a segment's executable runs its ops in order into their slots
//! (one [`HostKernels::run_pass`] per segment), and stateful ops compute on the
//! sequences' host layer copies ([`PassIo::layers`]).

use super::*;
use pn_ops::Value;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// The kernels of a host-memory backend.
pub trait HostKernels: Send + Sync + 'static {
    /// The backend's name ([`Backend::name`]).
    fn label(&self) -> &str;
    /// [`Backend::supports`]; default: every op but the leaves (the runner provides those).
    fn can_run(&self, node: &Node) -> Support {
        if node.op.is_leaf() {
            Support::No(format!("{} is a leaf (provided by the runner)", node.op.kind()))
        } else {
            Support::Yes
        }
    }
    /// Where its buffer slots live.
    fn mem(&self) -> &HostMem;
    /// Runs one op into `out` (a slot's buffer, reserved for the worst case: a kernel
    /// that writes there directly allocates nothing). `out` never aliases an input.
    fn kernel_into(
        &self,
        op: &Op,
        ins: &[Value<'_>],
        meta: &TensorMeta,
        state: Option<&mut LayerState>,
        out: &mut Tensor,
    ) -> Result<(), OpError>;
    /// The stateful `op` for every sequence of a pass in ONE call: sequence `i` owns
    /// tokens `seqs[i]` and updates `states[i]`; each row bitwise what the sequence gives
    /// alone. Default: once per sequence on its slice
    /// ([`pn_ops::reference::seqs::per_sequence`]).
    fn kernel_seqs(
        &self,
        op: &Op,
        ins: &[Value<'_>],
        meta: &TensorMeta,
        seqs: &[SeqSpan],
        states: &mut [&mut LayerState],
        out: &mut Tensor,
    ) -> Result<(), OpError> {
        let exec = &mut |ins: &[Value<'_>], m: &TensorMeta, st: &mut LayerState| self.execute(op, ins, m, Some(st));
        store_into(out, pn_ops::reference::seqs::per_sequence(op, ins, meta, seqs, states, exec)?);
        Ok(())
    }
    /// Runs `f` (a segment's ops) as one pass on the backend's threads. Default: inline.
    fn run_pass(&self, f: &mut (dyn FnMut() + Send)) {
        f()
    }
    /// One op into a new tensor (op-level tests and benchmarks).
    fn execute(&self, op: &Op, ins: &[Value<'_>], meta: &TensorMeta, state: Option<&mut LayerState>) -> Result<Tensor, OpError> {
        let mut out = empty(DType::F32);
        self.kernel_into(op, ins, meta, state, &mut out)?;
        Ok(out)
    }
}

/// A host-memory backend's buffer slots: per arena, `[class][slot]` tensors.
pub struct HostMem {
    arenas: Mutex<BTreeMap<u64, Table>>,
}

type Table = Vec<Vec<Tensor>>;

impl Default for HostMem {
    fn default() -> Self {
        HostMem::new()
    }
}

fn empty(dtype: DType) -> Tensor {
    let data = match dtype {
        DType::I32 => TensorData::I32(Vec::new()),
        _ => TensorData::F32(Vec::new()),
    };
    Tensor { shape: pn_ops::Shape::d1(0), data }
}

fn err(op: &'static str, msg: String) -> OpError {
    OpError::Invalid { op, msg }
}

fn slot_of<'t>(t: &'t mut Table, id: SlotId, op: &'static str) -> Result<&'t mut Tensor, OpError> {
    t.get_mut(id.class as usize)
        .and_then(|c| c.get_mut(id.slot as usize))
        .ok_or_else(|| err(op, format!("{id} is not reserved")))
}

impl HostMem {
    pub const fn new() -> HostMem {
        HostMem { arenas: Mutex::new(BTreeMap::new()) }
    }

    fn with<R>(&self, arena: u64, op: &'static str, f: impl FnOnce(&mut Table) -> Result<R, OpError>) -> Result<R, OpError> {
        let mut g = self.arenas.lock().map_err(|_| err(op, "host memory lock poisoned".into()))?;
        let t = g.get_mut(&arena).ok_or_else(|| err(op, format!("arena {arena} is not reserved (or in use)")))?;
        f(t)
    }

    fn reserve(&self, specs: &[SlotSpec]) -> Result<(), OpError> {
        let mut g = self.arenas.lock().map_err(|_| err("reserve", "host memory lock poisoned".into()))?;
        for s in specs {
            let t = g.entry(s.id.arena).or_default();
            let (c, i) = (s.id.class as usize, s.id.slot as usize);
            if t.len() <= c {
                t.resize_with(c + 1, Vec::new);
            }
            if t[c].len() <= i {
                t[c].resize_with(i + 1, || empty(s.dtype));
            }
            let elems = s.bytes.div_ceil(4);
            match &mut t[c][i].data {
                TensorData::F32(v) => v.reserve_exact(elems.saturating_sub(v.len())),
                TensorData::I32(v) => v.reserve_exact(elems.saturating_sub(v.len())),
            }
        }
        Ok(())
    }

    fn download(&self, slot: SlotId, meta: &TensorMeta, out: &mut Tensor) -> Result<(), OpError> {
        self.with(slot.arena, "download", |t| {
            let src = slot_of(t, slot, "download")?;
            if src.shape != meta.shape || src.dtype() != meta.dtype {
                return Err(err("download", format!("{slot} holds {}{:?}, expected {meta}", src.dtype(), src.shape)));
            }
            copy_tensor(out, src);
            Ok(())
        })
    }

    fn upload(&self, slot: SlotId, t: &Tensor) -> Result<(), OpError> {
        self.with(slot.arena, "upload", |tab| {
            copy_tensor(slot_of(tab, slot, "upload")?, t);
            Ok(())
        })
    }
}

impl<K: HostKernels> Backend for K {
    fn name(&self) -> &str {
        self.label()
    }
    fn supports(&self, node: &Node) -> Support {
        self.can_run(node)
    }
    fn memory(&self) -> Memory {
        Memory::Host
    }
    fn reserve(&self, specs: &[SlotSpec]) -> Result<(), OpError> {
        self.mem().reserve(specs)
    }
    fn release(&self, arena: u64) {
        if let Ok(mut g) = self.mem().arenas.lock() {
            g.remove(&arena);
        }
    }
    /// A die-to-die copy from another instance of the same type: between their host
    /// memories.
    fn transfer(&self, t: Transfer<'_>) -> Result<bool, OpError> {
        match t {
            Transfer::Upload(slot, t) => self.mem().upload(slot, t)?,
            Transfer::Download(slot, meta, out) => self.mem().download(slot, meta, out)?,
            Transfer::Copy { src, from, to, meta } => {
                let src: &dyn Any = src;
                let Some(peer) = src.downcast_ref::<K>() else { return Ok(false) };
                let mut staged = empty(meta.dtype);
                peer.mem().download(from, meta, &mut staged)?;
                self.mem().upload(to, &staged)?;
            }
        }
        Ok(true)
    }
    fn compile(self: Arc<Self>, seg: SegmentCode) -> Result<Box<dyn Executable>, OpError> {
        Ok(Box::new(HostExec { k: self, seg }))
    }
    fn state(&self, _op: StateOp<'_>) -> Result<StateReply, OpError> {
        Err(err("state", format!("backend {} computes on host layer copies; it holds none", self.label())))
    }
    /// One pass around `f`: a segment run inside it calls `run_pass` again from the
    /// backend's own thread (the CPU pool runs it there directly, no hand-over).
    fn enter(&self, f: &mut (dyn FnMut() + Send)) {
        self.run_pass(f)
    }
}

struct HostExec<K> {
    k: Arc<K>,
    seg: SegmentCode,
}

impl<K: HostKernels> Executable for HostExec<K> {
    fn run(&self, io: &mut PassIo<'_, '_>) -> Result<(), ExecError> {
        let arena = self.seg.arena;
        // the arena's table is taken out for the pass (no lock held while ops run)
        let mut table = {
            let mut g = self.k.mem().arenas.lock().map_err(|_| ExecError::segment(err("run", "host memory lock poisoned".into())))?;
            g.remove(&arena).ok_or_else(|| ExecError::segment(err("run", format!("arena {arena} is not reserved"))))?
        };
        let (weights, spans) = (io.weights, io.spans);
        let layers = &mut *io.layers;
        let timing = &mut io.timing;
        let res = match io.observe.as_mut() {
            // the observer stays on the caller's thread
            Some(obs) => self.ops(&mut table, weights, spans, layers, timing, Some(&mut **obs)),
            None => {
                let mut res = Ok(());
                self.k.run_pass(&mut || res = self.ops(&mut table, weights, spans, layers, timing, None));
                res
            }
        };
        if let Ok(mut g) = self.k.mem().arenas.lock() {
            g.insert(arena, table);
        }
        res
    }
}

impl<K: HostKernels> HostExec<K> {
    fn ops(
        &self,
        table: &mut Table,
        weights: &[WeightView<'_>],
        spans: &[SeqSpan],
        layers: &mut [&mut [LayerState]],
        timing: &mut Option<&mut (dyn FnMut(usize) + Send)>,
        mut observe: Option<crate::backend::Observer<'_>>,
    ) -> Result<(), ExecError> {
        for (i, oc) in self.seg.ops.iter().enumerate() {
            let at = ExecError::at(i);
            let kind = oc.op.kind();
            let mut out = std::mem::replace(slot_of(table, oc.out, kind).map_err(at)?, empty(oc.meta.dtype));
            let res = run_op(&*self.k, oc, table, weights, spans, layers, &mut out);
            *slot_of(table, oc.out, kind).map_err(ExecError::at(i))? = out;
            res.map_err(ExecError::at(i))?;
            if let Some(t) = timing.as_mut() {
                t(i);
            }
            if let Some(obs) = observe.as_mut() {
                obs(i, slot_of(table, oc.out, kind).map_err(ExecError::at(i))?);
            }
        }
        Ok(())
    }
}

fn run_op<K: HostKernels>(
    k: &K,
    oc: &OpCode,
    table: &mut Table,
    weights: &[WeightView<'_>],
    spans: &[SeqSpan],
    layers: &mut [&mut [LayerState]],
    out: &mut Tensor,
) -> Result<(), OpError> {
    let kind = oc.op.kind();
    let table = &*table;
    let ins: SmallVec<[Value<'_>; 6]> = oc
        .inputs
        .iter()
        .map(|i| match *i {
            OpInput::Slot(id, _) => table
                .get(id.class as usize)
                .and_then(|c| c.get(id.slot as usize))
                .map(Value::Act)
                .ok_or_else(|| err(kind, format!("{id} is not reserved"))),
            OpInput::Weight(w) => Ok(Value::Weight(weights[w as usize])),
        })
        .collect::<Result<_, _>>()?;
    if let Op::LastRows { .. } = oc.op {
        // data movement by the pass's sequence table: the same on every host backend
        let x = match ins.first() {
            Some(Value::Act(t)) if t.dtype() == pn_ops::DType::F32 => t.as_f32(),
            _ => return Err(err(kind, "x must be an f32 activation".into())),
        };
        let n = oc.meta.shape.0[0];
        return pn_ops::reference::seqs::last_rows(x, n, spans, crate::backend::f32_out(out, &oc.meta));
    }
    let Some(l) = oc.state else {
        return k.kernel_into(&oc.op, &ins, &oc.meta, None, out);
    };
    let no_state = || err(kind, format!("no layer state {l}"));
    if layers.len() == 1 {
        let st = layers[0].get_mut(l).ok_or_else(no_state)?;
        return k.kernel_into(&oc.op, &ins, &oc.meta, Some(st), out);
    }
    let mut states: SmallVec<[&mut LayerState; 16]> =
        layers.iter_mut().map(|s| s.get_mut(l)).collect::<Option<_>>().ok_or_else(no_state)?;
    k.kernel_seqs(&oc.op, &ins, &oc.meta, spans, &mut states, out)
}

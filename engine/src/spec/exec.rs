//! A small compiled executor for graphs the runner does not plan: the MTP block's
//! (crate::spec::mtp). The whole graph is ONE segment compiled once by the backend
//! ([`Backend::compile`]) over buffer slots reserved once (one per value, its own arena),
//! so a run is: upload the inputs, run the executable (on the CPU inside one `run_pass`,
//! the pool's workers awake for the whole graph), download the outputs. Leaves are GGUF
//! weights (zero-copy, type and shape checked at build), `inp_tokens` / `inp_pos`, and
//! caller-filled f32 inputs ([`GraphBuilder::external`]). One layer state serves the
//! graph's stateful ops. Host-memory backends only (speculative decoding refuses device
//! dies: verify.rs).

use crate::backend::{new_arena, Backend, Executable, Memory, OpCode, OpInput, PassIo, SegmentCode, SlotId, SlotSpec};
use crate::gguf::Gguf;
use crate::graph::Graph;
use crate::runner::RunError;
use pn_ops::{DType, LayerState, Op, OpError, SeqSpan, Shape, Tensor, TensorData, TensorMeta, WeightView};
use crate::runner::bounded::Bounded;
use std::collections::BTreeMap;
use std::time::Instant;
use std::sync::{Arc, Mutex};

/// What a non-weight leaf is filled with before a run.
enum Fill {
    Tokens,
    Positions,
    External(String),
}

/// A graph compiled for one backend: its executable, slots and leaves.
pub struct Compiled {
    graph: Graph,
    backend: Arc<dyn Backend>,
    arena: u64,
    /// Bytes of the arena's slots (one per value).
    bytes: usize,
    exe: Box<dyn Executable>,
    /// Per `OpInput::Weight(i)`: the GGUF tensor index.
    weights: Vec<usize>,
    /// Leaves to upload: slot, meta, what fills it.
    fills: Vec<(SlotId, TensorMeta, Fill)>,
    outputs: Vec<(SlotId, TensorMeta)>,
    /// Run one at a time (a run takes the arena's table out).
    busy: Mutex<()>,
    /// `PN_DEBUG>=2`: per op kind (runs, ns), printed when dropped.
    times: Option<Mutex<BTreeMap<&'static str, (u64, u64)>>>,
    /// Per op of the segment: its kind.
    kinds: Vec<&'static str>,
    /// Run on the caller's thread ([`Compiled::inline`]).
    inline: bool,
}

fn weight_err(name: &str, msg: String) -> RunError {
    RunError::Weight { name: name.to_string(), msg }
}

fn op_err(name: &str, source: OpError) -> RunError {
    RunError::Op { node: name.to_string(), source }
}

impl Compiled {
    /// Checks every weight leaf against the file (present, same type and shape), gives
    /// every value a slot and compiles the op list as one segment.
    pub fn new(graph: Graph, g: &Gguf, backend: Arc<dyn Backend>) -> Result<Compiled, RunError> {
        if backend.memory() == Memory::Device {
            return Err(RunError::Unsupported {
                node: "(MTP block)".into(),
                backend: backend.name().into(),
                device: "device memory".into(),
                reason: "the MTP executor runs on host-memory backends only".into(),
            });
        }
        let arena = new_arena();
        let slot = |i: usize| SlotId { arena, class: 0, slot: i as u32 };
        let mut weight_of: Vec<Option<u32>> = vec![None; graph.len()];
        let (mut weights, mut fills, mut ops, mut specs) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for id in graph.order() {
            let n = graph.node(id);
            let fill = match (&n.op, n.out.dtype) {
                (Op::Weight { name }, DType::Weight(ty)) => {
                    let ix = g.tensors.iter().position(|t| &t.name == name).ok_or_else(|| weight_err(name, "required tensor is missing from the GGUF".into()))?;
                    let info = &g.tensors[ix];
                    let shape = Shape([info.ne[0] as usize, info.ne[1] as usize, info.ne[2] as usize, info.ne[3] as usize]);
                    if info.ty != ty || shape != n.out.shape {
                        return Err(weight_err(name, format!("graph expects {}, file has {}{shape:?}", n.out, info.ty)));
                    }
                    if g.try_tensor_bytes(info).is_none() {
                        return Err(weight_err(name, "data lies outside the file".into()));
                    }
                    weight_of[id.index()] = Some(weights.len() as u32);
                    weights.push(ix);
                    continue;
                }
                (Op::Weight { name }, _) => Some(Fill::External(name.clone())),
                (Op::Tokens, _) => Some(Fill::Tokens),
                (Op::Positions, _) => Some(Fill::Positions),
                _ => None,
            };
            specs.push(SlotSpec { id: slot(id.index()), dtype: n.out.dtype, bytes: 4 * n.out.shape.numel() });
            if let Some(f) = fill {
                fills.push((slot(id.index()), n.out, f));
                continue;
            }
            let inputs = n
                .inputs
                .iter()
                .map(|&i| match weight_of[i.index()] {
                    Some(w) => OpInput::Weight(w),
                    None => OpInput::Slot(slot(i.index()), graph.node(i).out),
                })
                .collect();
            ops.push(OpCode { op: n.op.clone(), inputs, meta: n.out, out: slot(id.index()), state: n.op.state().map(|_| 0) });
        }
        let outputs = graph.outputs.iter().map(|&o| (slot(o.index()), graph.node(o).out)).collect();
        backend.reserve(&specs).map_err(|e| op_err("(MTP slots)", e))?;
        let bytes = specs.iter().map(|s| s.bytes).sum();
        let kinds = ops.iter().map(|o: &OpCode| o.op.kind()).collect();
        let seg = SegmentCode { arena, segment: 0, n_tokens: 0, seqs: 0, all_logits: false, stable: false, ops };
        let exe = match backend.clone().compile(seg) {
            Ok(e) => e,
            Err(e) => {
                backend.release(arena);
                return Err(op_err("(compiling the MTP graph)", e));
            }
        };
        let times = (crate::planner::debug::level_from_env() >= 2).then(|| Mutex::new(BTreeMap::new()));
        Ok(Compiled { graph, backend, arena, bytes, exe, weights, fills, outputs, busy: Mutex::new(()), times, kinds, inline: false })
    }

    /// Runs on the caller's thread: a host backend runs an observed pass's ops there
    /// (crate::backend::host), no hand-over to its threads and back, which costs more
    /// than a graph of a few tiny ops (the MTP norms of one pair: a row lookup and two
    /// RMSNorms of `n_embd`).
    pub fn inline(mut self) -> Compiled {
        self.inline = true;
        self
    }

    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// Bytes its value slots hold on the backend.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Runs the graph for one sequence: `tokens` / `pos` fill the Tokens / Positions
    /// inputs, `ext` the external inputs by name; `state` serves every stateful op.
    /// Returns the graph outputs in order.
    pub fn run(&self, g: &Gguf, tokens: &[u32], pos: &[i32], ext: &[(&str, &[f32])], state: Option<&mut LayerState>) -> Result<Vec<Tensor>, RunError> {
        let spans = [SeqSpan { start: 0, len: tokens.len() }];
        let mut one: Vec<&mut [LayerState]> = state.into_iter().map(std::slice::from_mut).collect();
        self.run_seqs(g, tokens, pos, ext, &spans, &mut one)
    }

    /// Runs the graph for several sequences in one pass: `spans` their tokens on the
    /// token axis, `layers[i]` the states of sequence i (none for a stateless graph).
    pub fn run_seqs(&self, g: &Gguf, tokens: &[u32], pos: &[i32], ext: &[(&str, &[f32])], spans: &[SeqSpan], layers: &mut [&mut [LayerState]]) -> Result<Vec<Tensor>, RunError> {
        let _one = self.busy.lock().map_err(|_| op_err("(MTP graph)", OpError::Invalid { op: "run", msg: "a run panicked".into() }))?;
        let b = &self.backend;
        for (slot, meta, f) in &self.fills {
            let n = meta.shape.numel();
            let t = match f {
                Fill::Tokens | Fill::Positions => {
                    let v: Vec<i32> = if matches!(f, Fill::Tokens) { tokens.iter().map(|&x| x as i32).collect() } else { pos.to_vec() };
                    if v.len() != n {
                        return Err(op_err("inp_tokens", OpError::Shape { op: "input", expected: format!("{n} values"), found: format!("{}", v.len()) }));
                    }
                    Tensor::i32(meta.shape, v)
                }
                Fill::External(name) => {
                    let v = ext.iter().find(|(k, _)| k == name).map(|(_, v)| *v).ok_or_else(|| op_err(name, OpError::Invalid { op: "external", msg: format!("input {name} not given") }))?;
                    if v.len() != n {
                        return Err(op_err(name, OpError::Shape { op: "external", expected: meta.to_string(), found: format!("{} values", v.len()) }));
                    }
                    Tensor::f32(meta.shape, v.to_vec())
                }
            };
            b.upload(*slot, &t).map_err(|e| op_err("(MTP input)", e))?;
        }
        let views: Vec<WeightView<'_>> = self.weights.iter().map(|&ix| g.weight_view(ix)).collect();
        let ops = &self.kinds;
        let mut acc: Vec<(&'static str, u64)> = Vec::new();
        let mut t_last = Instant::now();
        let mut timing = |i: usize| {
            acc.push((ops.get(i).copied().unwrap_or("?"), t_last.elapsed().as_nanos() as u64));
            t_last = Instant::now();
        };
        let timed = self.times.is_some();
        let mut here = |_: usize, _: &Tensor| {};
        let mut io = PassIo { weights: &views, spans, ids: &[self.arena], layers, timing: if timed { Some(&mut timing) } else { None }, observe: None };
        if self.inline {
            io.observe = Some(&mut here);
        }
        self.exe.run(&mut io).map_err(|e| {
            let node = e.op.map_or("(MTP graph)".to_string(), |i| format!("MTP op {i}"));
            op_err(&node, e.source)
        })?;
        if let Some(t) = &self.times {
            let mut t = t.lock().expect("timing table");
            for (k, ns) in acc {
                let e = t.entry(k).or_default();
                e.0 += 1;
                e.1 += ns;
            }
        }
        let mut out = Vec::with_capacity(self.outputs.len());
        for (slot, meta) in &self.outputs {
            let mut t = Tensor { shape: Shape::d1(0), data: TensorData::F32(Vec::new()) };
            b.download(*slot, meta, &mut t).map_err(|e| op_err("(MTP output)", e))?;
            out.push(t);
        }
        Ok(out)
    }
}

impl Drop for Compiled {
    fn drop(&mut self) {
        if let Some(t) = &self.times {
            let t = t.lock().expect("timing table");
            let total: u64 = t.values().map(|v| v.1).sum();
            let parts: Vec<String> = t.iter().map(|(k, (n, ns))| format!("{k} {n}x {:.3} ms", *ns as f64 / 1e6)).collect();
            eprintln!("[pn] MTP graph of {} nodes: {:.3} ms in ops: {}", self.graph.len(), total as f64 / 1e6, parts.join(", "));
        }
        self.backend.release(self.arena);
    }
}

/// A cache key: which graph, its token count, its sequence count.
pub type Key = (u8, usize, usize);

/// Compiled graphs by [`Key`], weighed by their slots' bytes within a budget (least
/// recently used out first; the newest is always kept): several slots' block passes meet
/// a geometry per (pairs, sequences), and a block graph over a real vocabulary holds
/// megabytes of logits per sequence.
pub struct Cache(Mutex<Bounded<Key, Arc<Compiled>>>);

impl Cache {
    pub fn new(budget_bytes: usize) -> Cache {
        Cache(Mutex::new(Bounded::new(budget_bytes)))
    }

    pub fn get(&self, key: Key, make: impl FnOnce() -> Result<Compiled, RunError>) -> Result<Arc<Compiled>, RunError> {
        if let Some(c) = self.0.lock().expect("graph cache").get(&key) {
            return Ok(c);
        }
        let c = Arc::new(make()?);
        self.0.lock().expect("graph cache").insert_weighted(key, c.clone(), c.bytes());
        Ok(c)
    }

    /// Graphs held now.
    pub fn len(&self) -> usize {
        self.0.lock().expect("graph cache").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of the graphs held.
    pub fn bytes(&self) -> usize {
        self.0.lock().expect("graph cache").weight()
    }
}

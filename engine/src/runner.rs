//! The generic runner: builds (and caches) a model's graph per batch geometry, plans it
//! on one or two dies (engine/planner) and executes the plan segment by segment, each on
//! its die's backend, copying the boundary values between dies and reading/updating the
//! sequence's state.
//!
//! Per geometry it keeps a prebuilt op list ([`program::Program`]) and a value table
//! reused from step to step; graph inputs and transfer destinations are refilled in
//! place. `PN_DEBUG=1..3` (see [`crate::planner::debug`]) reports timings and values.

use crate::backend::{Backend, Support};
use crate::gguf::{Gguf, TensorInfo};
use crate::graph::{Graph, GraphBuilder, GraphError, Node};
use crate::model::{Geometry, Model};
use crate::planner::debug::{self, Counters, Profile};
use crate::planner::program::{self, InputKind, Program, Src};
use crate::planner::{Device, Placement, PlacementError, Plan, PlanError};
use crate::state::SeqState;
use pn_ops::{DType, OpError, Shape, Tensor, TensorData, Value, WeightView};
use smallvec::SmallVec;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum RunError {
    #[error("graph: {0}")]
    Graph(#[from] GraphError),
    #[error("node {node}: {source}")]
    Op { node: String, source: OpError },
    #[error("weight {name}: {msg}")]
    Weight { name: String, msg: String },
    #[error("token id {id} is out of range: the vocabulary has {n_vocab} tokens")]
    BadToken { id: u32, n_vocab: usize },
    #[error("context full: {have} tokens in the sequence + {adding} new exceed max_seq {max_seq} (raise --max-seq)")]
    ContextFull {
        have: usize,
        adding: usize,
        max_seq: usize,
    },
    #[error("no tokens to evaluate: expected at least one")]
    Empty,
    #[error("plan: {0}")]
    Plan(#[from] PlanError),
    #[error("placement: {0}")]
    Placement(#[from] PlacementError),
    #[error("dies: expected backends for {expected}, found {found}")]
    Dies { expected: String, found: String },
    #[error("node {node}: backend {backend} on {device} cannot run it: {reason}")]
    Unsupported {
        node: String,
        backend: String,
        device: String,
        reason: String,
    },
}

/// Called for every executed node with its output (tensor dumps, debugging).
pub type Observer<'o> = &'o mut dyn FnMut(&Node, &Tensor);

/// Logits of the rows that asked for them: `rows × n_vocab`, row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct Logits {
    pub n_vocab: usize,
    pub data: Vec<f32>,
}

impl Logits {
    pub fn rows(&self) -> usize {
        self.data.len() / self.n_vocab.max(1)
    }
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.n_vocab..(i + 1) * self.n_vocab]
    }
    pub fn last(&self) -> &[f32] {
        self.row(self.rows() - 1)
    }
}

/// One die: a device name and the backend instance (own threads) that executes its segments.
#[derive(Clone)]
pub struct Die {
    pub device: Device,
    pub backend: Arc<dyn Backend>,
}

/// A plan ready to run: graph, plan, op list, the reused value table, capture flags.
struct Compiled {
    graph: Arc<Graph>,
    plan: Arc<Plan>,
    prog: Program,
    values: Mutex<Vec<Option<Tensor>>>,
    captured: Vec<AtomicBool>,
}

pub struct Runner {
    model: Arc<dyn Model>,
    gguf: Arc<Gguf>,
    dies: Vec<Die>,
    placement: Placement,
    tensor_ix: HashMap<String, usize>,
    graphs: Mutex<HashMap<Geometry, Arc<Graph>>>,
    compiled: Mutex<HashMap<Geometry, Arc<Compiled>>>,
    /// Maximum tokens per forward pass; longer inputs are split (state carries over).
    pub ubatch: usize,
    debug: u8,
    profile: Profile,
    reported: AtomicBool,
}

fn weight_shape(info: &TensorInfo) -> Shape {
    Shape([
        info.ne[0] as usize,
        info.ne[1] as usize,
        info.ne[2] as usize,
        info.ne[3] as usize,
    ])
}

impl Runner {
    /// Binds a model to its weights and one backend (one die, `cpu:0`), and plans the
    /// decode graph once so missing or mis-shaped tensors are reported at load time.
    pub fn new(
        model: Arc<dyn Model>,
        gguf: Arc<Gguf>,
        backend: Arc<dyn Backend>,
    ) -> Result<Runner, RunError> {
        let dev = Device::cpu(0);
        Runner::with_dies(
            model,
            gguf,
            vec![Die {
                device: dev,
                backend,
            }],
            Placement::single(dev),
        )
    }

    /// A runner over the dies of `placement` (`dies[0]` = die A, `dies[1]` = die B).
    pub fn with_dies(
        model: Arc<dyn Model>,
        gguf: Arc<Gguf>,
        dies: Vec<Die>,
        placement: Placement,
    ) -> Result<Runner, RunError> {
        placement.check()?;
        let want = placement.named_dies();
        let have: Vec<Device> = dies.iter().map(|d| d.device).collect();
        if want != have {
            let names = |v: &[Device]| {
                v.iter()
                    .map(Device::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            };
            return Err(RunError::Dies {
                expected: names(&want),
                found: names(&have),
            });
        }
        let tensor_ix = gguf
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        let r = Runner {
            model,
            gguf,
            dies,
            placement,
            tensor_ix,
            graphs: Mutex::new(HashMap::new()),
            compiled: Mutex::new(HashMap::new()),
            ubatch: 512,
            debug: debug::level_from_env(),
            profile: Profile::default(),
            reported: AtomicBool::new(false),
        };
        r.compiled(Geometry {
            n_tokens: 1,
            all_logits: false,
        })?;
        Ok(r)
    }

    pub fn model(&self) -> &dyn Model {
        &*self.model
    }
    pub fn gguf(&self) -> &Gguf {
        &self.gguf
    }
    /// Die A's backend.
    pub fn backend(&self) -> &dyn Backend {
        &*self.dies[0].backend
    }
    pub fn dies(&self) -> &[Die] {
        &self.dies
    }
    pub fn placement(&self) -> &Placement {
        &self.placement
    }
    /// Steps run, capture / replay counts and bytes moved between dies so far.
    pub fn counters(&self) -> Counters {
        self.profile.counters()
    }
    /// The per-op timing table gathered with `PN_DEBUG>=2` (empty otherwise).
    pub fn op_table(&self) -> String {
        self.profile.op_table()
    }

    /// A fresh sequence state with room for `max_seq` positions. On CPU dies the layer
    /// states live in host memory; [`Plan::state_die`] says which die owns each.
    pub fn new_state(&self, max_seq: usize) -> SeqState {
        SeqState::new(self.model.new_state(max_seq), max_seq)
    }

    /// The graph for a geometry (built once, then cached).
    pub fn graph(&self, geom: Geometry) -> Result<Arc<Graph>, RunError> {
        if let Some(g) = self.graphs.lock().expect("graph cache lock").get(&geom) {
            return Ok(g.clone());
        }
        let mut b = GraphBuilder::new();
        self.model.build(geom, &mut b)?;
        let g = Arc::new(b.finish());
        self.graphs
            .lock()
            .expect("graph cache lock")
            .insert(geom, g.clone());
        Ok(g)
    }

    /// The plan for a geometry (what `pn dump --plan` shows).
    pub fn plan(&self, geom: Geometry) -> Result<Arc<Plan>, RunError> {
        Ok(self.compiled(geom)?.plan.clone())
    }

    /// Arena bytes per die reserved for the worst-case geometry (`ubatch` tokens, all
    /// logits), so buffers never have to grow between steps.
    pub fn memory_reservation(&self) -> Result<Vec<(Device, usize)>, RunError> {
        let geom = Geometry {
            n_tokens: self.ubatch.max(1),
            all_logits: true,
        };
        let g = self.graph(geom)?;
        let p = crate::planner::plan(&g, &self.placement, self.model.n_layer(), geom)?;
        let mut out: Vec<(Device, usize)> = p
            .dies
            .iter()
            .copied()
            .zip(p.mem.arena.iter().copied())
            .collect();
        for c in self.compiled.lock().expect("plan cache lock").values() {
            for (d, b) in c.plan.mem.arena.iter().enumerate() {
                out[d].1 = out[d].1.max(*b);
            }
        }
        Ok(out)
    }

    fn compiled(&self, geom: Geometry) -> Result<Arc<Compiled>, RunError> {
        if let Some(c) = self.compiled.lock().expect("plan cache lock").get(&geom) {
            return Ok(c.clone());
        }
        let graph = self.graph(geom)?;
        let plan = crate::planner::plan(&graph, &self.placement, self.model.n_layer(), geom)?;
        for s in &plan.segments {
            let die = &self.dies[s.die];
            for &id in &s.nodes {
                if let Support::No(reason) = die.backend.supports(graph.node(id)) {
                    let node = graph.node(id).name.clone();
                    return Err(RunError::Unsupported {
                        node,
                        backend: die.backend.name().into(),
                        device: die.device.to_string(),
                        reason,
                    });
                }
            }
        }
        let prog = program::build(&graph, &plan, &|name| self.tensor_ix.get(name).copied())
            .map_err(|msg| RunError::Weight {
                name: "(plan)".into(),
                msg,
            })?;
        for w in &prog.weights {
            let (node, info) = (graph.node(w.node), &self.gguf.tensors[w.tensor]);
            if DType::Weight(info.ty) != node.out.dtype || weight_shape(info) != node.out.shape {
                let msg = format!(
                    "graph expects {}, file has {}{}",
                    node.out,
                    info.ty,
                    weight_shape(info)
                );
                return Err(RunError::Weight {
                    name: info.name.clone(),
                    msg,
                });
            }
            if self.gguf.try_tensor_bytes(info).is_none() {
                return Err(RunError::Weight {
                    name: info.name.clone(),
                    msg: "data lies outside the file".into(),
                });
            }
        }
        if self.debug >= 1 {
            eprint!(
                "[pn] plan for {} tokens (all logits: {}):\n{}",
                geom.n_tokens,
                geom.all_logits,
                plan.summary(&graph)
            );
        }
        let c = Arc::new(Compiled {
            values: Mutex::new(vec![None; prog.n_values]),
            captured: plan
                .segments
                .iter()
                .map(|_| AtomicBool::new(false))
                .collect(),
            graph,
            plan: Arc::new(plan),
            prog,
        });
        self.compiled
            .lock()
            .expect("plan cache lock")
            .insert(geom, c.clone());
        Ok(c)
    }

    /// Evaluate `tokens` (appended to the sequence) and return logits for every token
    /// (`all_logits`) or only the last one. Inputs longer than `ubatch` run in several
    /// passes; the sequence state carries over, so the result does not depend on the split.
    pub fn forward(
        &self,
        st: &mut SeqState,
        tokens: &[u32],
        all_logits: bool,
    ) -> Result<Logits, RunError> {
        self.forward_observed(st, tokens, all_logits, None)
    }

    pub fn forward_observed(
        &self,
        st: &mut SeqState,
        tokens: &[u32],
        all_logits: bool,
        mut observer: Option<Observer<'_>>,
    ) -> Result<Logits, RunError> {
        if tokens.is_empty() {
            return Err(RunError::Empty);
        }
        let n_vocab = self.model.n_vocab();
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(RunError::BadToken { id, n_vocab });
        }
        if !st.fits(tokens.len()) {
            return Err(RunError::ContextFull {
                have: st.pos,
                adding: tokens.len(),
                max_seq: st.max_seq,
            });
        }
        if self.debug >= 1 && !self.reported.swap(true, Ordering::Relaxed) {
            let r = self.memory_reservation()?;
            let parts: Vec<String> = r.iter().map(|(d, b)| format!("{d} {b} bytes")).collect();
            eprintln!(
                "[pn] activation arenas reserved for {} tokens: {}",
                self.ubatch.max(1),
                parts.join(", ")
            );
        }
        let ubatch = self.ubatch.max(1);
        let mut out = Vec::new();
        let n_chunks = tokens.len().div_ceil(ubatch);
        for (i, chunk) in tokens.chunks(ubatch).enumerate() {
            let last = i + 1 == n_chunks;
            let lens = [chunk.len()];
            if !all_logits && !last {
                self.eval(&mut [&mut *st], &lens, chunk, false, &mut observer)?;
                continue;
            }
            let t = self.eval(&mut [&mut *st], &lens, chunk, all_logits, &mut observer)?;
            out.extend_from_slice(t.as_f32());
        }
        Ok(Logits { n_vocab, data: out })
    }

    /// One pass over one micro-batch: the plan's segments in order. `seqs[i]` owns the
    /// next `lens[i]` tokens (several: [`Runner::forward_multi`], crate::slots). Returns
    /// `result_output`.
    pub(crate) fn eval(
        &self,
        seqs: &mut [&mut SeqState],
        lens: &[usize],
        tokens: &[u32],
        all_logits: bool,
        observer: &mut Option<Observer<'_>>,
    ) -> Result<Tensor, RunError> {
        let c = self.compiled(Geometry {
            n_tokens: tokens.len(),
            all_logits,
        })?;
        let (graph, plan, prog) = (&*c.graph, &*c.plan, &c.prog);
        let mut vals = c.values.lock().expect("value table lock");
        for (v, keep) in vals.iter_mut().zip(&prog.persistent) {
            if !keep {
                *v = None;
            }
        }
        let views: Vec<WeightView<'_>> = prog
            .weights
            .iter()
            .map(|w| {
                let info = &self.gguf.tensors[w.tensor];
                WeightView {
                    name: &info.name,
                    ty: info.ty,
                    shape: weight_shape(info),
                    bytes: self.gguf.tensor_bytes(info),
                }
            })
            .collect();
        let step = self.profile.counters().steps;
        let step_t0 = Instant::now();
        let mut op_times: BTreeMap<&'static str, (u64, u64)> = BTreeMap::new();
        for (si, sp) in prog.segs.iter().enumerate() {
            let t0 = Instant::now();
            let die = &self.dies[sp.die];
            let mut moved = 0usize;
            for &(src, dst, bytes) in &sp.transfers {
                let s = vals[src as usize]
                    .take()
                    .expect("transfer source computed by an earlier segment");
                copy_into(&mut vals[dst as usize], &s);
                vals[src as usize] = Some(s);
                moved += bytes;
            }
            for &(v, kind, node) in &sp.inputs {
                let slot = &mut vals[v as usize];
                fill_input(slot, kind, tokens, seqs, lens);
                if plan.nodes[node.index()].seg == Some(si) {
                    if let (Some(obs), Some(t)) = (observer.as_mut(), slot.as_ref()) {
                        obs(graph.node(node), t);
                    }
                }
            }
            for op in &sp.ops {
                let node = graph.node(op.node);
                let ins: SmallVec<[Value<'_>; 6]> = op
                    .inputs
                    .iter()
                    .map(|s| match *s {
                        Src::Val(v) => Value::Act(
                            vals[v as usize]
                                .as_ref()
                                .expect("inputs are computed before their consumers"),
                        ),
                        Src::Weight(w) => Value::Weight(views[w as usize]),
                    })
                    .collect();
                let t1 = (self.debug >= 2).then(Instant::now);
                let res = match op.state {
                    None => die.backend.execute(&node.op, &ins, &node.out, None),
                    Some(s) if seqs.len() == 1 => {
                        let state = seqs[0].layers.get_mut(s).ok_or_else(|| no_state(node, s))?;
                        die.backend.execute(&node.op, &ins, &node.out, Some(state))
                    }
                    Some(s) => {
                        if seqs.iter().any(|q| q.layers.len() <= s) {
                            return Err(no_state(node, s));
                        }
                        crate::slots::run_per_sequence(&*die.backend, node, &ins, s, seqs, lens)
                    }
                };
                let out = res.map_err(|source| RunError::Op {
                    node: node.name.clone(),
                    source,
                })?;
                drop(ins);
                if let Some(t1) = t1 {
                    let e = op_times.entry(node.op.kind()).or_default();
                    e.0 += 1;
                    e.1 += t1.elapsed().as_nanos() as u64;
                }
                if self.debug >= 3 {
                    eprintln!("[pn] {}", crate::dump::summary(&node.name, &out));
                }
                if let Some(obs) = observer.as_mut() {
                    obs(node, &out);
                }
                vals[op.out as usize] = Some(out);
                for &f in &op.frees {
                    vals[f as usize] = None;
                }
            }
            let unit = if plan.capture[si].stable {
                let replay = c.captured[si].swap(true, Ordering::Relaxed);
                let counter = if replay {
                    &self.profile.replays
                } else {
                    &self.profile.captures
                };
                counter.fetch_add(1, Ordering::Relaxed);
                if replay {
                    " replay"
                } else {
                    " capture"
                }
            } else {
                ""
            };
            self.profile
                .transfer_bytes
                .fetch_add(moved as u64, Ordering::Relaxed);
            if self.debug >= 1 {
                let ms = t0.elapsed().as_secs_f64() * 1e3;
                eprintln!(
                    "[pn] step {step} seg {si} @{}: {} ops {ms:.3} ms, transfer in {moved} B{unit}",
                    die.device,
                    sp.ops.len()
                );
            }
        }
        for (st, &n) in seqs.iter_mut().zip(lens) {
            st.pos += n;
        }
        self.profile.add_step(step_t0.elapsed());
        if self.debug >= 2 {
            self.profile.add_ops(&op_times);
        }
        if self.debug >= 1 {
            let k = self.profile.counters();
            eprintln!(
                "[pn] step {step}: {} tokens, {:.3} ms; capture units: {} captured, {} replays",
                tokens.len(),
                step_t0.elapsed().as_secs_f64() * 1e3,
                k.captures,
                k.replays
            );
        }
        Ok(vals[prog.output as usize]
            .take()
            .expect("the graph output is kept alive"))
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        if self.debug >= 2 {
            eprint!("{}", self.profile.op_table());
        }
    }
}

/// Copies a value into another die's buffer, reusing the buffer when it fits.
fn copy_into(dst: &mut Option<Tensor>, src: &Tensor) {
    if let Some(d) = dst.as_mut().filter(|d| d.shape == src.shape) {
        match (&mut d.data, &src.data) {
            (TensorData::F32(a), TensorData::F32(b)) => return a.copy_from_slice(b),
            (TensorData::I32(a), TensorData::I32(b)) => return a.copy_from_slice(b),
            _ => {}
        }
    }
    *dst = Some(src.clone());
}

fn no_state(node: &Node, s: usize) -> RunError {
    RunError::Op {
        node: node.name.clone(),
        source: OpError::Invalid {
            op: node.op.kind(),
            msg: format!("no layer state {s}"),
        },
    }
}

/// Token ids, or each sequence's positions `pos..pos+n` (`seqs[i]` owns `lens[i]`
/// consecutive tokens), written into the die's input buffer in place.
fn fill_input(
    slot: &mut Option<Tensor>,
    kind: InputKind,
    tokens: &[u32],
    seqs: &[&mut SeqState],
    lens: &[usize],
) {
    let n = tokens.len();
    let t = slot.get_or_insert_with(|| Tensor::i32(Shape::d1(n), vec![0; n]));
    if t.shape != Shape::d1(n) || t.dtype() != DType::I32 {
        *t = Tensor::i32(Shape::d1(n), vec![0; n]);
    }
    if let TensorData::I32(v) = &mut t.data {
        match kind {
            InputKind::Tokens => v.iter_mut().zip(tokens).for_each(|(x, &id)| *x = id as i32),
            InputKind::Positions => {
                let mut i = 0;
                for (st, &len) in seqs.iter().zip(lens) {
                    for j in 0..len {
                        v[i] = (st.pos + j) as i32;
                        i += 1;
                    }
                }
            }
        }
    }
}

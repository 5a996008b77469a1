//! The generic runner: builds (and caches) a model's graph per batch geometry, plans it
//! on one or two dies (engine/planner) and executes the plan segment by segment, each on
//! its die's backend, copying the boundary values between dies and reading/updating the
//! sequence's state.
//!
//! Per geometry it keeps a prebuilt op list ([`program::Program`]) and a value table
//! reused from step to step; graph inputs and transfer destinations are refilled in
//! place. `PN_DEBUG=1..3` (see [`crate::planner::debug`]) reports timings and values.
//!
//! Every die's backend keeps its buffer slots (and a device backend the layer states of
//! its layers, crate::backend): the runner moves only graph inputs (uploaded), values
//! crossing a die boundary, the graph output and observer copies (downloaded), see
//! `runner/moves.rs`, and runs each segment's [`Executable`], compiled once per geometry.
//!
//! A pass can also hand out the hidden rows after `output_norm` ([`HIDDEN_NODE`], what an
//! MTP drafter reads): its graph then has that node as a second output (its buffer lives
//! to the end of the pass, like the logits'), the backend runs the pass as usual and the
//! runner downloads both ([`Taps::hidden`]). No observer: the backend's pass is the same.

mod arena;
pub mod bounded;
mod compile;
mod eval;
mod lanes;
mod moves;

use crate::backend::{Backend, Executable, Memory};
use crate::gguf::Gguf;
use crate::graph::{Graph, GraphBuilder, GraphError, Node};
use crate::model::{Geometry, Model};
use crate::planner::debug::{self, Counters, Profile};
use crate::planner::program::{self, Program};
use crate::planner::{Device, Placement, PlacementError, Plan, PlanError};
use crate::state::SeqState;
use bounded::Bounded;
use pn_ops::{OpError, Tensor};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
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
    /// A backend failed to reserve, upload, download or copy a buffer slot
    /// (`slot`: its id and die, e.g. `slot 3/0#5 on cuda:0`).
    #[error("{action} of {node} ({slot}): {source}")]
    Slot {
        action: &'static str,
        node: String,
        slot: String,
        source: Box<OpError>,
    },
    /// A layer state could not be moved between the host and a device backend.
    #[error("{0}")]
    StateMove(#[from] crate::state::MoveError),
    /// [`Taps::hidden`] asked of a model whose graph has no [`HIDDEN_NODE`].
    #[error("the {arch} graph has no node {HIDDEN_NODE} (the hidden rows after output_norm) to hand out")]
    NoHidden { arch: String },
}

/// The node whose rows [`Taps::hidden`] hands out: the hidden state after `output_norm`,
/// `[n_embd]` per token of the pass (models/src/blocks.rs).
pub const HIDDEN_NODE: &str = "result_norm";

/// Called for every executed node with its output (tensor dumps, debugging).
pub type Observer<'o> = &'o mut dyn FnMut(&Node, &Tensor);

/// What a pass hands out besides the logits.
#[derive(Default)]
pub struct Taps<'o> {
    /// Sees every evaluated node's value (the backend runs the ops on the caller's
    /// thread for it: slower; dumps and debugging).
    pub observer: Option<Observer<'o>>,
    /// Receives (appended) the [`HIDDEN_NODE`] rows of every token of the pass, in
    /// order: a second graph output, downloaded like the logits.
    pub hidden: Option<&'o mut Vec<f32>>,
}

impl<'o> Taps<'o> {
    pub fn observer(o: Option<Observer<'o>>) -> Taps<'o> {
        Taps { observer: o, hidden: None }
    }
    pub fn hidden(h: &'o mut Vec<f32>) -> Taps<'o> {
        Taps { observer: None, hidden: Some(h) }
    }
}

/// A cache key: the geometry and whether the graph hands out [`HIDDEN_NODE`].
type Key = (Geometry, bool);

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

/// A plan ready to run: graph, plan, op list (bound to buffer slots), one executable per
/// segment (compiled by its die's backend), capture flags, the stateful nodes.
struct Compiled {
    graph: Arc<Graph>,
    stateful: Vec<crate::graph::NodeId>,
    plan: Arc<Plan>,
    prog: Program,
    exes: Vec<Box<dyn Executable>>,
    captured: Vec<AtomicBool>,
    /// With a hidden output: the value computing [`HIDDEN_NODE`] and its node.
    hidden: Option<(u32, crate::graph::NodeId)>,
}

pub struct Runner {
    model: Arc<dyn Model>,
    gguf: Arc<Gguf>,
    dies: Vec<Die>,
    placement: Placement,
    tensor_ix: HashMap<String, usize>,
    /// The model's graph per geometry (shared with [`Runner::replica`]s: the same model
    /// builds the same graphs).
    graphs: Arc<Mutex<Bounded<Key, Arc<Graph>>>>,
    /// Compiled geometries, least recently used out first above the cap (bounded.rs).
    compiled: Mutex<Bounded<Key, Arc<Compiled>>>,
    /// Nodes of the one-token graph (what a geometry's size is estimated from).
    nodes: AtomicUsize,
    /// Maximum tokens per forward pass; longer inputs are split (state carries over).
    pub ubatch: usize,
    debug: u8,
    profile: Profile,
    reported: AtomicBool,
    /// The buffer slots of every geometry's values (one pass at a time holds them).
    arena: Mutex<arena::Arena>,
    /// Whether the arena was reserved for the worst-case geometry yet.
    reserved: AtomicBool,
    /// Per die: where its backend's memory is, and the arena id of its slots there.
    memory: Vec<Memory>,
    arena_ids: Vec<u64>,
    /// Replicas on one-thread backends that run a multi-sequence pass as groups side
    /// by side ([`Runner::set_lanes`]; none: one pass).
    pub(crate) lanes: Option<lanes::Lanes>,
}

impl Runner {
    /// Binds a model to its weights and one backend (one die, `cpu:0`), and plans the
    /// decode graph once so missing or mis-shaped tensors are reported at load time.
    pub fn new(model: Arc<dyn Model>, gguf: Arc<Gguf>, backend: Arc<dyn Backend>) -> Result<Runner, RunError> {
        let dev = Device::cpu(0);
        Runner::with_dies(model, gguf, vec![Die { device: dev, backend }], Placement::single(dev))
    }

    /// A runner over the dies of `placement` (`dies[0]` = die A, `dies[1]` = die B).
    pub fn with_dies(model: Arc<dyn Model>, gguf: Arc<Gguf>, dies: Vec<Die>, placement: Placement) -> Result<Runner, RunError> {
        placement.check()?;
        let want = placement.named_dies();
        let have: Vec<Device> = dies.iter().map(|d| d.device).collect();
        if want != have {
            let names = |v: &[Device]| v.iter().map(Device::to_string).collect::<Vec<_>>().join(",");
            return Err(RunError::Dies { expected: names(&want), found: names(&have) });
        }
        let tensor_ix = gguf.tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
        let memory = dies.iter().map(|d| d.backend.memory()).collect();
        let arena_ids = dies.iter().map(|_| crate::backend::new_arena()).collect();
        let r = Runner {
            model,
            gguf,
            dies,
            placement,
            tensor_ix,
            graphs: Arc::new(Mutex::new(Bounded::new(usize::MAX))),
            compiled: Mutex::new(Bounded::new(usize::MAX)),
            nodes: AtomicUsize::new(0),
            ubatch: 256,
            debug: debug::level_from_env(),
            profile: Profile::default(),
            reported: AtomicBool::new(false),
            arena: Mutex::new(arena::Arena::default()),
            reserved: AtomicBool::new(false),
            memory,
            arena_ids,
            lanes: None,
        };
        let nodes = r.compiled(Geometry::one(1, false))?.graph.len();
        r.nodes.store(nodes, Ordering::Relaxed);
        r.set_max_geometries(bounded::cap_for(nodes, bounded::DEFAULT_BUDGET_MB));
        Ok(r)
    }

    /// Keep at most `n` compiled geometries (and graphs), least recently used out first;
    /// a geometry dropped is compiled again when met again. With lanes this runner runs
    /// the single-sequence passes and keeps `n`; the replicas run the groups of the
    /// multi-sequence passes and keep `n / lanes` each (so `2n` in all).
    pub fn set_max_geometries(&self, n: usize) {
        self.compiled.lock().expect("plan cache lock").set_cap(n);
        let lanes = self.lanes.as_ref().map_or(0, |l| l.runners.len());
        if let Some(l) = &self.lanes {
            l.runners.iter().for_each(|r| r.set_max_geometries((n / lanes).max(1)));
        }
        // the replicas share the graphs
        self.graphs.lock().expect("graph cache lock").set_cap(n.saturating_mul(if lanes == 0 { 1 } else { 2 }));
    }
    /// Keep the compiled geometries that fit `mb` MiB (at the estimated bytes of one).
    pub fn set_geometry_budget_mb(&self, mb: usize) {
        self.set_max_geometries(bounded::cap_for(self.nodes.load(Ordering::Relaxed), mb));
    }
    /// The cap [`Runner::set_max_geometries`] was given (the compiled cache's).
    fn max_geometries(&self) -> usize {
        self.compiled.lock().expect("plan cache lock").cap()
    }

    /// This runner's cap on compiled geometries (its lanes' are their own), and how
    /// many it dropped so far.
    pub fn geometry_cache(&self) -> (usize, u64) {
        let c = self.compiled.lock().expect("plan cache lock");
        (c.cap(), c.evicted)
    }

    pub fn model(&self) -> &dyn Model {
        &*self.model
    }
    /// A runner of the same model and file on one die of `backend` (`cpu:0`): what
    /// [`Runner::set_lanes`] takes.
    pub fn replica(&self, backend: Arc<dyn Backend>) -> Result<Runner, RunError> {
        let mut r = Runner::new(self.model.clone(), self.gguf.clone(), backend)?;
        r.graphs = self.graphs.clone();
        r.set_max_geometries(self.max_geometries());
        Ok(r)
    }

    /// Lanes (runner/lanes.rs): `lanes` replicas of this runner (the same model and
    /// file, each on its own one-thread backend) run the sequences of a multi-sequence
    /// pass in groups side by side; fewer than two: one pass, as without. They take this
    /// runner's `ubatch`.
    pub fn set_lanes(&mut self, mut lanes: Vec<Runner>) -> Result<(), String> {
        for l in &mut lanes {
            l.ubatch = self.ubatch;
            l.lanes = None;
        }
        self.lanes = if lanes.len() >= 2 { Some(lanes::Lanes::new(lanes)?) } else { None };
        self.set_max_geometries(self.max_geometries());
        Ok(())
    }
    /// How many lanes run a multi-sequence pass (1: one pass).
    pub fn lanes(&self) -> usize {
        self.lanes.as_ref().map_or(1, |l| l.runners.len())
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

    /// A fresh sequence state with room for `max_seq` positions. Its layers start on the
    /// host; a pass moves each to the die of its ops ([`Plan::state_die`]) when that
    /// die's memory is a device's.
    pub fn new_state(&self, max_seq: usize) -> SeqState {
        SeqState::new(self.model.new_state(max_seq), max_seq)
    }

    /// Brings every layer of `st` home from the device backends (the host copies are
    /// current afterwards; the next pass uploads them again). [`SeqState`]'s own readers
    /// and writers do this where they need it; this is for callers that read the host
    /// copies through [`SeqState::layers`] repeatedly.
    pub fn sync_state(&self, st: &mut SeqState) -> Result<(), RunError> {
        Ok(st.sync()?)
    }

    /// The graph for a geometry (built once, then cached).
    pub fn graph(&self, geom: Geometry) -> Result<Arc<Graph>, RunError> {
        self.graph_for((geom, false))
    }

    /// The graph of `key`: with `key.1`, [`HIDDEN_NODE`] is a second output.
    fn graph_for(&self, key: Key) -> Result<Arc<Graph>, RunError> {
        if let Some(g) = self.graphs.lock().expect("graph cache lock").get(&key) {
            return Ok(g.clone());
        }
        let mut b = GraphBuilder::new();
        self.model.build(key.0, &mut b)?;
        let mut g = b.finish();
        if key.1 {
            let id = g.find(HIDDEN_NODE).ok_or_else(|| RunError::NoHidden { arch: self.model.arch().into() })?;
            g.outputs.push(id);
        }
        let g = Arc::new(g);
        self.graphs.lock().expect("graph cache lock").insert(key, g.clone());
        Ok(g)
    }

    /// The geometries compiled so far (graph, plan and executables are cached per
    /// geometry), in order.
    pub fn geometries(&self) -> Vec<Geometry> {
        let mut v: Vec<Geometry> = self.compiled.lock().expect("plan cache lock").keys().map(|k| k.0).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// The plan for a geometry (what `pn dump --plan` shows).
    pub fn plan(&self, geom: Geometry) -> Result<Arc<Plan>, RunError> {
        Ok(self.compiled(geom)?.plan.clone())
    }

    /// Bytes per die the runner's buffer slots take for the worst-case geometry
    /// (`ubatch` tokens, all logits) and every geometry run so far: what the passes
    /// reserve once, so buffers never move between steps.
    pub fn memory_reservation(&self) -> Result<Vec<(Device, usize)>, RunError> {
        let worst = self.compiled(Geometry::one(self.ubatch.max(1), true))?;
        let compiled: Vec<Arc<Compiled>> = self.compiled.lock().expect("plan cache lock").values().cloned().collect();
        let mut a = arena::Arena::default();
        compiled.iter().chain([&worst]).for_each(|c| drop(a.reserve(&c.prog)));
        Ok(worst.plan.dies.iter().enumerate().map(|(d, &dev)| (dev, a.bytes(d).0)).collect())
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

    /// [`Runner::forward`] with an observer that sees every evaluated node's value.
    pub fn forward_observed(&self, st: &mut SeqState, tokens: &[u32], all_logits: bool, observer: Option<Observer<'_>>) -> Result<Logits, RunError> {
        self.forward_with(st, tokens, all_logits, Taps::observer(observer))
    }

    /// [`Runner::forward`] that also appends the [`HIDDEN_NODE`] rows of every token to
    /// `hidden` (`[n_embd]` per token; all of them whatever `all_logits`).
    pub fn forward_hidden(&self, st: &mut SeqState, tokens: &[u32], all_logits: bool, hidden: &mut Vec<f32>) -> Result<Logits, RunError> {
        self.forward_with(st, tokens, all_logits, Taps::hidden(hidden))
    }

    /// [`Runner::forward`] handing out `taps`.
    pub fn forward_with(&self, st: &mut SeqState, tokens: &[u32], all_logits: bool, mut taps: Taps<'_>) -> Result<Logits, RunError> {
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
                "[pn] activation buffer slots reserved for {} tokens: {}",
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
                self.eval(&mut [&mut *st], &lens, chunk, false, &mut taps)?;
                continue;
            }
            let t = self.eval(&mut [&mut *st], &lens, chunk, all_logits, &mut taps)?;
            out.extend_from_slice(t.as_f32());
        }
        Ok(Logits { n_vocab, data: out })
    }

}

impl Drop for Runner {
    fn drop(&mut self) {
        if self.debug >= 2 {
            eprint!("{}", self.profile.op_table());
        }
        for (d, die) in self.dies.iter().enumerate() {
            die.backend.release(self.arena_ids[d]);
        }
    }
}

//! The planner: turns a graph into a [`Plan`] for one or two dies, in named passes that
//! record why each node landed where it did.
//!
//! 1. placement ([`place`]): per-node overrides > the layer split (explicit > environment >
//!    default) for layer nodes; the embedding lookup is pinned to die A and the output
//!    norm + head to die B with their weights; leaves (weights, token ids, positions)
//!    follow their consumers and are materialized on every die that reads them — the
//!    positions, read by attention layers on both dies, are filled from the host on each
//!    die rather than transferred.
//! 2. segments: maximal runs of nodes on one die, with an explicit [`Transfer`] for every
//!    computed value read on the other die (for a layer split: the boundary hidden state
//!    `l_out-{split-1}`, and nothing else).
//! 3. memory ([`memory`]): every value's lifetime on its die; [`MemPlan::slots`] turns
//!    them into buffer slots (values with disjoint lifetimes share one): each slot is one
//!    persistent buffer per die, shared by all geometries and reserved for the worst case
//!    (`ubatch` tokens), that the backend writes op outputs into, so a step allocates no
//!    activations.
//! 4. capture units: segments of a stable geometry (decode, 1 token) are marked
//!    capturable; the runner replays them from a prebuilt op list after one plain run
//!    (the CUDA backend will capture them as CUDA graphs).
//!
//! Per-layer state (KV cache, conv/SSM state) lives with the die of the ops that use it
//! ([`Plan::state_die`]).

pub mod debug;
pub mod device;
pub mod memory;
pub mod place;
pub mod program;

pub use device::{Device, DeviceKind, Override, Placement, PlacementError, Source};
pub use memory::{BufKind, Buffer, MemPlan, Slots};
pub use place::{Cause, DieIx, NodePlan, Segment, Transfer};

use crate::graph::{Graph, NodeId};
use crate::model::Geometry;
use pn_ops::DType;
use std::fmt::Write;
use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq)]
pub enum PlanError {
    #[error("placement: {0}")]
    Placement(#[from] PlacementError),
    #[error("layer state {state}: expected one die, found ops on dies {a} and {b}")]
    StateSplit { state: usize, a: String, b: String },
    #[error("node %{node} {name}: expected a die and a segment, found none")]
    Unplaced { node: usize, name: String },
    #[error("edge %{from} -> %{to}: crosses from {src} to {dst} without a transfer")]
    CrossDie {
        from: usize,
        to: usize,
        src: String,
        dst: String,
    },
    #[error("segment {seg}: expected nodes of die {die} in graph order, found node %{node}")]
    BadSegment { seg: usize, die: usize, node: usize },
}

/// A segment that may be captured (its geometry is stable step after step).
#[derive(Clone, Debug, PartialEq)]
pub struct CaptureUnit {
    pub segment: usize,
    pub stable: bool,
}

/// Placement, segments, transfers, memory plan and capture units of one graph.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// The dies this plan uses: [A] or [A, B].
    pub dies: Vec<crate::planner::Device>,
    pub n_layer: usize,
    /// Layers [0, split_layer) on die A (split_layer == n_layer: one die).
    pub split_layer: usize,
    /// One entry per graph node, by node index.
    pub nodes: Vec<NodePlan>,
    pub segments: Vec<Segment>,
    pub transfers: Vec<Transfer>,
    pub mem: MemPlan,
    /// The die holding each layer state (by state index; None: unused by this graph).
    pub state_die: Vec<Option<DieIx>>,
    pub capture: Vec<CaptureUnit>,
}

/// Plans `g` (a graph of `n_layer` layers built for `geom`).
pub fn plan(g: &Graph, p: &Placement, n_layer: usize, geom: Geometry) -> Result<Plan, PlanError> {
    p.check()?;
    let dies = p.dies(n_layer);
    let split_layer = p.split_layer(n_layer);
    let placed = place::place(g, p, dies.len(), split_layer);
    let mut state_die: Vec<Option<DieIx>> = Vec::new();
    for id in g.order() {
        if let Some(s) = g.node(id).op.state() {
            if state_die.len() <= s {
                state_die.resize(s + 1, None);
            }
            let d = placed.nodes[id.index()].die;
            match state_die[s] {
                Some(o) if o != d => {
                    return Err(PlanError::StateSplit {
                        state: s,
                        a: dies[o].to_string(),
                        b: dies[d].to_string(),
                    })
                }
                _ => state_die[s] = Some(d),
            }
        }
    }
    let mem = memory_plan(g, &placed, dies.len());
    let capture = placed
        .segments
        .iter()
        .map(|s| CaptureUnit {
            segment: s.id,
            stable: geom.n_tokens == 1,
        })
        .collect();
    let plan = Plan {
        dies,
        n_layer,
        split_layer,
        nodes: placed.nodes,
        segments: placed.segments,
        transfers: placed.transfers,
        mem,
        state_die,
        capture,
    };
    plan.validate(g)?;
    Ok(plan)
}

/// Lifetimes over the schedule (per segment: transfers in, inputs, then its nodes).
fn memory_plan(g: &Graph, pl: &place::Placed, n_dies: usize) -> MemPlan {
    let mut bufs: Vec<Buffer> = Vec::new();
    // the buffer of (value, die)
    let mut index: std::collections::HashMap<(usize, DieIx), usize> = std::collections::HashMap::new();
    let open = |index: &mut std::collections::HashMap<_, _>, bufs: &mut Vec<Buffer>, value: NodeId, die: DieIx, kind: BufKind, step: usize| {
        index.insert((value.index(), die), bufs.len());
        let bytes = memory::align(crate::dump::node_bytes(g.node(value)));
        bufs.push(Buffer { value, die, kind, bytes, start: step, end: step });
    };
    let mut step = 0usize;
    for s in &pl.segments {
        for &t in &s.transfers_in {
            let tr = &pl.transfers[t];
            open(&mut index, &mut bufs, tr.value, tr.to, BufKind::TransferIn, step);
            let src = index[&(tr.value.index(), tr.from)];
            bufs[src].end = bufs[src].end.max(step);
            step += 1;
        }
        for &i in &s.inputs {
            open(&mut index, &mut bufs, i, s.die, BufKind::Input, step);
            step += 1;
        }
        for &id in &s.nodes {
            if !matches!(g.node(id).out.dtype, DType::Weight(_)) {
                open(&mut index, &mut bufs, id, s.die, BufKind::Act, step);
            }
            for &i in &g.node(id).inputs {
                if let Some(&b) = index.get(&(i.index(), s.die)) {
                    bufs[b].end = bufs[b].end.max(step);
                }
            }
            step += 1;
        }
    }
    for &o in &g.outputs {
        if let Some(&b) = index.get(&(o.index(), pl.nodes[o.index()].die)) {
            bufs[b].end = step;
        }
    }
    MemPlan::new(bufs, n_dies)
}

impl Plan {
    /// Checks the invariants: every node placed, segments are maximal same-die runs in
    /// graph order, no edge crosses dies without a transfer (or a per-die leaf), every
    /// layer state on one die.
    pub fn validate(&self, g: &Graph) -> Result<(), PlanError> {
        let die_name = |d: DieIx| {
            self.dies
                .get(d)
                .map_or(format!("die {d}"), |x| x.to_string())
        };
        let mut pos = 0usize;
        let computed: Vec<NodeId> = g.order().filter(|id| !g.node(*id).op.is_leaf()).collect();
        for s in &self.segments {
            for &id in &s.nodes {
                if computed.get(pos) != Some(&id)
                    || self.nodes[id.index()].die != s.die
                    || self.nodes[id.index()].seg != Some(s.id)
                {
                    return Err(PlanError::BadSegment {
                        seg: s.id,
                        die: s.die,
                        node: id.index(),
                    });
                }
                pos += 1;
            }
        }
        for id in g.order() {
            let n = g.node(id);
            let np = &self.nodes[id.index()];
            let consumed =
                g.g.neighbors_directed(id, petgraph::Direction::Outgoing)
                    .next()
                    .is_some()
                    || g.outputs.contains(&id);
            if np.die >= self.dies.len()
                || (consumed && (np.seg.is_none() || np.on & (1 << np.die) == 0))
            {
                return Err(PlanError::Unplaced {
                    node: id.index(),
                    name: n.name.clone(),
                });
            }
            for &i in &n.inputs {
                let src = &self.nodes[i.index()];
                let on_die = src.on & (1 << np.die) != 0;
                let moved = g.node(i).op.is_leaf()
                    || src.die == np.die
                    || self
                        .transfers
                        .iter()
                        .any(|t| t.value == i && t.to == np.die && t.before <= np.seg.unwrap_or(0));
                if !on_die || !moved {
                    return Err(PlanError::CrossDie {
                        from: i.index(),
                        to: id.index(),
                        src: die_name(src.die),
                        dst: die_name(np.die),
                    });
                }
            }
        }
        Ok(())
    }

    /// `@cpu:0 seg=2 cause=default` (a leaf on both dies: `@cpu:0+cpu:1`).
    pub fn annotation(&self, node: NodeId) -> String {
        let Some(np) = self.nodes.get(node.index()) else {
            return String::new();
        };
        let dies: Vec<String> = (0..self.dies.len())
            .filter(|d| np.on & (1 << d) != 0)
            .map(|d| self.dies[d].to_string())
            .collect();
        let at = if dies.is_empty() {
            self.dies[np.die].to_string()
        } else {
            dies.join("+")
        };
        let seg = np.seg.map_or("-".to_string(), |s| s.to_string());
        format!("@{at} seg={seg} cause={}", np.cause)
    }

    /// Bytes crossing between dies per step.
    pub fn transfer_bytes(&self) -> usize {
        self.transfers.iter().map(|t| t.bytes).sum()
    }

    /// Multi-line summary (`# `-prefixed): dies, segments, transfers, memory per die.
    pub fn summary(&self, g: &Graph) -> String {
        let mut s = String::new();
        let layers = |d: DieIx| match (d, self.dies.len()) {
            (_, 1) => format!("layers [0,{}) + embedding + head", self.n_layer),
            (0, _) => format!("layers [0,{}) + embedding", self.split_layer),
            _ => format!(
                "layers [{},{}) + output norm + head",
                self.split_layer, self.n_layer
            ),
        };
        let _ = writeln!(
            s,
            "# plan: {} die(s), split layer {} of {}",
            self.dies.len(),
            self.split_layer,
            self.n_layer
        );
        for (d, dev) in self.dies.iter().enumerate() {
            let (peak, naive) = (self.mem.peak_live(d), self.mem.naive[d]);
            let _ = writeln!(s, "#   die {d} {dev}: {}; values: {peak} bytes live at most ({naive} without reuse)", layers(d));
        }
        for seg in &self.segments {
            let cap = if self.capture[seg.id].stable {
                " capturable"
            } else {
                ""
            };
            let _ = writeln!(
                s,
                "#   seg {} @{}: {} ops{cap}",
                seg.id,
                self.dies[seg.die],
                seg.nodes.len()
            );
        }
        for t in &self.transfers {
            let _ = writeln!(
                s,
                "#   transfer {} %{} {} -> {}: {} bytes before seg {}",
                g.node(t.value).name,
                t.value.index(),
                self.dies[t.from],
                self.dies[t.to],
                t.bytes,
                t.before
            );
        }
        s
    }
}

//! Passes 1 and 2: placement of every node on a die (with its [`Cause`]), then segments
//! (maximal runs of nodes on one die, in graph order) and the transfers between them.

use super::device::{Placement, Source};
use crate::dump::node_bytes;
use crate::graph::{Graph, NodeId};
use pn_ops::Op;
use std::fmt;

/// Index of a die in [`super::Plan::dies`] (0 = die A, 1 = die B).
pub type DieIx = usize;

/// Why a node landed on its die.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cause {
    /// A per-node override, or the layer split given by the API / CLI.
    Explicit,
    /// The layer split from `PN_SPLIT_LAYER` (or its alias).
    Env,
    /// The default layer split.
    Default,
    /// An op outside the layers that reads global weights: the embedding lookup is pinned
    /// to die A with the embedding table, the output norm and head to die B.
    WeightsPin,
    /// An op outside the layers without weights: with its first computed input.
    FollowsInput,
    /// A leaf (weight, token ids, positions): wherever its consumers run (materialized
    /// on every die that reads it).
    FollowsConsumer,
    /// A leaf nothing reads.
    Unused,
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Cause::Explicit => "explicit",
            Cause::Env => "env",
            Cause::Default => "default",
            Cause::WeightsPin => "weights",
            Cause::FollowsInput => "follows-input",
            Cause::FollowsConsumer => "follows-consumer",
            Cause::Unused => "unused",
        })
    }
}

impl From<Source> for Cause {
    fn from(s: Source) -> Cause {
        match s {
            Source::Explicit => Cause::Explicit,
            Source::Env => Cause::Env,
            Source::Default => Cause::Default,
        }
    }
}

/// Where one node runs (or, for a leaf, where it is materialized).
#[derive(Clone, Debug, PartialEq)]
pub struct NodePlan {
    /// The die that runs it (a leaf: the die of its first consumer).
    pub die: DieIx,
    /// Bit `d` set: the value exists on die `d` (a leaf read on both dies has both).
    pub on: u8,
    /// Its segment (a leaf: its first consumer's segment); None for an unused leaf.
    pub seg: Option<usize>,
    pub cause: Cause,
}

/// A maximal run of nodes on one die, executed as a unit (a capture unit candidate).
#[derive(Clone, Debug, PartialEq)]
pub struct Segment {
    pub id: usize,
    pub die: DieIx,
    /// Computed (non-leaf) nodes in execution order.
    pub nodes: Vec<NodeId>,
    /// Indices into [`super::Plan::transfers`] that run before this segment.
    pub transfers_in: Vec<usize>,
    /// Graph inputs (tokens, positions) first needed on this die by this segment; they
    /// are materialized on the die from the host values at the start of the segment.
    pub inputs: Vec<NodeId>,
}

/// The copy of a computed value into another die's buffer: the only data that crosses.
#[derive(Clone, Debug, PartialEq)]
pub struct Transfer {
    pub value: NodeId,
    pub from: DieIx,
    pub to: DieIx,
    pub bytes: usize,
    /// The segment it runs in front of (the first consumer on `to`).
    pub before: usize,
}

pub(crate) struct Placed {
    pub nodes: Vec<NodePlan>,
    pub segments: Vec<Segment>,
    pub transfers: Vec<Transfer>,
}

/// Places every node; `n_dies` is 1 or 2 and `split` the effective split layer.
pub(crate) fn place(g: &Graph, p: &Placement, n_dies: usize, split: usize) -> Placed {
    let last = n_dies - 1;
    let layer_cause = if n_dies == 1 {
        Cause::from(p.dies_source)
    } else {
        Cause::from(p.split_source)
    };
    let mut nodes: Vec<NodePlan> = vec![
        NodePlan {
            die: 0,
            on: 0,
            seg: None,
            cause: Cause::Unused
        };
        g.len()
    ];
    let mut seen_layer = false;
    for id in g.order() {
        let n = g.node(id);
        if n.op.is_leaf() {
            continue;
        }
        let (die, cause) = if let Some(o) = p.overrides.iter().find(|o| o.matches(&n.name)) {
            (o.die.min(last), Cause::Explicit)
        } else if let Some(l) = n.layer {
            seen_layer = true;
            (if (l as usize) < split { 0 } else { last }, layer_cause)
        } else {
            let edge = if seen_layer { last } else { 0 };
            let has_weight = n
                .inputs
                .iter()
                .any(|i| matches!(g.node(*i).op, Op::Weight { .. }));
            let computed = n.inputs.iter().find(|i| !g.node(**i).op.is_leaf());
            match (has_weight, computed) {
                (true, _) => (edge, Cause::WeightsPin),
                (false, Some(i)) => (nodes[i.index()].die, Cause::FollowsInput),
                (false, None) => (edge, layer_cause),
            }
        };
        nodes[id.index()] = NodePlan {
            die,
            on: 1 << die,
            seg: None,
            cause,
        };
    }
    // segments: maximal runs of computed nodes on one die
    let mut segments: Vec<Segment> = Vec::new();
    for id in g.order() {
        if g.node(id).op.is_leaf() {
            continue;
        }
        let die = nodes[id.index()].die;
        if segments.last().map(|s| s.die) != Some(die) {
            segments.push(Segment {
                id: segments.len(),
                die,
                nodes: Vec::new(),
                transfers_in: Vec::new(),
                inputs: Vec::new(),
            });
        }
        let seg = segments.last_mut().expect("just pushed");
        seg.nodes.push(id);
        nodes[id.index()].seg = Some(seg.id);
    }
    // leaves follow their consumers; cross-die edges of computed values become transfers
    let mut transfers: Vec<Transfer> = Vec::new();
    #[allow(clippy::needless_range_loop)] // segments[s] is mutated while its nodes are read
    for s in 0..segments.len() {
        let die = segments[s].die;
        for k in 0..segments[s].nodes.len() {
            let id = segments[s].nodes[k];
            for &i in &g.node(id).inputs {
                let src = &mut nodes[i.index()];
                if g.node(i).op.is_leaf() {
                    if src.on == 0 {
                        *src = NodePlan {
                            die,
                            on: 0,
                            seg: Some(s),
                            cause: Cause::FollowsConsumer,
                        };
                    }
                    if src.on & (1 << die) == 0 {
                        src.on |= 1 << die;
                        if !matches!(g.node(i).op, Op::Weight { .. }) {
                            segments[s].inputs.push(i);
                        }
                    }
                } else if src.on & (1 << die) == 0 {
                    src.on |= 1 << die;
                    transfers.push(Transfer {
                        value: i,
                        from: src.die,
                        to: die,
                        bytes: node_bytes(g.node(i)),
                        before: s,
                    });
                    segments[s].transfers_in.push(transfers.len() - 1);
                }
            }
        }
    }
    Placed {
        nodes,
        segments,
        transfers,
    }
}

//! The runner's prebuilt op list for one plan: per segment, the transfers in, the inputs
//! to materialize and the ops with their inputs resolved to value slots or weight
//! indices and their state index. Built once per geometry, so a step does no graph
//! walking, name lookup or hashing.
//!
//! Value slot `v` is the value of the memory plan's `buffers[v]`, bound to a buffer slot
//! ([`Program::phys`], from [`super::MemPlan::slots`]): values whose lifetimes are disjoint
//! share one persistent buffer, which the backend overwrites in place.

use super::{DieIx, Plan};
use crate::graph::{Graph, NodeId};
use pn_ops::{DType, Op};
use smallvec::SmallVec;
use std::collections::HashMap;

/// Buffer slot classes (a slot never changes element type; the graph output is handed to
/// the caller, so it gets a slot of its own).
pub const CLASS_F32: usize = 0;
pub const CLASS_I32: usize = 1;
pub const CLASS_OUTPUT: usize = 2;
pub const N_CLASSES: usize = 3;

/// Where a value slot lives: (die, class, buffer slot).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Phys {
    pub die: DieIx,
    pub class: usize,
    pub slot: usize,
}

/// An op's input: a value slot or a weight (index into [`Program::weights`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Src {
    Val(u32),
    Weight(u32),
}

/// Which graph input an input slot holds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum InputKind {
    Tokens,
    Positions,
}

#[derive(Clone, Debug)]
pub struct OpStep {
    pub node: NodeId,
    pub inputs: SmallVec<[Src; 6]>,
    pub state: Option<usize>,
    pub out: u32,
}

#[derive(Clone, Debug)]
pub struct SegProgram {
    pub die: DieIx,
    /// (source slot, destination slot, bytes, the value's node).
    pub transfers: Vec<(u32, u32, usize, NodeId)>,
    /// (slot, kind, node): graph inputs filled on this die.
    pub inputs: Vec<(u32, InputKind, NodeId)>,
    pub ops: Vec<OpStep>,
}

/// A weight the program reads: the GGUF tensor index and the node that names it.
#[derive(Clone, Debug)]
pub struct WeightRef {
    pub node: NodeId,
    pub tensor: usize,
}

#[derive(Clone, Debug)]
pub struct Program {
    pub segs: Vec<SegProgram>,
    pub weights: Vec<WeightRef>,
    pub output: u32,
    /// The buffer slot of each value slot.
    pub phys: Vec<Phys>,
    /// Bytes of every buffer slot: `slot_bytes[die][class][slot]`.
    pub slot_bytes: Vec<Vec<Vec<usize>>>,
}

/// Builds the program; `tensor_of` maps a weight name to its GGUF tensor index.
pub fn build(g: &Graph, plan: &Plan, tensor_of: &dyn Fn(&str) -> Option<usize>) -> Result<Program, String> {
    let bufs = &plan.mem.buffers;
    let slot: HashMap<(usize, DieIx), u32> = bufs.iter().enumerate().map(|(v, b)| ((b.value.index(), b.die), v as u32)).collect();
    let at = |n: NodeId, die: DieIx| slot.get(&(n.index(), die)).copied().ok_or_else(|| format!("%{} has no buffer on die {die}", n.index()));
    let mut weights: Vec<WeightRef> = Vec::new();
    let mut weight_ix: HashMap<NodeId, u32> = HashMap::new();
    let mut segs = Vec::with_capacity(plan.segments.len());
    for s in &plan.segments {
        let mut sp = SegProgram { die: s.die, transfers: Vec::new(), inputs: Vec::new(), ops: Vec::new() };
        for tr in s.transfers_in.iter().map(|&t| &plan.transfers[t]) {
            sp.transfers.push((at(tr.value, tr.from)?, at(tr.value, tr.to)?, tr.bytes, tr.value));
        }
        for &i in &s.inputs {
            let kind = match g.node(i).op {
                Op::Tokens => InputKind::Tokens,
                Op::Positions => InputKind::Positions,
                _ => return Err(format!("input %{} is not a graph input", i.index())),
            };
            sp.inputs.push((at(i, s.die)?, kind, i));
        }
        for &id in &s.nodes {
            let n = g.node(id);
            let mut inputs = SmallVec::new();
            for &i in &n.inputs {
                inputs.push(match &g.node(i).op {
                    Op::Weight { name } => Src::Weight(match weight_ix.get(&i) {
                        Some(&w) => w,
                        None => {
                            let tensor = tensor_of(name).ok_or_else(|| format!("weight {name} is not in the GGUF"))?;
                            weights.push(WeightRef { node: i, tensor });
                            weight_ix.insert(i, weights.len() as u32 - 1);
                            weights.len() as u32 - 1
                        }
                    }),
                    _ => Src::Val(at(i, s.die)?),
                });
            }
            sp.ops.push(OpStep { node: id, inputs, state: n.op.state(), out: at(id, s.die)? });
        }
        segs.push(sp);
    }
    let out_node = *g.outputs.first().ok_or("the graph has no output")?;
    let output = at(out_node, plan.nodes[out_node.index()].die)?;
    let class_of = |v: usize| match bufs[v].value {
        node if node == out_node => CLASS_OUTPUT,
        node if g.node(node).out.dtype == DType::I32 => CLASS_I32,
        _ => CLASS_F32,
    };
    let slots = plan.mem.slots(&class_of);
    let phys = (0..bufs.len()).map(|v| Phys { die: bufs[v].die, class: class_of(v), slot: slots.of[v] }).collect();
    let mut slot_bytes = slots.bytes;
    slot_bytes.resize(plan.dies.len().max(slot_bytes.len()), Vec::new());
    slot_bytes.iter_mut().for_each(|d| d.resize(N_CLASSES, Vec::new()));
    Ok(Program { segs, weights, output, phys, slot_bytes })
}

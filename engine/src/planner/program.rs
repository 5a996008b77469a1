//! The runner's prebuilt op list for one plan: per segment, the transfers in, the inputs
//! to materialize and the ops with their inputs resolved to value slots or weight
//! indices, their state index and the values that die after them. Built once per
//! geometry, so a step does no graph walking, name lookup or hashing.

use super::{DieIx, Plan};
use crate::graph::{Graph, NodeId};
use pn_ops::Op;
use smallvec::SmallVec;
use std::collections::HashMap;

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
    /// Value slots whose last reader is this op (dropped after it).
    pub frees: SmallVec<[u32; 4]>,
}

#[derive(Clone, Debug)]
pub struct SegProgram {
    pub die: DieIx,
    /// (source slot, destination slot, bytes).
    pub transfers: Vec<(u32, u32, usize)>,
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
    pub n_values: usize,
    /// Slots kept from step to step (inputs, transfer destinations): refilled in place.
    pub persistent: Vec<bool>,
    pub weights: Vec<WeightRef>,
    pub output: u32,
}

/// Builds the program; `tensor_of` maps a weight name to its GGUF tensor index.
pub fn build(
    g: &Graph,
    plan: &Plan,
    tensor_of: &dyn Fn(&str) -> Option<usize>,
) -> Result<Program, String> {
    let mut slot: HashMap<(usize, DieIx), u32> = HashMap::new();
    let mut persistent: Vec<bool> = Vec::new();
    let new_slot = |slot: &mut HashMap<(usize, DieIx), u32>,
                    key: (usize, DieIx),
                    keep: bool,
                    persistent: &mut Vec<bool>|
     -> u32 {
        let s = persistent.len() as u32;
        persistent.push(keep);
        slot.insert(key, s);
        s
    };
    let mut weights: Vec<WeightRef> = Vec::new();
    let mut weight_ix: HashMap<usize, u32> = HashMap::new();
    let mut segs = Vec::new();
    // last reader (segment, op index) of each slot
    let mut last: HashMap<u32, (usize, usize)> = HashMap::new();
    for (si, s) in plan.segments.iter().enumerate() {
        let mut sp = SegProgram {
            die: s.die,
            transfers: Vec::new(),
            inputs: Vec::new(),
            ops: Vec::new(),
        };
        for &t in &s.transfers_in {
            let tr = &plan.transfers[t];
            let src = *slot
                .get(&(tr.value.index(), tr.from))
                .ok_or("transfer of a value not computed yet")?;
            let dst = new_slot(&mut slot, (tr.value.index(), tr.to), true, &mut persistent);
            sp.transfers.push((src, dst, tr.bytes));
        }
        for &i in &s.inputs {
            let kind = match g.node(i).op {
                Op::Tokens => InputKind::Tokens,
                Op::Positions => InputKind::Positions,
                _ => return Err(format!("input %{} is not a graph input", i.index())),
            };
            let v = new_slot(&mut slot, (i.index(), s.die), true, &mut persistent);
            sp.inputs.push((v, kind, i));
        }
        for &id in &s.nodes {
            let n = g.node(id);
            let mut inputs = SmallVec::new();
            for &i in &n.inputs {
                if let Op::Weight { name } = &g.node(i).op {
                    let w = match weight_ix.get(&i.index()) {
                        Some(&w) => w,
                        None => {
                            let tensor = tensor_of(name)
                                .ok_or_else(|| format!("weight {name} is not in the GGUF"))?;
                            weights.push(WeightRef { node: i, tensor });
                            weight_ix.insert(i.index(), weights.len() as u32 - 1);
                            weights.len() as u32 - 1
                        }
                    };
                    inputs.push(Src::Weight(w));
                } else {
                    let v = *slot.get(&(i.index(), s.die)).ok_or_else(|| {
                        format!("%{} reads %{} not on its die", id.index(), i.index())
                    })?;
                    last.insert(v, (si, sp.ops.len()));
                    inputs.push(Src::Val(v));
                }
            }
            let out = new_slot(&mut slot, (id.index(), s.die), false, &mut persistent);
            sp.ops.push(OpStep {
                node: id,
                inputs,
                state: n.op.state(),
                out,
                frees: SmallVec::new(),
            });
        }
        // transfer sources are read by the transfer (kept until then)
        for &(src, _, _) in &sp.transfers {
            let e = last.entry(src).or_insert((si, 0));
            *e = (*e).max((si, 0));
        }
        segs.push(sp);
    }
    let out_node = *g.outputs.first().ok_or("the graph has no output")?;
    let output = *slot
        .get(&(out_node.index(), plan.nodes[out_node.index()].die))
        .ok_or("the output is not computed")?;
    for (v, (si, k)) in last {
        // outputs and persistent slots are never freed by the op list
        if v != output && !persistent[v as usize] {
            segs[si].ops[k].frees.push(v);
        }
    }
    Ok(Program {
        segs,
        n_values: persistent.len(),
        persistent,
        weights,
        output,
    })
}

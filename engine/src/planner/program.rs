//! The runner's prebuilt op list for one plan: per segment, the transfers in, the inputs
//! to materialize and the ops with their inputs resolved to value slots or weight
//! indices, their state index and the values that die after them. Built once per
//! geometry, so a step does no graph walking, name lookup or hashing.
//!
//! Every value slot is bound to a buffer slot of the memory plan ([`Program::phys`],
//! from [`super::MemPlan::slots`]): values whose lifetimes are disjoint share one
//! persistent buffer, which the backend overwrites in place (`HostKernels::kernel_into`; a device backend its own buffers).

use super::{DieIx, Plan};
use crate::graph::{Graph, NodeId};
use pn_ops::{DType, Op};
use smallvec::SmallVec;
use std::collections::{HashMap, VecDeque};

/// Buffer slot classes (a slot never changes element type; the graph output is handed to
/// the caller, so it gets a slot of its own).
pub const CLASS_F32: usize = 0;
pub const CLASS_I32: usize = 1;
pub const CLASS_OUTPUT: usize = 2;
/// Values the memory plan has no buffer for (none today): one private slot each.
pub const CLASS_PRIVATE: usize = 3;
pub const N_CLASSES: usize = 4;

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
    /// Value slots whose last reader is this op (their buffer slot is free after it; the
    /// runner keeps the buffer for the next value assigned to it).
    pub frees: SmallVec<[u32; 4]>,
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
    pub n_values: usize,
    /// Inputs and transfer destinations (refilled at the start of their segment).
    pub persistent: Vec<bool>,
    pub weights: Vec<WeightRef>,
    pub output: u32,
    /// The buffer slot of each value slot.
    pub phys: Vec<Phys>,
    /// Bytes of every buffer slot: `slot_bytes[die][class][slot]`.
    pub slot_bytes: Vec<Vec<Vec<usize>>>,
}

/// Builds the program; `tensor_of` maps a weight name to its GGUF tensor index.
pub fn build(
    g: &Graph,
    plan: &Plan,
    tensor_of: &dyn Fn(&str) -> Option<usize>,
) -> Result<Program, String> {
    let mut slot: HashMap<(usize, DieIx), u32> = HashMap::new();
    let mut persistent: Vec<bool> = Vec::new();
    // (node, die) of every value slot, in creation order
    let mut order_keys: Vec<(usize, DieIx)> = Vec::new();
    let mut new_slot = |slot: &mut HashMap<(usize, DieIx), u32>,
                        key: (usize, DieIx),
                        keep: bool,
                        persistent: &mut Vec<bool>|
     -> u32 {
        let s = persistent.len() as u32;
        persistent.push(keep);
        order_keys.push(key);
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
            sp.transfers.push((src, dst, tr.bytes, tr.value));
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
        for &(src, _, _, _) in &sp.transfers {
            let e = last.entry(src).or_insert((si, 0));
            *e = (*e).max((si, 0));
        }
        segs.push(sp);
    }
    let out_node = *g.outputs.first().ok_or("the graph has no output")?;
    let output = *slot
        .get(&(out_node.index(), plan.nodes[out_node.index()].die))
        .ok_or("the output is not computed")?;
    // Bind value slots to the memory plan's buffers (created in the same order: per
    // segment transfers in, inputs, then nodes), then to their buffer slots.
    let mut bufq: HashMap<(usize, DieIx), VecDeque<usize>> = HashMap::new();
    for (i, b) in plan.mem.buffers.iter().enumerate() {
        bufq.entry((b.value.index(), b.die)).or_default().push_back(i);
    }
    let class_of = |node: usize| -> usize {
        if g.outputs.first().map(|o| o.index()) == Some(node) {
            CLASS_OUTPUT
        } else if g.node(NodeId::new(node)).out.dtype == DType::I32 {
            CLASS_I32
        } else {
            CLASS_F32
        }
    };
    let slots = plan
        .mem
        .slots(&|i| class_of(plan.mem.buffers[i].value.index()));
    let mut slot_bytes = slots.bytes.clone();
    slot_bytes.resize(plan.dies.len().max(slot_bytes.len()), Vec::new());
    for d in &mut slot_bytes {
        d.resize(N_CLASSES, Vec::new());
    }
    let mut phys = Vec::with_capacity(persistent.len());
    for &(node, die) in &order_keys {
        match bufq.get_mut(&(node, die)).and_then(VecDeque::pop_front) {
            Some(i) => phys.push(Phys {
                die,
                class: class_of(node),
                slot: slots.of[i],
            }),
            None => {
                let private = &mut slot_bytes[die][CLASS_PRIVATE];
                private.push(crate::dump::node_bytes(g.node(NodeId::new(node))));
                phys.push(Phys {
                    die,
                    class: CLASS_PRIVATE,
                    slot: private.len() - 1,
                });
            }
        }
    }
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
        phys,
        slot_bytes,
    })
}

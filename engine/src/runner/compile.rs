//! Compiling a geometry: its graph planned on the dies, checked against the backends and
//! the file's weights, the weights' CPU copies made (first plan), each segment compiled
//! by its die's backend; cached per geometry ([`Runner::compiled_for`]).

use super::{program, Compiled, Key, RunError, Runner, HIDDEN_NODE};
use crate::backend::{Executable, Memory, OpCode, OpInput, SegmentCode, Support};
use crate::graph::{Graph, NodeId};
use crate::model::Geometry;
use crate::planner::program::Program;
use crate::planner::Plan;
use pn_ops::DType;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

impl Runner {
    pub(super) fn compiled(&self, geom: Geometry) -> Result<Arc<Compiled>, RunError> {
        self.compiled_for((geom, false))
    }

    pub(super) fn compiled_for(&self, key: Key) -> Result<Arc<Compiled>, RunError> {
        if let Some(c) = self.compiled.lock().expect("plan cache lock").get(&key) {
            return Ok(c.clone());
        }
        let geom = key.0;
        let graph = self.graph_for(key)?;
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
            if DType::Weight(info.ty) != node.out.dtype || info.op_shape() != node.out.shape {
                let msg = format!(
                    "graph expects {}, file has {}{}",
                    node.out,
                    info.ty,
                    info.op_shape()
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
        self.prepare_cpu_copies(&graph, &plan, &prog);
        if self.debug >= 1 {
            let (n, k, all) = (geom.n_tokens, geom.seqs, geom.all_logits);
            eprint!("[pn] plan for {n} tokens of {k} sequences (all logits: {all}):\n{}", plan.summary(&graph));
            for (d, classes) in prog.slot_bytes.iter().enumerate() {
                let all: Vec<usize> = classes.iter().flatten().copied().collect();
                eprintln!(
                    "#   die {d}: {} buffer slots, {} bytes: {all:?}",
                    all.len(),
                    all.iter().sum::<usize>()
                );
            }
        }
        let exes = self.compile_segments(&graph, &plan, &prog, geom)?;
        // the hidden output's value: the one its op writes (graph.outputs[1])
        let hidden = graph.outputs.get(1).map(|&id| {
            let v = prog.segs.iter().flat_map(|s| &s.ops).find(|o| o.node == id).map(|o| o.out);
            v.map(|v| (v, id)).ok_or_else(|| RunError::Weight { name: "(plan)".into(), msg: format!("{HIDDEN_NODE} is not computed by any segment") })
        });
        let c = Arc::new(Compiled {
            hidden: hidden.transpose()?,
            exes,
            stateful: graph.order().filter(|&id| graph.node(id).state.is_some()).collect(),
            captured: plan
                .segments
                .iter()
                .map(|_| AtomicBool::new(false))
                .collect(),
            graph,
            plan: Arc::new(plan),
            prog,
        });
        self.compiled.lock().expect("plan cache lock").insert(key, c.clone());
        Ok(c)
    }

    /// The `rows16` copies (`Gguf::prepare_rows16`) of the weights that the matmuls and
    /// experts of host-memory dies read, and plain huge-page copies
    /// (`Gguf::prepare_plain_copies`) of the other weights those dies read but the
    /// embedding (a few rows a step): made once, at the first plan (load time), so the
    /// CPU kernels never transpose their rows per call (`PN_NO_REPACK=1`: no `rows16`)
    /// and no weight faults in from the file during a pass.
    fn prepare_cpu_copies(&self, graph: &Graph, plan: &Plan, prog: &Program) {
        let host_nodes = || {
            plan.segments
                .iter()
                .filter(|s| self.memory[s.die] == Memory::Host)
                .flat_map(|s| &s.nodes)
                .map(|&id| graph.node(id))
        };
        let inputs_of = |keep: &dyn Fn(&pn_ops::Op) -> bool| -> Vec<usize> {
            let read: std::collections::HashSet<NodeId> =
                host_nodes().filter(|node| keep(&node.op)).flat_map(|node| node.inputs.iter().copied()).collect();
            prog.weights.iter().filter(|w| read.contains(&w.node)).map(|w| w.tensor).collect()
        };
        let t0 = std::time::Instant::now();
        let made = self.gguf.prepare_rows16(&inputs_of(&|op| matches!(op, pn_ops::Op::MatMul | pn_ops::Op::MoeExperts { .. })));
        let copied = self.gguf.prepare_plain_copies(&inputs_of(&|op| !matches!(op, pn_ops::Op::GetRows)));
        if made + copied > 0 && self.debug >= 1 {
            eprintln!(
                "[pn] rows16: {made} bytes of weights interleaved for the CPU, {copied} bytes copied into huge pages, in {:.2?}",
                t0.elapsed()
            );
        }
    }

    /// Each segment's ops bound to their slots, compiled by its die's backend.
    fn compile_segments(&self, graph: &Graph, plan: &Plan, prog: &Program, geom: Geometry) -> Result<Vec<Box<dyn Executable>>, RunError> {
        let phys = &prog.phys;
        let mut exes = Vec::with_capacity(prog.segs.len());
        for (si, sp) in prog.segs.iter().enumerate() {
            let ops = sp
                .ops
                .iter()
                .map(|op| {
                    let node = graph.node(op.node);
                    // op.inputs parallels node.inputs (program::build)
                    let inputs = op
                        .inputs
                        .iter()
                        .zip(&node.inputs)
                        .map(|(s, &i)| match *s {
                            program::Src::Val(v) => OpInput::Slot(self.slot_id(phys[v as usize]), graph.node(i).out),
                            program::Src::Weight(w) => OpInput::Weight(w),
                        })
                        .collect();
                    OpCode { op: node.op.clone(), inputs, meta: node.out, out: self.slot_id(phys[op.out as usize]), state: op.state }
                })
                .collect();
            let seg = SegmentCode {
                arena: self.arena_ids[sp.die],
                segment: si,
                n_tokens: geom.n_tokens,
                seqs: geom.seqs,
                all_logits: geom.all_logits,
                stable: plan.capture[si].stable,
                ops,
            };
            let exe = self.dies[sp.die].backend.clone().compile(seg).map_err(|source| RunError::Op {
                node: format!("(compiling segment {si})"),
                source,
            })?;
            exes.push(exe);
        }
        Ok(exes)
    }
}

//! A small executor for graphs the runner does not plan: the MTP block's (crate::spec::mtp).
//! Nodes run in order, each through the backend protocol ([`execute_op`]); leaves are
//! GGUF weights (zero-copy, type and shape checked), `inp_tokens` / `inp_pos`, and
//! caller-filled f32 inputs ([`GraphBuilder::external`]). One layer state serves the
//! graph's stateful ops. Values are dropped after their last use.

use crate::backend::{execute_op, Backend};
use std::sync::Arc;
use crate::gguf::Gguf;
use crate::graph::{Graph, NodeId};
use crate::runner::RunError;
use pn_ops::{DType, LayerState, Op, OpError, Shape, Tensor, TensorMeta, Value, WeightView};
use std::collections::HashMap;

/// A graph bound to a GGUF's tensors (indices checked once).
pub struct Bound {
    pub graph: Graph,
    /// Per node: the GGUF tensor index of a weight leaf.
    tensor: Vec<Option<usize>>,
    last_use: Vec<usize>,
}

fn weight_err(name: &str, msg: String) -> RunError {
    RunError::Weight { name: name.to_string(), msg }
}

impl Bound {
    /// Checks every weight leaf against the file: present, same type and shape.
    pub fn new(graph: Graph, g: &Gguf) -> Result<Bound, RunError> {
        let mut tensor = vec![None; graph.len()];
        for id in graph.order() {
            let n = graph.node(id);
            if let (Op::Weight { name }, DType::Weight(ty)) = (&n.op, n.out.dtype) {
                let ix = g.tensors.iter().position(|t| &t.name == name).ok_or_else(|| weight_err(name, "required tensor is missing from the GGUF".into()))?;
                let info = &g.tensors[ix];
                let shape = Shape([info.ne[0] as usize, info.ne[1] as usize, info.ne[2] as usize, info.ne[3] as usize]);
                if info.ty != ty || shape != n.out.shape {
                    return Err(weight_err(name, format!("graph expects {}, file has {}{shape:?}", n.out, info.ty)));
                }
                if g.try_tensor_bytes(info).is_none() {
                    return Err(weight_err(name, "data lies outside the file".into()));
                }
                tensor[id.index()] = Some(ix);
            }
        }
        let last_use = graph.last_use();
        Ok(Bound { graph, tensor, last_use })
    }

    /// Runs the graph: `tokens` / `pos` fill the Tokens / Positions inputs, `ext` the
    /// external inputs by name; returns the graph outputs in order.
    pub fn run(&self, g: &Gguf, backend: &Arc<dyn Backend>, tokens: &[u32], pos: &[i32], ext: &[(&str, &Tensor)], mut state: Option<&mut LayerState>) -> Result<Vec<Tensor>, RunError> {
        let graph = &self.graph;
        let mut vals: Vec<Option<Tensor>> = vec![None; graph.len()];
        let op_err = |id: NodeId, source: OpError| RunError::Op { node: graph.node(id).name.clone(), source };
        for id in graph.order() {
            let n = graph.node(id);
            let out = match &n.op {
                Op::Weight { .. } if self.tensor[id.index()].is_some() => continue,
                Op::Weight { name } => {
                    let t = ext.iter().find(|(k, _)| k == name).map(|(_, t)| *t).ok_or_else(|| op_err(id, OpError::Invalid { op: "external", msg: format!("input {name} not given") }))?;
                    if t.shape != n.out.shape || t.dtype() != n.out.dtype {
                        return Err(op_err(id, OpError::Shape { op: "external", expected: n.out.to_string(), found: format!("{:?} {:?}", t.dtype(), t.shape) }));
                    }
                    t.clone()
                }
                Op::Tokens => Tensor::i32(Shape::d1(tokens.len()), tokens.iter().map(|&x| x as i32).collect()),
                Op::Positions => Tensor::i32(Shape::d1(pos.len()), pos.to_vec()),
                op => {
                    let ins: Vec<Value<'_>> = n
                        .inputs
                        .iter()
                        .map(|&i| match self.tensor[i.index()] {
                            Some(ix) => {
                                let info = &g.tensors[ix];
                                Value::Weight(WeightView { name: &info.name, ty: info.ty, shape: graph.node(i).out.shape, bytes: g.tensor_bytes(info) })
                            }
                            None => Value::Act(vals[i.index()].as_ref().expect("inputs run before their consumers")),
                        })
                        .collect();
                    let st = if op.state().is_some() { state.as_deref_mut() } else { None };
                    execute_op(backend, op, &ins, &n.out, st).map_err(|e| op_err(id, e))?
                }
            };
            vals[id.index()] = Some(out);
            for &i in &n.inputs {
                if self.last_use[i.index()] == id.index() {
                    vals[i.index()] = None;
                }
            }
        }
        Ok(graph.outputs.iter().map(|&o| vals[o.index()].take().expect("outputs are kept")).collect())
    }
}

/// The meta of an f32 external input.
pub fn external_meta(shape: Shape) -> TensorMeta {
    TensorMeta::f32(shape)
}

/// Bound graphs cached by a key (the token count of a geometry).
#[derive(Default)]
pub struct Cache(std::sync::Mutex<HashMap<(u8, usize), std::sync::Arc<Bound>>>);

impl Cache {
    pub fn get(&self, key: (u8, usize), make: impl FnOnce() -> Result<Bound, RunError>) -> Result<std::sync::Arc<Bound>, RunError> {
        if let Some(b) = self.0.lock().expect("graph cache").get(&key) {
            return Ok(b.clone());
        }
        let b = std::sync::Arc::new(make()?);
        self.0.lock().expect("graph cache").insert(key, b.clone());
        Ok(b)
    }
}

//! Graph IR: a petgraph DAG of typed nodes, built with [`GraphBuilder`].
//!
//! Nodes are added in dependency order (an input must exist before its consumer), so the
//! insertion order is a topological order; the runner executes in that order. Every node
//! has a name, llama.cpp's callback name where one exists (`attn_norm-3`, `result_output`).

use petgraph::graph::{DiGraph, NodeIndex};
use pn_ops::{DType, GgmlType, Op, OpError, Shape, StateShape, TensorMeta};
use smallvec::SmallVec;
use std::collections::HashMap;
use thiserror::Error;

pub type NodeId = NodeIndex<u32>;

#[derive(Debug, Error)]
pub enum GraphError {
    #[error("node {name}: {source}")]
    Op { name: String, source: OpError },
    #[error("duplicate node name {0}")]
    DuplicateName(String),
    #[error("tensor {name}: {msg}")]
    Weight { name: String, msg: String },
}

#[derive(Clone, Debug)]
pub struct Node {
    pub op: Op,
    pub inputs: SmallVec<[NodeId; 6]>,
    pub out: TensorMeta,
    pub name: String,
    /// The model layer this node belongs to (None: embedding, head, inputs).
    pub layer: Option<u16>,
    /// A stateful op's layer state, inferred with its output ([`Op::state_shape`]).
    pub state: Option<StateShape>,
}

/// A built graph: nodes in topological (insertion) order, plus its named outputs.
#[derive(Clone, Debug, Default)]
pub struct Graph {
    pub g: DiGraph<Node, u8, u32>,
    pub outputs: Vec<NodeId>,
    by_name: HashMap<String, NodeId>,
}

impl Graph {
    pub fn node(&self, id: NodeId) -> &Node {
        &self.g[id]
    }
    pub fn len(&self) -> usize {
        self.g.node_count()
    }
    pub fn is_empty(&self) -> bool {
        self.g.node_count() == 0
    }
    /// Node ids in execution (insertion = topological) order.
    pub fn order(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.g.node_indices()
    }
    pub fn find(&self, name: &str) -> Option<NodeId> {
        self.by_name.get(name).copied()
    }
    /// For each node, the position in `order()` of its last consumer (or usize::MAX for
    /// graph outputs), so the runner can free activations as soon as they are dead.
    pub fn last_use(&self) -> Vec<usize> {
        let mut last = vec![0usize; self.len()];
        for id in self.order() {
            for &i in &self.g[id].inputs {
                last[i.index()] = last[i.index()].max(id.index());
            }
        }
        for &o in &self.outputs {
            last[o.index()] = usize::MAX;
        }
        last
    }
}

/// Builds a [`Graph`]; every op's inputs are shape-checked as it is added, and a
/// stateful op's layer state inferred ([`Node::state`]).
#[derive(Default)]
pub struct GraphBuilder {
    graph: Graph,
    layer: Option<u16>,
    weights: HashMap<String, NodeId>,
}

impl GraphBuilder {
    pub fn new() -> GraphBuilder {
        GraphBuilder::default()
    }
    /// Nodes added from now on belong to `layer` (None: outside the layers).
    pub fn set_layer(&mut self, layer: Option<usize>) {
        self.layer = layer.map(|l| l as u16);
    }
    pub fn meta(&self, id: NodeId) -> TensorMeta {
        self.graph.g[id].out
    }
    pub fn shape(&self, id: NodeId) -> Shape {
        self.graph.g[id].out.shape
    }

    fn push(&mut self, op: Op, inputs: &[NodeId], out: TensorMeta, name: String) -> Result<NodeId, GraphError> {
        if self.graph.by_name.contains_key(&name) {
            return Err(GraphError::DuplicateName(name));
        }
        let state = op.state_shape(&inputs.iter().map(|&i| self.graph.g[i].out).collect::<SmallVec<[TensorMeta; 6]>>());
        let node = Node { op, inputs: inputs.iter().copied().collect(), out, name: name.clone(), layer: self.layer, state };
        let id = self.graph.g.add_node(node);
        for (slot, &i) in inputs.iter().enumerate() {
            self.graph.g.add_edge(i, id, slot as u8);
        }
        self.graph.by_name.insert(name, id);
        Ok(id)
    }

    /// A graph input (Tokens or Positions) of `n` i32 values.
    pub fn input(&mut self, op: Op, n: usize, name: &str) -> Result<NodeId, GraphError> {
        self.push(op, &[], TensorMeta::i32(Shape::d1(n)), name.to_string())
    }

    /// An f32 input `[shape]` the caller fills by name: for graphs run by an executor
    /// that fills it (crate::spec::exec; the MTP block's hidden-state input). The runner
    /// rejects such a graph (no GGUF tensor of that name and type).
    pub fn external(&mut self, name: &str, shape: Shape) -> Result<NodeId, GraphError> {
        let saved = self.layer.take();
        let id = self.push(Op::Weight { name: name.to_string() }, &[], TensorMeta::f32(shape), name.to_string());
        self.layer = saved;
        id
    }

    /// A weight leaf (deduplicated by tensor name).
    pub fn weight(&mut self, name: &str, ty: GgmlType, shape: Shape) -> Result<NodeId, GraphError> {
        if let Some(&id) = self.weights.get(name) {
            return Ok(id);
        }
        let saved = self.layer.take();
        let id = self.push(
            Op::Weight { name: name.to_string() },
            &[],
            TensorMeta { shape, dtype: DType::Weight(ty) },
            name.to_string(),
        )?;
        self.layer = saved;
        self.weights.insert(name.to_string(), id);
        Ok(id)
    }

    /// Add an op node named `name` (with `-{layer}` appended inside a layer, llama.cpp style).
    pub fn op(&mut self, op: Op, inputs: &[NodeId], name: &str) -> Result<NodeId, GraphError> {
        let full = match self.layer {
            Some(l) => format!("{name}-{l}"),
            None => name.to_string(),
        };
        let metas: Vec<TensorMeta> = inputs.iter().map(|&i| self.graph.g[i].out).collect();
        let out = op.infer(&metas).map_err(|source| GraphError::Op { name: full.clone(), source })?;
        self.push(op, inputs, out, full)
    }

    pub fn output(&mut self, id: NodeId) {
        self.graph.outputs.push(id);
    }

    pub fn finish(self) -> Graph {
        self.graph
    }
}

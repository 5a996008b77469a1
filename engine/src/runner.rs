//! The generic runner: builds (and caches) a model's graph per batch geometry and executes
//! it node by node on a backend, reading and updating a sequence's state.

use crate::backend::Backend;
use crate::gguf::Gguf;
use crate::graph::{Graph, GraphBuilder, GraphError, Node};
use crate::model::{Geometry, Model};
use crate::state::SeqState;
use pn_ops::{DType, Op, OpError, Shape, Tensor, Value, WeightView};
use std::collections::HashMap;
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
    ContextFull { have: usize, adding: usize, max_seq: usize },
    #[error("no tokens to evaluate: expected at least one")]
    Empty,
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

pub struct Runner {
    model: Arc<dyn Model>,
    gguf: Arc<Gguf>,
    backend: Arc<dyn Backend>,
    graphs: Mutex<HashMap<Geometry, Arc<Graph>>>,
    /// Maximum tokens per forward pass; longer inputs are split (state carries over).
    pub ubatch: usize,
}

impl Runner {
    /// Binds a model to its weights and a backend, and builds the decode graph once so
    /// missing or mis-shaped tensors are reported at load time.
    pub fn new(model: Arc<dyn Model>, gguf: Arc<Gguf>, backend: Arc<dyn Backend>) -> Result<Runner, RunError> {
        let r = Runner { model, gguf, backend, graphs: Mutex::new(HashMap::new()), ubatch: 512 };
        let g = r.graph(Geometry { n_tokens: 1, all_logits: false })?;
        for id in g.order() {
            if let Op::Weight { name } = &g.node(id).op {
                r.weight_view(name)?;
            }
        }
        Ok(r)
    }

    pub fn model(&self) -> &dyn Model {
        &*self.model
    }
    pub fn gguf(&self) -> &Gguf {
        &self.gguf
    }
    pub fn backend(&self) -> &dyn Backend {
        &*self.backend
    }

    /// A fresh sequence state with room for `max_seq` positions.
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
        self.graphs.lock().expect("graph cache lock").insert(geom, g.clone());
        Ok(g)
    }

    fn weight_view(&self, name: &str) -> Result<WeightView<'_>, RunError> {
        let info = self
            .gguf
            .tensor(name)
            .ok_or_else(|| RunError::Weight { name: name.into(), msg: "not in the GGUF".into() })?;
        let shape = Shape([info.ne[0] as usize, info.ne[1] as usize, info.ne[2] as usize, info.ne[3] as usize]);
        Ok(WeightView { name: &info.name, ty: info.ty, shape, bytes: self.gguf.tensor_bytes(info) })
    }

    /// Evaluate `tokens` (appended to the sequence) and return logits for every token
    /// (`all_logits`) or only the last one. Inputs longer than `ubatch` run in several
    /// passes; the sequence state carries over, so the result does not depend on the split.
    pub fn forward(&self, st: &mut SeqState, tokens: &[u32], all_logits: bool) -> Result<Logits, RunError> {
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
        if st.pos + tokens.len() > st.max_seq {
            return Err(RunError::ContextFull { have: st.pos, adding: tokens.len(), max_seq: st.max_seq });
        }
        let ubatch = self.ubatch.max(1);
        let mut out = Vec::new();
        let n_chunks = tokens.len().div_ceil(ubatch);
        for (i, chunk) in tokens.chunks(ubatch).enumerate() {
            let last = i + 1 == n_chunks;
            if !all_logits && !last {
                self.eval(st, chunk, false, &mut observer)?;
                continue;
            }
            let t = self.eval(st, chunk, all_logits, &mut observer)?;
            out.extend_from_slice(t.as_f32());
        }
        Ok(Logits { n_vocab, data: out })
    }

    /// One pass over one micro-batch. Returns the `result_output` tensor.
    fn eval(&self, st: &mut SeqState, tokens: &[u32], all_logits: bool, observer: &mut Option<Observer<'_>>) -> Result<Tensor, RunError> {
        let graph = self.graph(Geometry { n_tokens: tokens.len(), all_logits })?;
        let last_use = graph.last_use();
        let mut values: Vec<Option<Tensor>> = vec![None; graph.len()];
        let mut weights: Vec<Option<WeightView<'_>>> = vec![None; graph.len()];
        let pos0 = st.pos;
        for id in graph.order() {
            let node = graph.node(id);
            let idx = id.index();
            let value = match &node.op {
                Op::Tokens => Tensor::i32(Shape::d1(tokens.len()), tokens.iter().map(|&t| t as i32).collect()),
                Op::Positions => Tensor::i32(Shape::d1(tokens.len()), (0..tokens.len()).map(|i| (pos0 + i) as i32).collect()),
                Op::Weight { name } => {
                    let w = self.weight_view(name)?;
                    if DType::Weight(w.ty) != node.out.dtype || w.shape != node.out.shape {
                        return Err(RunError::Weight { name: name.clone(), msg: format!("graph expects {}, file has {}{}", node.out, w.ty, w.shape) });
                    }
                    weights[idx] = Some(w);
                    continue;
                }
                op => {
                    let ins: Vec<Value<'_>> = node
                        .inputs
                        .iter()
                        .map(|i| match (&values[i.index()], &weights[i.index()]) {
                            (Some(t), _) => Value::Act(t),
                            (None, Some(w)) => Value::Weight(*w),
                            (None, None) => unreachable!("inputs precede their consumers in graph order"),
                        })
                        .collect();
                    let state = match op.state() {
                        Some(s) => Some(st.layers.get_mut(s).ok_or_else(|| RunError::Op {
                            node: node.name.clone(),
                            source: OpError::Invalid { op: op.kind(), msg: format!("no layer state {s}") },
                        })?),
                        None => None,
                    };
                    self.backend
                        .execute(op, &ins, &node.out, state)
                        .map_err(|source| RunError::Op { node: node.name.clone(), source })?
                }
            };
            if let Some(obs) = observer {
                obs(node, &value);
            }
            values[idx] = Some(value);
            for &i in &node.inputs {
                if last_use[i.index()] == idx {
                    values[i.index()] = None;
                }
            }
        }
        st.pos += tokens.len();
        let out = graph.outputs.first().copied().ok_or_else(|| RunError::Op {
            node: "result_output".into(),
            source: OpError::Invalid { op: "graph", msg: "the model graph has no output".into() },
        })?;
        Ok(values[out.index()].take().expect("graph outputs are kept alive"))
    }
}

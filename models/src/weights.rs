//! The weight catalog of a GGUF: name → (type, shape), with shape-checked lookups so a
//! tensor of the wrong shape for its role is reported by name at load time.

use pn_engine::graph::{GraphBuilder, GraphError, NodeId};
use pn_engine::Gguf;
use pn_ops::{GgmlType, Shape};
use std::collections::HashMap;

#[derive(Clone, Debug, Default)]
pub struct Weights {
    map: HashMap<String, (GgmlType, Shape)>,
}

impl Weights {
    pub fn from_gguf(g: &Gguf) -> Weights {
        let map = g
            .tensors
            .iter()
            .map(|t| (t.name.clone(), (t.ty, Shape([t.ne[0] as usize, t.ne[1] as usize, t.ne[2] as usize, t.ne[3] as usize]))))
            .collect();
        Weights { map }
    }
    pub fn has(&self, name: &str) -> bool {
        self.map.contains_key(name)
    }
    pub fn get(&self, name: &str) -> Option<(GgmlType, Shape)> {
        self.map.get(name).copied()
    }

    /// Add weight `name` to the graph, checking its shape (ggml order; a 1-D `[n]` also
    /// accepts `[n, 1]`) and that its type is computable.
    pub fn node(&self, b: &mut GraphBuilder, name: &str, shape: &[usize]) -> Result<NodeId, GraphError> {
        let (ty, have) = self.get(name).ok_or_else(|| GraphError::Weight { name: name.into(), msg: "required tensor is missing from the GGUF".into() })?;
        let mut want = [1usize; 4];
        want[..shape.len()].copy_from_slice(shape);
        if have.0 != want {
            return Err(GraphError::Weight { name: name.into(), msg: format!("expected shape {:?}, found {:?}", Shape(want), have) });
        }
        if !ty.is_supported_weight() {
            return Err(GraphError::Weight { name: name.into(), msg: format!("type {ty} is not supported (supported: F32, F16, BF16, Q4_0..Q8_0, K-quants, IQ types, MXFP4)") });
        }
        b.weight(name, ty, have)
    }

    /// Like [`Weights::node`], but `None` when the tensor is absent.
    pub fn opt_node(&self, b: &mut GraphBuilder, name: &str, shape: &[usize]) -> Result<Option<NodeId>, GraphError> {
        if self.has(name) {
            self.node(b, name, shape).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Require an F32 tensor (norms, router, conv taps: the converter keeps them F32).
    pub fn require_f32(&self, name: &str) -> Result<(), GraphError> {
        match self.get(name) {
            Some((GgmlType::F32, _)) | None => Ok(()),
            Some((ty, _)) => Err(GraphError::Weight { name: name.into(), msg: format!("expected type F32, found {ty}") }),
        }
    }
}

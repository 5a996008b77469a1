//! pn-engine: everything between a GGUF file and logits that is not model-specific.

pub mod backend;
pub mod gguf;
pub mod graph;
pub mod runner;
pub mod sampler;
pub mod tokenizer;

pub use backend::{Backend, ReferenceBackend, Support};
pub use gguf::{Gguf, GgufError, MetaValue, TensorInfo};
pub use graph::{Graph, GraphBuilder, Node, NodeId};

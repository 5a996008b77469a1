//! pn-engine: everything between a GGUF file and logits that is not model-specific.
// Two unsafe blocks (the read-only mmap in gguf/mod.rs and dropping its pages in
// gguf/rows16.rs, each with a SAFETY comment) are allowed where they are; any other is an
// error.
#![deny(unsafe_code)]

pub mod async_step;
pub mod backend;
pub mod chat;
pub mod conversation;
pub mod dump;
pub mod gguf;
pub mod gguf_writer;
pub mod graph;
pub mod model;
pub mod npy;
pub mod planner;
pub mod prefix_cache;
pub mod runner;
pub mod sampler;
pub mod slots;
pub mod spec;
pub mod state;
pub mod stop;
pub mod tensor_dump;
#[doc(hidden)]
pub mod testing;
pub mod tokenizer;

pub use backend::{
    copy_tensor, execute_op, f32_out, i32_out, store_into, Backend, ExecError, Executable, HostKernels, HostMem, Memory, OpCode,
    OpInput, PassIo, ReferenceBackend, ResidentInput, SegmentCode, SegmentRun, SlotId, SlotSpec, StateKey, StateOp,
    StateReply, Support, Transfer,
};
pub use gguf::{Gguf, GgufError, LoadMode, MetaValue, TensorInfo};
pub use graph::{Graph, GraphBuilder, Node, NodeId};
pub use model::{Geometry, LayerInfo, Model};
pub use runner::{RunError, Runner};
pub use slots::{SlotError, SlotHandle, Slots};
pub use state::SeqState;

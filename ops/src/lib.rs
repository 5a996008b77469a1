//! pn-ops: the op vocabulary of Pantheon.
//!
//! - [`GgmlType`]: every GGUF tensor type with its block geometry ([`dtype`]).
//! - [`quant`]: block formats, exact reference dequantization, the activation quantizers
//!   llama.cpp uses before quantized dot products, and `vec_dot` per weight type.
//! - [`Op`]: the typed ops a graph is made of, with shape inference ([`op`]).
//! - [`Tensor`], [`WeightView`]: activations and zero-copy weight views ([`tensor`]).
//! - [`state`]: per-layer sequence state (KV cache, conv state, delta-rule state).
//! - [`math`]: the project's own f32 `exp` (and silu, sigmoid): the same bits in every
//!   backend and vector width.
//! - [`reference`]: a plain f32 reference kernel for every op — the oracle every
//!   backend is tested against.

pub mod dtype;
pub mod math;
pub mod op;
pub mod quant;
pub mod reference;
pub mod state;
pub mod tensor;
#[doc(hidden)]
pub mod testing;

pub use dtype::GgmlType;
pub use op::{BinaryOp, Op, OpError, RopeMode, UnaryOp};
pub use state::{KvCache, KvType, LayerSnapshot, LayerState, Overflow, RecurrentState, SeqSpan, StateShape};
pub use tensor::{DType, Shape, Tensor, TensorData, TensorMeta, Value, WeightView};

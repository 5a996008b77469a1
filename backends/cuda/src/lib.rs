//! pn-cuda: the CUDA backend. Kernels in `kernels/*.cu` are compiled at run time by
//! NVRTC for the device's architecture (CUBIN, cached on disk), and launched through
//! cudarc with the driver loaded dynamically: this crate builds, and its tests pass,
//! on machines without CUDA; [`CudaBackend::new`] then fails with
//! [`CudaError::NoDevice`].
//!
//! CONTRACT: `CudaBackend::new(device_index) -> Result<CudaBackend, CudaError>`,
//! implementing `pn_engine::Backend` for every op.
//!
//! Numerics follow the CPU backend: weights stay in their GGUF blocks (uploaded once,
//! cached by the address of their bytes), activations are quantized on the device to
//! the weight's vec-dot format (q8_0 / q8_1 / q8_K / f16 / bf16) byte for byte as
//! `pn_ops::quant::quantize_row` does, block dots are exact integer sums, reductions
//! use f64 where the reference does. Results track the CPU within float reordering.
//!
//! Today's `Backend` trait hands host tensors in and out of every op, so each op
//! uploads its activation inputs and downloads its output, and stateful ops upload and
//! download their layer state (docs/cuda.md lists these copies and the trait change
//! that removes them). Every op runs on the device: attention over every KV-cache
//! format (f32 / f16 / q8_0 / q4_0, shadows, Hadamard rotation, ring), the delta rule
//! for any head size (recurrent or chunked). There is no CPU fallback.
//!
//! For the device-resident engine path: CUDA graphs (capture / replay / re-capture on a
//! geometry change) and events (record / query / wait), `stream.rs` over the host-side
//! bookkeeping of `graphs.rs`.

mod device;
pub mod formats;
pub mod graphs;
pub mod kernels;
mod ops_attn;
mod ops_delta;
mod ops_linear;
mod ops_misc;
mod ops_state;
mod stream;

pub use graphs::{EventId, GraphKey, GraphStats};

use device::Device;
use pn_engine::{Backend, Node, Support};
use pn_ops::reference::common::validate;
use pn_ops::{LayerState, Op, OpError, Tensor, TensorMeta, Value};
use std::sync::Mutex;
use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq)]
pub enum CudaError {
    /// No usable driver or device (the machine has no NVIDIA GPU, or the index is out of range).
    #[error("no CUDA driver/device: {0}")]
    NoDevice(String),
    #[error("NVRTC: {0}")]
    Nvrtc(String),
    #[error("NVRTC failed on {file} for {arch}:\n{log}")]
    Compile {
        file: String,
        arch: String,
        log: String,
    },
    #[error("CUDA driver: {0}")]
    Driver(String),
    #[error("unsupported on cuda: {0}")]
    Unsupported(String),
    /// Misuse of the graph / event API (nested capture, unknown event, ...).
    #[error("CUDA graph: {0}")]
    Graph(String),
}

/// The CUDA backend on one device.
pub struct CudaBackend {
    dev: Device,
    label: String,
    /// One op at a time: ops share the stream and the weight cache.
    lock: Mutex<()>,
    /// Captured graphs (stream.rs); taken after `lock` when both are held.
    graphs: Mutex<graphs::GraphTable<stream::SendGraph>>,
    /// Recorded events (stream.rs).
    events: Mutex<graphs::EventTable<cudarc::driver::CudaEvent>>,
}

impl CudaBackend {
    /// Open device `device_index`, compile (or load from the cache) every kernel for its
    /// architecture. Fails with [`CudaError::NoDevice`] when there is no driver/device.
    pub fn new(device_index: usize) -> Result<CudaBackend, CudaError> {
        let dev = Device::new(device_index)?;
        let label = format!("cuda:{device_index}");
        Ok(CudaBackend {
            dev,
            label,
            lock: Mutex::new(()),
            graphs: Mutex::new(Default::default()),
            events: Mutex::new(Default::default()),
        })
    }

    /// Device name and architecture, e.g. "NVIDIA H200 (sm_90)".
    pub fn describe(&self) -> String {
        format!("{} ({})", self.dev.name, self.dev.arch)
    }

    /// Bytes of weights resident on the device.
    pub fn weight_bytes(&self) -> usize {
        self.dev.weight_bytes()
    }

    /// Rows of `k` f32 converted on the device to the activation format of weight type
    /// `wty` (raw bytes, to compare with `pn_ops::quant::quantize_row`).
    pub fn quantize_rows(
        &self,
        wty: pn_ops::GgmlType,
        x: &[f32],
        k: usize,
    ) -> Result<Vec<u8>, CudaError> {
        let _guard = self
            .lock
            .lock()
            .map_err(|_| CudaError::Driver("lock poisoned".into()))?;
        self.dev.ctx.bind_to_thread().map_err(device::drv)?;
        let rows = x.len().checked_div(k).unwrap_or(0);
        let xd = self.dev.upload(x)?;
        match ops_linear::quantize(&self.dev, &xd, rows, k, wty)? {
            (ops_linear::Act::F32, _) => Ok(x.iter().flat_map(|v| v.to_le_bytes()).collect()),
            (ops_linear::Act::Q(q), rb) => self.dev.download(&q, rows * rb),
        }
    }

    /// Run one op on the device (what [`Backend::execute`] does).
    pub fn run(
        &self,
        op: &Op,
        ins: &[Value<'_>],
        out: &TensorMeta,
        state: Option<&mut LayerState>,
    ) -> Result<Tensor, OpError> {
        validate(op, ins, out)?;
        if let Some(key) = self.capturing() {
            return Err(OpError::Invalid {
                op: op.kind(),
                msg: format!(
                    "cuda: graph {key} is being captured; execute() copies host tensors and cannot be captured"
                ),
            });
        }
        let _guard = self.lock.lock().map_err(|_| OpError::Invalid {
            op: op.kind(),
            msg: "cuda backend lock poisoned".into(),
        })?;
        self.dev
            .ctx
            .bind_to_thread()
            .map_err(|e| OpError::Invalid {
                op: op.kind(),
                msg: format!("cuda: {e:?}"),
            })?;
        self.dispatch(op, ins, out, state)
    }

    fn dispatch(
        &self,
        op: &Op,
        ins: &[Value<'_>],
        out: &TensorMeta,
        state: Option<&mut LayerState>,
    ) -> Result<Tensor, OpError> {
        let k = op.kind();
        let e = |r: Result<Tensor, CudaError>| r.map_err(|e| to_op_error(k, e));
        let d = &self.dev;
        match op {
            Op::Tokens | Op::Positions | Op::Weight { .. } => Err(OpError::Invalid {
                op: k,
                msg: "leaves are provided by the runner, not executed".into(),
            }),
            Op::GetRows => e(ops_linear::get_rows(d, ins, out)),
            Op::MatMul => e(ops_linear::matmul(d, ins, out)),
            Op::MoeExperts { merged_gate_up } => {
                e(ops_linear::moe_experts(d, ins, out, *merged_gate_up))
            }
            Op::RmsNorm { eps } => e(ops_misc::norm(d, ins, out, *eps, true)),
            Op::L2Norm { eps } => e(ops_misc::norm(d, ins, out, *eps, false)),
            Op::Softmax => e(ops_misc::softmax(d, ins, out)),
            Op::Rope {
                n_rot,
                mode,
                freq_base,
                freq_scale,
            } => e(ops_misc::rope(
                d,
                ins,
                out,
                *n_rot,
                *mode,
                *freq_base,
                *freq_scale,
            )),
            Op::TopK { k: top } => e(ops_misc::topk(d, ins, out, *top)),
            Op::MoeWeights { normalize } => e(ops_misc::moe_weights(d, ins, out, *normalize)),
            Op::Unary(u) => e(ops_misc::unary(d, ins, out, *u)),
            Op::Binary(b) => e(ops_misc::binary(d, ins, out, *b)),
            Op::SliceCols { group, offset, len } => {
                e(ops_misc::slice_cols(d, ins, out, *group, *offset, *len))
            }
            Op::SliceRows { start, len: _ } => e(ops_misc::slice_rows(d, ins, out, *start)),
            // Same data, new shape: no device work.
            Op::Reshape(_) => pn_ops::reference::elementwise::reshape(ins, out),
            Op::Attention {
                n_head,
                n_head_kv,
                head_dim,
                scale,
                state: _,
            } => {
                let g = ops_attn::AttnGeom {
                    n_head: *n_head,
                    n_head_kv: *n_head_kv,
                    d: *head_dim,
                    scale: *scale,
                };
                ops_attn::attention(d, ins, out, state, g)
            }
            Op::Conv1dCausal { d_conv, state: _ } => ops_state::conv1d(d, ins, out, state, *d_conv),
            Op::DeltaRule { state: _ } => ops_delta::delta_rule(d, ins, out, state),
        }
    }
}

fn to_op_error(op: &'static str, e: CudaError) -> OpError {
    match e {
        CudaError::Unsupported(ty) => OpError::Invalid {
            op,
            msg: format!("unsupported on cuda: {ty}"),
        },
        e => OpError::Invalid {
            op,
            msg: format!("cuda: {e}"),
        },
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &str {
        &self.label
    }

    fn supports(&self, node: &Node) -> Support {
        if node.op.is_leaf() {
            return Support::No(format!(
                "{} is a leaf (provided by the runner)",
                node.op.kind()
            ));
        }
        Support::Yes
    }

    fn execute(
        &self,
        op: &Op,
        inputs: &[Value<'_>],
        out: &TensorMeta,
        state: Option<&mut LayerState>,
    ) -> Result<Tensor, OpError> {
        self.run(op, inputs, out, state)
    }
}

/// Weight formats a matmul can take on the device, and how (for `pn info`-like reports).
pub fn weight_support(ty: pn_ops::GgmlType) -> Support {
    match formats::residency(ty) {
        formats::Residency::Native => Support::Yes,
        formats::Residency::F16Fallback => Support::Yes,
        formats::Residency::No(why) => Support::No(why),
    }
}

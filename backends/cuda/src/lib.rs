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
//! Two protocols over the same op code (dispatch.rs, written against exec.rs's `Cx`):
//! - resident (`Backend::resident() == true`, what the runner uses on a `cuda:N` die):
//!   activations live in one device buffer per runner slot, layer states (KV cache of
//!   every format, conv window, ssm state) on the device by `StateKey`, every op reads and
//!   writes device memory; a decode step uploads token ids and positions and downloads
//!   the logits, nothing else (resident.rs). Stable segments (decode) are captured as CUDA
//!   graphs and replayed while their work is the same (segment.rs, capture.rs);
//! - host (`Backend::execute`): inputs uploaded to temporaries, the output downloaded, a
//!   stateful op's state copied to the device and back around the call (host.rs).
//!
//! Every op runs on the device: attention over every KV-cache format (f32 / f16 / q8_0 /
//! q4_0, shadows, Hadamard rotation, ring), the delta rule for any head size (recurrent
//! or chunked). There is no CPU fallback. Events (record / query / wait) and the graph
//! primitives are in stream.rs over the host-side bookkeeping of graphs.rs.

mod capture;
mod device;
mod devstate;
mod layerstate;
mod dispatch;
mod exec;
pub mod formats;
mod graph_capture;
pub mod graphs;
mod host;
pub mod kernels;
mod opnd;
mod ops_attn;
mod ops_delta;
mod ops_linear;
mod ops_misc;
mod ops_state;
mod resident;
mod segment;
mod seqtab;
pub mod start;
mod stream;
mod tables;
pub mod weights;

pub use capture::ResidentStats;
pub use ops_delta::set_chunked_from as set_delta_chunked_from;
pub use graphs::{EventId, GraphKey, GraphStats};

use device::Device;
use pn_engine::{Backend, Executable, Memory, Node, SegmentCode, SlotSpec, StateOp, StateReply, Support, Transfer};
use pn_ops::reference::common::{validate, validate_state};
use pn_ops::{LayerState, Op, OpError, Tensor, TensorMeta, Value};
use std::sync::{Arc, Mutex};
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
    graphs: Mutex<graphs::GraphTable<graph_capture::DevGraph>>,
    /// Recorded events (stream.rs).
    events: Mutex<graphs::EventTable<cudarc::driver::CudaEvent>>,
    /// Slots, layer states, scratch, the open segment (resident.rs); taken after `lock`.
    res: Mutex<resident::ResState>,
    /// Capture stable segments as CUDA graphs (`PN_CUDA_GRAPHS=0`: never).
    graphs_on: bool,
    /// `PN_DEBUG` level (1: a line per resident segment).
    debug: u8,
}

impl CudaBackend {
    /// Open device `device_index`, compile (or load from the cache) every kernel for its
    /// architecture. Fails with [`CudaError::NoDevice`] when there is no driver/device.
    /// `device_index` is the die's index: the physical device is the same unless
    /// `PN_CUDA_DEVICE_MAP` maps it (start.rs: `0,0` puts cuda:0 and cuda:1 on one GPU).
    pub fn new(device_index: usize) -> Result<CudaBackend, CudaError> {
        let map = std::env::var(start::MAP_VAR).ok();
        CudaBackend::on_device(device_index, start::physical(device_index, map.as_deref())?)
    }

    /// Die `cuda:{die}` on physical device `device`. Several backends may share a device:
    /// each has its own stream, all share its primary context (die-to-die copies are
    /// then device-to-device copies).
    pub fn on_device(die: usize, device: usize) -> Result<CudaBackend, CudaError> {
        let dev = Device::new(device)?;
        let label = format!("cuda:{die}");
        let graphs_on = std::env::var("PN_CUDA_GRAPHS").map_or(true, |v| v.trim() != "0");
        Ok(CudaBackend {
            dev,
            label,
            lock: Mutex::new(()),
            graphs: Mutex::new(Default::default()),
            events: Mutex::new(Default::default()),
            res: Mutex::new(Default::default()),
            graphs_on,
            debug: pn_engine::planner::debug::level_from_env(),
        })
    }

    /// Turn CUDA graph capture of stable resident segments on or off (default on;
    /// `PN_CUDA_GRAPHS=0` starts with it off). Graphs held stay until replaced.
    pub fn set_graphs(&mut self, on: bool) {
        self.graphs_on = on;
    }

    /// Device name and architecture, e.g. "NVIDIA H200 (sm_90)".
    pub fn describe(&self) -> String {
        format!("{} ({})", self.dev.name, self.dev.arch)
    }

    /// Bytes of weights resident on the device.
    pub fn weight_bytes(&self) -> usize {
        self.dev.weight_bytes()
    }

    /// Hits, misses and stale entries of the device weight cache (weights.rs).
    pub fn weight_stats(&self) -> weights::CacheStats {
        self.dev.weight_stats()
    }

    /// Static shared memory of kernel `name` in bytes, as the driver reports it.
    pub fn static_shared(&self, name: &str) -> usize {
        self.dev.static_shared(name)
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
        let mut cx = exec::Cx::host(&self.dev);
        let xd = cx.upload(x)?;
        match ops_linear::quantize(&mut cx, xd, rows, k, wty)? {
            (None, _) => Ok(x.iter().flat_map(|v| v.to_le_bytes()).collect()),
            (Some(q), rb) => {
                let mut out = vec![0u8; rows * rb];
                self.dev.dtoh(&mut out, q)?;
                Ok(out)
            }
        }
    }

    /// Run one op on host tensors through the device (op-level parity tests): inputs
    /// uploaded, the result and the state downloaded.
    pub fn run(
        &self,
        op: &Op,
        ins: &[Value<'_>],
        out: &TensorMeta,
        state: Option<&mut LayerState>,
    ) -> Result<Tensor, OpError> {
        validate(op, ins, out)?;
        validate_state(op, ins, state.as_deref())?;
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
        // a resident segment's deferred commands go first (stream order)
        if let Ok(mut r) = self.res.lock() {
            r.flush(&self.dev)
                .map_err(|e| dispatch::to_op_error(op.kind(), e))?;
        }
        host::execute(&self.dev, op, ins, out, state)
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

    // ---- the protocol on device memory (resident.rs, segment.rs) ----

    fn memory(&self) -> Memory {
        Memory::Device
    }
    fn reserve(&self, specs: &[SlotSpec]) -> Result<(), OpError> {
        CudaBackend::reserve(self, specs)
    }
    fn release(&self, arena: u64) {
        CudaBackend::release(self, arena)
    }
    fn transfer(&self, t: Transfer<'_>) -> Result<bool, OpError> {
        match t {
            Transfer::Upload(slot, t) => self.upload_slot(slot, t).map(|_| true),
            Transfer::Download(slot, meta, out) => self.download_slot(slot, meta, out).map(|_| true),
            Transfer::Copy { src, from, to, meta } => self.copy_slot(src, from, to, meta),
        }
    }
    fn compile(self: Arc<Self>, seg: SegmentCode) -> Result<Box<dyn Executable>, OpError> {
        Ok(Box::new(segment::SegExec::new(self, seg)))
    }
    fn state(&self, op: StateOp<'_>) -> Result<StateReply, OpError> {
        let done = |b: bool| if b { StateReply::Done } else { StateReply::Unsupported };
        Ok(match op {
            StateOp::Upload(key, st) => {
                self.state_up(key, st)?;
                StateReply::Done
            }
            StateOp::Download(key, st) => {
                self.state_down(key, st)?;
                StateReply::Done
            }
            StateOp::Copy(from, to) => done(self.state_fork(from, to)?),
            StateOp::Reset(key) => done(self.state_zero(key)?),
            StateOp::Snapshot(key, pos) => match self.state_snap(key, pos)? {
                Some(s) => StateReply::Snapshot(s),
                None => StateReply::Unsupported,
            },
            StateOp::Release(key) => {
                self.state_drop(key);
                StateReply::Done
            }
        })
    }
}

impl Drop for CudaBackend {
    /// Deferred commands launched, graphs and resident buffers dropped, then the stream
    /// drained, before the device (context, modules) goes.
    fn drop(&mut self) {
        if let Ok(mut r) = self.res.lock() {
            let _ = self.dev.ctx.bind_to_thread();
            let _ = r.flush(&self.dev);
            *r = Default::default();
        }
        if let Ok(mut g) = self.graphs.lock() {
            g.clear();
        }
        let _ = self.dev.stream.synchronize();
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

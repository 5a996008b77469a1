//! pn-cpu: the CPU backend. Multi-threaded (rayon) kernels whose results are bitwise
//! independent of the thread count: work is split by output rows / heads, never inside a
//! row's reduction.
//!
//! CONTRACT: `CpuBackend::new(threads: usize) -> CpuBackend` (0 = all cores), implementing
//! `pn_engine::Backend`.
//!
//! Every kernel computes exactly what the pn-ops reference kernel computes, in the same
//! floating-point order per output element, so CPU and reference results are bitwise equal.

/// `default`, or a benchmark's override of it (`pn_ops::quant::set_knobs`, knob `$knob` of
/// `pn_ops::quant`; the knobs exist on x86-64 only): `tuned!(KNOB_ROWS16, 1)`.
macro_rules! tuned {
    ($knob:ident, $default:expr) => {{
        #[cfg(target_arch = "x86_64")]
        let v = pn_ops::quant::knob(pn_ops::quant::$knob, $default);
        #[cfg(not(target_arch = "x86_64"))]
        let v = $default;
        v
    }};
}

mod attention;
mod delta;
pub mod delta_chunk;
mod delta_rows;
mod elementwise;
mod matmul;
mod moe;
mod norm;
mod par;
mod rope;
mod scratch;
mod transpose;

use pn_engine::{f32_out, i32_out, store_into, HostKernels, HostMem};
use pn_ops::reference::common::{validate, validate_state};
use pn_ops::{LayerState, Op, OpError, SeqSpan, Tensor, TensorMeta, Value};

/// The CPU backend: owns its own rayon thread pool (two instances are two independent
/// "dies"); with one thread, none: it runs on the caller's thread (no hand-off per pass;
/// what each of a runner's lanes is, `pn_engine` runner/lanes.rs).
pub struct CpuBackend {
    pool: Option<rayon::ThreadPool>,
    threads: usize,
    /// The buffer slots (host memory: the CPU's device memory).
    mem: HostMem,
}

impl CpuBackend {
    /// A backend with `threads` worker threads (0 = all cores).
    ///
    /// Panics if the operating system refuses the threads; [`CpuBackend::try_new`] returns
    /// that as an error instead (what the CLI uses).
    pub fn new(threads: usize) -> CpuBackend {
        CpuBackend::try_new(threads).expect("building the CPU thread pool")
    }

    /// Like [`CpuBackend::new`], with a failure to start the threads as an error.
    pub fn try_new(threads: usize) -> Result<CpuBackend, String> {
        if threads == 1 {
            return Ok(CpuBackend { pool: None, threads, mem: HostMem::new() });
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("pn-cpu-{i}"))
            .build()
            .map_err(|e| format!("cannot start {threads} CPU threads: {e}"))?;
        let threads = pool.current_num_threads();
        Ok(CpuBackend { pool: Some(pool), threads, mem: HostMem::new() })
    }

    /// `f` on this backend's threads: inside the pool (a caller that already is one of
    /// its threads runs it directly), or, without a pool, on the caller's thread with
    /// every loop serial.
    fn on_threads<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match &self.pool {
            Some(p) => p.install(f),
            None => par::inline(f),
        }
    }

    /// Number of worker threads.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Run one op on this backend's threads (what [`HostKernels::execute`] does).
    pub fn run(
        &self,
        op: &Op,
        ins: &[Value<'_>],
        out: &TensorMeta,
        state: Option<&mut LayerState>,
    ) -> Result<Tensor, OpError> {
        validate(op, ins, out)?;
        validate_state(op, ins, state.as_deref())?;
        if runs_inline(op, ins, out) {
            // Small ops run on the caller's thread: handing them to the pool costs more
            // (a wake-up and a blocking wait per op) than the op itself. Their loops go
            // through `par::rows`, which stays serial for them (also inside a pass).
            return par::inline(|| dispatch(op, ins, out, state));
        }
        // Inside `run_pass` the caller already is one of this pool's threads: `install`
        // then runs the op directly, without a hand-off.
        self.on_threads(|| dispatch(op, ins, out, state))
    }
}

impl Default for CpuBackend {
    fn default() -> Self {
        CpuBackend::new(0)
    }
}

/// Output elements up to which the light ops run inline (a decode step's activations).
const INLINE_MAX: usize = 1 << 15;
/// Multiply-adds up to which a matmul (or conv) runs inline: ~20 µs of work, about what
/// waking the pool and waiting for it costs on a busy machine.
const INLINE_WORK: usize = 1 << 19;
/// Weight bytes up to which a matmul runs inline (~20 µs of one thread's reading).
const INLINE_BYTES: usize = 256 << 10;

/// Whether `op` is light enough to run on the calling thread: element-wise, norms,
/// routing and data movement on small outputs. These only parallelize through
/// `par::rows`, which runs serially outside the pool.
fn runs_inline(op: &Op, ins: &[Value<'_>], out: &TensorMeta) -> bool {
    // Small matmuls (decode: router, β/α, shared-expert gate) and conv1d steps too.
    let small = |work: usize| work <= INLINE_WORK;
    match op {
        Op::MatMul => {
            let (k, bytes) = match &ins[0] {
                Value::Weight(w) => (w.shape.0[0], w.bytes.len()),
                Value::Act(t) => (t.shape.0[0], 0),
            };
            // a one-token matmul is a read of its weights: the F32 router (2048 × 256,
            // 2 MB) is little work but takes both threads' bandwidth
            return small(k.saturating_mul(out.shape.numel())) && bytes <= INLINE_BYTES;
        }
        Op::GetRows => return out.shape.numel() <= INLINE_MAX,
        // t·top·3·K·F multiply-adds (small models' decode)
        Op::MoeExperts { .. } => {
            let (top, kd) = (ins[1].act().shape.0[0], out.shape.0[0]);
            let f = match &ins[ins.len() - 1] {
                Value::Weight(w) => w.shape.0[0],
                Value::Act(_) => return false,
            };
            return small(out.shape.0[1].saturating_mul(top * 3 * kd * f));
        }
        // ~4·Dk·Dv per token and V head
        Op::DeltaRule { .. } => {
            let dk = ins[0].act().shape.0[0];
            return small(4 * dk * out.shape.numel());
        }
        // (a decode token's conv is a read of its taps and window: inline up to
        // a quarter of INLINE_BYTES of them: 8192 channels take both threads)
        Op::Conv1dCausal { d_conv, .. } => return small(d_conv * out.shape.numel() * 4) && 4 * (2 * d_conv - 1) * out.shape.0[0] <= INLINE_BYTES / 4,
        _ => {}
    }
    let light = matches!(
        op,
        Op::RmsNorm { .. }
            | Op::L2Norm { .. }
            | Op::Softmax
            | Op::TopK { .. }
            | Op::MoeWeights { .. }
            | Op::Unary(_)
            | Op::Binary(_)
            | Op::SliceCols { .. }
            | Op::SliceRows { .. }
            | Op::Reshape(_)
            | Op::Rope { .. }
    );
    light && out.shape.numel() <= INLINE_MAX
}

/// Gives `runner` `n` lanes (`pn_engine` runner/lanes.rs): replicas on one-thread CPU
/// backends, each running on its caller's thread. Fewer than two: none.
pub fn add_lanes(runner: &mut pn_engine::Runner, n: usize) -> Result<(), String> {
    let replicas = (0..n)
        .map(|_| {
            let b = std::sync::Arc::new(CpuBackend::try_new(1)?) as std::sync::Arc<dyn pn_engine::Backend>;
            runner.replica(b).map_err(|e| e.to_string())
        })
        .collect::<Result<Vec<_>, String>>()?;
    runner.set_lanes(replicas)
}

/// Sets the flag when dropped: also when the pass panics, so the spinners stop and the
/// joins can unwind.
struct Done<'a>(&'a std::sync::atomic::AtomicBool);
impl Drop for Done<'_> {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Release);
    }
}

/// Whether a pass keeps the other workers spinning (`PN_NO_SPIN` turns it off, e.g. on
/// an oversubscribed machine).
fn spin_pass() -> bool {
    static V: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *V.get_or_init(|| std::env::var_os("PN_NO_SPIN").is_none())
}

/// Like [`dispatch`], writing into `out` (a persistent buffer of the runner); the hot ops
/// write there directly, the others go through `dispatch` and a copy.
fn dispatch_into(
    op: &Op,
    ins: &[Value<'_>],
    meta: &TensorMeta,
    state: Option<&mut LayerState>,
    out: &mut Tensor,
) -> Result<(), OpError> {
    match (op, meta.dtype) {
        (Op::TopK { k }, pn_ops::DType::I32) => return moe::topk_into(ins, meta, *k, i32_out(out, meta)),
        (_, pn_ops::DType::F32) => {}
        _ => {
            store_into(out, dispatch(op, ins, meta, state)?);
            return Ok(());
        }
    }
    match op {
        Op::Softmax => norm::softmax_into(ins, meta, f32_out(out, meta)),
        Op::MoeWeights { normalize } => moe::moe_weights_into(ins, meta, *normalize, f32_out(out, meta)),
        Op::GetRows => matmul::get_rows_into(ins, meta, f32_out(out, meta)),
        Op::MatMul => matmul::matmul_into(ins, meta, f32_out(out, meta)),
        Op::RmsNorm { eps } => norm::rms_norm_into(ins, meta, *eps, f32_out(out, meta)),
        Op::L2Norm { eps } => norm::l2_norm_into(ins, meta, *eps, f32_out(out, meta)),
        Op::Rope {
            n_rot,
            mode,
            freq_base,
            freq_scale,
        } => rope::rope_into(ins, meta, *n_rot, *mode, *freq_base, *freq_scale, f32_out(out, meta)),
        Op::Conv1dCausal { d_conv, state: _ } => {
            delta::conv1d_causal_into(ins, meta, state, *d_conv, f32_out(out, meta))
        }
        Op::DeltaRule { state: _ } => delta::delta_rule_into(ins, meta, state, f32_out(out, meta)),
        Op::Attention { n_head, n_head_kv, head_dim, scale, state: _ } => {
            attention::attention_into(ins, meta, state, *n_head, *n_head_kv, *head_dim, *scale, f32_out(out, meta))
        }
        Op::MoeExperts { merged_gate_up } => {
            moe::moe_experts_into(ins, meta, *merged_gate_up, f32_out(out, meta))
        }
        Op::Unary(u) => elementwise::unary_into(ins, meta, *u, f32_out(out, meta)),
        Op::Binary(b) => elementwise::binary_into(ins, meta, *b, f32_out(out, meta)),
        Op::SliceCols { group, offset, len } => {
            elementwise::slice_cols_into(ins, meta, *group, *offset, *len, f32_out(out, meta))
        }
        Op::SliceRows { start, len: _ } => {
            elementwise::slice_rows_into(ins, meta, *start, f32_out(out, meta))
        }
        Op::Reshape(_) if matches!(ins.first(), Some(Value::Act(t)) if t.dtype() == pn_ops::DType::F32) => {
            let (x, y) = (ins[0].act().as_f32(), f32_out(out, meta));
            crate::norm::len_check("Reshape", x.len(), y.len())?;
            par::copy(y, x);
            Ok(())
        }
        _ => {
            store_into(out, dispatch(op, ins, meta, state)?);
            Ok(())
        }
    }
}

fn dispatch(
    op: &Op,
    ins: &[Value<'_>],
    out: &TensorMeta,
    state: Option<&mut LayerState>,
) -> Result<Tensor, OpError> {
    match op {
        Op::Tokens | Op::Positions | Op::Weight { .. } => Err(OpError::Invalid {
            op: op.kind(),
            msg: "leaves are provided by the runner, not executed".into(),
        }),
        Op::GetRows => matmul::get_rows(ins, out),
        Op::MatMul => matmul::matmul(ins, out),
        Op::RmsNorm { eps } => norm::rms_norm(ins, out, *eps),
        Op::L2Norm { eps } => norm::l2_norm(ins, out, *eps),
        Op::Rope {
            n_rot,
            mode,
            freq_base,
            freq_scale,
        } => rope::rope(ins, out, *n_rot, *mode, *freq_base, *freq_scale),
        Op::Attention {
            n_head,
            n_head_kv,
            head_dim,
            scale,
            state: _,
        } => attention::attention(ins, out, state, *n_head, *n_head_kv, *head_dim, *scale),
        Op::Conv1dCausal { d_conv, state: _ } => delta::conv1d_causal(ins, out, state, *d_conv),
        Op::DeltaRule { state: _ } => delta::delta_rule(ins, out, state),
        Op::Softmax => norm::softmax(ins, out),
        Op::TopK { k } => moe::topk(ins, out, *k),
        Op::MoeWeights { normalize } => moe::moe_weights(ins, out, *normalize),
        Op::MoeExperts { merged_gate_up } => moe::moe_experts(ins, out, *merged_gate_up),
        Op::Unary(u) => elementwise::unary(ins, out, *u),
        Op::Binary(b) => elementwise::binary(ins, out, *b),
        Op::SliceCols { group, offset, len } => {
            elementwise::slice_cols(ins, out, *group, *offset, *len)
        }
        Op::SliceRows { start, len: _ } => elementwise::slice_rows(ins, out, *start),
        // by the pass's sequence table (the host executor, engine backend/host.rs)
        Op::LastRows { .. } => pn_ops::reference::execute(op, ins, out, None),
        Op::Reshape(_) => elementwise::reshape(ins, out),
    }
}

/// The CPU's kernels; through `pn_engine`'s blanket impl, a `Backend` over host memory.
impl HostKernels for CpuBackend {
    fn label(&self) -> &str {
        "cpu"
    }

    fn mem(&self) -> &HostMem {
        &self.mem
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

    fn kernel_into(
        &self,
        op: &Op,
        inputs: &[Value<'_>],
        meta: &TensorMeta,
        state: Option<&mut LayerState>,
        out: &mut Tensor,
    ) -> Result<(), OpError> {
        validate(op, inputs, meta)?;
        if runs_inline(op, inputs, meta) {
            return par::inline(|| dispatch_into(op, inputs, meta, state, out));
        }
        self.on_threads(|| dispatch_into(op, inputs, meta, state, out))
    }

    /// The whole segment on one of this backend's threads: heavy ops then start their
    /// parallel loops from inside the pool (no wake-up and blocking wait per op), and the
    /// light ones run inline there as before.
    fn run_pass(&self, f: &mut (dyn FnMut() + Send)) {
        let pool = match &self.pool {
            Some(p) if self.threads > 1 && spin_pass() => p,
            _ => return self.on_threads(f),
        };
        // The other workers stay awake for the whole pass, taking the halves of the
        // ops' parallel loops as soon as they are pushed, instead of sleeping between
        // ops (a futex wake-up and a context switch for each parallel op otherwise).
        use std::sync::atomic::{AtomicBool, Ordering};
        let done = AtomicBool::new(false);
        let spin = || {
            let mut idle = 0u32;
            while !done.load(Ordering::Acquire) {
                if rayon::yield_now() == Some(rayon::Yield::Executed) {
                    idle = 0;
                } else {
                    idle += 1;
                    // let an oversubscribed machine's other work run now and then
                    if idle.is_multiple_of(64) {
                        std::thread::yield_now();
                    } else {
                        std::hint::spin_loop();
                    }
                }
            }
        };
        pool.install(|| {
            let pass_thread = rayon::current_thread_index();
            // Never spin on the pass's own thread (it could pick a spinner up while waiting
            // inside `f`, which would then never finish).
            let spinner = || {
                if rayon::current_thread_index() != pass_thread {
                    spin()
                }
            };
            // `threads − 1` spinners through nested joins (stack jobs: nothing allocated
            // per pass); the innermost runs `f`, then the flag releases them.
            fn nest(k: usize, spinner: &(dyn Fn() + Sync), f: &mut (dyn FnMut() + Send), done: &AtomicBool) {
                if k == 0 {
                    let _done = Done(done);
                    f();
                } else {
                    rayon::join(|| nest(k - 1, spinner, f, done), spinner);
                }
            }
            nest(self.threads - 1, &spinner, f, &done);
        })
    }

    /// Every sequence of a pass in one kernel call (attention.rs, delta.rs): one
    /// parallel loop over the (sequence, head) rows of all sequences.
    fn kernel_seqs(
        &self,
        op: &Op,
        ins: &[Value<'_>],
        meta: &TensorMeta,
        seqs: &[SeqSpan],
        states: &mut [&mut LayerState],
        out: &mut Tensor,
    ) -> Result<(), OpError> {
        validate(op, ins, meta)?;
        let run = || -> Result<(), OpError> {
            match op {
                Op::Attention { n_head, n_head_kv, head_dim, scale, state: _ } => {
                    attention::attention_seqs(ins, meta, seqs, states, (*n_head, *n_head_kv, *head_dim, *scale), f32_out(out, meta))
                }
                Op::Conv1dCausal { d_conv, state: _ } => delta::conv1d_causal_seqs(ins, meta, seqs, states, *d_conv, f32_out(out, meta)),
                Op::DeltaRule { state: _ } => delta::delta_rule_seqs(ins, meta, seqs, states, f32_out(out, meta)),
                _ => Err(OpError::Invalid { op: op.kind(), msg: "not a stateful op".into() }),
            }
        };
        if runs_inline(op, ins, meta) {
            return par::inline(run);
        }
        self.on_threads(run)
    }
}

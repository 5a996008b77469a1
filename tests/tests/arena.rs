//! The runner's buffer slots: after warm-up, a decode step's converted ops (matmuls, MoE,
//! norms, element-wise, rope, slices, conv, delta rule, embedding lookup) allocate
//! nothing — they write into the persistent buffers the memory plan assigns them — and
//! results are the same as through plain `execute`.
//!
//! One test per binary (and `geometry_bytes`, ignored): the byte counter is process-wide;
//! each op call is charged the allocations of the thread that runs it.

use pn_cpu::CpuBackend;
use pn_engine::{Gguf, HostKernels, HostMem, Node, Runner, Support};
use pn_ops::{LayerState, Op, OpError, Tensor, TensorMeta, Value};
use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

struct Counting;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);
/// Bytes allocated and not freed.
static LIVE: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Allocations made by this thread: what an op's call is charged (a pool thread's
    /// first steal or first use of a thread-local scratch, at any moment, is not the op
    /// allocating per call; counting every thread made this test fail 1 run in 5).
    static MINE: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

fn count() {
    ALLOCS.fetch_add(1, Ordering::Relaxed);
    let _ = MINE.try_with(|c| c.set(c.get() + 1));
}

// SAFETY: forwards to the system allocator, only counting calls and live bytes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        count();
        LIVE.fetch_add(l.size(), Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        count();
        LIVE.fetch_add(l.size(), Ordering::Relaxed);
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        count();
        LIVE.fetch_add(n, Ordering::Relaxed);
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
        unsafe { System.realloc(p, l, n) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
        unsafe { System.dealloc(p, l) }
    }
}

/// What one compiled geometry holds (graph, plan, program, executables), against the
/// estimate the runner's cache bound uses (`pn_engine::runner::bounded::BYTES_PER_NODE`):
/// `[MODEL=F.gguf] cargo test --release -p pn-tests --test arena geometry_bytes --
/// --ignored --nocapture` (alone in its process: the byte counter is process-wide).
#[test]
#[ignore]
fn geometry_bytes() {
    let path = std::env::var("MODEL").map(std::path::PathBuf::from).unwrap_or_else(|_| pn_tests::fixture("../../models/default/pn-default-code-q4_k_m.gguf"));
    let g = Arc::new(Gguf::open(&path).expect("model opens"));
    let m = pn_models::load(&g).expect("model loads");
    let r = Runner::new(m, g, Arc::new(CpuBackend::new(1))).expect("runner builds");
    r.set_max_geometries(usize::MAX);
    let nodes = r.graph(pn_engine::Geometry::one(1, false)).unwrap().len();
    let n = 64;
    let before = LIVE.load(Ordering::Relaxed);
    let t0 = std::time::Instant::now();
    for k in 2..2 + n {
        r.plan(pn_engine::Geometry::one(k, false)).unwrap();
    }
    let per = (LIVE.load(Ordering::Relaxed) - before) / n;
    let ms = t0.elapsed().as_secs_f64() * 1e3 / n as f64;
    eprintln!("{}: {nodes} nodes, {per} bytes a geometry ({} a node; estimate {}), {ms:.2} ms to compile one", path.display(), per / nodes, pn_engine::runner::bounded::BYTES_PER_NODE);
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The CPU backend, counting allocations per op kind (`kernel_into`: those of the thread
/// that runs the call) and whether a plain `execute` gives the same result (`check`).
struct Probe {
    cpu: CpuBackend,
    mem: HostMem,
    allocs: Mutex<BTreeMap<&'static str, (usize, usize)>>,
    check: AtomicBool,
}

impl HostKernels for Probe {
    fn label(&self) -> &str {
        "probe"
    }
    fn can_run(&self, node: &Node) -> Support {
        self.cpu.can_run(node)
    }
    fn mem(&self) -> &HostMem {
        &self.mem
    }
    fn execute(
        &self,
        op: &Op,
        ins: &[Value<'_>],
        out: &TensorMeta,
        state: Option<&mut LayerState>,
    ) -> Result<Tensor, OpError> {
        self.cpu.execute(op, ins, out, state)
    }
    fn kernel_into(
        &self,
        op: &Op,
        ins: &[Value<'_>],
        meta: &TensorMeta,
        state: Option<&mut LayerState>,
        out: &mut Tensor,
    ) -> Result<(), OpError> {
        if self.check.load(Ordering::Relaxed) && op.state().is_none() {
            let want = self.cpu.execute(op, ins, meta, None)?;
            self.cpu.kernel_into(op, ins, meta, None, out)?;
            assert_eq!(*out, want, "{}: kernel_into differs from execute", op.kind());
            return Ok(());
        }
        let a0 = MINE.with(|c| c.get());
        let r = self.cpu.kernel_into(op, ins, meta, state, out);
        let n = MINE.with(|c| c.get()) - a0;
        let mut m = self.allocs.lock().unwrap();
        let e = m.entry(op.kind()).or_default();
        e.0 += 1;
        e.1 += n;
        r
    }
    fn run_pass(&self, f: &mut (dyn FnMut() + Send)) {
        self.cpu.run_pass(f)
    }
}

#[test]
fn decode_ops_write_into_persistent_buffers() {
    let path = pn_tests::fixture("ktiny-q4_k_m.gguf");
    let g = Arc::new(Gguf::open(&path).expect("fixture opens"));
    let m = pn_models::load(&g).expect("fixture model loads");
    let probe = Arc::new(Probe {
        cpu: CpuBackend::new(2),
        mem: HostMem::new(),
        allocs: Mutex::new(BTreeMap::new()),
        check: AtomicBool::new(true),
    });
    let r = Runner::new(m, g, probe.clone()).expect("runner builds");
    let mut st = r.new_state(64);
    // warm-up (and execute_into == execute for every stateless op): prefill + decode
    r.forward(&mut st, &[1, 2, 3, 4, 5, 6, 7], false).unwrap();
    for t in 0..3 {
        r.forward(&mut st, &[10 + t], false).unwrap();
    }
    probe.check.store(false, Ordering::Relaxed);
    for t in 0..3 {
        r.forward(&mut st, &[20 + t], false).unwrap();
    }
    let converted = [
        "Attention",
        "GetRows",
        "MatMul",
        "RmsNorm",
        "L2Norm",
        "Rope",
        "Conv1dCausal",
        "DeltaRule",
        "Softmax",
        "TopK",
        "MoeWeights",
        "MoeExperts",
        "Unary",
        "Binary",
        "SliceCols",
        "SliceRows",
        "Reshape",
    ];
    // Per call, none: an op called at least once a step that allocates in its calls shows
    // `steps` or more. A thread's scratch buffers may still grow once each, the first time
    // that thread runs the op's kind of work (which pool thread runs a pass varies), so
    // fewer than half the steps is allowed. Once in CI a window saw 9 allocations in 8
    // Attention calls (0 in every local run): most likely a thread running its first
    // attention tile inside the window, whose scratch (`attention.rs` SCRATCH: 7 buffers)
    // grows all at once, past that allowance. So a window of steps is measured up to 3
    // times: an op that allocates in its calls fails every window.
    let steps = 8;
    let mut failures = Vec::new();
    for _window in 0..3 {
        probe.allocs.lock().unwrap().clear();
        let a0 = ALLOCS.load(Ordering::SeqCst);
        for t in 0..steps {
            r.forward(&mut st, &[30 + t], false).unwrap();
        }
        let total = ALLOCS.load(Ordering::SeqCst) - a0;
        let m = probe.allocs.lock().unwrap();
        let ops: usize = m.values().map(|v| v.0).sum();
        eprintln!("{total} allocations in {steps} decode steps ({ops} ops): {m:?}");
        assert!(m.get("MatMul").is_some_and(|v| v.0 > 0));
        assert!(m.get("Attention").is_some_and(|v| v.0 > 0), "the model has attention layers");
        failures = converted
            .iter()
            .filter_map(|k| m.get(k).filter(|&&(n, a)| !(n >= steps as usize && a < steps as usize / 2)).map(|&(n, a)| format!("{k}: {a} allocations in {n} calls")))
            .collect();
        if failures.is_empty() {
            break;
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("; "));
}

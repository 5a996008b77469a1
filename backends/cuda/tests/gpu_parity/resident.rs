//! The resident protocol on a device, end to end through `pn_engine::Runner` with a
//! `cuda:0` die (docs/cuda.md "The resident protocol"): fixture models' logits against
//! the CPU's (prompt, every position, then greedy decode), the runner's counters per
//! decode step (2 uploads: token id + position; 1 download: the logits; no state
//! traffic), one host wait per decode step, CUDA graphs captured and replayed (and the
//! same logits bitwise with graphs off and through the host protocol), decode slots
//! (several sequences in one pass), state fork / sync on the device.
//! Without a device: a skip line (the protocol's host logic has unit tests in the crate;
//! the engine tests it with `ResidentMock`).

use pn_cpu::CpuBackend;
use pn_cuda::{CudaBackend, ResidentStats};
use pn_engine::planner::debug::Counters;
use pn_engine::planner::{Device, Placement};
use pn_engine::runner::Die;
use pn_engine::sampler::argmax;
use pn_engine::{Backend, Gguf, HostKernels, HostMem, Node, Runner, Support};
use pn_ops::{LayerState, Op, OpError, Tensor, TensorMeta, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Fixtures covering dense (q4_0, q4_k_m), recurrent + attention (qwen35) and MoE.
const MODELS: &[&str] = &[
    "tiny-q4_0",
    "ktiny-q4_k_m",
    "qwen35-ktiny-q4_k_m",
    "qwen3moe-ktiny-q4_k_m",
];
const PROMPT: usize = 8;
const DECODE: usize = 6;

/// `$PN_E2E_MODELS` (`:`-separated files or folders, as gpu_e2e) or tests/fixtures.
fn find(name: &str) -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let places: Vec<PathBuf> = match std::env::var("PN_E2E_MODELS") {
        Ok(s) if !s.is_empty() => s.split(':').map(PathBuf::from).collect(),
        _ => vec![root.join("tests/fixtures")],
    };
    let file = format!("{name}.gguf");
    places.into_iter().find_map(|p| {
        if p.is_file() {
            (p.file_name()? == file.as_str()).then_some(p)
        } else {
            Some(p.join(&file)).filter(|f| f.is_file())
        }
    })
}

/// The CUDA backend one op at a time on host tensors (inputs uploaded, the result and
/// the state downloaded per op: `CudaBackend::run`), as host kernels of the protocol.
struct HostOnly(Arc<CudaBackend>, HostMem);

impl HostKernels for HostOnly {
    fn label(&self) -> &str {
        "cuda-host"
    }
    fn can_run(&self, n: &Node) -> Support {
        self.0.supports(n)
    }
    fn mem(&self) -> &HostMem {
        &self.1
    }
    fn kernel_into(
        &self,
        op: &Op,
        ins: &[Value<'_>],
        meta: &TensorMeta,
        st: Option<&mut LayerState>,
        out: &mut Tensor,
    ) -> Result<(), OpError> {
        pn_engine::store_into(out, self.0.run(op, ins, meta, st)?);
        Ok(())
    }
}

fn runner(path: &Path, dev: Device, b: Arc<dyn Backend>) -> Runner {
    let g = Arc::new(Gguf::open(path).expect("fixture opens"));
    let m = pn_models::load(&g).expect("fixture is a model");
    Runner::with_dies(
        m,
        g,
        vec![Die {
            device: dev,
            backend: b,
        }],
        Placement::single(dev),
    )
    .expect("runner")
}

fn pearson(a: &[f32], b: &[f32]) -> f64 {
    let n = a.len() as f64;
    let (ma, mb) = (
        a.iter().map(|&x| x as f64).sum::<f64>() / n,
        b.iter().map(|&x| x as f64).sum::<f64>() / n,
    );
    let (mut ab, mut aa, mut bb) = (0.0, 0.0, 0.0);
    for (&x, &y) in a.iter().zip(b) {
        let (dx, dy) = (x as f64 - ma, y as f64 - mb);
        ab += dx * dy;
        aa += dx * dx;
        bb += dy * dy;
    }
    if aa == 0.0 && bb == 0.0 {
        return 1.0;
    }
    ab / (aa.sqrt() * bb.sqrt()).max(1e-300)
}

/// Rows close to the CPU's: argmax agreement ≥ 95 %, every row's Pearson r ≥ 0.999.
fn close(name: &str, got: &[Vec<f32>], want: &[Vec<f32>]) {
    assert_eq!(got.len(), want.len());
    let agree = got
        .iter()
        .zip(want)
        .filter(|(a, b)| argmax(a) == argmax(b))
        .count();
    let r = got
        .iter()
        .zip(want)
        .map(|(a, b)| pearson(a, b))
        .fold(f64::INFINITY, f64::min);
    println!(
        "{name:<28} resident cuda vs cpu: argmax {agree}/{} r_min {r:.6}",
        got.len()
    );
    assert!(
        got.iter().flatten().all(|x| x.is_finite()),
        "{name}: non-finite logits"
    );
    assert!(
        agree as f64 >= 0.95 * got.len() as f64 && r >= 0.999,
        "{name}: resident CUDA logits differ from the CPU's"
    );
}

/// Logits rows of the prompt (every position) then `DECODE` steps fed `tokens`; the
/// runner counters and the backend stats after every decode step.
fn trace(
    r: &Runner,
    cuda: Option<&CudaBackend>,
    prompt: &[u32],
    tokens: &[u32],
) -> (Vec<Vec<f32>>, Vec<(Counters, ResidentStats)>) {
    let mut st = r.new_state(PROMPT + DECODE + 8);
    let l = r.forward(&mut st, prompt, true).expect("prefill");
    let mut rows: Vec<Vec<f32>> = (0..l.rows()).map(|i| l.row(i).to_vec()).collect();
    let snap = |r: &Runner| {
        (
            r.counters(),
            cuda.map(|c| c.resident_stats()).unwrap_or_default(),
        )
    };
    let mut marks = vec![snap(r)];
    for &t in tokens {
        rows.push(
            r.forward(&mut st, &[t], false)
                .expect("decode")
                .row(0)
                .to_vec(),
        );
        marks.push(snap(r));
    }
    (rows, marks)
}

#[test]
fn resident_runner_on_a_device() {
    let mk = |graphs: bool| -> Option<Arc<CudaBackend>> {
        let mut b = pn_cuda::start::for_test(0, "resident_runner_on_a_device")?;
        b.set_graphs(graphs);
        Some(Arc::new(b))
    };
    let Some(cuda) = mk(true) else { return };
    let nograph = mk(false).expect("a second backend on the same device");
    let cpu: Arc<dyn Backend> = Arc::new(CpuBackend::new(4));
    let mut n = 0;
    for name in MODELS {
        let Some(path) = find(name) else {
            println!("{name}: fixture not found, skipped");
            continue;
        };
        n += 1;
        let rc = runner(&path, Device::cpu(0), cpu.clone());
        let rg = runner(&path, Device::cuda(0), cuda.clone());
        let v = rc.model().n_vocab();
        let prompt: Vec<u32> = (0..PROMPT)
            .map(|i| ((i * 7919 + 13) % (v - 1) + 1) as u32)
            .collect();
        // the CPU's greedy continuation, fed to every runner
        let (want, _) = trace(&rc, None, &prompt, &[]);
        let mut tokens = vec![argmax(want.last().unwrap()) as u32];
        let mut st = rc.new_state(PROMPT + DECODE + 8);
        rc.forward(&mut st, &prompt, false).unwrap();
        while tokens.len() < DECODE {
            let l = rc
                .forward(&mut st, &[*tokens.last().unwrap()], false)
                .unwrap();
            tokens.push(argmax(l.last()) as u32);
        }
        let (want, _) = trace(&rc, None, &prompt, &tokens);
        let (got, marks) = trace(&rg, Some(&cuda), &prompt, &tokens);
        close(name, &got, &want);
        // per decode step: token id + position up, logits down, no state traffic, one wait
        for (s, w) in marks.windows(2).enumerate() {
            let ((c0, s0), (c1, s1)) = (w[0], w[1]);
            let moved = (
                c1.uploads - c0.uploads,
                c1.upload_bytes - c0.upload_bytes,
                c1.downloads - c0.downloads,
                c1.download_bytes - c0.download_bytes,
                c1.state_uploads - c0.state_uploads,
                c1.state_downloads - c0.state_downloads,
                c1.device_copies - c0.device_copies,
            );
            assert_eq!(
                moved,
                (2, 8, 1, 4 * v as u64, 0, 0, 0),
                "{name}: decode step {s}: runner counters"
            );
            assert_eq!(
                s1.syncs - s0.syncs,
                1,
                "{name}: decode step {s}: the download is the only wait"
            );
            assert_eq!(
                s1.flushes, s0.flushes,
                "{name}: decode step {s}: nothing needed the stream mid-segment"
            );
            let (cap, rep) = (
                s1.segments_captured - s0.segments_captured,
                s1.segments_replayed - s0.segments_replayed,
            );
            println!(
                "{name:<28} decode step {s}: {} commands, captured {cap}, replayed {rep}",
                s1.commands - s0.commands
            );
            if s >= 2 {
                assert_eq!(
                    (cap, rep),
                    (0, 1),
                    "{name}: decode step {s} replays its graph"
                );
            }
        }
        let g = cuda.graph_stats();
        println!(
            "{name:<28} graphs: {g:?}; resident: {:?}",
            cuda.resident_stats()
        );
        // graphs off, and the host protocol: the same kernels, so the same logits bitwise
        let (off, _) = trace(
            &runner(&path, Device::cuda(0), nograph.clone()),
            None,
            &prompt,
            &tokens,
        );
        assert!(off == got, "{name}: graph replay changed the logits");
        let host: Arc<dyn Backend> = Arc::new(HostOnly(nograph.clone(), HostMem::new()));
        let (h, _) = trace(
            &runner(&path, Device::cuda(0), host),
            None,
            &prompt,
            &tokens,
        );
        assert!(h == got, "{name}: resident and host protocol differ");
        // state on the device: a fork decodes like the original; a sync (download) and
        // re-upload changes nothing
        let mut a = rg.new_state(64);
        rg.forward(&mut a, &prompt, false).unwrap();
        let mut b = a.try_clone().expect("fork on the device");
        assert!(b.is_resident(), "{name}: the fork stays on the device");
        let la = rg.forward(&mut a, &tokens[..2], false).unwrap();
        b.sync().expect("state download");
        let lb = rg.forward(&mut b, &tokens[..2], false).unwrap();
        assert!(la == lb, "{name}: fork / sync changed the logits");
        // decode slots: three sequences in one pass, each row what it gives alone
        let mut seqs: Vec<_> = (0..3)
            .map(|i| {
                let mut s = rg.new_state(64);
                rg.forward(&mut s, &prompt[..3 + i], false).unwrap();
                s
            })
            .collect();
        let alone: Vec<Vec<f32>> = seqs
            .iter()
            .enumerate()
            .map(|(i, s)| {
                rg.forward(&mut s.try_clone().unwrap(), &[tokens[i]], false)
                    .unwrap()
                    .data
            })
            .collect();
        let toks: Vec<[u32; 1]> = (0..3).map(|i| [tokens[i]]).collect();
        let mut parts: Vec<(&mut pn_engine::SeqState, &[u32])> = seqs
            .iter_mut()
            .zip(&toks)
            .map(|(s, t)| (s, &t[..]))
            .collect();
        let multi = rg.forward_multi(&mut parts).expect("decode slots");
        for (i, row) in alone.iter().enumerate() {
            assert!(
                multi.row(i) == &row[..],
                "{name}: slot {i} differs from the sequence alone"
            );
        }
        // a prefill of several prompts: the LM head for each one's last row only
        // (LastRows: one device copy per sequence), the matching rows of all logits
        let lens = [5usize, 1, 3];
        let prefill = |last: bool| {
            let mut sts: Vec<_> = lens.iter().map(|_| rg.new_state(64)).collect();
            let mut parts: Vec<(&mut pn_engine::SeqState, &[u32])> = sts
                .iter_mut()
                .zip(&lens)
                .map(|(s, &n)| (s, &prompt[..n]))
                .collect();
            if last {
                rg.forward_multi_last(&mut parts)
            } else {
                rg.forward_multi(&mut parts)
            }
            .expect("a prefill of three prompts")
        };
        let (all, last) = (prefill(false), prefill(true));
        assert_eq!(last.rows(), lens.len(), "{name}: one row per prompt");
        let mut end = 0;
        for (i, &n) in lens.iter().enumerate() {
            end += n;
            assert!(
                last.row(i) == all.row(end - 1),
                "{name}: prompt {i}'s last row differs from its row in all logits"
            );
            // the stateful ops ran every prompt in one launch (ops_delta / ops_state
            // `*_seqs`): each row is the prompt's own
            let alone = rg.forward(&mut rg.new_state(64), &prompt[..n], true).unwrap();
            for r in 0..n {
                assert!(
                    all.row(end - n + r) == alone.row(r),
                    "{name}: prompt {i} row {r} differs from the prompt alone"
                );
            }
        }
        // 17 sequences: two sequence tables (16 + 1) in one decode pass
        let mut many: Vec<_> = (0..17)
            .map(|i| {
                let mut s = rg.new_state(64);
                rg.forward(&mut s, &prompt[..1 + i % 4], false).unwrap();
                s
            })
            .collect();
        let alone: Vec<Vec<f32>> = many
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let tok = [tokens[i % tokens.len()]];
                rg.forward(&mut s.try_clone().unwrap(), &tok, false).unwrap().data
            })
            .collect();
        let toks: Vec<[u32; 1]> = (0..17).map(|i| [tokens[i % tokens.len()]]).collect();
        let mut parts: Vec<(&mut pn_engine::SeqState, &[u32])> =
            many.iter_mut().zip(&toks).map(|(s, t)| (s, &t[..])).collect();
        let multi = rg.forward_multi(&mut parts).expect("17 sequences");
        for (i, row) in alone.iter().enumerate() {
            assert!(multi.row(i) == &row[..], "{name}: sequence {i} of 17 differs from it alone");
        }
        // a mixed pass: one-token sequences around a 4-token chunk (the one-token ones share
        // a launch pair, the chunk runs alone), every row the sequence's own
        let lens = [1usize, 4, 1, 1];
        let mut sts: Vec<_> = (0..lens.len())
            .map(|i| {
                let mut s = rg.new_state(64);
                rg.forward(&mut s, &prompt[..2 + i], false).unwrap();
                s
            })
            .collect();
        let feeds: Vec<Vec<u32>> = lens.iter().enumerate().map(|(i, &n)| (0..n).map(|j| tokens[(i + j) % tokens.len()]).collect()).collect();
        let alone: Vec<_> = sts
            .iter()
            .zip(&feeds)
            .map(|(s, f)| rg.forward(&mut s.try_clone().unwrap(), f, true).unwrap())
            .collect();
        let mut parts: Vec<(&mut pn_engine::SeqState, &[u32])> = sts.iter_mut().zip(&feeds).map(|(s, f)| (s, &f[..])).collect();
        let mixed = rg.forward_multi(&mut parts).expect("a mixed pass");
        let mut row = 0;
        for (i, a) in alone.iter().enumerate() {
            for r in 0..lens[i] {
                assert!(mixed.row(row) == a.row(r), "{name}: mixed pass, sequence {i} row {r} differs from it alone");
                row += 1;
            }
        }
    }
    assert!(n > 0, "no fixture found (set PN_E2E_MODELS)");
}

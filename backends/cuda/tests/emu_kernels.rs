//! CUDA kernels run under a CPU emulation of the CUDA execution model
//! (tests/emu/cuda_emu.h: blocks in turn, a block's threads as fibers switched at every
//! barrier and warp shuffle), built with the host C++ compiler around the kernel files, so
//! the device code is checked here before any GPU runs it:
//! - kernels/delta.cu's multi-sequence kernels against each sequence computed alone,
//!   bitwise (tests/emu/delta_seqs.cpp);
//! - kernels/attention.cu's kernels for many one-token sequences (`kv_store_seqs`,
//!   `attn_kv_seqs`) against the single-sequence kernels launched once per sequence: every
//!   row and cache byte, each cell format, ring and plain (tests/emu/attention_seqs.cpp);
//! - kernels/matmul.cu's `mm_<format>` for every native weight format against pn-ops'
//!   `vec_dot`, dense and with expert ids (the MoE's form; tests/emu/matmul.cpp);
//! - kernels/quantize.cu's activation conversions against pn-ops' `quantize_row`, byte for
//!   byte (tests/emu/quantize.cpp);
//! - `get_rows_<format>` bitwise the reference GetRows, and delta_chunk.cu's chunked form
//!   against the reference recurrence (nmse ≤ 1e-8; ~1e-13 measured);
//! - attention.cu, norm.cu, moe.cu, elementwise.cu (with the slices) and rope.cu through a
//!   generic launcher (tests/emu/launch.cpp: buffers and launches given as the host code
//!   gives them) against the reference ops (Attention with its cache, TopK ids,
//!   MoeWeights, the combine and the slices bitwise; the rest within the GPU op-parity
//!   test's bounds).
//!
//! What it cannot show (a device's memory model, launch limits, the device's `expf` /
//! `logf`, real warp scheduling) is the GPU parity tests' business (tests/gpu_parity.rs,
//! tests/gpu_parity/resident.rs, run by tools/gpu-check.sh).
#![cfg(target_arch = "x86_64")]

use std::path::{Path, PathBuf};
use std::process::Command;

/// Kernel source as plain C++ for the emulation: no `extern "C"`, the dynamic shared
/// arrays the emulation's, common.cuh's f16 `asm` the emulation's F16C.
fn cpp_of(what: &str, src: &str) -> String {
    let mut cpp = src.replace("extern \"C\" ", "");
    for arr in ["qk", "xs", "sh"] {
        cpp = cpp.replace(&format!("extern __shared__ float {arr}[];"), &format!("float* {arr} = emu_dyn_shared;"));
    }
    let asm = [
        ("asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"(h));", "f = emu_h2f(h);"),
        ("asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f));", "h = emu_f2h(f);"),
    ];
    for (from, to) in asm {
        cpp = cpp.replace(from, to);
    }
    assert!(!cpp.contains("asm(") && !cpp.contains("extern __shared__"), "{what}: something the emulation does not rewrite");
    cpp
}

/// `file` under kernels/ as plain C++ in the test's temporary folder ([`cpp_of`]).
fn as_cpp(root: &Path, out: &Path, file: &str) -> PathBuf {
    let src = std::fs::read_to_string(root.join("kernels").join(file)).unwrap();
    let path = out.join(format!("{file}.inc"));
    std::fs::write(&path, cpp_of(file, &src)).unwrap();
    path
}

/// Builds tests/emu/`main` with the kernel files (`(macro, file under kernels/)`): the
/// executable, or None (said on stderr) where no C++ compiler runs outside CI.
fn build(main: &str, kernels: &[(&str, &str)]) -> Option<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let defs: Vec<String> = kernels.iter().map(|(m, f)| format!("-D{m}=\"{}\"", as_cpp(&root, &out, f).display())).collect();
    build_with(main.trim_end_matches(".cpp"), main, &defs)
}

/// Builds tests/emu/`main` into `exe_name` with the compiler flags `defs`.
fn build_with(exe_name: &str, main: &str, defs: &[String]) -> Option<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let exe = out.join(exe_name);
    let mut cmd = Command::new(&cxx);
    cmd.args(["-O1", "-std=c++20", "-mf16c", "-o"]).arg(&exe).arg(format!("-I{}", root.join("tests/emu").display())).args(defs);
    let built = match cmd.arg(root.join("tests/emu").join(main)).output() {
        Ok(o) => o,
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("no C++ compiler ({cxx}: {e}): the emulation test did not run");
            return None;
        }
        Err(e) => panic!("no C++ compiler ({cxx}): {e}"),
    };
    assert!(built.status.success(), "{}", String::from_utf8_lossy(&built.stderr));
    Some(exe)
}

/// Builds tests/emu/`main` with the kernel files and runs it: its output must say `expect`.
fn run(main: &str, kernels: &[(&str, &str)], expect: &str) {
    let Some(exe) = build(main, kernels) else { return };
    let ran = Command::new(&exe).output().unwrap();
    let said = String::from_utf8_lossy(&ran.stdout);
    assert!(ran.status.success() && said.contains(expect), "{said}");
}

#[test]
fn multi_sequence_delta_kernels_equal_each_sequence_alone() {
    run("delta_seqs.cpp", &[("COMMON_CUH", "common.cuh"), ("DELTA_CU", "delta.cu")], "bitwise equal to each sequence alone");
}

#[test]
fn multi_sequence_decode_attention_equals_the_per_sequence_kernels() {
    run(
        "attention_seqs.cpp",
        &[("COMMON_CUH", "common.cuh"), ("ATTENTION_CU", "attention.cu")],
        "every row and cache byte equal to the per-sequence kernels",
    );
}

/// xorshift floats in [-1, 1].
fn floats(seed: &mut u64, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            scale * (((*seed >> 11) % 20001) as f32 / 10000.0 - 1.0)
        })
        .collect()
}

/// A matmul launch: `n` rows of each of `n_exp` experts, `p` pairs (`ids[p]` their expert
/// with several, `act_div` pairs per activation row), `k` elements.
struct MmCase<'a> {
    n: usize,
    p: usize,
    k: usize,
    n_exp: usize,
    ids: &'a [i32],
    act_div: usize,
}

/// `mm_<format>` of `ty` under the emulation for `c`: every finite output checked against
/// `vec_dot` (nmse ≤ 1e-10, the GPU op-parity test's bound), an out-of-range expert's rows NaN.
fn check_mm(exe: &Path, ty: pn_ops::GgmlType, c: &MmCase<'_>, seed: &mut u64) {
    let MmCase { n, p, k, n_exp, ids, act_div } = *c;
    use pn_ops::quant::quantize_weights::quantize_weights;
    use pn_ops::quant::{quantize_row, vec_dot, vec_dot_type};
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let sfx = pn_cuda::formats::suffix(ty).expect("a native format");
    let at = vec_dot_type(ty);
    assert_eq!(pn_cuda::formats::act_format(ty).0, at, "{ty}: the device's activation format is the CPU's");
    let (w_rb, a_rb) = (ty.row_bytes(k).unwrap(), at.row_bytes(k).unwrap());
    let estride = n * w_rb;
    let mut w = vec![0u8; n_exp * estride];
    for r in w.chunks_mut(w_rb) {
        quantize_weights(ty, &floats(seed, k, 1.0), r).unwrap();
    }
    let a_rows = p.div_ceil(act_div);
    let mut a = vec![0u8; a_rows * a_rb];
    for r in a.chunks_mut(a_rb) {
        quantize_row(at, &floats(seed, k, 3.0), r);
    }
    let nb = if matches!(ty, pn_ops::GgmlType::F32 | pn_ops::GgmlType::F16 | pn_ops::GgmlType::BF16) { k } else { k / ty.block_size() };
    let mut file = Vec::new();
    for v in [n, nb, p, w_rb, a_rb, n_exp, estride, act_div] {
        file.extend_from_slice(&(v as i64).to_le_bytes());
    }
    file.extend_from_slice(&w);
    file.extend_from_slice(&a);
    ids.iter().for_each(|i| file.extend_from_slice(&i.to_le_bytes()));
    let (inp, outp) = (out.join(format!("mm_{sfx}_{n_exp}.in")), out.join(format!("mm_{sfx}_{n_exp}.out")));
    std::fs::write(&inp, &file).unwrap();
    let ran = Command::new(exe).arg(sfx).arg(&inp).arg(&outp).output().unwrap();
    assert!(ran.status.success(), "mm_{sfx}: {}", String::from_utf8_lossy(&ran.stdout));
    let y: Vec<f32> = std::fs::read(&outp).unwrap().chunks(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
    assert_eq!(y.len(), n * p);
    let (mut err, mut norm) = (0f64, 0f64);
    for pi in 0..p {
        let e = if n_exp > 1 { ids[pi] } else { 0 };
        for r in 0..n {
            let got = y[pi * n + r] as f64;
            if e < 0 || e as usize >= n_exp {
                assert!(got.is_nan(), "mm_{sfx}: pair {pi} names expert {e} of {n_exp}: expected NaN, found {got}");
                continue;
            }
            let wr = &w[e as usize * estride + r * w_rb..][..w_rb];
            let want = vec_dot(ty, k, wr, &a[pi / act_div * a_rb..][..a_rb]) as f64;
            assert!(got.is_finite(), "mm_{sfx}: row {r} pair {pi} is {got}");
            err += (got - want) * (got - want);
            norm += want * want;
        }
    }
    let nmse = err / norm.max(1e-30);
    assert!(nmse <= 1e-10, "mm_{sfx}: nmse {nmse:e} against vec_dot ({n_exp} experts)");
}

fn mm_exe() -> Option<PathBuf> {
    build("matmul.cpp", &[("COMMON_CUH", "common.cuh"), ("BLOCKS_CUH", "blocks.cuh"), ("MATMUL_CU", "matmul.cu")])
}

const NATIVE: [pn_ops::GgmlType; 16] = {
    use pn_ops::GgmlType::*;
    [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2K, Q3K, Q4K, Q5K, Q6K, IQ4NL, IQ4XS, MXFP4, F32, F16, BF16]
};

#[test]
fn matmul_kernels_match_vec_dot_for_every_native_format() {
    let Some(exe) = mm_exe() else { return };
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    // 6 rows (a partly filled block of 4 warps), 11 activation rows (a partly filled tile
    // of 8 / 4 pairs), 512 elements (two 256-blocks)
    for ty in NATIVE {
        check_mm(&exe, ty, &MmCase { n: 6, p: 11, k: 512, n_exp: 1, ids: &[], act_div: 1 }, &mut seed);
    }
}

#[test]
fn expert_matmuls_follow_the_ids() {
    let Some(exe) = mm_exe() else { return };
    let mut seed = 0x1234_5678_9abc_def1u64;
    // 3 experts, 13 pairs of 2 per activation row (top-2), one id out of range
    let ids: Vec<i32> = (0..13).map(|i| if i == 7 { 3 } else { i * 5 % 3 }).collect();
    for ty in NATIVE {
        check_mm(&exe, ty, &MmCase { n: 5, p: 13, k: 256, n_exp: 3, ids: &ids, act_div: 2 }, &mut seed);
    }
}

#[test]
fn activation_conversions_are_byte_identical_to_pn_ops() {
    use pn_ops::quant::quantize_row;
    use pn_ops::GgmlType::*;
    let Some(exe) = build("quantize.cpp", &[("COMMON_CUH", "common.cuh"), ("QUANTIZE_CU", "quantize.cu")]) else { return };
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let (rows, k) = (5usize, 512usize);
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut x: Vec<f32> = (0..rows * k)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            ((seed >> 11) % 200001) as f32 / 1000.0 - 100.0
        })
        .collect();
    // edge rows: all zero, one large outlier, ties at .5 after scaling, tiny values
    x[..k].fill(0.0);
    x[k + 3] = 3.0e4;
    for (i, v) in x[2 * k..3 * k].iter_mut().enumerate() {
        *v = (i % 255) as f32 - 127.0 + if i % 2 == 0 { 0.5 } else { -0.5 };
    }
    for v in &mut x[3 * k..4 * k] {
        *v *= 1e-30;
    }
    let mut file = Vec::new();
    for v in [rows, k] {
        file.extend_from_slice(&(v as i64).to_le_bytes());
    }
    x.iter().for_each(|v| file.extend_from_slice(&v.to_le_bytes()));
    let inp = out.join("quantize.in");
    std::fs::write(&inp, &file).unwrap();
    for (ty, name) in [(Q8_0, "q8_0"), (Q8_1, "q8_1"), (Q8K, "q8_k"), (F16, "f16"), (BF16, "bf16")] {
        let outp = out.join(format!("quantize_{name}.out"));
        let ran = Command::new(&exe).arg(name).arg(&inp).arg(&outp).output().unwrap();
        assert!(ran.status.success(), "quantize_{name}: {}", String::from_utf8_lossy(&ran.stdout));
        let got = std::fs::read(&outp).unwrap();
        let rb = ty.row_bytes(k).unwrap();
        assert_eq!(got.len(), rows * rb, "quantize_{name}");
        for r in 0..rows {
            let mut want = vec![0u8; rb];
            quantize_row(ty, &x[r * k..(r + 1) * k], &mut want);
            assert!(got[r * rb..(r + 1) * rb] == want[..], "quantize_{name}: row {r} differs from pn-ops");
        }
    }
}

/// One argument of a generic launch (tests/emu/launch.cpp), as the host code passes it.
enum A {
    /// A pointer into buffer `.0`, `.1` bytes in.
    P(u32, u64),
    I(i32),
    L(i64),
    F(f32),
    Null,
}

/// Buffers and kernel launches for tests/emu/launch.cpp, run under the emulation.
#[derive(Default)]
struct Job {
    bufs: Vec<Vec<u8>>,
    cmds: Vec<u8>,
    n_cmds: u32,
}

impl Job {
    /// A buffer of these bytes: its index.
    fn buf(&mut self, bytes: Vec<u8>) -> u32 {
        self.bufs.push(bytes);
        self.bufs.len() as u32 - 1
    }
    fn f32s(&mut self, v: &[f32]) -> u32 {
        self.buf(v.iter().flat_map(|x| x.to_le_bytes()).collect())
    }
    fn i32s(&mut self, v: &[i32]) -> u32 {
        self.buf(v.iter().flat_map(|x| x.to_le_bytes()).collect())
    }
    /// `name` on a grid of `grid` blocks of `block` threads.
    fn launch(&mut self, name: &str, grid: [u32; 3], block: [u32; 3], args: &[A]) {
        let c = &mut self.cmds;
        c.extend_from_slice(&(name.len() as u32).to_le_bytes());
        c.extend_from_slice(name.as_bytes());
        grid.iter().chain(&block).for_each(|v| c.extend_from_slice(&v.to_le_bytes()));
        c.extend_from_slice(&(args.len() as u32).to_le_bytes());
        for a in args {
            match *a {
                A::P(b, off) => {
                    c.push(1);
                    c.extend_from_slice(&b.to_le_bytes());
                    c.extend_from_slice(&off.to_le_bytes());
                }
                A::I(v) => {
                    c.push(2);
                    c.extend_from_slice(&v.to_le_bytes());
                }
                A::L(v) => {
                    c.push(3);
                    c.extend_from_slice(&v.to_le_bytes());
                }
                A::F(v) => {
                    c.push(4);
                    c.extend_from_slice(&v.to_le_bytes());
                }
                A::Null => c.push(5),
            }
        }
        self.n_cmds += 1;
    }
    /// Runs the launches on module `file` (src/kernels.rs `MODULES`): every buffer after
    /// them, or None where no C++ compiler runs outside CI.
    fn run(self, file: &str) -> Option<Vec<Vec<u8>>> {
        let m = pn_cuda::kernels::MODULES.iter().find(|m| m.file == file).expect("a kernel module");
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
        let stem = file.trim_end_matches(".cu");
        let src = out.join(format!("{stem}.module.inc"));
        std::fs::write(&src, cpp_of(file, &m.full_source())).unwrap();
        let entries: String = m.entries.iter().map(|e| format!("X({e}) ")).collect();
        let exe = build_with(&format!("launch_{stem}"), "launch.cpp", &[format!("-DKERNEL_CU=\"{}\"", src.display()), format!("-DENTRIES={entries}")])?;
        let mut job = Vec::new();
        job.extend_from_slice(&(self.bufs.len() as u32).to_le_bytes());
        for b in &self.bufs {
            job.extend_from_slice(&(b.len() as u64).to_le_bytes());
            job.extend_from_slice(b);
        }
        job.extend_from_slice(&self.n_cmds.to_le_bytes());
        job.extend_from_slice(&self.cmds);
        let (jp, op) = (out.join(format!("{stem}.job")), out.join(format!("{stem}.job.out")));
        std::fs::write(&jp, &job).unwrap();
        let ran = Command::new(&exe).arg(&jp).arg(&op).output().unwrap();
        assert!(ran.status.success(), "{file}: {}", String::from_utf8_lossy(&ran.stdout));
        let all = std::fs::read(&op).unwrap();
        let mut at = 0;
        Some(
            self.bufs
                .iter()
                .map(|b| {
                    at += b.len();
                    all[at - b.len()..at].to_vec()
                })
                .collect(),
        )
    }
}

fn as_f32(b: &[u8]) -> Vec<f32> {
    b.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

fn as_i32(b: &[u8]) -> Vec<i32> {
    b.chunks(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect()
}

fn nmse(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    let (mut e, mut n) = (0f64, 0f64);
    for (&g, &w) in got.iter().zip(want) {
        e += (g as f64 - w as f64).powi(2);
        n += (w as f64).powi(2);
    }
    e / n.max(1e-30)
}

/// The reference's output of `op` on `ins`.
fn reference(op: &pn_ops::Op, ins: &[pn_ops::Value<'_>]) -> pn_ops::Tensor {
    let metas: Vec<pn_ops::TensorMeta> = ins.iter().map(pn_ops::reference::common::meta_of).collect();
    let out = op.infer(&metas).expect("a valid op");
    pn_ops::reference::execute(op, ins, &out, None).expect("the reference runs it")
}

#[test]
fn norms_and_softmax_match_the_reference() {
    use pn_ops::{Op, Shape, Tensor, Value};
    let mut seed = 77u64;
    let (n, rows) = (300usize, 5usize);
    let x = floats(&mut seed, n * rows, 2.0);
    let w = floats(&mut seed, n, 1.0);
    let mut job = Job::default();
    let (bx, bw) = (job.f32s(&x), job.f32s(&w));
    let ys: Vec<u32> = (0..4).map(|_| job.f32s(&vec![f32::NAN; n * rows])).collect();
    let rows_cfg = [rows as u32, 1, 1];
    job.launch("rms_norm", rows_cfg, [256, 1, 1], &[A::P(bx, 0), A::P(bw, 0), A::P(ys[0], 0), A::I(n as i32), A::F(1e-6)]);
    job.launch("rms_norm", rows_cfg, [256, 1, 1], &[A::P(bx, 0), A::Null, A::P(ys[1], 0), A::I(n as i32), A::F(1e-6)]);
    job.launch("l2_norm", rows_cfg, [256, 1, 1], &[A::P(bx, 0), A::P(ys[2], 0), A::I(n as i32), A::F(1e-6)]);
    job.launch("softmax_rows", rows_cfg, [256, 1, 1], &[A::P(bx, 0), A::P(ys[3], 0), A::I(n as i32)]);
    let Some(out) = job.run("norm.cu") else { return };
    let xt = Tensor::f32(Shape::d2(n, rows), x.clone());
    let wt = Tensor::f32(Shape::d1(n), w.clone());
    let cases = [
        ("RmsNorm w", reference(&Op::RmsNorm { eps: 1e-6 }, &[Value::Act(&xt), Value::Act(&wt)])),
        ("RmsNorm", reference(&Op::RmsNorm { eps: 1e-6 }, &[Value::Act(&xt)])),
        ("L2Norm", reference(&Op::L2Norm { eps: 1e-6 }, &[Value::Act(&xt)])),
        ("Softmax", reference(&Op::Softmax, &[Value::Act(&xt)])),
    ];
    for (i, (what, want)) in cases.iter().enumerate() {
        let e = nmse(&as_f32(&out[ys[i] as usize]), want.as_f32());
        assert!(e <= 1e-12, "{what}: nmse {e:e}");
    }
}

#[test]
fn routing_kernels_match_the_reference() {
    use pn_ops::{Op, Shape, Tensor, Value};
    let mut seed = 99u64;
    let (e, t, k, dmodel) = (64usize, 5usize, 8usize, 96usize);
    let mut logits = floats(&mut seed, e * t, 4.0);
    // ties (the lower index first), ±0 folded, one NaN-free row of equal values
    logits[3] = logits[10];
    logits[e + 1] = 0.0;
    logits[e + 2] = -0.0;
    logits[2 * e..3 * e].fill(0.5);
    let probs: Vec<f32> = floats(&mut seed, e * t, 1.0).iter().map(|v| v.abs() + 1e-3).collect();
    let lt = Tensor::f32(Shape::d2(e, t), logits.clone());
    let ids = reference(&Op::TopK { k }, &[Value::Act(&lt)]);
    let d = floats(&mut seed, t * k * dmodel, 1.0);
    let wts = floats(&mut seed, t * k, 1.0);
    let mut job = Job::default();
    let (bl, bp, bd, bwt) = (job.f32s(&logits), job.f32s(&probs), job.f32s(&d), job.f32s(&wts));
    let bids = job.i32s(&vec![-1; t * k]);
    let bref_ids = job.i32s(ids.as_i32());
    let (bw0, bw1, bc) = (job.f32s(&vec![f32::NAN; t * k]), job.f32s(&vec![f32::NAN; t * k]), job.f32s(&vec![f32::NAN; t * dmodel]));
    let grid1 = |items: usize, threads: u32| [items.div_ceil(threads as usize).max(1) as u32, 1, 1];
    job.launch("topk_rows", [t as u32, 1, 1], [256, 1, 1], &[A::P(bl, 0), A::P(bids, 0), A::I(e as i32), A::I(k as i32)]);
    for (b, norm) in [(bw0, 0), (bw1, 1)] {
        job.launch("moe_weights", grid1(t, 128), [128, 1, 1], &[A::P(bp, 0), A::P(bref_ids, 0), A::P(b, 0), A::I(e as i32), A::I(k as i32), A::I(t as i32), A::I(norm)]);
    }
    job.launch("moe_combine", grid1(dmodel * t, 256), [256, 1, 1], &[A::P(bd, 0), A::P(bwt, 0), A::P(bc, 0), A::I(dmodel as i32), A::I(k as i32), A::I(t as i32)]);
    let Some(out) = job.run("moe.cu") else { return };
    assert_eq!(as_i32(&out[bids as usize]), ids.as_i32(), "TopK ids");
    let pt = Tensor::f32(Shape::d2(e, t), probs.clone());
    for (b, normalize) in [(bw0, false), (bw1, true)] {
        let want = reference(&Op::MoeWeights { normalize }, &[Value::Act(&pt), Value::Act(&ids)]);
        assert!(as_f32(&out[b as usize]) == want.as_f32(), "MoeWeights normalize {normalize}: not bitwise the reference");
    }
    // the combine: each token sums its slots in selection order, from 0
    let mut want = vec![0f32; t * dmodel];
    for ti in 0..t {
        for i in 0..dmodel {
            let mut acc = 0f32;
            for r in 0..k {
                acc += d[(ti * k + r) * dmodel + i] * wts[ti * k + r];
            }
            want[ti * dmodel + i] = acc;
        }
    }
    assert!(as_f32(&out[bc as usize]) == want, "moe_combine: not bitwise the selection-order sum");
}

#[test]
fn elementwise_kernels_match_the_reference() {
    use pn_ops::{BinaryOp, Op, Shape, Tensor, UnaryOp, Value};
    let mut seed = 5u64;
    let (n, t) = (300usize, 6usize);
    let x = floats(&mut seed, n * t, 8.0);
    let z = floats(&mut seed, n * t, 1.0);
    let row = floats(&mut seed, n, 1.0);
    let mut job = Job::default();
    let (bx, bz, brow) = (job.f32s(&x), job.f32s(&z), job.f32s(&row));
    let grid1 = |items: usize| [items.div_ceil(256) as u32, 1, 1];
    let unary = [(UnaryOp::Silu, 0), (UnaryOp::Sigmoid, 1), (UnaryOp::Softplus, 2), (UnaryOp::Exp, 3), (UnaryOp::Scale(0.37), 4)];
    let mut outs = Vec::new();
    for (u, code) in unary {
        let s = if let UnaryOp::Scale(s) = u { s } else { 0.0 };
        let y = job.f32s(&vec![f32::NAN; n * t]);
        job.launch("unary_f32", grid1(n * t), [256, 1, 1], &[A::P(bx, 0), A::P(y, 0), A::L((n * t) as i64), A::I(code), A::F(s)]);
        outs.push((format!("Unary {u:?}"), y, Op::Unary(u), false));
    }
    for (b, code) in [(BinaryOp::Add, 0), (BinaryOp::Mul, 1), (BinaryOp::SwiGlu, 2)] {
        for bcast in [false, true] {
            let (other, b0, b1) = if bcast { (brow, n as i32, 1) } else { (bz, n as i32, t as i32) };
            let y = job.f32s(&vec![f32::NAN; n * t]);
            let dims = [A::I(n as i32), A::I(t as i32), A::I(1), A::I(1), A::I(b0), A::I(b1), A::I(1), A::I(1)];
            let mut args = vec![A::P(bx, 0), A::P(other, 0), A::P(y, 0)];
            args.extend(dims);
            args.push(A::I(code));
            job.launch("binary_f32", grid1(n * t), [256, 1, 1], &args);
            outs.push((format!("Binary {b:?} bcast {bcast}"), y, Op::Binary(b), bcast));
        }
    }
    let Some(out) = job.run("elementwise.cu") else { return };
    let (xt, zt, rt) = (Tensor::f32(Shape::d2(n, t), x.clone()), Tensor::f32(Shape::d2(n, t), z.clone()), Tensor::f32(Shape::d2(n, 1), row.clone()));
    for (what, y, op, bcast) in outs {
        let want = match op {
            Op::Unary(_) => reference(&op, &[Value::Act(&xt)]),
            _ => reference(&op, &[Value::Act(&xt), Value::Act(if bcast { &rt } else { &zt })]),
        };
        let e = nmse(&as_f32(&out[y as usize]), want.as_f32());
        assert!(e <= 1e-12, "{what}: nmse {e:e}");
    }
}

#[test]
fn rope_matches_the_reference() {
    use pn_ops::{Op, RopeMode, Shape, Tensor, Value};
    let mut seed = 11u64;
    let (d, h, t) = (64usize, 3usize, 5usize);
    let x = floats(&mut seed, d * h * t, 2.0);
    let pos: Vec<i32> = vec![0, 7, 8, 100, 4095];
    let mut job = Job::default();
    let bpos = job.i32s(&pos);
    let mut outs = Vec::new();
    for (mode, n_rot) in [(RopeMode::Neox, 64usize), (RopeMode::Neox, 32), (RopeMode::Normal, 64)] {
        let (freq_base, freq_scale) = (10000.0f32, 1.0f32);
        let theta_scale = freq_base.powf(-2.0f32 / n_rot as f32);
        // the host copies x into y, then rotates y in place
        let y = job.f32s(&x);
        let n = n_rot / 2 * h * t;
        let args = [
            A::P(y, 0), A::P(bpos, 0), A::I(d as i32), A::I(h as i32), A::I(t as i32), A::I(1), A::I(n_rot as i32), A::F(theta_scale), A::F(freq_scale),
            A::I(0), A::I(0), A::I(0), A::I(0), A::I(0), A::Null, A::I((mode == RopeMode::Normal) as i32),
        ];
        job.launch("rope_neox", [n.div_ceil(256) as u32, 1, 1], [256, 1, 1], &args);
        outs.push((mode, n_rot, freq_base, freq_scale, y));
    }
    let Some(out) = job.run("rope.cu") else { return };
    let xt = Tensor::f32(Shape([d, h, t, 1]), x.clone());
    let pt = Tensor::i32(Shape::d1(t), pos.clone());
    for (mode, n_rot, freq_base, freq_scale, y) in outs {
        let want = reference(&Op::Rope { n_rot, mode, freq_base, freq_scale }, &[Value::Act(&xt), Value::Act(&pt)]);
        let e = nmse(&as_f32(&out[y as usize]), want.as_f32());
        assert!(e <= 1e-12, "Rope {mode:?} n_rot {n_rot}: nmse {e:e}");
    }
}

#[test]
fn attention_kernels_match_the_reference_for_every_kv_format() {
    use pn_ops::{KvCache, KvType, LayerState, Op, Shape, Tensor, Value};
    let (d, h, hkv, cap) = (64usize, 4usize, 2usize, 40usize);
    let scale = 1.0 / (d as f32).sqrt();
    let op = Op::Attention { n_head: h, n_head_kv: hkv, head_dim: d, scale, state: 0 };
    // each format with its default shadows, and without any (every position read from
    // the cells)
    let formats = [(KvType::F32, 0), (KvType::F16, 1), (KvType::Q8_0, 2), (KvType::Q4_0, 3)];
    for ((ty, code), shadows) in formats.into_iter().flat_map(|f| [(f, true), (f, false)]) {
        let mut seed = 21 + code as u64;
        let mut cache = if shadows { KvCache::with_type(hkv, d, cap, ty) } else { KvCache::with_shadows(hkv, d, cap, ty, 0, 0) };
        let (rb, sink, window, slots) = (cache.ty.row_bytes(d), cache.shadow.sink, cache.shadow.window, cache.shadow.slots);
        let rs = |n: usize| if n == 0 { 0.0 } else { 1.0 / (n as f32).sqrt() };
        let (rot_k, rot_v) = (cache.rot_k, cache.rot_v);
        let mut job = Job::default();
        let cell_bytes = hkv * cap * rb;
        let cells = [job.buf(vec![0; cell_bytes]), job.buf(vec![0; cell_bytes])];
        let sinks = [job.buf(vec![0; hkv * sink * d * 2]), job.buf(vec![0; hkv * sink * d * 2])];
        let wins = [job.buf(vec![0; hkv * slots * d * 2]), job.buf(vec![0; hkv * slots * d * 2])];
        let ptr = |b: u32| A::P(b, 0);
        let mut wants = Vec::new();
        let mut ys = Vec::new();
        // a prefill of 6 tokens (one run), then a decode token, as ops_attn.rs `run` launches them
        for (pos, fixed) in [(vec![0i32, 1, 2, 3, 4, 5], false), (vec![6], true)] {
            let t = pos.len();
            let (q, k, v) = (floats(&mut seed, d * h * t, 1.0), floats(&mut seed, d * hkv * t, 1.0), floats(&mut seed, d * hkv * t, 1.0));
            let (qt, kt, vt) = (Tensor::f32(Shape([d, h, t, 1]), q.clone()), Tensor::f32(Shape([d, hkv, t, 1]), k.clone()), Tensor::f32(Shape([d, hkv, t, 1]), v.clone()));
            let pt = Tensor::i32(Shape::d1(t), pos.clone());
            let ins = [Value::Act(&qt), Value::Act(&kt), Value::Act(&vt), Value::Act(&pt)];
            let metas: Vec<pn_ops::TensorMeta> = ins.iter().map(pn_ops::reference::common::meta_of).collect();
            let out = op.infer(&metas).unwrap();
            let mut st = LayerState::Kv(cache);
            wants.push(pn_ops::reference::execute(&op, &ins, &out, Some(&mut st)).unwrap());
            let LayerState::Kv(c) = st else { unreachable!() };
            cache = c;
            let (bq, bk, bv, bp) = (job.f32s(&q), job.f32s(&k), job.f32s(&v), job.i32s(&pos));
            let span = if fixed { cap } else { *pos.iter().max().unwrap() as usize + 1 };
            let (bs, by) = (job.f32s(&vec![0.0; h * t * span]), job.f32s(&vec![f32::NAN; d * h * t]));
            let mut a = vec![ptr(cells[0]), ptr(cells[1]), ptr(sinks[0]), ptr(sinks[1]), ptr(wins[0]), ptr(wins[1]), A::Null, A::Null, ptr(bk), ptr(bv), ptr(bp)];
            a.extend([A::I(0), A::I(code), A::I(d as i32), A::I(hkv as i32), A::I(rb as i32), A::I(cap as i32), A::I(cap as i32), A::I(0), A::I(sink as i32), A::I(slots as i32)]);
            a.extend([A::I(rot_k as i32), A::F(rs(rot_k)), A::I(rot_v as i32), A::F(rs(rot_v))]);
            job.launch("kv_store", [t as u32, hkv as u32, 1], [128, 1, 1], &a);
            let mut a = vec![ptr(bq), ptr(cells[0]), ptr(cells[1]), ptr(sinks[0]), ptr(sinks[1]), ptr(wins[0]), ptr(wins[1]), ptr(bp), ptr(bs), ptr(by)];
            a.extend([A::I(0), A::I(code), A::I(d as i32), A::I(h as i32), A::I(hkv as i32), A::I(rb as i32), A::I(cap as i32), A::I(cap as i32), A::I(0)]);
            a.extend([A::I(sink as i32), A::I(window as i32), A::I(slots as i32), A::I(span as i32)]);
            a.extend([A::I(rot_k as i32), A::F(rs(rot_k)), A::I(rot_v as i32), A::F(rs(rot_v)), A::F(scale)]);
            job.launch("attn_kv", [h as u32, t as u32, 1], [128, 1, 1], &a);
            ys.push(by);
        }
        let Some(out) = job.run("attention.cu") else { return };
        for (pass, (y, want)) in ys.iter().zip(&wants).enumerate() {
            assert!(as_f32(&out[*y as usize]) == want.as_f32(), "{ty:?} (shadows {shadows}) pass {pass}: attention output not bitwise the reference");
        }
        let enc = |i: usize| if ty == KvType::F32 { (if i == 0 { &cache.k } else { &cache.v }).iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>() } else { (if i == 0 { &cache.kq } else { &cache.vq }).clone() };
        let u16s = |v: &Vec<u16>| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        for i in 0..2 {
            assert!(out[cells[i] as usize] == enc(i), "{ty:?}: cells {i} differ from the reference cache");
        }
        assert!(out[sinks[0] as usize] == u16s(&cache.shadow.k_sink) && out[sinks[1] as usize] == u16s(&cache.shadow.v_sink), "{ty:?}: sink shadows differ");
        assert!(out[wins[0] as usize] == u16s(&cache.shadow.k_win) && out[wins[1] as usize] == u16s(&cache.shadow.v_win), "{ty:?}: window shadows differ");
    }
}

#[test]
fn get_rows_match_the_reference_for_every_native_format() {
    use pn_ops::quant::quantize_weights::quantize_weights;
    use pn_ops::{Op, Shape, Tensor, Value, WeightView};
    let (k, vocab) = (256usize, 40usize);
    let ids = vec![0i32, 39, 7, 7, 12];
    let mut seed = 3u64;
    let mut job = Job::default();
    let bids = job.i32s(&ids);
    let bad_ids = job.i32s(&[40, -1]);
    let mut cases = Vec::new();
    for ty in NATIVE {
        let rb = ty.row_bytes(k).unwrap();
        let mut w = vec![0u8; vocab * rb];
        for r in w.chunks_mut(rb) {
            quantize_weights(ty, &floats(&mut seed, k, 2.0), r).unwrap();
        }
        let bw = job.buf(w.clone());
        let sfx = pn_cuda::formats::suffix(ty).unwrap();
        let (y, ybad) = (job.f32s(&vec![0.5; k * ids.len()]), job.f32s(&vec![0.5; k * 2]));
        for (b, yb, t) in [(bids, y, ids.len()), (bad_ids, ybad, 2)] {
            let args = [A::P(bw, 0), A::L(rb as i64), A::P(b, 0), A::I(t as i32), A::I(k as i32), A::P(yb, 0), A::I(vocab as i32)];
            job.launch(&format!("get_rows_{sfx}"), [(k * t).div_ceil(256) as u32, 1, 1], [256, 1, 1], &args);
        }
        cases.push((ty, w, y, ybad));
    }
    let Some(out) = job.run("matmul.cu") else { return };
    let it = Tensor::i32(Shape::d1(ids.len()), ids.clone());
    for (ty, w, y, ybad) in cases {
        let view = Value::Weight(WeightView { name: "tok", ty, shape: Shape::d2(k, vocab), bytes: &w, rows16: None });
        let want = reference(&Op::GetRows, &[view, Value::Act(&it)]);
        assert!(as_f32(&out[y as usize]) == want.as_f32(), "get_rows {ty}: not bitwise the reference");
        assert!(as_f32(&out[ybad as usize]).iter().all(|v| v.is_nan()), "get_rows {ty}: an id outside the table gives NaN rows");
    }
}

#[test]
fn chunked_delta_rule_matches_the_recurrence() {
    use pn_ops::{LayerState, Op, RecurrentState, Shape, Tensor, Value};
    // 150 tokens: chunks of 64, 64 and 22; the scratch of one group of all three
    let (dk, hk, dv, hv, t) = (32usize, 2usize, 48usize, 4usize, 150usize);
    let (dc, dtj) = (64usize, 32usize);
    let mut seed = 8u64;
    let q = floats(&mut seed, dk * hk * t, 1.0);
    let k: Vec<f32> = {
        // unit-norm keys, as the model's l2-normed ones
        let raw = floats(&mut seed, dk * hk * t, 1.0);
        raw.chunks(dk).flat_map(|r| {
            let n = r.iter().map(|x| x * x).sum::<f32>().sqrt();
            r.iter().map(move |x| x / n).collect::<Vec<_>>()
        }).collect()
    };
    let v = floats(&mut seed, dv * hv * t, 1.0);
    let g: Vec<f32> = floats(&mut seed, hv * t, 1.0).iter().map(|x| -0.05 - 0.3 * x.abs()).collect();
    let beta: Vec<f32> = floats(&mut seed, hv * t, 1.0).iter().map(|x| 0.5 + 0.4 * x).collect();
    let mut rs = RecurrentState::new(4, 8, hv, dk, dv);
    rs.ssm = floats(&mut seed, hv * dv * dk, 0.5);
    let scale = 1.0 / (dk as f32).sqrt();
    let n_chunks = t.div_ceil(dc);
    let stride = 2 * dc * dc + dc * dk + dc;
    let mut job = Job::default();
    let (bq, bk, bv, bg, bb) = (job.f32s(&q), job.f32s(&k), job.f32s(&v), job.f32s(&g), job.f32s(&beta));
    let (bs, by, bscr) = (job.f32s(&rs.ssm), job.f32s(&vec![f32::NAN; dv * hv * t]), job.f32s(&vec![0.0; hv * n_chunks * stride]));
    let i = |x: usize| A::I(x as i32);
    let p = |b: u32| A::P(b, 0);
    job.launch("delta_chunk_prep", [hv as u32, n_chunks as u32, 1], [256, 1, 1], &[p(bq), p(bk), p(bg), p(bb), p(bscr), i(dk), i(hk), i(hv), i(t), i(0), A::F(scale)]);
    job.launch("delta_chunk_apply", [hv as u32, dv.div_ceil(dtj) as u32, 1], [256, 1, 1], &[p(bs), p(bq), p(bk), p(bv), p(bscr), p(by), i(dk), i(hk), i(dv), i(hv), i(t), i(0), i(n_chunks), A::F(scale)]);
    let Some(out) = job.run("delta_chunk.cu") else { return };
    let ts = |v: &[f32], s: [usize; 4]| Tensor::f32(Shape(s), v.to_vec());
    let (qt, kt, vt, gt, bt) = (ts(&q, [dk, hk, t, 1]), ts(&k, [dk, hk, t, 1]), ts(&v, [dv, hv, t, 1]), ts(&g, [hv, t, 1, 1]), ts(&beta, [hv, t, 1, 1]));
    let ins = [Value::Act(&qt), Value::Act(&kt), Value::Act(&vt), Value::Act(&gt), Value::Act(&bt)];
    let metas: Vec<pn_ops::TensorMeta> = ins.iter().map(pn_ops::reference::common::meta_of).collect();
    let op = Op::DeltaRule { state: 0 };
    let meta = op.infer(&metas).unwrap();
    let mut st = LayerState::Recurrent(rs);
    let want = pn_ops::reference::execute(&op, &ins, &meta, Some(&mut st)).unwrap();
    let LayerState::Recurrent(rs) = st else { unreachable!() };
    // the chunked form reassociates the recurrence's sums (≤ 1e-4 relative, docs/perf.md)
    let (ey, es) = (nmse(&as_f32(&out[by as usize]), want.as_f32()), nmse(&as_f32(&out[bs as usize]), &rs.ssm));
    assert!(ey <= 1e-8 && es <= 1e-8, "chunked delta rule: output nmse {ey:e}, state nmse {es:e}");
}

#[test]
fn slices_match_the_reference() {
    use pn_ops::{Op, Shape, Tensor, Value};
    let mut seed = 13u64;
    let (n, t) = (96usize, 5usize);
    let x = floats(&mut seed, n * t, 1.0);
    let (group, offset, len) = (32usize, 8usize, 16usize);
    let (start, rows) = (1usize, 3usize);
    let mut job = Job::default();
    let bx = job.f32s(&x);
    let n_cols = n / group * len * t;
    let (yc, yr) = (job.f32s(&vec![f32::NAN; n_cols]), job.f32s(&vec![f32::NAN; n * rows]));
    job.launch("slice_cols", [n_cols.div_ceil(256) as u32, 1, 1], [256, 1, 1], &[A::P(bx, 0), A::P(yc, 0), A::L(n_cols as i64), A::I(group as i32), A::I(offset as i32), A::I(len as i32)]);
    job.launch("copy_f32", [(n * rows).div_ceil(256) as u32, 1, 1], [256, 1, 1], &[A::P(bx, 0), A::P(yr, 0), A::L((start * n) as i64), A::L((n * rows) as i64)]);
    let Some(out) = job.run("elementwise.cu") else { return };
    let xt = Tensor::f32(Shape::d2(n, t), x.clone());
    let cols = reference(&Op::SliceCols { group, offset, len }, &[Value::Act(&xt)]);
    let rows_want = reference(&Op::SliceRows { start, len: rows }, &[Value::Act(&xt)]);
    assert!(as_f32(&out[yc as usize]) == cols.as_f32(), "slice_cols: not the reference's elements");
    assert!(as_f32(&out[yr as usize]) == rows_want.as_f32(), "copy_f32 (SliceRows): not the reference's rows");
}

//! The CUDA emulation harness shared by tests/emu_kernels.rs and tests/emu_ops.rs: kernel
//! sources rewritten to plain C++, built with the host compiler around tests/emu/*.cpp
//! (cuda_emu.h: blocks in turn, a block's threads as fibers switched at every barrier and
//! warp shuffle), a generic launcher's jobs (launch.cpp), and comparison helpers.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

/// `stem` made unique in this process: the tests of a file run at once, and two building
/// or running the same kernel file must not share a path.
fn unique(stem: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!("{stem}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

/// Kernel source as plain C++ for the emulation: no `extern "C"`, the dynamic shared
/// arrays the emulation's, common.cuh's f16 `asm` the emulation's F16C.
pub fn cpp_of(what: &str, src: &str) -> String {
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
pub fn as_cpp(root: &Path, out: &Path, file: &str) -> PathBuf {
    let src = std::fs::read_to_string(root.join("kernels").join(file)).unwrap();
    let path = out.join(format!("{}.inc", unique(file)));
    std::fs::write(&path, cpp_of(file, &src)).unwrap();
    path
}

/// Builds tests/emu/`main` with the kernel files (`(macro, file under kernels/)`): the
/// executable, or None (said on stderr) where no C++ compiler runs outside CI.
pub fn build(main: &str, kernels: &[(&str, &str)]) -> Option<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let defs: Vec<String> = kernels.iter().map(|(m, f)| format!("-D{m}=\"{}\"", as_cpp(&root, &out, f).display())).collect();
    build_with(&unique(main.trim_end_matches(".cpp")), main, &defs)
}

/// Builds tests/emu/`main` into `exe_name` with the compiler flags `defs`.
pub fn build_with(exe_name: &str, main: &str, defs: &[String]) -> Option<PathBuf> {
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
pub fn run(main: &str, kernels: &[(&str, &str)], expect: &str) {
    let Some(exe) = build(main, kernels) else { return };
    let ran = Command::new(&exe).output().unwrap();
    let said = String::from_utf8_lossy(&ran.stdout);
    assert!(ran.status.success() && said.contains(expect), "{said}");
}

/// xorshift floats in [-1, 1].
pub fn floats(seed: &mut u64, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            scale * (((*seed >> 11) % 20001) as f32 / 10000.0 - 1.0)
        })
        .collect()
}

/// One argument of a generic launch (tests/emu/launch.cpp), as the host code passes it.
pub enum A {
    /// A pointer into buffer `.0`, `.1` bytes in.
    P(u32, u64),
    I(i32),
    L(i64),
    F(f32),
    Null,
}

/// Buffers and kernel launches for tests/emu/launch.cpp, run under the emulation.
#[derive(Default)]
pub struct Job {
    bufs: Vec<Vec<u8>>,
    cmds: Vec<u8>,
    n_cmds: u32,
}

impl Job {
    /// A buffer of these bytes: its index.
    pub fn buf(&mut self, bytes: Vec<u8>) -> u32 {
        self.bufs.push(bytes);
        self.bufs.len() as u32 - 1
    }
    pub fn f32s(&mut self, v: &[f32]) -> u32 {
        self.buf(v.iter().flat_map(|x| x.to_le_bytes()).collect())
    }
    pub fn i32s(&mut self, v: &[i32]) -> u32 {
        self.buf(v.iter().flat_map(|x| x.to_le_bytes()).collect())
    }
    /// `name` on a grid of `grid` blocks of `block` threads.
    pub fn launch(&mut self, name: &str, grid: [u32; 3], block: [u32; 3], args: &[A]) {
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
    pub fn run(self, file: &str) -> Option<Vec<Vec<u8>>> {
        let m = pn_cuda::kernels::MODULES.iter().find(|m| m.file == file).expect("a kernel module");
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
        let stem = unique(file.trim_end_matches(".cu"));
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

pub fn as_f32(b: &[u8]) -> Vec<f32> {
    b.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

pub fn as_i32(b: &[u8]) -> Vec<i32> {
    b.chunks(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect()
}

pub fn nmse(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    let (mut e, mut n) = (0f64, 0f64);
    for (&g, &w) in got.iter().zip(want) {
        e += (g as f64 - w as f64).powi(2);
        n += (w as f64).powi(2);
    }
    e / n.max(1e-30)
}

/// The reference's output of `op` on `ins`.
pub fn reference(op: &pn_ops::Op, ins: &[pn_ops::Value<'_>]) -> pn_ops::Tensor {
    let metas: Vec<pn_ops::TensorMeta> = ins.iter().map(pn_ops::reference::common::meta_of).collect();
    let out = op.infer(&metas).expect("a valid op");
    pn_ops::reference::execute(op, ins, &out, None).expect("the reference runs it")
}


/// The native weight formats (src/formats.rs `suffix`): every `mm_*` / `get_rows_*` kernel.
pub const NATIVE: [pn_ops::GgmlType; 16] = {
    use pn_ops::GgmlType::*;
    [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2K, Q3K, Q4K, Q5K, Q6K, IQ4NL, IQ4XS, MXFP4, F32, F16, BF16]
};


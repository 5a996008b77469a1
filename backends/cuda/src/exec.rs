//! How ops reach the device: device address ranges ([`Buf`]), launch descriptors
//! ([`Cmd`]: a kernel with its exact arguments, a memset, a device copy) and the
//! execution context of one op ([`Cx`]).
//!
//! Every op of `ops_*.rs` is written once against [`Cx`]: it asks for temporaries
//! ([`Cx::tmp`]) and issues [`Cmd`]s ([`Cx::go`]). The two protocols differ only in the
//! context they pass:
//! - host protocol (`Backend::execute`, host.rs): inputs uploaded to temporaries the
//!   context owns (zeroed allocations, freed stream-ordered when it drops), commands
//!   launched at once, the output downloaded;
//! - resident protocol (resident.rs): inputs and output are slot buffers, temporaries come
//!   from the backend's [`Scratch`] (same addresses step after step), and inside a stable
//!   segment the commands are *deferred*: collected, compared with the previous step's
//!   ([`fingerprint`]) and launched at the segment's end directly, captured as a CUDA
//!   graph, or replayed from one (segment.rs).

use crate::device::{drv, Device};
use crate::CudaError;
use cudarc::driver::{result, CudaSlice, LaunchConfig};
use std::ffi::c_void;

/// A device address range: `bytes` bytes from `ptr` (0 / 0: no buffer, a null argument).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Buf {
    pub ptr: u64,
    pub bytes: usize,
}

impl Buf {
    pub const NULL: Buf = Buf { ptr: 0, bytes: 0 };

    /// `bytes` bytes from `off` bytes in (a sub-range of this buffer).
    pub fn at(&self, off: usize, bytes: usize) -> Buf {
        debug_assert!(
            off + bytes <= self.bytes,
            "sub-range {off}+{bytes} of {} bytes",
            self.bytes
        );
        Buf {
            ptr: self.ptr + off as u64,
            bytes,
        }
    }
    /// From `off` bytes in to the end.
    pub fn from(&self, off: usize) -> Buf {
        self.at(off, self.bytes.saturating_sub(off))
    }
}

/// One kernel argument, typed as the kernel's C signature: a pointer, `int`, `long long`
/// (`i64`), `float`, or a sequence table passed by value.
#[derive(Clone, Debug, PartialEq)]
pub enum Arg {
    P(u64),
    I(i32),
    L(i64),
    F(f32),
    /// A struct passed by value (`seqtab::ByValue`), as its 8-byte words.
    V(Box<[u64]>),
}

/// One command on the backend's stream, with every address and scalar it uses (kernels
/// and device copies: both can be captured into a graph).
#[derive(Clone, Debug, PartialEq)]
pub enum Cmd {
    Kernel {
        name: &'static str,
        /// The `CUfunction` (as an integer: descriptors are compared and sent between threads).
        f: usize,
        grid: [u32; 3],
        block: [u32; 3],
        shared: u32,
        args: Vec<Arg>,
    },
    /// Device-to-device copy of `bytes` bytes.
    Copy { dst: u64, src: u64, bytes: usize },
}

/// A kernel call being built: `d.k("name")?.p(x).i(n).f(eps).cfg(c)`.
pub struct K {
    name: &'static str,
    f: usize,
    args: Vec<Arg>,
}

impl K {
    pub(crate) fn new(name: &'static str, f: usize) -> K {
        K {
            name,
            f,
            args: Vec::with_capacity(24),
        }
    }
    /// A pointer argument.
    pub fn p(mut self, b: Buf) -> K {
        self.args.push(Arg::P(b.ptr));
        self
    }
    pub fn i(mut self, x: i32) -> K {
        self.args.push(Arg::I(x));
        self
    }
    pub fn l(mut self, x: i64) -> K {
        self.args.push(Arg::L(x));
        self
    }
    pub fn f(mut self, x: f32) -> K {
        self.args.push(Arg::F(x));
        self
    }
    /// A struct by value (a sequence table).
    pub fn val<T: crate::seqtab::ByValue>(mut self, t: &T) -> K {
        self.args.push(Arg::V(t.words()));
        self
    }
    pub fn cfg(self, c: LaunchConfig) -> Cmd {
        Cmd::Kernel {
            name: self.name,
            f: self.f,
            grid: [c.grid_dim.0, c.grid_dim.1, c.grid_dim.2],
            block: [c.block_dim.0, c.block_dim.1, c.block_dim.2],
            shared: c.shared_mem_bytes,
            args: self.args,
        }
    }
}

/// The commands of a segment flattened into words, compared exactly (not hashed) to
/// decide whether a captured graph replays the same work: kind, function, launch
/// geometry, then every argument with its type.
pub fn fingerprint(cmds: &[Cmd]) -> Vec<u64> {
    let mut v = Vec::with_capacity(cmds.len() * 24);
    for c in cmds {
        match c {
            Cmd::Kernel {
                f,
                grid,
                block,
                shared,
                args,
                ..
            } => {
                v.push(1);
                v.push(*f as u64);
                v.extend(grid.iter().chain(block).map(|&x| x as u64));
                v.push(*shared as u64);
                v.push(args.len() as u64);
                for a in args {
                    let (tag, bits) = match a {
                        Arg::P(x) => (1, *x),
                        Arg::I(x) => (2, *x as u32 as u64),
                        Arg::L(x) => (3, *x as u64),
                        Arg::F(x) => (4, x.to_bits() as u64),
                        Arg::V(w) => {
                            v.extend(w.iter());
                            (5, w.len() as u64)
                        }
                    };
                    v.push(tag);
                    v.push(bits);
                }
            }
            Cmd::Copy { dst, src, bytes } => v.extend([3, *dst, *src, *bytes as u64]),
        }
    }
    v
}

/// Issue one command on the device's stream now.
pub fn launch(d: &Device, c: &Cmd) -> Result<(), CudaError> {
    let s = d.stream.cu_stream();
    match c {
        Cmd::Kernel {
            f,
            grid,
            block,
            shared,
            args,
            ..
        } => {
            let mut params: Vec<*mut c_void> = args
                .iter()
                .map(|a| match a {
                    Arg::P(x) => x as *const u64 as *mut c_void,
                    Arg::I(x) => x as *const i32 as *mut c_void,
                    Arg::L(x) => x as *const i64 as *mut c_void,
                    Arg::F(x) => x as *const f32 as *mut c_void,
                    Arg::V(w) => w.as_ptr() as *mut c_void,
                })
                .collect();
            // SAFETY: `f` is a function of a module the device keeps loaded; every launch
            // site passes the arguments in the order and with the C types of the kernel's
            // signature (pointers as 8-byte addresses of live device buffers, `int` as i32,
            // `long long` as i64, `float` as f32, a struct as the words of the `repr(C)` twin
            // of its layout (`ByValue`), whose addresses are live layer states); `params`
            // points into `args`, which
            // outlives the call (the driver copies the values before returning); grids are
            // sized to the buffers and the kernels bound-check their indices.
            unsafe {
                result::launch_kernel(
                    *f as cudarc::driver::sys::CUfunction,
                    (grid[0], grid[1], grid[2]),
                    (block[0], block[1], block[2]),
                    *shared,
                    s,
                    &mut params,
                )
            }
            .map_err(drv)
        }
        // SAFETY: `dst` / `src` are live device allocations of at least `bytes` bytes (slot
        // buffers, layer states, scratch or temporaries), ordered on the one stream.
        Cmd::Copy { dst, src, bytes } if *bytes > 0 && dst != src => {
            unsafe { result::memcpy_dtod_async(*dst, *src, *bytes, s) }.map_err(drv)
        }
        Cmd::Copy { .. } => Ok(()),
    }
}

/// A block of device memory the scratch allocator hands out pieces of.
pub trait Chunk {
    fn base(&self) -> u64;
    fn size(&self) -> usize;
}

impl Chunk for CudaSlice<u8> {
    fn base(&self) -> u64 {
        crate::device::ptr_of(self).ptr
    }
    fn size(&self) -> usize {
        self.len()
    }
}

/// Alignment of scratch pieces.
const ALIGN: usize = 256;
/// Smallest scratch chunk.
const MIN_CHUNK: usize = 1 << 20;

/// Temporaries of the resident path: a bump allocator over chunks that live as long as
/// the backend. [`Scratch::reset`] before each op (an op's temporaries are dead once the
/// next op's commands follow it on the stream), so the same op sequence gets the same
/// addresses step after step (what a captured graph needs). A request the last chunk
/// cannot hold adds a larger chunk; older chunks are freed by [`Scratch::trim`] between
/// segments, when no deferred command can still name them.
pub struct Scratch<C> {
    chunks: Vec<C>,
    off: usize,
}

impl<C> Default for Scratch<C> {
    fn default() -> Self {
        Scratch {
            chunks: Vec::new(),
            off: 0,
        }
    }
}

impl<C: Chunk> Scratch<C> {
    /// Start of an op: its temporaries start at the beginning of the last chunk.
    pub fn reset(&mut self) {
        self.off = 0;
    }
    /// Between segments: free every chunk but the last (the largest).
    pub fn trim(&mut self) {
        if self.chunks.len() > 1 {
            self.chunks.drain(..self.chunks.len() - 1);
        }
        self.off = 0;
    }
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.chunks.iter().map(|c| c.size()).sum()
    }
    #[cfg(test)]
    pub fn chunks(&self) -> usize {
        self.chunks.len()
    }
    /// `bytes` bytes (aligned) for the current op; `alloc` makes a new chunk of the given
    /// size when the last one is full.
    pub fn take(
        &mut self,
        bytes: usize,
        alloc: impl FnOnce(usize) -> Result<C, CudaError>,
    ) -> Result<Buf, CudaError> {
        let need = bytes.max(1).div_ceil(ALIGN) * ALIGN;
        let fits = self
            .chunks
            .last()
            .is_some_and(|c| self.off + need <= c.size());
        if !fits {
            let last = self.chunks.last().map_or(0, |c| c.size());
            let size = (2 * last).max(2 * (self.off + need)).max(MIN_CHUNK);
            self.chunks.push(alloc(size)?);
            self.off = 0;
        }
        let c = self.chunks.last().expect("a chunk exists");
        let b = Buf {
            ptr: c.base() + self.off as u64,
            bytes,
        };
        self.off += need;
        Ok(b)
    }
}

/// Where an op's temporaries come from.
enum Temps<'a> {
    /// Host protocol: zeroed allocations owned by the context.
    Owned(Vec<CudaSlice<u8>>),
    /// Resident protocol: the backend's scratch.
    Scratch(&'a mut Scratch<CudaSlice<u8>>),
}

/// The execution context of one op (see the module doc).
pub struct Cx<'a> {
    pub d: &'a Device,
    temps: Temps<'a>,
    defer: Option<&'a mut Vec<Cmd>>,
    /// Commands issued (launched or deferred).
    pub issued: usize,
}

impl<'a> Cx<'a> {
    /// Host protocol: commands launched at once, temporaries owned (and zeroed).
    pub fn host(d: &'a Device) -> Cx<'a> {
        Cx {
            d,
            temps: Temps::Owned(Vec::new()),
            defer: None,
            issued: 0,
        }
    }
    /// Resident protocol: temporaries from `scratch`; commands pushed to `defer` when
    /// given, else launched.
    pub fn resident(
        d: &'a Device,
        scratch: &'a mut Scratch<CudaSlice<u8>>,
        defer: Option<&'a mut Vec<Cmd>>,
    ) -> Cx<'a> {
        Cx {
            d,
            temps: Temps::Scratch(scratch),
            defer,
            issued: 0,
        }
    }
    /// Start of an op (or of one sequence's part of a multi-sequence op).
    pub fn new_op(&mut self) {
        if let Temps::Scratch(s) = &mut self.temps {
            s.reset();
        }
    }
    /// A temporary of `bytes` bytes, valid until the next op.
    pub fn tmp(&mut self, bytes: usize) -> Result<Buf, CudaError> {
        let d = self.d;
        match &mut self.temps {
            Temps::Owned(v) => {
                let s = d.alloc::<u8>(bytes)?;
                let b = crate::device::ptr_of(&s);
                v.push(s);
                Ok(Buf { ptr: b.ptr, bytes })
            }
            Temps::Scratch(s) => s.take(bytes, |n| d.alloc_raw(n)),
        }
    }
    /// A temporary of `n` f32 (or i32).
    pub fn tmp4(&mut self, n: usize) -> Result<Buf, CudaError> {
        self.tmp(4 * n)
    }
    /// Host protocol only: a temporary holding `data`.
    pub fn upload<T: cudarc::driver::DeviceRepr>(&mut self, data: &[T]) -> Result<Buf, CudaError> {
        let b = self.tmp(std::mem::size_of_val(data))?;
        self.d.htod(b, data)?;
        Ok(b)
    }
    /// Issue `c`: launched now, or deferred.
    pub fn go(&mut self, c: Cmd) -> Result<(), CudaError> {
        if let Cmd::Kernel { name, shared, .. } = &c {
            if *shared > 0 {
                crate::device::shared_fits(name, *shared as usize, self.d.static_shared(name))?;
            }
        }
        self.issued += 1;
        match &mut self.defer {
            Some(v) => {
                v.push(c);
                Ok(())
            }
            None => launch(self.d, &c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fake(u64, usize);
    impl Chunk for Fake {
        fn base(&self) -> u64 {
            self.0
        }
        fn size(&self) -> usize {
            self.1
        }
    }

    fn alloc_at(next: &mut u64) -> impl FnOnce(usize) -> Result<Fake, CudaError> + '_ {
        move |n| {
            let c = Fake(*next, n);
            *next += 1 << 40;
            Ok(c)
        }
    }

    #[test]
    fn scratch_gives_the_same_addresses_for_the_same_ops() {
        let (mut s, mut next) = (Scratch::<Fake>::default(), 1u64 << 40);
        let run = |s: &mut Scratch<Fake>, next: &mut u64| -> Vec<Buf> {
            let mut v = Vec::new();
            for sizes in [&[100usize, 5000][..], &[1 << 19], &[7, 7, 7]] {
                s.reset();
                for &n in sizes {
                    v.push(s.take(n, alloc_at(next)).unwrap());
                }
            }
            v
        };
        let a = run(&mut s, &mut next);
        assert_eq!(s.chunks(), 1, "1 MiB is enough");
        assert_eq!(a[0].ptr % ALIGN as u64, 0);
        assert_eq!(a[1].ptr - a[0].ptr, 256, "aligned pieces");
        assert_eq!(
            a[2].ptr, a[0].ptr,
            "each op starts again at the chunk's start"
        );
        assert_eq!(a[4].ptr, a[3].ptr + 256);
        s.trim();
        let b = run(&mut s, &mut next);
        assert_eq!(a, b, "deterministic addresses: replay-safe");
    }

    #[test]
    fn scratch_grows_then_settles() {
        let (mut s, mut next) = (Scratch::<Fake>::default(), 1u64 << 40);
        s.reset();
        let a = s.take(100, alloc_at(&mut next)).unwrap();
        let b = s.take(3 << 20, alloc_at(&mut next)).unwrap();
        assert_eq!(s.chunks(), 2, "a larger chunk was added");
        assert_ne!(a.ptr >> 40, b.ptr >> 40);
        assert!(s.bytes() >= (1 << 20) + (3 << 20));
        s.trim();
        assert_eq!(s.chunks(), 1, "older chunks freed between segments");
        s.reset();
        let a2 = s.take(100, alloc_at(&mut next)).unwrap();
        let b2 = s.take(3 << 20, alloc_at(&mut next)).unwrap();
        assert_eq!(s.chunks(), 1, "the op fits the grown chunk now");
        assert_eq!(a2.ptr >> 40, b2.ptr >> 40);
        s.reset();
        let again = (
            s.take(100, alloc_at(&mut next)).unwrap(),
            s.take(3 << 20, alloc_at(&mut next)).unwrap(),
        );
        assert_eq!(again, (a2, b2));
    }

    #[test]
    fn fingerprints_see_every_argument() {
        let k = |args: Vec<Arg>| Cmd::Kernel {
            name: "k",
            f: 0x1000,
            grid: [1, 2, 1],
            block: [128, 1, 1],
            shared: 512,
            args,
        };
        let base = vec![
            k(vec![Arg::P(0xa000), Arg::I(5), Arg::F(1.5)]),
            Cmd::Copy {
                dst: 0xb000,
                src: 0xc000,
                bytes: 64,
            },
        ];
        let fp = fingerprint(&base);
        assert_eq!(fp, fingerprint(&base.clone()));
        let variants = [
            vec![
                k(vec![Arg::P(0xa100), Arg::I(5), Arg::F(1.5)]),
                base[1].clone(),
            ],
            vec![
                k(vec![Arg::P(0xa000), Arg::I(6), Arg::F(1.5)]),
                base[1].clone(),
            ],
            vec![
                k(vec![Arg::P(0xa000), Arg::L(5), Arg::F(1.5)]),
                base[1].clone(),
            ],
            vec![
                k(vec![Arg::P(0xa000), Arg::I(5), Arg::F(-1.5)]),
                base[1].clone(),
            ],
            vec![
                k(vec![Arg::P(0xa000), Arg::I(5), Arg::F(1.5)]),
                Cmd::Copy {
                    dst: 0xb000,
                    src: 0xc000,
                    bytes: 65,
                },
            ],
            vec![
                k(vec![Arg::P(0xa000), Arg::I(5), Arg::F(1.5)]),
                Cmd::Copy {
                    dst: 0xb000,
                    src: 0xc100,
                    bytes: 64,
                },
            ],
            vec![k(vec![Arg::P(0xa000), Arg::I(5), Arg::F(1.5)])],
        ];
        for v in &variants {
            assert_ne!(fingerprint(v), fp, "{v:?}");
        }
        let mut g = base.clone();
        if let Cmd::Kernel { grid, .. } = &mut g[0] {
            grid[1] = 3;
        }
        assert_ne!(fingerprint(&g), fp, "launch geometry counts");
    }

    #[test]
    fn bufs_slice() {
        let b = Buf {
            ptr: 4096,
            bytes: 100,
        };
        assert_eq!(
            b.at(10, 20),
            Buf {
                ptr: 4106,
                bytes: 20
            }
        );
        assert_eq!(
            b.from(40),
            Buf {
                ptr: 4136,
                bytes: 60
            }
        );
    }
}

//! AMX-INT8 tiles for the 16-row K-quant kernels (Intel Sapphire Rapids and later):
//! Q4_K, Q5_K, Q6_K and IQ4_XS against 16 tokens at a time.
//!
//! `x86_pack16` decodes 16 weight rows into `Packed16`, whose `w` vectors hold, for a
//! sub-block, dword lane r = 4 elements of row r: exactly the VNNI layout of an AMX `B`
//! tile (K/4 rows of 64 bytes). The `A` tile is 16 tokens' activation bytes of the same
//! elements, loaded in place (stride = the activation row stride). Three forms, each
//! giving, per (token, row, super-block), the exact i32 that `dot16`'s `vpdpbusd` chain
//! gives, then `finish16`'s float step:
//! - per sub-block (Q4_K / Q5_K / IQ4_XS below `SPLIT_MIN_TOKENS`): one `tdpbsud` (signed
//!   activations × unsigned codes) per 32-element sub-block, each accumulator row scaled
//!   by the sub-block's scales (`vpmulld`, as `dot16`) and summed;
//! - split (Q4_K / Q5_K from `SPLIT_MIN_TOKENS`, IQ4_XS from `IQ4XS_SPLIT_MIN_TOKENS`,
//!   Q6_K): the scales folded into the codes in two parts ([`Split`]; Q6_K, IQ4_XS:
//!   value·scale as two signed bytes, `tdpbssd`, no offset correction left; Q4_K, Q5_K:
//!   the mins' correction from 4 more products), a super-block in 8 full-size products
//!   and two accumulators; two token tiles a pass where there are 32 tokens
//!   (`products16_split2`: each `B` load shared, four independent accumulators).
//!
//! Integer sums are exact in any order, so every lane is bitwise the single-row kernel's
//! (and `vec_dot`'s): results do not depend on whether a machine has AMX.
//!
//! Tiles: tmm0/tmm1 accumulators (16 × 64 bytes), tmm2/tmm3 `A` (16 tokens × K bytes),
//! tmm4..tmm7 `B` (K/4 × 64 bytes), K = 32 (per sub-block) or 64 (split; there
//! every tile is 16 × 64 and tmm2/tmm3 also serve as accumulators). Alternating pairs let
//! one product run while the vector unit scales the previous one's. Each thread loads its
//! configuration once per K (`configure`). A tile load into a register that a pending
//! product still reads waits for it (~15 ns a 16×16×64 product here), which is what the
//! forms' register rotation is for.

use super::q8::{Q8_K_BYTES, Q8_K_QS};
use super::x86_amx_split::{isums16_split, products16_split2, split, split_isums, split_signed, Split, SIGNED_SHIFT};
use super::x86_pack16::{self, finish16, pack16_from, Corr, Packed16, Rows, Scratch16, Src, IQ4XS, Q4K, Q5K, Q6K};
use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::Cell;
use std::sync::atomic::AtomicU8;

static AMX: AtomicU8 = AtomicU8::new(0);

/// AMX-TILE + AMX-INT8 usable (CPU support, the OS's XSAVE state enabled, and Linux's
/// permission to use the tile data granted to this process), on top of AVX-512 VNNI;
/// detected once. Setting `PN_NO_AMX` keeps the AVX-512 kernels.
pub fn has_amx() -> bool {
    super::x86::detected_once(&AMX, || super::x86::has_vnni() && std::env::var_os("PN_NO_AMX").is_none() && detect())
}

#[cfg(target_os = "linux")]
fn detect() -> bool {
    let (l1, l7) = (__cpuid(1), __cpuid_count(7, 0));
    let osxsave = (l1.ecx >> 27) & 1 == 1;
    let (tile, int8) = ((l7.edx >> 24) & 1 == 1, (l7.edx >> 25) & 1 == 1);
    if !(osxsave && tile && int8) {
        return false;
    }
    let xcr0: u32;
    // SAFETY: OSXSAVE is set, so xgetbv(0) is allowed; it only reads XCR0.
    unsafe { asm!("xgetbv", in("ecx") 0u32, out("eax") xcr0, out("edx") _, options(nomem, nostack, preserves_flags)) };
    // XTILECFG (bit 17) and XTILEDATA (bit 18) enabled by the OS
    if (xcr0 >> 17) & 3 != 3 {
        return false;
    }
    // arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA): Linux hands the 8 KB tile state
    // to a process only when asked (per process, for every thread).
    let r: i64;
    // SAFETY: a plain system call; it reads and writes no memory of ours.
    unsafe {
        asm!("syscall", inlateout("rax") 158i64 => r, in("rdi") 0x1023i64, in("rsi") 18i64,
             lateout("rcx") _, lateout("r11") _, options(nostack));
    }
    r == 0
}

#[cfg(not(target_os = "linux"))]
fn detect() -> bool {
    false
}

thread_local! {
    /// The sub-block bytes this thread's tile configuration was loaded for (0: none).
    static CONFIGURED: Cell<u8> = const { Cell::new(0) };
}

#[repr(C, align(64))]
struct TileConfig([u8; 64]);

/// Loads this thread's tile configuration for sub-blocks of `k` bytes (16 or 32), unless
/// it already is.
///
/// # Safety
/// `has_amx()` returned true.
pub(super) unsafe fn configure(k: usize) {
    let (kb, b) = (k as u16, (k / 4) as u8);
    // C: 16 tokens × 16 rows (i32); A: 16 tokens × k activation bytes; B: k/4 dwords × 16 rows
    // SAFETY: the caller's contract.
    unsafe { load_tiles(k as u8, [(16, 64), (16, 64), (16, kb), (16, kb), (b, 64), (b, 64), (b, 64), (b, 64)]) }
}

/// Loads the palette-1 tile configuration `shapes` (rows, bytes a row, per tile), marked
/// `mark` in this thread's `CONFIGURED`, unless that one is loaded already.
///
/// # Safety
/// `has_amx()` returned true; `shapes` a valid configuration (rows ≤ 16, bytes ≤ 64).
pub(super) unsafe fn load_tiles(mark: u8, shapes: [(u8, u16); 8]) {
    CONFIGURED.with(|c| {
        if c.get() == mark {
            return;
        }
        let mut t = TileConfig([0; 64]);
        t.0[0] = 1; // palette 1
        for (tile, (rows, colsb)) in shapes.into_iter().enumerate() {
            t.0[16 + 2 * tile..18 + 2 * tile].copy_from_slice(&colsb.to_le_bytes());
            t.0[48 + tile] = rows;
        }
        // SAFETY: AMX is usable (the caller); the configuration is a valid palette-1 one.
        unsafe { asm!("ldtilecfg [{}]", in(reg) t.0.as_ptr(), options(nostack, readonly)) };
        c.set(mark);
    });
}

/// One sub-block's tile product into `c` (16 tokens × 16 rows, i32): `A` = 16 rows of
/// `K` bytes at `a` (stride `astride`), `B` = the packed vectors at `b`. Pair `P` of tiles.
#[inline(always)]
pub(super) unsafe fn tile_product<const P: usize>(a: *const u8, astride: usize, b: *const __m512i, c: *mut [i32; 256]) {
    // SAFETY: the caller configured the tiles and guarantees 16 rows of K bytes at `a`,
    // K/4 vectors at `b`, and 1 KB writable at `c`.
    unsafe {
        asm!(
            "tilezero tmm{p}",
            "tileloadd tmm{pa}, [{a} + {s}*1]",
            "tileloadd tmm{pb}, [{b} + {bs}*1]",
            "tdpbsud tmm{p}, tmm{pa}, tmm{pb}",
            "tilestored [{c} + {bs}*1], tmm{p}",
            p = const P, pa = const 2 + P, pb = const 4 + P,
            a = in(reg) a, s = in(reg) astride, b = in(reg) b, bs = in(reg) 64usize, c = in(reg) c,
            options(nostack),
        );
    }
}

/// The tile product of [`tile_product`] into tile pair `P`'s C, left in the tile
/// (`tile_store` writes it out): `SIGNED` B bytes (`tdpbssd`) or unsigned (`tdpbsud`).
#[inline(always)]
pub(super) unsafe fn tile_issue<const P: usize, const SIGNED: bool>(a: *const u8, astride: usize, b: *const u8) {
    // SAFETY: as `tile_product` (minus the store).
    macro_rules! issue {
        ($op:literal) => {
            asm!(
                "tilezero tmm{p}",
                "tileloadd tmm{pa}, [{a} + {s}*1]",
                "tileloadd tmm{pb}, [{b} + {bs}*1]",
                concat!($op, " tmm{p}, tmm{pa}, tmm{pb}"),
                p = const P, pa = const 2 + P, pb = const 4 + P,
                a = in(reg) a, s = in(reg) astride, b = in(reg) b, bs = in(reg) 64usize,
                options(nostack, readonly),
            )
        };
    }
    unsafe {
        if SIGNED {
            issue!("tdpbssd");
        } else {
            issue!("tdpbsud");
        }
    }
}

/// The four accumulators tmm0..tmm3 (16 × 16 i32 each) into `buf[0..4]`.
#[inline(always)]
pub(super) unsafe fn store4(buf: &mut [[i32; 256]; 4]) {
    // SAFETY: 4 KB writable at buf; the tiles configured (the caller).
    unsafe {
        asm!(
            "tilestored [{c0} + {bs}*1], tmm0",
            "tilestored [{c1} + {bs}*1], tmm1",
            "tilestored [{c2} + {bs}*1], tmm2",
            "tilestored [{c3} + {bs}*1], tmm3",
            c0 = in(reg) buf[0].as_mut_ptr(), c1 = in(reg) buf[1].as_mut_ptr(),
            c2 = in(reg) buf[2].as_mut_ptr(), c3 = in(reg) buf[3].as_mut_ptr(), bs = in(reg) 64usize,
            options(nostack),
        );
    }
}

/// Tile pair `P`'s C (16 × 16 i32) into `c`.
#[inline(always)]
pub(super) unsafe fn tile_store<const P: usize>(c: *mut [i32; 256]) {
    // SAFETY: 1 KB writable at c; the tiles configured (the caller).
    unsafe { asm!("tilestored [{c} + {bs}*1], tmm{p}", p = const P, c = in(reg) c, bs = in(reg) 64usize, options(nostack)) };
}

/// `isum[j] += C[j] · sc` (lane r = row r): `dot16`'s scale step for 16 tokens.
#[inline(always)]
unsafe fn scale_add(c: &[i32; 256], sc: __m512i, isum: &mut [__m512i; 16]) {
    for (j, is) in isum.iter_mut().enumerate() {
        // SAFETY: 16 readable i32 at row j of `c`; AVX-512 enabled in every caller.
        unsafe { *is = _mm512_add_epi32(*is, _mm512_mullo_epi32(_mm512_loadu_si512(c[16 * j..].as_ptr() as *const _), sc)) };
    }
}

/// The integer sums of packed super-block `pk` (32-element sub-blocks: Q4_K, Q5_K,
/// IQ4_XS) for 16 tokens whose Q8_K blocks start at `y + j·astride`, one tile product per
/// sub-block.
#[inline(always)]
unsafe fn isums16(pk: &Packed16, y: *const u8, astride: usize, buf: [&mut [i32; 256]; 2]) -> [__m512i; 16] {
    let (ns, k, gs) = (8, 32, 8);
    let mut isum = [_mm512_setzero_si512(); 16];
    // SAFETY (whole body): the caller's contract; sub-block s's activation bytes are
    // at `y + Q8_K_QS + k·s`, its packed vectors at `pk.w[gs·s..]`.
    unsafe {
        let q = y.add(Q8_K_QS);
        let w = pk.w.as_ptr();
        tile_product::<0>(q, astride, w, buf[0]);
        for s in 0..ns {
            // the next sub-block's product (the other tile pair) before this one's scaling
            if s + 1 < ns {
                let (a1, b1) = (q.add(k * (s + 1)), w.add(gs * (s + 1)));
                if s % 2 == 0 {
                    tile_product::<1>(a1, astride, b1, buf[1]);
                } else {
                    tile_product::<0>(a1, astride, b1, buf[0]);
                }
            }
            scale_add(buf[s % 2], pk.sc[s], &mut isum);
        }
    }
    isum
}

/// Tokens from which Q4_K / Q5_K take the split form (folding the scales costs about what
/// one 16-token tile saves). Q6_K takes it whenever it takes the tiles
/// (`x86_block::AMX_Q6K_MIN_TOKENS`; its 16-element sub-blocks would make quarter-size
/// tile products per sub-block).
pub(super) const SPLIT_MIN_TOKENS: usize = 128;

/// IQ4_XS's: its split form needs no offset correction per token (`split_signed`), the
/// per-sub-block form does. Measured (`moe_bench matmul_few_tokens`, Intel Xeon 6/207, 2
/// threads, calls interleaved, split vs per sub-block, best ms): 2048×4096 n=16 0.81 vs
/// 0.66, n=32 1.07 vs 1.05, n=64 1.62 vs 1.93, n=128 2.78 vs 3.74; 512×2048 n=16 0.19 vs
/// 0.15, n=32 0.29 vs 0.31, n=64 0.34 vs 0.39.
pub(super) const IQ4XS_SPLIT_MIN_TOKENS: usize = 32;

/// Tokens of a last, partial tile that run through `x86_pack16` instead of a tile
/// product padded to 16 (at most its `MAX_TILE`).
pub(super) const VNNI_TAIL: usize = 8;

/// Scratch of [`group16`]: the packed super-blocks and the accumulator stores.
#[derive(Default)]
pub struct ScratchAmx {
    pk: Scratch16,
    split: Vec<Split>,
    c: Vec<[[i32; 256]; 6]>,
}

/// Rows `0..nr` (1 ≤ nr ≤ 16) of `w` (stride `ws`, `nb` super-blocks of format `kind`)
/// against `m` tokens at `a + j·astride` (Q8_K): `out[r·ostride + j]`. Tokens go 16 at a
/// time; a last `m % 16` of at most `VNNI_TAIL` runs through `x86_pack16`, more come from
/// `tail`, a copy of them padded with zero rows to 16 (same stride). `next` (pointer,
/// bytes): the weights to prefetch meanwhile.
///
/// # Safety
/// `has_amx()` returned true; `nr` rows of `nb` blocks at `w`; `m` tokens of `nb` Q8_K
/// blocks at `a + j·astride` and, when `m % 16 > VNNI_TAIL`, 16 at `tail`; `out` holds
/// `(nr−1)·ostride + m` floats.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn group16(
    kind: u8,
    nb: usize,
    nr: usize,
    w: *const u8,
    ws: usize,
    a: *const u8,
    astride: usize,
    m: usize,
    tail: *const u8,
    out: &mut [f32],
    ostride: usize,
    sc: &mut ScratchAmx,
    next: Option<(*const u8, usize)>,
) {
    let o = x86_pack16::Out::rows(out, ostride);
    // SAFETY (whole body): the caller's contract.
    unsafe {
        match kind {
            IQ4XS => run::<IQ4XS, IQ4XS, Rows>(nb, nr, Rows { xb: w, ws, nr }, a, astride, m, tail, o, sc, next),
            Q6K => run::<Q6K, Q6K, Rows>(nb, nr, Rows { xb: w, ws, nr }, a, astride, m, tail, o, sc, next),
            Q5K => run::<Q5K, Q4K, Rows>(nb, nr, Rows { xb: w, ws, nr }, a, astride, m, tail, o, sc, next),
            _ => run::<Q4K, Q4K, Rows>(nb, nr, Rows { xb: w, ws, nr }, a, astride, m, tail, o, sc, next),
        }
    }
}

/// `group16` for format `F` (packing) with dot formula `D`, the rows' blocks from `src`
/// (block 0; plain rows or the `rows16` layout).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) unsafe fn run<const F: u8, const D: u8, S: Src>(
    nb: usize,
    nr: usize,
    src: S,
    a: *const u8,
    astride: usize,
    m: usize,
    tail: *const u8,
    o: x86_pack16::Out,
    sc: &mut ScratchAmx,
    next: Option<(*const u8, usize)>,
) {
    // SAFETY (whole body): the caller's contract; AMX usable.
    unsafe {
        // Q4_K / Q5_K / IQ4_XS from `split_from` tokens: scales folded into the codes
        // (`Split`)
        let split_from = super::x86_block::knob(super::x86_block::KNOB_AMX_SPLIT_FROM, if F == IQ4XS { IQ4XS_SPLIT_MIN_TOKENS } else { SPLIT_MIN_TOKENS });
        let split_shift = match F {
            Q4K if m >= split_from => 4,
            Q5K if m >= split_from => 3,
            IQ4XS if m >= split_from => SIGNED_SHIFT,
            Q6K => SIGNED_SHIFT,
            _ => 0,
        };
        configure(if split_shift > 0 { 64 } else { 32 });
        // SAFETY: an all-zero bit pattern is a valid Packed16.
        sc.pk.pks.resize(nb, std::mem::zeroed());
        // per-sub-block products (Q4_K / Q5_K / IQ4_XS below their split form): the first
        // token tile packs each super-block one step ahead of its products (its tiles then
        // load from L1, not from a whole group packed into L2 first) and spreads the next
        // rows' prefetch over its blocks (one burst stalled the first products)
        let ahead = m >= 16 && split_shift == 0 && super::x86_block::knob(super::x86_block::KNOB_PACK_AHEAD, 1) != 0;
        for i in 0..if ahead { 1 } else { nb } {
            pack16_from::<F, S>(src.block::<F>(i), &mut sc.pk.pks[i]);
        }
        if split_shift > 0 {
            sc.split.resize(nb, std::mem::zeroed());
            for (pk, sp) in sc.pk.pks.iter().zip(sc.split.iter_mut()) {
                match (split_shift, F) {
                    (4, _) => split::<4>(pk, sp),
                    (3, _) => split::<3>(pk, sp),
                    (_, Q6K) => split_signed::<16, 4, 32>(pk, sp),
                    _ => split_signed::<8, 8, 128>(pk, sp),
                }
            }
        }
        // (a Vec of one: arrays of 256 have no Default to derive the scratch's)
        if sc.c.is_empty() {
            sc.c.push([[0; 256]; 6]);
        }
        let buf = &mut sc.c[0];
        // the next rows load while the first token tile computes (a block a step ahead:
        // spread over its super-blocks instead, below)
        if let (Some((p, len)), false) = (next, ahead) {
            super::x86::prefetch_l2_range(p, 0, len);
        }
        let pf_step = next.map_or(0, |(_, len)| len.div_ceil(nb.max(1)).next_multiple_of(64));
        let pairs = split_shift > 0 && super::x86_block::knob(super::x86_block::KNOB_AMX_PAIRS, 1) != 0;
        let mut t0 = 0;
        while t0 < m {
            if pairs && m - t0 >= 32 {
                // two whole token tiles sharing each B load
                let (a1, a2) = (a.add(t0 * astride), a.add((t0 + 16) * astride));
                let (mut s1, mut s2) = ([_mm512_setzero_ps(); 16], [_mm512_setzero_ps(); 16]);
                for (i, pk) in sc.pk.pks.iter().enumerate() {
                    let (y1, y2) = (a1.add(i * Q8_K_BYTES), a2.add(i * Q8_K_BYTES));
                    if split_shift == SIGNED_SHIFT {
                        products16_split2::<true>(&sc.split[i], y1, y2, astride, buf);
                    } else {
                        products16_split2::<false>(&sc.split[i], y1, y2, astride, buf);
                    }
                    let [b0, b1, b2, b3, m1, m2] = &*buf;
                    let (i1, i2) = match split_shift {
                        4 => (split_isums::<4>(b0, b1), split_isums::<4>(b2, b3)),
                        3 => (split_isums::<3>(b0, b1), split_isums::<3>(b2, b3)),
                        _ => (split_isums::<SIGNED_SHIFT>(b0, b1), split_isums::<SIGNED_SHIFT>(b2, b3)),
                    };
                    // (a constant correction kind per call: `finish16` inlines it away)
                    if split_shift == SIGNED_SHIFT {
                        finish16::<D, 16>(pk, i, a1, astride, &i1, Corr::Folded, &mut s1);
                        finish16::<D, 16>(pk, i, a2, astride, &i2, Corr::Folded, &mut s2);
                    } else {
                        finish16::<D, 16>(pk, i, a1, astride, &i1, Corr::Rows(m1), &mut s1);
                        finish16::<D, 16>(pk, i, a2, astride, &i2, Corr::Rows(m2), &mut s2);
                    }
                }
                for (j, v) in s1.iter().chain(&s2).enumerate() {
                    x86_pack16::store_rows(*v, nr, o, t0 + j);
                }
                t0 += 32;
                continue;
            }
            let mt = 16.min(m - t0);
            if mt <= VNNI_TAIL {
                // a few tokens left: `x86_pack16`'s tiles over the packed blocks (a padded
                // tile product would compute 16)
                x86_pack16::run::<F, S>(nb, nr, src, a.add(t0 * astride), astride, mt, o.at(0, t0), &mut sc.pk, None, true, None);
                break;
            }
            let at = if mt == 16 { a.add(t0 * astride) } else { tail };
            let mut sumf = [_mm512_setzero_ps(); 16];
            for i in 0..nb {
                // with `ahead`, the first token tile packs as it goes (and prefetches its
                // share of the next rows); the later ones find every block packed
                if ahead && t0 == 0 {
                    if let Some((p, len)) = next {
                        super::x86::prefetch_l2_range(p, (i * pf_step).min(len), ((i + 1) * pf_step).min(len));
                    }
                    if i + 1 < nb {
                        pack16_from::<F, S>(src.block::<F>(i + 1), &mut sc.pk.pks[i + 1]);
                    }
                }
                let pk = &sc.pk.pks[i];
                let y = at.add(i * Q8_K_BYTES);
                // (a constant correction kind per call: `finish16` inlines it away)
                match split_shift {
                    SIGNED_SHIFT => {
                        let isum = isums16_split::<SIGNED_SHIFT, true>(&sc.split[i], y, astride, buf);
                        finish16::<D, 16>(pk, i, at, astride, &isum, Corr::Folded, &mut sumf);
                    }
                    4 | 3 => {
                        let isum = if split_shift == 4 {
                            isums16_split::<4, false>(&sc.split[i], y, astride, buf)
                        } else {
                            isums16_split::<3, false>(&sc.split[i], y, astride, buf)
                        };
                        finish16::<D, 16>(pk, i, at, astride, &isum, Corr::Rows(&buf[2]), &mut sumf);
                    }
                    _ => {
                        let [b0, b1, ..] = &mut *buf;
                        let isum = isums16(pk, y, astride, [b0, b1]);
                        finish16::<D, 16>(pk, i, at, astride, &isum, Corr::Bsums, &mut sumf);
                    }
                }
            }
            for (j, v) in sumf.iter().enumerate().take(mt) {
                x86_pack16::store_rows(*v, nr, o, t0 + j);
            }
            t0 += mt;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn signed_split_rebuilds_value_times_scale() {
        if !has_amx() {
            return;
        }
        // Q6_K (16 sub-blocks of 4 vectors, codes 0..63 = value + 32, scales -128..127) and
        // IQ4_XS (8 of 8, codes 1..241 = value + 128, scales -32..31), every code against
        // the scales' extremes
        for (ns, off, codes, scales) in [(16usize, 32i32, 0..64i32, -128..128i32), (8, 128, 1..242, -32..32)] {
            let gs = 64 / ns;
            let (nc, nsc) = (codes.len(), scales.len());
            // SAFETY: AVX-512 present (has_amx); all-zero Packed16 / Split are valid.
            unsafe {
                let mut pk: Packed16 = std::mem::zeroed();
                let mut w = [0u8; 64 * 64];
                for (i, b) in w.iter_mut().enumerate() {
                    *b = (codes.start + ((i * 37 + 11) % nc) as i32) as u8;
                }
                pk.w = std::mem::transmute::<[u8; 4096], [__m512i; 64]>(w);
                let mut sc = [0i32; 256];
                for (i, v) in sc.iter_mut().enumerate() {
                    *v = scales.start + ((i * 97) % nsc) as i32;
                }
                (sc[0], sc[1]) = (scales.start, scales.end - 1);
                pk.sc = std::mem::transmute::<[i32; 256], [__m512i; 16]>(sc);
                let mut sp: Split = std::mem::zeroed();
                if ns == 16 {
                    split_signed::<16, 4, 32>(&pk, &mut sp);
                } else {
                    split_signed::<8, 8, 128>(&pk, &mut sp);
                }
                let (hi, lo): ([i8; 4096], [i8; 4096]) = (std::mem::transmute::<[__m512i; 64], [i8; 4096]>(sp.hi), std::mem::transmute::<[__m512i; 64], [i8; 4096]>(sp.lo));
                for v in 0..64 {
                    let s = v / gs;
                    for byte in 0..64 {
                        let lane = byte / 4;
                        let want = (w[v * 64 + byte] as i32 - off) * sc[s * 16 + lane];
                        let (h, l) = (hi[v * 64 + byte] as i32, lo[v * 64 + byte] as i32);
                        assert!((0..64).contains(&l), "{ns} sub-blocks, vector {v} byte {byte}: lo {l}");
                        assert_eq!((h << SIGNED_SHIFT) + l, want, "{ns} sub-blocks, vector {v} byte {byte}");
                    }
                }
            }
        }
    }
}

//! Multi-token ("tile") AVX2 dot products: one weight row against `M` (1..=8) activation
//! rows, each weight block decoded once and dotted with every row of the tile.
//!
//! Bitwise contract: for every token `j` the result equals the single-row kernel's.
//! The integer part of each block is exact (any summation order gives the same i32),
//! and the float part repeats the single-row formula per token, per block, in block
//! order. The single-row entry points in `x86.rs` call these kernels with `M = 1`, so
//! `vec_dot` and the tiles are literally the same code.
//!
//! All functions are `unsafe`: callers must have detected AVX2+FMA+F16C and must pass
//! `nb` whole blocks of weights at `w` and, for every token `j < M`, `nb` whole
//! activation blocks at `a + j·stride`.

use super::iq4::{IQ4_NL_BYTES, IQ4_XS_BYTES, KVALUES_IQ4NL};
use super::k_quants::{Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES};
use super::legacy::Q4_0_BYTES;
use super::mxfp4::{e8m0_to_f32_half, KVALUES_MXFP4, MXFP4_BYTES};
use super::q8::{Q8_0_BYTES, Q8_K_BSUMS, Q8_K_BYTES, Q8_K_QS};
use std::arch::x86_64::*;

/// Largest tile.
pub const MAX_TILE: usize = 8;

/// The integer multiply-accumulate steps, in two instruction sets with identical (exact)
/// results: plain AVX2, and AVX-512 VNNI (fused `vpdpwssd` / `vpdpbusd`; the bodies are
/// compiled inside `avx512vnni,avx512vl` functions, where 32 vector registers are also
/// available).
pub trait Mac {
    /// `acc + Σ pairs(a·b)·s`: `maddubs(a, b)` (u8·i8 pairs, never saturating for our
    /// operands) times the i16 scales `s`, summed into i32 lanes.
    unsafe fn mac_scaled(acc: __m256i, a: __m256i, b: __m256i, s: __m256i) -> __m256i;
    /// Σ of 4 adjacent u8·i8 products per i32 lane.
    unsafe fn dot4(a: __m256i, b: __m256i) -> __m256i;
}

pub struct Avx2;
pub struct Vnni;

impl Mac for Avx2 {
    #[inline(always)]
    unsafe fn mac_scaled(acc: __m256i, a: __m256i, b: __m256i, s: __m256i) -> __m256i {
        _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), s))
    }
    #[inline(always)]
    unsafe fn dot4(a: __m256i, b: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1))
    }
}

impl Mac for Vnni {
    #[inline(always)]
    unsafe fn mac_scaled(acc: __m256i, a: __m256i, b: __m256i, s: __m256i) -> __m256i {
        // SAFETY: only inlined into functions that enable avx512vnni + avx512vl.
        unsafe { _mm256_dpwssd_epi32(acc, _mm256_maddubs_epi16(a, b), s) }
    }
    #[inline(always)]
    unsafe fn dot4(a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: as above.
        unsafe { _mm256_dpbusd_epi32(_mm256_setzero_si256(), a, b) }
    }
}

#[inline(always)]
pub(super) unsafe fn ld(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 32 readable bytes at `p`.
    unsafe { _mm256_loadu_si256(p as *const __m256i) }
}

#[inline(always)]
unsafe fn rd_u32(p: *const u8) -> u32 {
    // SAFETY: the caller guarantees 4 readable bytes at `p`.
    unsafe { (p as *const u32).read_unaligned() }
}

/// f16 at `p` -> f32 (F16C; exact).
#[inline(always)]
pub(super) unsafe fn f16(p: *const u8) -> f32 {
    // SAFETY: the caller guarantees 2 readable bytes at `p`.
    let bits = unsafe { (p as *const u16).read_unaligned() };
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

#[inline(always)]
unsafe fn f32_at(p: *const u8) -> f32 {
    // SAFETY: the caller guarantees 4 readable bytes at `p`.
    unsafe { (p as *const f32).read_unaligned() }
}

/// Horizontal sums of `M` vectors of 8 i32 lanes (exact; 4 at a time with hadd).
#[inline(always)]
unsafe fn hsums<const M: usize>(v: &[__m256i; M]) -> [i32; M] {
    let mut out = [0i32; M];
    let mut j = 0;
    while j < M {
        let g = |k: usize| if j + k < M { v[j + k] } else { _mm256_setzero_si256() };
        let a = _mm256_hadd_epi32(g(0), g(1));
        let b = _mm256_hadd_epi32(g(2), g(3));
        let c = _mm256_hadd_epi32(a, b);
        let s = _mm_add_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
        let mut l = [0i32; 4];
        // SAFETY: `l` is 16 writable bytes.
        unsafe { _mm_storeu_si128(l.as_mut_ptr() as *mut __m128i, s) };
        let k = 4.min(M - j);
        out[j..j + k].copy_from_slice(&l[..k]);
        j += 4;
    }
    out
}

/// The 8 six-bit scales and 8 mins of a Q4_K / Q5_K super-block (`get_scale_min_k4` for
/// all sub-blocks at once): returns (scales, mins).
#[inline(always)]
pub(super) unsafe fn scales_mins_k4(s: *const u8) -> ([u8; 8], [u8; 8]) {
    const K1: u32 = 0x3f3f_3f3f;
    const K2: u32 = 0x0f0f_0f0f;
    const K3: u32 = 0x0303_0303;
    // SAFETY: the caller guarantees the 12 scale bytes at `s`.
    let (u0, u1, u2) = unsafe { (rd_u32(s), rd_u32(s.add(4)), rd_u32(s.add(8))) };
    let sc_lo = u0 & K1;
    let mn_lo = u1 & K1;
    let sc_hi = (u2 & K2) | (((u0 >> 6) & K3) << 4);
    let mn_hi = ((u2 >> 4) & K2) | (((u1 >> 6) & K3) << 4);
    let sc = ((sc_hi as u64) << 32 | sc_lo as u64).to_le_bytes();
    let mn = ((mn_hi as u64) << 32 | mn_lo as u64).to_le_bytes();
    (sc, mn)
}

/// Horizontal sums of 4 vectors of 8 i32 lanes.
#[inline(always)]
unsafe fn reduce4(v: [__m256i; 4]) -> [i32; 4] {
    let a = _mm256_hadd_epi32(v[0], v[1]);
    let b = _mm256_hadd_epi32(v[2], v[3]);
    let c = _mm256_hadd_epi32(a, b);
    let s = _mm_add_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
    let mut l = [0i32; 4];
    // SAFETY: `l` is 16 writable bytes.
    unsafe { _mm_storeu_si128(l.as_mut_ptr() as *mut __m128i, s) };
    l
}

/// pshufb controls broadcasting i16 word `k` of each 128-bit lane to all its words.
static SCALE_CTRL: [[u8; 32]; 8] = {
    let mut c = [[0u8; 32]; 8];
    let mut k = 0;
    while k < 8 {
        let mut b = 0;
        while b < 32 {
            c[k][b] = (2 * k + (b & 1)) as u8;
            b += 1;
        }
        k += 1;
    }
    c
};

/// Integer part of Q4_K / Q5_K super-block `x` against `M` tokens' blocks `y(j)`:
/// per token, 8 lanes summing to `is` and 8 lanes summing to the min term `summ`.
#[inline(always)]
unsafe fn q45_ints<K: Mac, const M: usize, const FIVE: bool>(
    x: *const u8,
    y: impl Fn(usize) -> *const u8,
) -> ([__m256i; M], [__m256i; M]) {
    let qs_off = if FIVE { 48 } else { 16 };
    let m4 = _mm256_set1_epi8(0x0f);
    let sixteen = _mm256_set1_epi8(16);
    // SAFETY (whole body): x is a whole Q4_K / Q5_K block (qs 128 B, qh 32 B, scales
    // 12 B @4), y(j) a whole Q8_K block (qs 256 B @4, bsums 32 B @260).
    unsafe {
        let (sc, mn) = scales_mins_k4(x.add(4));
        // the 8 scales as i16 in both 128-bit lanes: one pshufb per sub-block broadcasts one
        let sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(
            u64::from_le_bytes(sc) as i64,
        )));
        let mins8 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(u64::from_le_bytes(mn) as i64));
        let mins16 =
            _mm256_set_m128i(_mm_unpackhi_epi16(mins8, mins8), _mm_unpacklo_epi16(mins8, mins8));
        let hv = if FIVE { ld(x.add(16)) } else { _mm256_setzero_si256() };
        let mut sumi = [_mm256_setzero_si256(); M];
        for c in 0..4 {
            let q = ld(x.add(qs_off + 32 * c));
            let mut lo = _mm256_and_si256(q, m4);
            let mut hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            if FIVE {
                let ml = _mm256_set1_epi8((1u8 << (2 * c)) as i8);
                let mh = _mm256_set1_epi8((1u8 << (2 * c + 1)) as i8);
                lo = _mm256_or_si256(
                    lo,
                    _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hv, ml), ml), sixteen),
                );
                hi = _mm256_or_si256(
                    hi,
                    _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hv, mh), mh), sixteen),
                );
            }
            let sl = _mm256_shuffle_epi8(sc16, ld(SCALE_CTRL[2 * c].as_ptr()));
            let sh = _mm256_shuffle_epi8(sc16, ld(SCALE_CTRL[2 * c + 1].as_ptr()));
            for (j, s) in sumi.iter_mut().enumerate() {
                let yq = y(j).add(Q8_K_QS + 64 * c);
                *s = K::mac_scaled(*s, lo, ld(yq), sl);
                *s = K::mac_scaled(*s, hi, ld(yq.add(32)), sh);
            }
        }
        let mut smv = [_mm256_setzero_si256(); M];
        for (j, s) in smv.iter_mut().enumerate() {
            *s = _mm256_madd_epi16(ld(y(j).add(Q8_K_BSUMS)), mins16);
        }
        (sumi, smv)
    }
}

/// Q4_K (`FIVE = false`) / Q5_K (`FIVE = true`) against Q8_K. One token (decode): two
/// super-blocks share one horizontal reduction.
#[inline(always)]
pub unsafe fn tile_q45<K: Mac, const M: usize, const FIVE: bool>(
    nb: usize,
    w: *const u8,
    a: *const u8,
    stride: usize,
    out: &mut [f32; M],
) {
    let wbytes = if FIVE { Q5_K_BYTES } else { Q4_K_BYTES };
    let mut sumf = [0f32; M];
    // the float step of super-block i for token j (the scalar kernel's formula)
    let step = |sumf: &mut f32, x: *const u8, yb: *const u8, is: i32, summ: i32| {
        // SAFETY: x is a whole weight block, yb a whole Q8_K block.
        let (dw, dmw, yd) = unsafe { (f16(x), f16(x.add(2)), f32_at(yb)) };
        let (d, dmin) = (dw * yd, dmw * yd);
        *sumf += d * is as f32 - dmin * summ as f32;
    };
    let mut i = 0;
    if M == 1 {
        while i + 2 <= nb {
            // SAFETY: blocks i and i + 1 exist for the weights and the token.
            unsafe {
                let (x0, x1) = (w.add(i * wbytes), w.add((i + 1) * wbytes));
                let (y0, y1) = (a.add(i * Q8_K_BYTES), a.add((i + 1) * Q8_K_BYTES));
                let (s0, m0) = q45_ints::<K, 1, FIVE>(x0, |_| y0);
                let (s1, m1) = q45_ints::<K, 1, FIVE>(x1, |_| y1);
                let r = reduce4([s0[0], m0[0], s1[0], m1[0]]);
                step(&mut sumf[0], x0, y0, r[0], r[1]);
                step(&mut sumf[0], x1, y1, r[2], r[3]);
            }
            i += 2;
        }
    }
    while i < nb {
        // SAFETY: block i of the weights and of every token's activations exist.
        unsafe {
            let x = w.add(i * wbytes);
            let y = |j: usize| a.add(j * stride + i * Q8_K_BYTES);
            let (sumi, smv) = q45_ints::<K, M, FIVE>(x, y);
            let is = hsums(&sumi);
            let summ = hsums(&smv);
            for j in 0..M {
                step(&mut sumf[j], x, y(j), is[j], summ[j]);
            }
        }
        i += 1;
    }
    *out = sumf;
}

/// Word-broadcast controls for the Q6_K scale pairs: group pair k of a half takes word
/// 2k in the low lane and 2k+1 in the high lane.
const Q6_CTRL: [[u8; 32]; 4] = {
    let mut c = [[0u8; 32]; 4];
    let mut k = 0;
    while k < 4 {
        let mut b = 0;
        while b < 16 {
            c[k][b] = (4 * k + (b & 1)) as u8;
            c[k][16 + b] = (4 * k + 2 + (b & 1)) as u8;
            b += 1;
        }
        k += 1;
    }
    c
};

/// Integer part of Q6_K super-block `x` against `M` tokens' blocks `y(j)`: per token, 8
/// lanes summing to `is` and 8 lanes summing to the offset term `off`.
#[inline(always)]
unsafe fn q6_ints<K: Mac, const M: usize>(
    x: *const u8,
    y: impl Fn(usize) -> *const u8,
    ctrl: &[__m256i; 4],
) -> ([__m256i; M], [__m256i; M]) {
    let (m4, m2) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(3));
    // SAFETY (whole body): x is a whole 210-byte block (ql 128 B @0, qh 64 B @128,
    // scales 16 B @192), y(j) a whole Q8_K block (qs 256 B @4, bsums 32 B @260).
    unsafe {
        let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(x.add(192) as *const __m128i));
        let mut sumi = [_mm256_setzero_si256(); M];
        for half in 0..2 {
            let sch = if half == 0 {
                _mm256_permute2x128_si256(sc16, sc16, 0x00)
            } else {
                _mm256_permute2x128_si256(sc16, sc16, 0x11)
            };
            let q0 = ld(x.add(64 * half));
            let q1 = ld(x.add(64 * half + 32));
            let qh = ld(x.add(128 + 32 * half));
            let low = [
                _mm256_and_si256(q0, m4),
                _mm256_and_si256(q1, m4),
                _mm256_and_si256(_mm256_srli_epi16(q0, 4), m4),
                _mm256_and_si256(_mm256_srli_epi16(q1, 4), m4),
            ];
            let high = [
                _mm256_and_si256(qh, m2),
                _mm256_and_si256(_mm256_srli_epi16(qh, 2), m2),
                _mm256_and_si256(_mm256_srli_epi16(qh, 4), m2),
                _mm256_and_si256(_mm256_srli_epi16(qh, 6), m2),
            ];
            for k in 0..4 {
                let q = _mm256_or_si256(low[k], _mm256_slli_epi16(high[k], 4));
                let scv = _mm256_shuffle_epi8(sch, ctrl[k]);
                for (j, s) in sumi.iter_mut().enumerate() {
                    let yv = ld(y(j).add(Q8_K_QS + 128 * half + 32 * k));
                    *s = K::mac_scaled(*s, q, yv, scv);
                }
            }
        }
        let mut offv = [_mm256_setzero_si256(); M];
        for (j, o) in offv.iter_mut().enumerate() {
            *o = _mm256_madd_epi16(ld(y(j).add(Q8_K_BSUMS)), sc16);
        }
        (sumi, offv)
    }
}

/// Q6_K against Q8_K. One token (decode): two super-blocks share one reduction.
#[inline(always)]
pub unsafe fn tile_q6_k<K: Mac, const M: usize>(
    nb: usize,
    w: *const u8,
    a: *const u8,
    stride: usize,
    out: &mut [f32; M],
) {
    // SAFETY: the tables are 32 readable bytes each.
    let ctrl: [__m256i; 4] = core::array::from_fn(|k| unsafe { ld(Q6_CTRL[k].as_ptr()) });
    let mut sumf = [0f32; M];
    let step = |sumf: &mut f32, x: *const u8, yb: *const u8, is: i32, off: i32| {
        // SAFETY: x is a whole Q6_K block, yb a whole Q8_K block.
        let (dw, yd) = unsafe { (f16(x.add(208)), f32_at(yb)) };
        *sumf += dw * yd * (is - 32 * off) as f32;
    };
    let mut i = 0;
    if M == 1 {
        while i + 2 <= nb {
            // SAFETY: blocks i and i + 1 exist for the weights and the token.
            unsafe {
                let (x0, x1) = (w.add(i * Q6_K_BYTES), w.add((i + 1) * Q6_K_BYTES));
                let (y0, y1) = (a.add(i * Q8_K_BYTES), a.add((i + 1) * Q8_K_BYTES));
                let (s0, o0) = q6_ints::<K, 1>(x0, |_| y0, &ctrl);
                let (s1, o1) = q6_ints::<K, 1>(x1, |_| y1, &ctrl);
                let r = reduce4([s0[0], o0[0], s1[0], o1[0]]);
                step(&mut sumf[0], x0, y0, r[0], r[1]);
                step(&mut sumf[0], x1, y1, r[2], r[3]);
            }
            i += 2;
        }
    }
    while i < nb {
        // SAFETY: block i of the weights and of every token's activations exist.
        unsafe {
            let x = w.add(i * Q6_K_BYTES);
            let y = |j: usize| a.add(j * stride + i * Q8_K_BYTES);
            let (sumi, offv) = q6_ints::<K, M>(x, y, &ctrl);
            let is = hsums(&sumi);
            let off = hsums(&offv);
            for j in 0..M {
                step(&mut sumf[j], x, y(j), is[j], off[j]);
            }
        }
        i += 1;
    }
    *out = sumf;
}

/// 16 bytes at `p` split into 32 nibbles: low nibbles in bytes 0..16, high in 16..32.
#[inline(always)]
pub(super) unsafe fn nibbles32(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 16 readable bytes at `p`.
    let t = unsafe { _mm_loadu_si128(p as *const __m128i) };
    let b = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
    _mm256_and_si256(b, _mm256_set1_epi8(0x0f))
}

#[inline(always)]
pub(super) unsafe fn table16(t: &[i8; 16]) -> __m256i {
    // SAFETY: the table is 16 readable bytes.
    unsafe { _mm256_broadcastsi128_si256(_mm_loadu_si128(t.as_ptr() as *const __m128i)) }
}

/// IQ4_XS against Q8_K.
#[inline(always)]
pub unsafe fn tile_iq4_xs<K: Mac, const M: usize>(
    nb: usize,
    w: *const u8,
    a: *const u8,
    stride: usize,
    out: &mut [f32; M],
) {
    // SAFETY: reads the 16-byte table.
    let t = unsafe { table16(&KVALUES_IQ4NL) };
    let mut sumf = [0f32; M];
    for i in 0..nb {
        // SAFETY (whole loop body): block i of the weights is 136 bytes at x (d @0,
        // scales_h @2, scales_l 4 B @4, qs 128 B @8); activation block i of token j is
        // Q8_K_BYTES at y(j) (qs 256 B @4).
        unsafe {
            let x = w.add(i * IQ4_XS_BYTES);
            let y = |j: usize| a.add(j * stride + i * Q8_K_BYTES);
            let sh = (x.add(2) as *const u16).read_unaligned() as i32;
            let mut sumi = [_mm256_setzero_si256(); M];
            for ib in 0..8 {
                let lo = ((*x.add(4 + ib / 2) >> (4 * (ib % 2))) & 15) as i32;
                let ls = _mm256_set1_epi16(((lo | (((sh >> (2 * ib)) & 3) << 4)) - 32) as i16);
                let v = _mm256_shuffle_epi8(t, nibbles32(x.add(8 + 16 * ib)));
                let av = _mm256_sign_epi8(v, v);
                for (j, s) in sumi.iter_mut().enumerate() {
                    let yv = ld(y(j).add(Q8_K_QS + 32 * ib));
                    *s = K::mac_scaled(*s, av, _mm256_sign_epi8(yv, v), ls);
                }
            }
            let is = hsums(&sumi);
            let dw = f16(x);
            for j in 0..M {
                sumf[j] += dw * f32_at(y(j)) * is[j] as f32;
            }
        }
    }
    *out = sumf;
}

/// Shared loop of the 32-element formats paired with Q8_0: `ints(block)` gives the 32
/// signed weight integers, `dw(block)` the weight's float scale. Contract (every Q8_0-
/// family kernel, and the scalar `dot_*`): per block the exact integer `sumi` of the 32
/// products, then `sumf += sumi as f32 · (dw · d_a)` in block order, from 0. The integer
/// is order-free and the float steps are one per block, so the 16-row kernels
/// (`x86_pack_q8`, lanes = rows) reproduce it bitwise without per-lane float work.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_32<K: Mac, const M: usize>(
    nb: usize,
    w: *const u8,
    wbytes: usize,
    a: *const u8,
    stride: usize,
    out: &mut [f32; M],
    ints: impl Fn(*const u8) -> __m256i,
    dw: impl Fn(*const u8) -> f32,
) {
    let mut sumf = [0f32; M];
    // below 4 tokens, 4 blocks at a time (one reduction gives a token's 4 block
    // integers); the rest one block at a time, one reduction for the tokens' integers.
    // Plain loops, no closures: those would not inherit the callers' target features.
    let mut i = 0;
    if M < 4 {
        while i + 4 <= nb {
            let (mut q, mut aq, mut d) = ([_mm256_setzero_si256(); 4], [_mm256_setzero_si256(); 4], [0f32; 4]);
            // SAFETY (whole block): blocks i..i + 4 of the weights are `wbytes` each at w
            // (`ints`/`dw` read inside them); activation block i of token j is 34 bytes
            // at a + j·stride + 34·i (d @0, qs @2).
            unsafe {
                for b in 0..4 {
                    let x = w.add((i + b) * wbytes);
                    q[b] = ints(x);
                    aq[b] = _mm256_sign_epi8(q[b], q[b]);
                    d[b] = dw(x);
                }
                for (j, sf) in sumf.iter_mut().enumerate() {
                    let y = a.add(j * stride + i * Q8_0_BYTES);
                    let mut v = [_mm256_setzero_si256(); 4];
                    for b in 0..4 {
                        v[b] = K::dot4(aq[b], _mm256_sign_epi8(ld(y.add(b * Q8_0_BYTES + 2)), q[b]));
                    }
                    let is = hsums(&v);
                    for b in 0..4 {
                        *sf += is[b] as f32 * (d[b] * f16(y.add(b * Q8_0_BYTES)));
                    }
                }
            }
            i += 4;
        }
    }
    while i < nb {
        // SAFETY: as above, block i.
        unsafe {
            let x = w.add(i * wbytes);
            let q = ints(x);
            let aq = _mm256_sign_epi8(q, q);
            let d = dw(x);
            let mut sumi = [_mm256_setzero_si256(); M];
            for (j, si) in sumi.iter_mut().enumerate() {
                *si = K::dot4(aq, _mm256_sign_epi8(ld(a.add(j * stride + i * Q8_0_BYTES + 2)), q));
            }
            let is = hsums(&sumi);
            for (j, sf) in sumf.iter_mut().enumerate() {
                *sf += is[j] as f32 * (d * f16(a.add(j * stride + i * Q8_0_BYTES)));
            }
        }
        i += 1;
    }
    *out = sumf;
}

#[inline(always)]
pub unsafe fn tile_q8_0<K: Mac, const M: usize>(
    nb: usize,
    w: *const u8,
    a: *const u8,
    s: usize,
    o: &mut [f32; M],
) {
    // SAFETY: Q8_0 blocks hold d @0 and 32 quants @2.
    unsafe { tile_32::<K, M>(nb, w, Q8_0_BYTES, a, s, o, |p| ld(p.add(2)), |p| f16(p)) }
}

#[inline(always)]
pub unsafe fn tile_q4_0<K: Mac, const M: usize>(
    nb: usize,
    w: *const u8,
    a: *const u8,
    s: usize,
    o: &mut [f32; M],
) {
    let eight = _mm256_set1_epi8(8);
    // SAFETY: Q4_0 blocks hold d @0 and 16 nibble bytes @2.
    unsafe {
        tile_32::<K, M>(
            nb,
            w,
            Q4_0_BYTES,
            a,
            s,
            o,
            |p| _mm256_sub_epi8(nibbles32(p.add(2)), eight),
            |p| f16(p),
        )
    }
}

#[inline(always)]
pub unsafe fn tile_mxfp4<K: Mac, const M: usize>(
    nb: usize,
    w: *const u8,
    a: *const u8,
    s: usize,
    o: &mut [f32; M],
) {
    // SAFETY: reads the 16-byte table; MXFP4 blocks hold e @0 and 16 nibble bytes @1.
    unsafe {
        let t = table16(&KVALUES_MXFP4);
        tile_32::<K, M>(
            nb,
            w,
            MXFP4_BYTES,
            a,
            s,
            o,
            |p| _mm256_shuffle_epi8(t, nibbles32(p.add(1))),
            |p| e8m0_to_f32_half(*p),
        )
    }
}

#[inline(always)]
pub unsafe fn tile_iq4_nl<K: Mac, const M: usize>(
    nb: usize,
    w: *const u8,
    a: *const u8,
    s: usize,
    o: &mut [f32; M],
) {
    // SAFETY: reads the 16-byte table; IQ4_NL blocks hold d @0 and 16 nibble bytes @2.
    unsafe {
        let t = table16(&KVALUES_IQ4NL);
        tile_32::<K, M>(
            nb,
            w,
            IQ4_NL_BYTES,
            a,
            s,
            o,
            |p| _mm256_shuffle_epi8(t, nibbles32(p.add(2))),
            |p| f16(p),
        )
    }
}

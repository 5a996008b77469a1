//! AVX2 + FMA + F16C kernels (x86_64), chosen at run time (detected once, cached).
//!
//! This file: the dispatcher, shared helpers, the float types (F32 / F16 / BF16) and the
//! activation quantizers (F16, BF16, Q8_0, Q8_K). The quantized dot products live in
//! `x86_k.rs`. Every kernel has a scalar twin in the parent module, and
//! `tests/quant_dot.rs` checks them against each other.

use super::q8::{Q8_0_BYTES, Q8_K_BSUMS, Q8_K_BYTES, Q8_K_QS};
use super::x86_block;
use crate::GgmlType;
use std::arch::x86_64::*;
use std::sync::atomic::{AtomicU8, Ordering};

static HAS: AtomicU8 = AtomicU8::new(0);
static VNNI: AtomicU8 = AtomicU8::new(0);

/// AVX-512 F/BW/VL + VNNI present (on top of `has_avx2`; detected once). Setting
/// `PN_NO_AVX512` keeps the AVX2 kernels.
pub fn has_vnni() -> bool {
    detected_once(&VNNI, || {
        has_avx2()
            && std::env::var_os("PN_NO_AVX512").is_none()
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512vnni")
    })
}

static AVX512F: AtomicU8 = AtomicU8::new(0);
static GFNI: AtomicU8 = AtomicU8::new(0);

/// AVX-512F present (on top of `has_avx2`; detected once); `PN_NO_AVX512` says no.
pub fn has_avx512f() -> bool {
    detected_once(&AVX512F, || has_avx2() && std::env::var_os("PN_NO_AVX512").is_none() && is_x86_feature_detected!("avx512f"))
}

/// GFNI present beside [`has_vnni`] (detected once): the 16-row kernels decode codes
/// with `vgf2p8affineqb`. Setting `PN_NO_GFNI` keeps the shift-and-mask decode.
pub fn has_gfni() -> bool {
    detected_once(&GFNI, || has_vnni() && std::env::var_os("PN_NO_GFNI").is_none() && is_x86_feature_detected!("gfni"))
}

/// AVX2, FMA and F16C all present (detected once; 1 = no, 2 = yes). Setting the
/// environment variable `PN_NO_SIMD` forces the scalar kernels.
pub fn has_avx2() -> bool {
    detected_once(&HAS, || {
        std::env::var_os("PN_NO_SIMD").is_none()
            && is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    })
}

/// `detect()` once, its answer cached in `flag` (0 = not yet, 1 = no, 2 = yes): the CPU
/// feature switches, read on every kernel call.
#[inline]
pub(super) fn detected_once(flag: &AtomicU8, detect: impl FnOnce() -> bool) -> bool {
    match flag.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => {
            let ok = detect();
            flag.store(if ok { 2 } else { 1 }, Ordering::Relaxed);
            ok
        }
    }
}

/// The SIMD dot product for `w_ty`, or `None` when there is none (or no AVX2). The
/// caller (`try_vec_dot`) has checked that `w` and `a` hold exactly the `n`-element rows.
pub fn vec_dot(w_ty: GgmlType, n: usize, w: &[u8], a: &[u8]) -> Option<f32> {
    use GgmlType::*;
    if !has_avx2() {
        return None;
    }
    debug_assert_eq!(Some(w.len()), w_ty.row_bytes(n));
    debug_assert_eq!(Some(a.len()), super::vec_dot_type(w_ty).row_bytes(n));
    // SAFETY: AVX2/FMA/F16C were detected above; every kernel reads only the `n`
    // elements' blocks, and the caller checked `w`/`a` hold exactly that many bytes.
    unsafe {
        Some(match w_ty {
            F32 => dot_f32(n, w, a),
            F16 => dot_f16(n, w, a),
            BF16 => dot_bf16(n, w, a),
            _ if has_tile(w_ty) => {
                let mut o = [0f32; 1];
                x86_block::vec_dot_block(w_ty, n, w, 0, 1, a, 0, 1, &mut o, 1);
                o[0]
            }
            _ => return None,
        })
    }
}

/// Whether `w_ty` has a multi-token tile kernel (`vec_dot_tile`).
pub fn has_tile(w_ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(w_ty, Q8_0 | Q4_0 | MXFP4 | IQ4NL | IQ4XS | Q4K | Q5K | Q6K)
}

/// Prefetches the line at `p` into L2 (hint T1; a prefetch never faults): how the 16-row
/// kernels (`x86_fused16`, `x86_pack16`, `x86_pack_q8`, `x86_amx`) stream the next rows'
/// weights while they compute. Measured (`moe_bench`, Xeon 6/207, 2 threads, weights
/// streamed, calls alternated, best of; T1 vs T0): one token Q6_K 2048×8192 0.640 → 0.560
/// ms, Q4_K 4096×2048 0.256 → 0.242, Q8_0 4096×2048 0.493 → 0.455, MoeExperts (256
/// experts) 0.765 → 0.721; two tokens 3–6% faster; from 4 tokens (compute-bound) level.
/// The per-row path's prefetch (`x86_block::prefetch_row`) stays T0: there T1 was slower.
#[inline(always)]
pub(super) fn prefetch_l2(p: *const u8) {
    // SAFETY: a prefetch is a hint: it never faults, whatever the address.
    unsafe { _mm_prefetch::<_MM_HINT_T1>(p as *const i8) }
}

/// [`prefetch_l2`] of every 64-byte line of bytes `from..to` at `at` (the window of the
/// next rows' weights a kernel step takes on).
#[inline(always)]
pub(super) fn prefetch_l2_range(at: *const u8, from: usize, to: usize) {
    let mut off = from;
    while off < to {
        prefetch_l2(at.wrapping_add(off));
        off += 64;
    }
}

/// Block `i`'s share (of `nb`) of the bytes `pf` (pointer, length) to prefetch, so the
/// next rows' loads stay in flight through the pass without a burst: into L2 (`L2`, hint
/// T1: the 16-row and Q8_0-activation kernels, see [`prefetch_l2`]) or into L1 (T0: the
/// AVX2 8-row packed kernels, `x86_pack8`, `x86_pack8x2`).
#[inline(always)]
pub(super) fn prefetch_share<const L2: bool>(pf: Option<(*const u8, usize)>, nb: usize, i: usize) {
    let Some((at, len)) = pf else { return };
    let per_block = len.div_ceil(nb).next_multiple_of(64);
    let mut off = i * per_block;
    while off < ((i + 1) * per_block).min(len) {
        if L2 {
            prefetch_l2(at.wrapping_add(off));
        } else {
            // SAFETY: a prefetch is a hint: it never faults, whatever the address.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(off) as *const i8) };
        }
        off += 64;
    }
}

/// Horizontal sum of 8 f32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn hsum_ps(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Horizontal max of 8 f32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hmax_ps(v: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_movehdup_ps(m));
    _mm_cvtss_f32(m)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f32(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (pw, pa) = (w.as_ptr() as *const f32, a.as_ptr() as *const f32);
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (k, c) in acc.iter_mut().enumerate() {
            // SAFETY: i + 8k + 8 <= n elements; unaligned loads.
            let x = unsafe { _mm256_loadu_ps(pw.add(i + 8 * k)) };
            // SAFETY: as for the line above.
            let y = unsafe { _mm256_loadu_ps(pa.add(i + 8 * k)) };
            *c = _mm256_fmadd_ps(x, y, *c);
        }
        i += 32;
    }
    // SAFETY: AVX2/FMA enabled here; i = the elements the loop above consumed.
    unsafe { dot_f32_tail(acc, i, n, w, a) }
}

/// The rest of [`dot_f32`] after its 32-element steps (`acc`: the four accumulators,
/// lane l of `acc[k]` the sum of elements 32s + 8k + l; `i`: the elements done): the
/// 8-element steps into `acc[0]`, the reduction, the scalar tail. The multi-token F32
/// kernel (`x86_f32`) ends every pair here, so it is bitwise this function.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_f32_tail(mut acc: [__m256; 4], mut i: usize, n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (pw, pa) = (w.as_ptr() as *const f32, a.as_ptr() as *const f32);
    while i + 8 <= n {
        // SAFETY: i + 8 <= n elements.
        let (x, y) = unsafe { (_mm256_loadu_ps(pw.add(i)), _mm256_loadu_ps(pa.add(i))) };
        acc[0] = _mm256_fmadd_ps(x, y, acc[0]);
        i += 8;
    }
    let mut s = hsum_ps(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[1]),
        _mm256_add_ps(acc[2], acc[3]),
    ));
    for j in i..n {
        s += super::rd_f32(w, 4 * j) * super::rd_f32(a, 4 * j);
    }
    s
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f16(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (pw, pa) = (w.as_ptr(), a.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (k, c) in acc.iter_mut().enumerate() {
            // SAFETY: elements i+8k .. i+8k+8 (16 bytes each) are inside both rows.
            let x = _mm256_cvtph_ps(unsafe {
                _mm_loadu_si128(pw.add(2 * (i + 8 * k)) as *const __m128i)
            });
            // SAFETY: as for the line above.
            let y = _mm256_cvtph_ps(unsafe {
                _mm_loadu_si128(pa.add(2 * (i + 8 * k)) as *const __m128i)
            });
            *c = _mm256_fmadd_ps(x, y, *c);
        }
        i += 32;
    }
    while i + 8 <= n {
        // SAFETY: elements i .. i+8 are inside both rows.
        let x = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(pw.add(2 * i) as *const __m128i) });
        // SAFETY: as for the line above.
        let y = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(pa.add(2 * i) as *const __m128i) });
        acc[0] = _mm256_fmadd_ps(x, y, acc[0]);
        i += 8;
    }
    let mut s = hsum_ps(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[1]),
        _mm256_add_ps(acc[2], acc[3]),
    ));
    for j in i..n {
        s += super::rd_f16(w, 2 * j) * super::rd_f16(a, 2 * j);
    }
    s
}

/// 8 bf16 values at `p` widened to f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load_bf16(p: *const u8) -> __m256 {
    // SAFETY: the caller guarantees 16 readable bytes at `p`.
    let h = unsafe { _mm_loadu_si128(p as *const __m128i) };
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_bf16(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (pw, pa) = (w.as_ptr(), a.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (k, c) in acc.iter_mut().enumerate() {
            // SAFETY: elements i+8k .. i+8k+8 are inside both rows.
            let (x, y) = unsafe {
                (
                    load_bf16(pw.add(2 * (i + 8 * k))),
                    load_bf16(pa.add(2 * (i + 8 * k))),
                )
            };
            *c = _mm256_fmadd_ps(x, y, *c);
        }
        i += 32;
    }
    while i + 8 <= n {
        // SAFETY: elements i .. i+8 are inside both rows.
        let (x, y) = unsafe { (load_bf16(pw.add(2 * i)), load_bf16(pa.add(2 * i))) };
        acc[0] = _mm256_fmadd_ps(x, y, acc[0]);
        i += 8;
    }
    let mut s = hsum_ps(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[1]),
        _mm256_add_ps(acc[2], acc[3]),
    ));
    let bf = |b: &[u8], j: usize| super::floats::bf16_bits_to_f32(super::rd_u16(b, 2 * j));
    for j in i..n {
        s += bf(w, j) * bf(a, j);
    }
    s
}

/// F16 row -> f32 (exact). Returns false when AVX2/F16C is missing.
pub fn dequant_f16(src: &[u8], out: &mut [f32]) -> bool {
    if !has_avx2() || src.len() != 2 * out.len() {
        return false;
    }
    // SAFETY: features detected above; lengths checked above.
    unsafe { dequant_f16_avx(src, out) };
    true
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dequant_f16_avx(src: &[u8], out: &mut [f32]) {
    let n = out.len();
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: 16 bytes of src at 2i and 8 floats of out at i are in bounds (i + 8 <= n).
        unsafe {
            let h = _mm_loadu_si128(src.as_ptr().add(2 * i) as *const __m128i);
            _mm256_storeu_ps(out.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
        }
        i += 8;
    }
    for j in i..n {
        out[j] = super::rd_f16(src, 2 * j);
    }
}

/// F16 values (as u16 bits) -> f32, F16C (exact, as the scalar conversion).
pub fn f16_bits_to_f32_row(src: &[u16], out: &mut [f32]) -> bool {
    // SAFETY: `src` holds out.len() values (checked).
    src.len() == out.len() && unsafe { f16_ptr_to_f32_row(src.as_ptr(), out) }
}

/// Little-endian f16 bytes (a KV cell) -> f32, F16C (exact, as the scalar conversion).
pub fn f16_bytes_to_f32_row(src: &[u8], out: &mut [f32]) -> bool {
    // SAFETY: `src` holds 2·out.len() bytes (checked); reads are unaligned loads.
    src.len() == 2 * out.len() && unsafe { f16_ptr_to_f32_row(src.as_ptr() as *const u16, out) }
}

/// # Safety
/// `src` must point to `out.len()` f16 values (any alignment).
unsafe fn f16_ptr_to_f32_row(src: *const u16, out: &mut [f32]) -> bool {
    if !has_avx2() {
        return false;
    }
    let n = out.len();
    // SAFETY: features detected above; 8 values at i and 8 floats at i exist (i + 8 <= n).
    unsafe {
        let mut i = 0;
        while i + 8 <= n {
            cvt8(src.add(i), out.as_mut_ptr().add(i));
            i += 8;
        }
        for j in i..n {
            out[j] = super::floats::f16_bits_to_f32(src.add(j).read_unaligned());
        }
    }
    true
}

#[target_feature(enable = "avx2,f16c")]
unsafe fn cvt8(src: *const u16, out: *mut f32) {
    // SAFETY: the caller guarantees 8 values at src and 8 floats at out.
    unsafe { _mm256_storeu_ps(out, _mm256_cvtph_ps(_mm_loadu_si128(src as *const __m128i))) }
}

/// Q4_0 blocks -> f32 (`(q − 8)·d`, the scalar formula: exact int to float, one product).
pub fn dequant_q4_0(src: &[u8], out: &mut [f32]) -> bool {
    if !has_avx2() || src.len() / super::legacy::Q4_0_BYTES * 32 != out.len() {
        return false;
    }
    // SAFETY: features detected; lengths checked above.
    unsafe {
        if has_avx512f() {
            dequant_q4_0_avx512(src, out)
        } else {
            dequant_q4_0_avx(src, out)
        }
    };
    true
}

/// A block's f16 scale as f32 through F16C (exact, as the scalar conversion).
#[inline(always)]
unsafe fn block_d(b: &[u8]) -> f32 {
    // SAFETY: the callers enable F16C; b holds the 2-byte scale.
    unsafe { _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(super::rd_u16(b, 0) as i32))) }
}

#[target_feature(enable = "avx2,f16c")]
unsafe fn dequant_q4_0_avx(src: &[u8], out: &mut [f32]) {
    let m4 = _mm_set1_epi8(0x0f);
    let eight = _mm256_set1_epi32(8);
    for (b, o) in src.chunks_exact(super::legacy::Q4_0_BYTES).zip(out.chunks_exact_mut(32)) {
        // SAFETY: b is one 18-byte block, o 32 floats.
        unsafe {
            let d = _mm256_set1_ps(block_d(b));
            let q = _mm_loadu_si128(b.as_ptr().add(2) as *const __m128i);
            let (lo, hi) = (_mm_and_si128(q, m4), _mm_and_si128(_mm_srli_epi16(q, 4), m4));
            for (k, v) in [lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)].into_iter().enumerate() {
                let i = _mm256_sub_epi32(_mm256_cvtepu8_epi32(v), eight);
                _mm256_storeu_ps(o.as_mut_ptr().add(8 * k), _mm256_mul_ps(_mm256_cvtepi32_ps(i), d));
            }
        }
    }
}

/// [`dequant_q4_0_avx`] 16 values a vector (the same `(q − 8)·d`, one rounding).
#[target_feature(enable = "avx2,f16c,avx512f")]
unsafe fn dequant_q4_0_avx512(src: &[u8], out: &mut [f32]) {
    let m4 = _mm_set1_epi8(0x0f);
    let eight = _mm512_set1_epi32(8);
    for (b, o) in src.chunks_exact(super::legacy::Q4_0_BYTES).zip(out.chunks_exact_mut(32)) {
        // SAFETY: b is one 18-byte block, o 32 floats.
        unsafe {
            let d = _mm512_set1_ps(block_d(b));
            let q = _mm_loadu_si128(b.as_ptr().add(2) as *const __m128i);
            for (k, v) in [_mm_and_si128(q, m4), _mm_and_si128(_mm_srli_epi16(q, 4), m4)].into_iter().enumerate() {
                let i = _mm512_sub_epi32(_mm512_cvtepu8_epi32(v), eight);
                _mm512_storeu_ps(o.as_mut_ptr().add(16 * k), _mm512_mul_ps(_mm512_cvtepi32_ps(i), d));
            }
        }
    }
}

/// f32 row -> F16 (round to nearest even, as `_mm256_cvtps_ph(x, 0)`).
pub fn quantize_f16(x: &[f32], out: &mut [u8]) -> bool {
    if !has_avx2() || out.len() != 2 * x.len() {
        return false;
    }
    // SAFETY: features detected above; lengths checked above.
    unsafe { quantize_f16_avx(x, out) };
    true
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_f16_avx(x: &[f32], out: &mut [u8]) {
    let n = x.len();
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: 8 floats at i and 16 bytes of out at 2i are in bounds (i + 8 <= n).
        unsafe {
            let h = _mm256_cvtps_ph(
                _mm256_loadu_ps(x.as_ptr().add(i)),
                _MM_FROUND_TO_NEAREST_INT,
            );
            _mm_storeu_si128(out.as_mut_ptr().add(2 * i) as *mut __m128i, h);
        }
        i += 8;
    }
    super::floats::quantize_f16_scalar(&x[i..], &mut out[2 * i..]);
}

/// f32 row -> BF16 (ggml rounding: NaN quieted, otherwise round to nearest even).
pub fn quantize_bf16(x: &[f32], out: &mut [u8]) -> bool {
    if !has_avx2() || out.len() != 2 * x.len() {
        return false;
    }
    // SAFETY: features detected above; lengths checked above.
    unsafe { quantize_bf16_avx(x, out) };
    true
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_bf16_avx(x: &[f32], out: &mut [u8]) {
    let n = x.len();
    let mut i = 0;
    let (abs_mask, inf, one, bias, quiet) = (
        _mm256_set1_epi32(0x7fff_ffff),
        _mm256_set1_epi32(0x7f80_0000),
        _mm256_set1_epi32(1),
        _mm256_set1_epi32(0x7fff),
        _mm256_set1_epi32(64),
    );
    while i + 16 <= n {
        let mut halves = [_mm256_setzero_si256(); 2];
        for (k, h) in halves.iter_mut().enumerate() {
            // SAFETY: 8 floats at i + 8k are in bounds (i + 16 <= n).
            let u = _mm256_castps_si256(unsafe { _mm256_loadu_ps(x.as_ptr().add(i + 8 * k)) });
            let odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
            let rne = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(bias, odd)), 16);
            let nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
            let qn = _mm256_or_si256(_mm256_srli_epi32(u, 16), quiet);
            *h = _mm256_blendv_epi8(rne, qn, nan);
        }
        // values are <= 0xffff, so the unsigned saturation of packus is exact
        let p = _mm256_permute4x64_epi64(_mm256_packus_epi32(halves[0], halves[1]), 0b11_01_10_00);
        // SAFETY: 32 bytes of out at 2i are in bounds (i + 16 <= n).
        unsafe { _mm256_storeu_si256(out.as_mut_ptr().add(2 * i) as *mut __m256i, p) };
        i += 16;
    }
    super::floats::quantize_bf16_scalar(&x[i..], &mut out[2 * i..]);
}

/// max |x| of 32 floats at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn amax32(p: *const f32) -> (f32, [__m256; 4]) {
    let sign = _mm256_set1_ps(-0.0);
    // SAFETY: the caller guarantees 32 readable floats at `p`.
    let v = unsafe {
        [
            _mm256_loadu_ps(p),
            _mm256_loadu_ps(p.add(8)),
            _mm256_loadu_ps(p.add(16)),
            _mm256_loadu_ps(p.add(24)),
        ]
    };
    let m = _mm256_max_ps(
        _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
        _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])),
    );
    (hmax_ps(m), v)
}

/// Packs 32 i32 lanes (already in i8 range or saturated) into 32 i8 in element order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pack_i8(i: [__m256i; 4]) -> __m256i {
    let a = _mm256_packs_epi32(i[0], i[1]);
    let b = _mm256_packs_epi32(i[2], i[3]);
    let p = _mm256_packs_epi16(a, b);
    _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

/// f32 row -> Q8_0 as ggml's AVX `quantize_row_q8_0`.
pub fn quantize_q8_0(x: &[f32], out: &mut [u8]) -> bool {
    if !has_avx2() || !x.len().is_multiple_of(32) || out.len() != x.len() / 32 * Q8_0_BYTES {
        return false;
    }
    // SAFETY: features detected above; lengths checked above.
    unsafe { quantize_q8_0_avx(x, out) };
    true
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_q8_0_avx(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(32).zip(out.chunks_exact_mut(Q8_0_BYTES)) {
        // SAFETY: xb holds 32 floats.
        let (amax, v) = unsafe { amax32(xb.as_ptr()) };
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mul = _mm256_set1_ps(id);
        let q: [__m256i; 4] = core::array::from_fn(|k| {
            let r = _mm256_round_ps(
                _mm256_mul_ps(v[k], mul),
                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
            );
            _mm256_cvtps_epi32(r)
        });
        let p = pack_i8(q);
        super::wr_f16(ob, 0, d);
        // SAFETY: ob[2..34] is 32 writable bytes.
        unsafe { _mm256_storeu_si256(ob.as_mut_ptr().add(2) as *mut __m256i, p) };
    }
}

/// f32 row -> Q8_K exactly as `quantize_row_q8_K_ref`.
pub fn quantize_q8_k(x: &[f32], out: &mut [u8]) -> bool {
    if !has_avx2() || !x.len().is_multiple_of(256) || out.len() != x.len() / 256 * Q8_K_BYTES {
        return false;
    }
    // SAFETY: features detected above; lengths checked above.
    unsafe { quantize_q8_k_avx(x, out) };
    true
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_q8_k_avx(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(256).zip(out.chunks_exact_mut(Q8_K_BYTES)) {
        let mut amax = 0f32;
        for c in xb.chunks_exact(32) {
            // SAFETY: c holds 32 floats.
            amax = amax.max(unsafe { amax32(c.as_ptr()) }.0);
        }
        if amax == 0.0 || amax.is_nan() {
            // (NaN inputs: defer to the scalar reference, whatever it does)
            super::q8::quantize_q8_k_scalar(xb, ob);
            continue;
        }
        // the signed value of the first element with the largest |x| (strict `>` in ggml)
        let max = *xb.iter().find(|v| v.abs() == amax).unwrap_or(&amax);
        let iscale = -127.0f32 / max;
        let (mul, magic) = (_mm256_set1_ps(iscale), _mm256_set1_ps(12582912.0));
        let (mant, off, top) = (
            _mm256_set1_epi32(0x007f_ffff),
            _mm256_set1_epi32(0x0040_0000),
            _mm256_set1_epi32(127),
        );
        for (c, qo) in xb
            .chunks_exact(32)
            .zip(ob[Q8_K_QS..Q8_K_QS + 256].chunks_exact_mut(32))
        {
            let q: [__m256i; 4] = core::array::from_fn(|k| {
                // SAFETY: c holds 32 floats.
                let v = unsafe { _mm256_loadu_ps(c.as_ptr().add(8 * k)) };
                // nearest_int: (bits(x·iscale + 1.5·2^23) & 0x7fffff) − 0x400000, then min 127
                let t = _mm256_castps_si256(_mm256_add_ps(_mm256_mul_ps(v, mul), magic));
                _mm256_min_epi32(_mm256_sub_epi32(_mm256_and_si256(t, mant), off), top)
            });
            // SAFETY: qo is 32 writable bytes.
            unsafe { _mm256_storeu_si256(qo.as_mut_ptr() as *mut __m256i, pack_i8(q)) };
        }
        // bsums: sums of 16 via sad on the biased bytes (q + 128)
        for g in 0..8 {
            // SAFETY: 32 bytes of qs at 32g are in bounds.
            let q =
                unsafe { _mm256_loadu_si256(ob.as_ptr().add(Q8_K_QS + 32 * g) as *const __m256i) };
            let s = _mm256_sad_epu8(
                _mm256_xor_si256(q, _mm256_set1_epi8(-128)),
                _mm256_setzero_si256(),
            );
            let mut l = [0u64; 4];
            // SAFETY: l is 32 writable bytes.
            unsafe { _mm256_storeu_si256(l.as_mut_ptr() as *mut __m256i, s) };
            for h in 0..2 {
                let v = (l[2 * h] + l[2 * h + 1]) as i32 - 16 * 128;
                let o = Q8_K_BSUMS + 2 * (2 * g + h);
                ob[o..o + 2].copy_from_slice(&(v as i16).to_le_bytes());
            }
        }
        ob[0..4].copy_from_slice(&(1.0f32 / iscale).to_le_bytes());
    }
}

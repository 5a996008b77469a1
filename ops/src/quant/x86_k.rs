//! (Test oracle only.) The previous AVX2 dot products of Q4_K, Q5_K, Q6_K, IQ4_XS (with
//! Q8_K activations). (The Q8_0-activation formats' kernels are bitwise their scalar
//! `dot_*`: that is their oracle.)
//!
//! All functions are `unsafe` with `#[target_feature(enable = "avx2,fma,f16c")]`:
//! callers must have detected those features and must pass rows of exactly `nb` blocks
//! (`x86::vec_dot` does both). Integer inner sums are exact (the `maddubs` operands are
//! bounded so the i16 pair sums cannot saturate for activations produced by
//! `quantize_row`, whose |q| <= 127). The K-quants reduce each super-block to one exact
//! integer and then apply the same float formula as the scalar kernels.

use super::iq4::{iq4_xs_scale, IQ4_XS_BYTES, KVALUES_IQ4NL};
use super::k_quants::{scale_min_k4, Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES};
use super::q8::{Q8K, Q8_K_BYTES};
use std::arch::x86_64::*;

/// f16 bits -> f32 with F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16c(b: &[u8], off: usize) -> f32 {
    let bits = u16::from_le_bytes([b[off], b[off + 1]]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// 32 bytes at `p` (unaligned).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load32(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 32 readable bytes at `p`.
    unsafe { _mm256_loadu_si256(p as *const __m256i) }
}

/// 16 bytes at `p` split into 32 nibbles: low nibbles in bytes 0..16, high in 16..32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibbles32(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 16 readable bytes at `p`.
    let t = unsafe { _mm_loadu_si128(p as *const __m128i) };
    let b = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
    _mm256_and_si256(b, _mm256_set1_epi8(0x0f))
}

/// Σ of signed i8 products, as 8 i32 lanes (pairs summed via the sign trick).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn mul_sum_i8(x: __m256i, y: __m256i) -> __m256i {
    let ax = _mm256_sign_epi8(x, x);
    let sy = _mm256_sign_epi8(y, x);
    _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1))
}

/// Horizontal sum of 8 i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum_epi32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    _mm_cvtsi128_si32(s)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_iq4_xs(nb: usize, w: &[u8], a: &[u8]) -> f32 {
    // SAFETY: the table is 16 readable bytes.
    let t = unsafe {
        _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i))
    };
    let mut sumf = 0f32;
    for i in 0..nb {
        let (x, yb) = (
            &w[i * IQ4_XS_BYTES..(i + 1) * IQ4_XS_BYTES],
            &a[i * Q8_K_BYTES..(i + 1) * Q8_K_BYTES],
        );
        let mut sumi = _mm256_setzero_si256();
        for ib in 0..8 {
            // SAFETY: qs (128 bytes at 8) and the activation qs (256 bytes at 4) are in
            // their blocks: 8 + 16·7 + 16 <= 136 and 4 + 32·7 + 32 <= 292.
            let (v, y) = unsafe {
                (
                    _mm256_shuffle_epi8(t, nibbles32(x.as_ptr().add(8 + 16 * ib))),
                    load32(yb.as_ptr().add(4 + 32 * ib)),
                )
            };
            let p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(v, v), _mm256_sign_epi8(y, v));
            let ls = _mm256_set1_epi16(iq4_xs_scale(x, ib) as i16);
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p16, ls));
        }
        let y = Q8K::new(yb);
        // SAFETY: features enabled here.
        let (is, dw) = unsafe { (hsum_epi32(sumi), f16c(x, 0)) };
        sumf += dw * y.d * is as f32;
    }
    sumf
}

/// Σ_sub sc_sub · Σ q·q8 of a Q4_K / Q5_K super-block (q from `qs`, plus the 5th bit
/// from `qh` when given).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q45_isum(qs: *const u8, qh: Option<*const u8>, y: *const u8, sc: &[u8; 8]) -> i32 {
    let m4 = _mm256_set1_epi8(0x0f);
    let sixteen = _mm256_set1_epi8(16);
    // SAFETY: the caller guarantees 32 readable bytes of qh.
    let hv = qh.map(|p| unsafe { load32(p) });
    let mut sumi = _mm256_setzero_si256();
    for c in 0..4 {
        // SAFETY: the caller guarantees 128 bytes of qs and 256 bytes of y.
        let (q, ylo, yhi) = unsafe {
            (
                load32(qs.add(32 * c)),
                load32(y.add(64 * c)),
                load32(y.add(64 * c + 32)),
            )
        };
        let mut lo = _mm256_and_si256(q, m4);
        let mut hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        if let Some(h) = hv {
            let (ml, mh) = (
                _mm256_set1_epi8((1u8 << (2 * c)) as i8),
                _mm256_set1_epi8((1u8 << (2 * c + 1)) as i8),
            );
            lo = _mm256_or_si256(
                lo,
                _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(h, ml), ml), sixteen),
            );
            hi = _mm256_or_si256(
                hi,
                _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(h, mh), mh), sixteen),
            );
        }
        let plo = _mm256_madd_epi16(
            _mm256_maddubs_epi16(lo, ylo),
            _mm256_set1_epi16(sc[2 * c] as i16),
        );
        let phi = _mm256_madd_epi16(
            _mm256_maddubs_epi16(hi, yhi),
            _mm256_set1_epi16(sc[2 * c + 1] as i16),
        );
        sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(plo, phi));
    }
    hsum_epi32(sumi)
}

#[inline(always)]
unsafe fn dot_q45(nb: usize, w: &[u8], a: &[u8], wbytes: usize, five: bool) -> f32 {
    let mut sumf = 0f32;
    for i in 0..nb {
        let (x, yb) = (
            &w[i * wbytes..(i + 1) * wbytes],
            &a[i * Q8_K_BYTES..(i + 1) * Q8_K_BYTES],
        );
        let y = Q8K::new(yb);
        let (mut sc, mut summ) = ([0u8; 8], 0i32);
        for (s, v) in sc.iter_mut().enumerate() {
            let (c, m) = scale_min_k4(s, &x[4..16]);
            *v = c;
            summ += m as i32 * (y.bsum(2 * s) + y.bsum(2 * s + 1));
        }
        let (qs, qh) = if five { (48, Some(16)) } else { (16, None) };
        // SAFETY: Q4_K: qs is 128 bytes at 16 (16 + 128 = 144); Q5_K: qh is 32 bytes at
        // 16 and qs 128 bytes at 48 (48 + 128 = 176); the activation qs is 256 bytes
        // at 4. The features are enabled in both callers.
        let is = unsafe {
            q45_isum(
                x.as_ptr().add(qs),
                qh.map(|o| x.as_ptr().add(o)),
                yb.as_ptr().add(4),
                &sc,
            )
        };
        // SAFETY: as above.
        let (d, dmin) = unsafe { (f16c(x, 0) * y.d, f16c(x, 2) * y.d) };
        sumf += d * is as f32 - dmin * summ as f32;
    }
    sumf
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q4_k(nb: usize, w: &[u8], a: &[u8]) -> f32 {
    // SAFETY: features enabled here; rows of nb blocks guaranteed by the caller.
    unsafe { dot_q45(nb, w, a, Q4_K_BYTES, false) }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q5_k(nb: usize, w: &[u8], a: &[u8]) -> f32 {
    // SAFETY: features enabled here; rows of nb blocks guaranteed by the caller.
    unsafe { dot_q45(nb, w, a, Q5_K_BYTES, true) }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q6_k(nb: usize, w: &[u8], a: &[u8]) -> f32 {
    let (m4, m2) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(3));
    let mut sumf = 0f32;
    for i in 0..nb {
        let (x, yb) = (
            &w[i * Q6_K_BYTES..(i + 1) * Q6_K_BYTES],
            &a[i * Q8_K_BYTES..(i + 1) * Q8_K_BYTES],
        );
        let y = Q8K::new(yb);
        let (mut sc, mut off) = ([0i16; 16], 0i32);
        for (g, v) in sc.iter_mut().enumerate() {
            *v = x[192 + g] as i8 as i16;
            off += *v as i32 * y.bsum(g);
        }
        let mut sumi = _mm256_setzero_si256();
        for half in 0..2 {
            // SAFETY: ql is 128 bytes at 0, qh 64 bytes at 128 (both inside the 210-byte
            // block); 64·half + 32 + 32 <= 128 and 128 + 32·half + 32 <= 192.
            let (q0, q1, qh) = unsafe {
                let p = x.as_ptr();
                (
                    load32(p.add(64 * half)),
                    load32(p.add(64 * half + 32)),
                    load32(p.add(128 + 32 * half)),
                )
            };
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
                // SAFETY: activation qs is 256 bytes at 4: 4 + 128·half + 32k + 32 <= 260.
                let yv = unsafe { load32(yb.as_ptr().add(4 + 128 * half + 32 * k)) };
                let g = 8 * half + 2 * k;
                let scv = _mm256_set_m128i(_mm_set1_epi16(sc[g + 1]), _mm_set1_epi16(sc[g]));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_maddubs_epi16(q, yv), scv));
            }
        }
        // SAFETY: features enabled here.
        let (is, dw) = unsafe { (hsum_epi32(sumi), f16c(x, 208)) };
        sumf += dw * y.d * (is - 32 * off) as f32;
    }
    sumf
}

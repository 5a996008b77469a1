//! The project's own `exp` for f32, and the activations built on it (silu, sigmoid), in
//! one exact sequence of operations that the scalar form and the SIMD forms (AVX2 8 lanes,
//! AVX-512 16 lanes) all execute, so every backend and every vector width gives the same
//! bits. (`f32::exp` is the platform's libm: one value at a time, ~20 cycles, and not the
//! same bits everywhere.)
//!
//! exp(x) = 2^n · e^r with n = round(x · log2 e) and r = x − n·ln 2 (two FMAs, ln 2 split
//! into a high part of 16 bits and the rest); e^r by its Taylor series to degree 7 in
//! Horner form (|r| ≤ ln 2 / 2: the first omitted term is < 2^-27); 2^n applied in two
//! exact halves so that overflow gives +inf and tiny results round once into the
//! subnormals. NaN in, NaN out. Accuracy: within 2 ulp of the exact value
//! (`exp_is_within_two_ulp`, against f64 over 2^26 sampled inputs).

const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2 = LN2_HI + LN2_LO, LN2_HI with its low 8 mantissa bits zero (both written as
/// the exact decimal of their f32 value, hence the allow).
#[allow(clippy::excessive_precision)]
const LN2_HI: f32 = 0.693_145_751_953_125;
#[allow(clippy::excessive_precision)]
const LN2_LO: f32 = 1.428_606_820_309_417_2e-6;
/// 1/k!, k = 2..=7, rounded to f32.
const C: [f32; 6] = [1.0 / 2.0, 1.0 / 6.0, 1.0 / 24.0, 1.0 / 120.0, 1.0 / 720.0, 1.0 / 5040.0];
/// Inputs are clamped to this range first (exp(−104) is 0 and exp(89) +inf in f32).
const LO: f32 = -104.0;
const HI: f32 = 89.0;

/// e^x (see the module doc).
#[inline]
pub fn exp(x: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if crate::quant::simd_available() {
        // SAFETY: AVX2 + FMA detected (`simd_available`).
        return unsafe { x86::exp1(x) };
    }
    exp_scalar(x)
}

/// x / (1 + e^−x).
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + exp(-x))
}

/// 1 / (1 + e^−x).
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// The portable form: `mul_add` is one rounding whether or not the CPU has FMA.
#[inline(always)]
fn exp_scalar(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let x = x.clamp(LO, HI);
    let n = (x * LOG2E).round_ties_even();
    let r = (-n).mul_add(LN2_HI, x);
    let r = (-n).mul_add(LN2_LO, r);
    let mut p = C[5];
    for &c in C[..5].iter().rev() {
        p = p.mul_add(r, c);
    }
    let p = p.mul_add(r, 1.0);
    let p = p.mul_add(r, 1.0);
    let n = n as i32;
    let (n1, n2) = (n >> 1, n - (n >> 1));
    p * pow2(n1) * pow2(n2)
}

/// 2^n for −126 ≤ n ≤ 127 (here −76..=64).
#[inline(always)]
fn pow2(n: i32) -> f32 {
    f32::from_bits(((n + 127) as u32) << 23)
}

/// `y[i] = silu(y[i])`, vectorized where the CPU allows (same bits as [`silu`]).
pub fn silu_in_place(y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::quant::simd_available() {
        // SAFETY: AVX2 + FMA detected.
        return unsafe { x86::map(y, x86::Act::Silu) };
    }
    y.iter_mut().for_each(|v| *v = silu(*v));
}

/// `y[i] = sigmoid(y[i])`, vectorized where the CPU allows (same bits as [`sigmoid`]).
pub fn sigmoid_in_place(y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::quant::simd_available() {
        // SAFETY: AVX2 + FMA detected.
        return unsafe { x86::map(y, x86::Act::Sigmoid) };
    }
    y.iter_mut().for_each(|v| *v = sigmoid(*v));
}

/// `y[i] = exp(y[i])`, vectorized where the CPU allows (same bits as [`exp`]).
pub fn exp_in_place(y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::quant::simd_available() {
        // SAFETY: AVX2 + FMA detected.
        return unsafe { x86::map(y, x86::Act::Exp) };
    }
    y.iter_mut().for_each(|v| *v = exp(*v));
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{C, HI, LN2_HI, LN2_LO, LO, LOG2E};
    use std::arch::x86_64::*;

    #[derive(Clone, Copy, PartialEq)]
    pub(super) enum Act {
        Exp,
        Silu,
        Sigmoid,
    }

    /// The scalar form compiled with FMA (the same operations as `exp_scalar`).
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn exp1(x: f32) -> f32 {
        super::exp_scalar(x)
    }

    /// Eight lanes of `exp_scalar`, operation for operation.
    #[inline(always)]
    unsafe fn exp8(x: __m256) -> __m256 {
        let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x);
        let xc = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(LO)), _mm256_set1_ps(HI));
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(xc, _mm256_set1_ps(LOG2E)));
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), xc);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
        let mut p = _mm256_set1_ps(C[5]);
        for &c in C[..5].iter().rev() {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
        }
        let one = _mm256_set1_ps(1.0);
        let p = _mm256_fmadd_ps(p, r, one);
        let p = _mm256_fmadd_ps(p, r, one);
        let ni = _mm256_cvtps_epi32(n);
        let n1 = _mm256_srai_epi32::<1>(ni);
        let n2 = _mm256_sub_epi32(ni, n1);
        let pow2 = |k: __m256i| _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(k, _mm256_set1_epi32(127))));
        let y = _mm256_mul_ps(_mm256_mul_ps(p, pow2(n1)), pow2(n2));
        _mm256_blendv_ps(y, x, nan)
    }

    /// Sixteen lanes of `exp_scalar`, operation for operation.
    #[inline(always)]
    unsafe fn exp16(x: __m512) -> __m512 {
        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
        let xc = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(LO)), _mm512_set1_ps(HI));
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(xc, _mm512_set1_ps(LOG2E)));
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), xc);
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
        let mut p = _mm512_set1_ps(C[5]);
        for &c in C[..5].iter().rev() {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
        }
        let one = _mm512_set1_ps(1.0);
        let p = _mm512_fmadd_ps(p, r, one);
        let p = _mm512_fmadd_ps(p, r, one);
        let ni = _mm512_cvtps_epi32(n);
        let n1 = _mm512_srai_epi32::<1>(ni);
        let n2 = _mm512_sub_epi32(ni, n1);
        let pow2 = |k: __m512i| _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(k, _mm512_set1_epi32(127))));
        let y = _mm512_mul_ps(_mm512_mul_ps(p, pow2(n1)), pow2(n2));
        _mm512_mask_blend_ps(nan, y, x)
    }

    /// `act` over `y` in place: 16 lanes with AVX-512, else 8, the tail through the scalar
    /// form; every lane the same bits as the scalar functions.
    ///
    /// # Safety
    /// AVX2 + FMA available.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn map(y: &mut [f32], act: Act) {
        let mut i = 0;
        if crate::quant::avx512_available() {
            // SAFETY: AVX-512 F detected.
            i = unsafe { map16(y, act) };
        }
        let p = y.as_mut_ptr();
        while i + 8 <= y.len() {
            // SAFETY: i + 8 <= len; unaligned loads and stores.
            unsafe {
                let x = _mm256_loadu_ps(p.add(i));
                let one = _mm256_set1_ps(1.0);
                let v = match act {
                    Act::Exp => exp8(x),
                    Act::Silu => _mm256_div_ps(x, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), x)))),
                    Act::Sigmoid => _mm256_div_ps(one, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), x)))),
                };
                _mm256_storeu_ps(p.add(i), v);
            }
            i += 8;
        }
        for v in &mut y[i..] {
            let x = *v;
            *v = match act {
                Act::Exp => super::exp_scalar(x),
                Act::Silu => x / (1.0 + super::exp_scalar(-x)),
                Act::Sigmoid => 1.0 / (1.0 + super::exp_scalar(-x)),
            };
        }
    }

    /// The 16-lane part of [`map`]; returns how many elements it did.
    #[target_feature(enable = "avx2,fma,avx512f")]
    unsafe fn map16(y: &mut [f32], act: Act) -> usize {
        let p = y.as_mut_ptr();
        let mut i = 0;
        while i + 16 <= y.len() {
            // SAFETY: i + 16 <= len; unaligned loads and stores.
            unsafe {
                let x = _mm512_loadu_ps(p.add(i));
                let one = _mm512_set1_ps(1.0);
                let v = match act {
                    Act::Exp => exp16(x),
                    Act::Silu => _mm512_div_ps(x, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), x)))),
                    Act::Sigmoid => _mm512_div_ps(one, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), x)))),
                };
                _mm512_storeu_ps(p.add(i), v);
            }
            i += 16;
        }
        i
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ulps(a: f32, b: f64) -> f64 {
        let b32 = b as f32;
        if b32.is_infinite() || a.is_infinite() {
            return if a == b32 { 0.0 } else { f64::INFINITY };
        }
        let ulp = if b32 == 0.0 { f32::from_bits(1) as f64 } else { ((f32::from_bits(b32.abs().to_bits() + 1) - b32.abs()) as f64).max(f32::from_bits(1) as f64) };
        (a as f64 - b).abs() / ulp
    }

    #[test]
    fn exp_is_within_two_ulp() {
        let mut worst = (0.0f64, 0.0f32);
        // every 64th f32 bit pattern (both signs), plus the region boundaries
        for bits in (0..u32::MAX).step_by(64).chain([0x42b1_7218, 0xc2ce_8ed0, 0x42b1_7217]) {
            let x = f32::from_bits(bits);
            if x.is_nan() {
                assert!(exp(x).is_nan());
                continue;
            }
            let e = ulps(exp(x), (x as f64).exp());
            if e > worst.0 {
                worst = (e, x);
            }
        }
        assert!(worst.0 <= 2.0, "exp({}) is {} ulp off", worst.1, worst.0);
    }

    #[test]
    fn specials() {
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-0.0), 1.0);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(100.0), f32::INFINITY);
        assert_eq!(exp(-200.0), 0.0);
        assert!(exp(f32::NAN).is_nan());
        // the largest input with a finite result, and a subnormal result
        assert!(exp(88.72).is_finite());
        let s = exp(-100.0);
        assert!(s > 0.0 && s < f32::MIN_POSITIVE);
        assert_eq!(silu(0.0), 0.0);
        assert_eq!(sigmoid(0.0), 0.5);
        assert_eq!(silu(-200.0), -0.0);
    }

    /// The vector forms (every width the CPU has, and the scalar tail) give the scalar
    /// functions' bits for every lane, and those the portable form's.
    #[test]
    fn slices_equal_the_scalar_functions() {
        // every 61st f32 bit pattern between −104 and 89 (where exp is neither 0 nor +inf)
        let mut xs: Vec<f32> = (0..u32::MAX).step_by(61).map(f32::from_bits).filter(|x| (-104.0..89.0).contains(x)).collect();
        xs.extend([0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 88.72, -103.9, 1e-30]);
        let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
        for &x in &xs {
            assert!(same(exp(x), exp_scalar(x)), "exp({x}): {} vs the portable {}", exp(x), exp_scalar(x));
        }
        for (f, g) in [
            (exp_in_place as fn(&mut [f32]), exp as fn(f32) -> f32),
            (silu_in_place, silu),
            (sigmoid_in_place, sigmoid),
        ] {
            // odd lengths: the 16-, 8-lane and scalar parts all run
            for len in [xs.len(), 23, 7] {
                let mut y = xs[..len].to_vec();
                f(&mut y);
                for (i, (&a, &x)) in y.iter().zip(&xs).enumerate() {
                    assert!(same(a, g(x)), "lane {i}: f({x}) = {a} vs {}", g(x));
                }
            }
        }
    }
}

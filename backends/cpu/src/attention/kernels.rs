//! Attention tile kernels (`super`): the score dots, the V accumulation, softmax, the
//! Hadamard rotation, K block transposes. Each computes exactly the reference's sums in
//! the reference's order; vectors / register blocks only interleave independent sums.

/// Cells processed together (a K block is transposed to `[d][CB]` so the CB dot products
/// of one query are one SIMD vector).
pub(super) const CB: usize = 8;
/// Output lanes per query kept in registers in the V pass.
const VW: usize = 16;

/// acc[n][c] = Σ_i q_n[i] · kt[i][c], sequential in i from 0.0, for NQ queries
/// (`q`: NQ rows of d) and the CB cells of the transposed block `kt` (`[d][CB]`).
#[inline(always)]
fn dots<const NQ: usize>(q: &[f32], d: usize, kt: &[f32]) -> [[f32; CB]; NQ] {
    assert!(q.len() >= NQ * d && kt.len() >= d * CB);
    let mut acc = [[0.0f32; CB]; NQ];
    for i in 0..d {
        // SAFETY: i < d, n < NQ, c < CB: in bounds by the assert above.
        let k: &[f32; CB] = unsafe { &*(kt.as_ptr().add(i * CB) as *const [f32; CB]) };
        for (n, a) in acc.iter_mut().enumerate() {
            let qi = unsafe { *q.get_unchecked(n * d + i) };
            for c in 0..CB {
                a[c] += qi * k[c];
            }
        }
    }
    acc
}

/// o_q[i] += Σ_c w_q[c] · rows[c][i], c increasing from 0, for the NV queries of `o`
/// (`[NV][d]`; `w`: `[NV][m]`, `rows`: `[m][d]`): each loaded row vector serves NV queries.
#[inline(always)]
fn acc_block<const NV: usize>(o: &mut [f32], rows: &[f32], w: &[f32], m: usize, d: usize) {
    assert!(o.len() == NV * d && rows.len() >= m * d && w.len() >= NV * m);
    let mut i = 0;
    while i + VW <= d {
        let mut acc = [[0.0f32; VW]; NV];
        for (q, a) in acc.iter_mut().enumerate() {
            a.copy_from_slice(&o[q * d + i..q * d + i + VW]);
        }
        for c in 0..m {
            // SAFETY: c < m, i + VW <= d, q < NV: in bounds by the assert above.
            let r: &[f32; VW] = unsafe { &*(rows.as_ptr().add(c * d + i) as *const [f32; VW]) };
            for (q, a) in acc.iter_mut().enumerate() {
                let wq = unsafe { *w.get_unchecked(q * m + c) };
                for l in 0..VW {
                    a[l] += wq * r[l];
                }
            }
        }
        for (q, a) in acc.iter().enumerate() {
            o[q * d + i..q * d + i + VW].copy_from_slice(a);
        }
        i += VW;
    }
    for q in 0..NV {
        for i in i..d {
            let mut x = o[q * d + i];
            for c in 0..m {
                x += w[q * m + c] * rows[c * d + i];
            }
            o[q * d + i] = x;
        }
    }
}

/// [`acc_block`] over all queries of `o` (`[nq][d]`, `w`: `[nq][m]`), NV at a time.
#[inline(always)]
pub(super) fn accumulate<const NV: usize>(o: &mut [f32], rows: &[f32], w: &[f32], m: usize, d: usize) {
    let nq = o.len() / d;
    let mut q0 = 0;
    while q0 + NV <= nq {
        acc_block::<NV>(&mut o[q0 * d..(q0 + NV) * d], rows, &w[q0 * m..(q0 + NV) * m], m, d);
        q0 += NV;
    }
    for q in q0..nq {
        acc_block::<1>(&mut o[q * d..(q + 1) * d], rows, &w[q * m..(q + 1) * m], m, d);
    }
}

/// `pn_ops::state::kv::hadamard` (x ← H_n x per n-chunk) with the same butterflies and
/// final scale, so bitwise equal; levels h < 8 stay within aligned 8-groups, so they run
/// per group, and levels h ≥ 8 on 8-lane vectors.
#[inline(always)]
pub(super) fn hadamard(x: &mut [f32], n: usize) {
    if n == 0 || !n.is_multiple_of(8) {
        return pn_ops::state::kv::hadamard(x, n);
    }
    let scale = 1.0 / (n as f32).sqrt();
    for c in x.chunks_exact_mut(n) {
        for v in c.chunks_exact_mut(8) {
            let v: &mut [f32; 8] = v.try_into().expect("8 lanes");
            // level h: x = v with lanes j and j^h swapped; lane j (j & h == 0) gets
            // v[j] + v[j+h], lane j+h gets v[j] - v[j+h] = x - v there (vectorizes)
            for h in [1, 2, 4] {
                let x: [f32; 8] = std::array::from_fn(|j| v[j ^ h]);
                *v = std::array::from_fn(|j| if j & h == 0 { v[j] + x[j] } else { x[j] - v[j] });
            }
        }
        let mut h = 8;
        while h < n {
            for i in (0..n).step_by(2 * h) {
                let (lo, hi) = c[i..i + 2 * h].split_at_mut(h);
                for (l, r) in lo.chunks_exact_mut(8).zip(hi.chunks_exact_mut(8)) {
                    for k in 0..8 {
                        let (a, b) = (l[k], r[k]);
                        l[k] = a + b;
                        r[k] = a - b;
                    }
                }
            }
            h *= 2;
        }
        for v in c.iter_mut() {
            *v *= scale;
        }
    }
}

/// Softmax of rows r = 0.. of `s` (`inv.len()` rows at stride `st`, cells `a..b` of each):
/// x ← exp(x − max) in place, inv[r] = 1 / Σ x (sum in f64, sequential in x). The sums
/// of 8 rows are interleaved only so that their dependency chains overlap.
#[inline(always)]
pub(super) fn softmax(s: &mut [f32], st: usize, a: usize, b: usize, inv: &mut [f32]) {
    for r in 0..inv.len() {
        let x = &mut s[r * st + a..r * st + b];
        let mut m = f32::NEG_INFINITY;
        for &v in x.iter() {
            if v > m {
                m = v;
            }
        }
        // exp(x − max), vectorized (pn_ops::math: the reference's and CUDA's bits)
        x.iter_mut().for_each(|v| *v -= m);
        pn_ops::math::exp_in_place(x);
    }
    let mut r0 = 0;
    while r0 + 8 <= inv.len() {
        let mut sum = [0.0f64; 8];
        for j in a..b {
            for (r, x) in sum.iter_mut().enumerate() {
                *x += s[(r0 + r) * st + j] as f64;
            }
        }
        for (r, x) in sum.iter().enumerate() {
            inv[r0 + r] = (1.0 / x) as f32;
        }
        r0 += 8;
    }
    for r in r0..inv.len() {
        let sum: f64 = s[r * st + a..r * st + b].iter().fold(0.0, |acc, &x| acc + x as f64);
        inv[r] = (1.0 / sum) as f32;
    }
}

/// [`dots`] of NQ queries over NB full blocks at once (`kt`: NB transposed blocks,
/// `[NB][d][CB]`): acc[n][b][c] = Σ_i q_n[i] · kt_b[i][c], sequential in i from 0.0 — the
/// same sums, NQ × NB independent chains in flight instead of NQ (a decode tile of a
/// small GQA group would otherwise wait on the add latency of one or two chains).
#[inline(always)]
fn dots_blocks<const NQ: usize, const NB: usize>(q: &[f32], d: usize, kt: &[f32]) -> [[[f32; CB]; NB]; NQ] {
    assert!(q.len() >= NQ * d && kt.len() >= NB * d * CB);
    let mut acc = [[[0.0f32; CB]; NB]; NQ];
    for i in 0..d {
        for b in 0..NB {
            // SAFETY: b < NB, i < d, n < NQ, c < CB: in bounds by the assert above.
            let k: &[f32; CB] = unsafe { &*(kt.as_ptr().add((b * d + i) * CB) as *const [f32; CB]) };
            for (n, a) in acc.iter_mut().enumerate() {
                let qi = unsafe { *q.get_unchecked(n * d + i) };
                for c in 0..CB {
                    a[b][c] += qi * k[c];
                }
            }
        }
    }
    acc
}

/// Full blocks a decode tile of `nq` queries scores together ([`score_blocks`]): enough
/// that nq × blocks ≥ 8 chains; 0 where `nq` fills a register block on its own.
pub(super) const fn blocks_for(nq: usize) -> usize {
    match nq {
        1 => 8,
        2 => 4,
        3 | 4 => 2,
        _ => 0,
    }
}

/// Score rows `0..nq` for `blocks_for(nq)` full blocks starting at `jb`, their transposes
/// in `kt` (`[blocks][d][CB]`): each score as [`score_rows`] computes it.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn score_blocks(sc_q: &[f32], s: &mut [f32], kt: &[f32], d: usize, nq: usize, ncells: usize, jb: usize, scale: f32) {
    fn put<const NQ: usize, const NB: usize>(acc: [[[f32; CB]; NB]; NQ], s: &mut [f32], ncells: usize, jb: usize, scale: f32) {
        for (n, a) in acc.iter().enumerate() {
            let row = &mut s[n * ncells + jb..][..NB * CB];
            for (x, &v) in row.iter_mut().zip(a.as_flattened()) {
                *x = scale * v;
            }
        }
    }
    match nq {
        1 => put(dots_blocks::<1, 8>(sc_q, d, kt), s, ncells, jb, scale),
        2 => put(dots_blocks::<2, 4>(sc_q, d, kt), s, ncells, jb, scale),
        3 => put(dots_blocks::<3, 2>(sc_q, d, kt), s, ncells, jb, scale),
        4 => put(dots_blocks::<4, 2>(sc_q, d, kt), s, ncells, jb, scale),
        _ => unreachable!("blocks_for({nq}) is 0"),
    }
}

/// Score rows `q0..q0+NQ` for the block of `n` cells at `jb` (offset in the score rows).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn score_rows<const NQ: usize>(sc_q: &[f32], s: &mut [f32], kt: &[f32], d: usize, q0: usize, ncells: usize, jb: usize, n: usize, scale: f32) {
    let acc = dots::<NQ>(&sc_q[q0 * d..(q0 + NQ) * d], d, kt);
    for (k, a) in acc.iter().enumerate() {
        let row = &mut s[(q0 + k) * ncells + jb..][..n];
        for (x, &v) in row.iter_mut().zip(a) {
            *x = scale * v;
        }
    }
}

/// Score rows `qa..qb` (NQ at a time, then singly) for the block of `n` cells at `jb`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn score_range<const NQ: usize>(sc_q: &[f32], s: &mut [f32], kt: &[f32], d: usize, qa: usize, qb: usize, ncells: usize, jb: usize, n: usize, scale: f32) {
    let mut q0 = qa;
    while q0 + NQ <= qb {
        score_rows::<NQ>(sc_q, s, kt, d, q0, ncells, jb, n, scale);
        q0 += NQ;
    }
    while q0 < qb {
        score_rows::<1>(sc_q, s, kt, d, q0, ncells, jb, n, scale);
        q0 += 1;
    }
}

/// kt[i][c] = rows[c][i] for the `n` cells of a block, zero-padded to CB (`AVX`: full
/// blocks by 8×8 register transposes; a pure copy either way).
#[inline(always)]
pub(super) fn transpose<const AVX: bool>(rows: &[f32], n: usize, d: usize, kt: &mut [f32]) {
    assert!(rows.len() >= n * d && kt.len() >= d * CB);
    let mut i0 = 0;
    #[cfg(target_arch = "x86_64")]
    if AVX && n == CB {
        while i0 + 8 <= d {
            // SAFETY: rows i0..i0+8 of the 8 cells and of kt are in bounds (assert above);
            // AVX is only set by the caller that checked for AVX2.
            unsafe { crate::transpose::transpose8(rows.as_ptr().add(i0), d, kt.as_mut_ptr().add(i0 * CB), CB) };
            i0 += 8;
        }
    }
    for i in i0..d {
        for c in 0..CB {
            kt[i * CB + c] = if c < n { rows[c * d + i] } else { 0.0 };
        }
    }
}

//! Attention over the KV cache on the device, every `pn_ops::KvType` (f32, f16, q8_0,
//! q4_0), with the Hadamard rotation, the f16 sink / window shadows and the ring mode of
//! `pn_ops::KvCache` (kernels/attention.cu), over a device copy of the cache
//! (devstate.rs): per run of the batch (`KvCache::runs`, as the reference) `kv_store`
//! rotates, encodes and stores the run's k/v, then `attn_kv` attends.
//!
//! Resident path: the copy is the state itself (all `capacity` cells), no staging, and a
//! single-token call's launches do not depend on the position: the kernels read it from
//! the positions buffer (the runner's positions slot) — the cell written, the positions
//! visible (`lo..=p`, ring included), the window test — and the scores stride is the
//! capacity. So a decode segment's launches are the same step after step (a CUDA graph
//! replays them). Host path: a per-call copy of the cells the batch can read, with
//! staging rows for the cells written (devstate.rs `write_back`).

use crate::device::shared_fits;
use crate::devstate::KvBufs;
use crate::exec::{Buf, Cx};
use crate::seqtab::ByValue;
use crate::opnd::Opnd;
use crate::CudaError;
use cudarc::driver::LaunchConfig;
use pn_ops::{KvCache, KvType, OpError, TensorMeta};

#[derive(Clone, Copy)]
pub struct AttnGeom {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub d: usize,
    pub scale: f32,
}

const OP: &str = "Attention";

/// Scores scratch of one attention launch, in floats (chunks of tokens above it).
const SCORES_MAX: usize = 1 << 26;
/// Threads per block of `kv_store` / `attn_kv`.
const THREADS: u32 = 128;

/// `KvType` as the kernels number it (kernels/attention.cu `KV_*`).
fn ty_code(ty: KvType) -> i32 {
    match ty {
        KvType::F32 => 0,
        KvType::F16 => 1,
        KvType::Q8_0 => 2,
        KvType::Q4_0 => 3,
    }
}

/// 1/sqrt(n) as `pn_ops::state::kv::hadamard` computes it (0 when there is no rotation).
fn rot_scale(n: usize) -> f32 {
    if n == 0 {
        0.0
    } else {
        1.0 / (n as f32).sqrt()
    }
}

fn cuda(e: CudaError) -> OpError {
    OpError::Invalid {
        op: OP,
        msg: format!("cuda: {e}"),
    }
}

/// Cells of the host copy a batch at `pos` reads (max position + 1, or the capacity once
/// a ring wraps; positions checked by the caller).
pub fn cells_read(kv: &KvCache, pos: &[i32]) -> usize {
    let max_p = pos.iter().map(|&p| p.max(0) as usize).max().unwrap_or(0);
    if kv.ring && max_p >= kv.capacity {
        kv.capacity
    } else {
        (max_p + 1).min(kv.capacity)
    }
}

/// Causal GQA attention (see the module doc). `kv`: the cache's geometry and modes;
/// `b`: its device copy. Errors (a cache of another geometry, positions the host does not
/// have or past a non-ring cache) are the CPU backend's.
pub fn attention(
    cx: &mut Cx<'_>,
    ins: &[Opnd<'_>],
    y: Buf,
    out: &TensorMeta,
    kv: &KvCache,
    b: &KvBufs,
    g: AttnGeom,
) -> Result<(), OpError> {
    let t = out.shape.0[1];
    let pos = host_positions(ins, t)?;
    if kv.n_head_kv != g.n_head_kv || kv.head_dim != g.d {
        return Err(OpError::Invalid {
            op: OP,
            msg: format!(
                "KV cache [{} heads, {} dims, {} cells, {}] does not fit n_head_kv {}, head_dim {}",
                kv.n_head_kv, kv.head_dim, kv.capacity, kv.ty, g.n_head_kv, g.d
            ),
        });
    }
    kv.check_positions(OP, pos)?;
    if t == 0 || g.n_head == 0 {
        return Ok(());
    }
    head_row_fits(cx, g, ["kv_store", "attn_kv"])?;
    run(cx, ins, y, kv, b, pos, g).map_err(cuda)
}

/// The pass's `t` positions, from their host mirror (the runner uploads them into their
/// slot, so the host has them).
fn host_positions<'a>(ins: &[Opnd<'a>], t: usize) -> Result<&'a [i32], OpError> {
    let pos = ins[3].host().ok_or_else(|| OpError::Invalid {
        op: OP,
        msg: "cuda: the positions must come from the host (the runner uploads them into their slot)".into(),
    })?;
    pn_ops::reference::common::token_positions(OP, pos, t)
}

/// Both kernels (a store and an attend) keep one head row of D floats in dynamic shared
/// memory, beside their static shared memory (the attend: 384 bytes of reduction scratch).
fn head_row_fits(cx: &Cx<'_>, g: AttnGeom, kernels: [&str; 2]) -> Result<(), OpError> {
    for k in kernels {
        shared_fits(k, g.d * 4, cx.d.static_shared(k))
            .map_err(|e| cuda(CudaError::Unsupported(format!("head_dim {}: {e} (the kernels keep one head row in shared memory)", g.d))))?;
    }
    Ok(())
}

fn run(
    cx: &mut Cx<'_>,
    ins: &[Opnd<'_>],
    y: Buf,
    kv: &KvCache,
    b: &KvBufs,
    pos: &[i32],
    g: AttnGeom,
) -> Result<(), CudaError> {
    let (dd, hkv, h, t) = (g.d, g.n_head_kv, g.n_head, pos.len());
    let (q, k, v, dpos) = (ins[0].f32()?, ins[1].f32()?, ins[2].f32()?, ins[3].i32()?);
    let rb = kv.ty.row_bytes(dd);
    let sh = &kv.shadow;
    let i = |x: usize| x as i32;
    let (rsk, rsv) = (rot_scale(kv.rot_k), rot_scale(kv.rot_v));
    let shared = (dd * 4) as u32;
    let visible = |p: i32| p as usize + 1 - kv.first_visible(p as usize);
    // one token over the whole cache: a stride that does not depend on the position
    let fixed = t == 1 && b.ncells == kv.capacity;
    let span_of = |ps: &[i32]| {
        if fixed {
            kv.capacity.max(1)
        } else {
            ps.iter().map(|&p| visible(p)).max().unwrap_or(1)
        }
    };
    let span_max = span_of(pos);
    let chunk = (SCORES_MAX / (h * span_max)).clamp(1, 65535);
    let scores = cx.tmp4(h * chunk.min(t) * span_max)?;
    let [kst, vst] = b.stage.unwrap_or([Buf::NULL; 2]);
    let d = cx.d;
    for (a, e) in kv.runs(pos) {
        let s = d
            .k("kv_store")?
            .p(b.cells[0])
            .p(b.cells[1])
            .p(b.sink[0])
            .p(b.sink[1])
            .p(b.win[0])
            .p(b.win[1])
            .p(kst)
            .p(vst)
            .p(k)
            .p(v)
            .p(dpos)
            .i(i(a))
            .i(ty_code(kv.ty))
            .i(i(dd))
            .i(i(hkv))
            .i(i(rb))
            .i(i(b.ncells))
            .i(i(kv.capacity))
            .i(kv.ring as i32)
            .i(i(sh.sink))
            .i(i(sh.slots))
            .i(i(kv.rot_k))
            .f(rsk)
            .i(i(kv.rot_v))
            .f(rsv);
        cx.go(s.cfg(cfg((e - a) as u32, hkv as u32, shared)))?;
        for t0 in (a..e).step_by(chunk) {
            let n = chunk.min(e - t0);
            let span = span_of(&pos[t0..t0 + n]);
            let c = d
                .k("attn_kv")?
                .p(q)
                .p(b.cells[0])
                .p(b.cells[1])
                .p(b.sink[0])
                .p(b.sink[1])
                .p(b.win[0])
                .p(b.win[1])
                .p(dpos)
                .p(scores)
                .p(y)
                .i(i(t0))
                .i(ty_code(kv.ty))
                .i(i(dd))
                .i(i(h))
                .i(i(hkv))
                .i(i(rb))
                .i(i(b.ncells))
                .i(i(kv.capacity))
                .i(kv.ring as i32)
                .i(i(sh.sink))
                .i(i(sh.window))
                .i(i(sh.slots))
                .i(i(span))
                .i(i(kv.rot_k))
                .f(rsk)
                .i(i(kv.rot_v))
                .f(rsv)
                .f(g.scale);
            cx.go(c.cfg(cfg(h as u32, n as u32, shared)))?;
        }
    }
    Ok(())
}

/// Most sequences of one multi-sequence attention launch (kernels/attention.cu `KV_TAB`).
pub const KV_TAB: usize = 16;

/// The KV caches of sequences with one token each, passed by value as the kernels'
/// `KvTab` (kernels/attention.cu, the same C layout): sequence z's K / V cells, sink and
/// window shadows, and its token's index in the pass.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KvTab {
    pub kc: [u64; KV_TAB],
    pub vc: [u64; KV_TAB],
    pub ks: [u64; KV_TAB],
    pub vs: [u64; KV_TAB],
    pub kw: [u64; KV_TAB],
    pub vw: [u64; KV_TAB],
    pub tok: [i32; KV_TAB],
    pub n: i32,
    pub pad: i32,
}

// SAFETY: repr(C), 96 u64 then 18 i32: 840 bytes, no padding, aligned to 8.
unsafe impl ByValue for KvTab {}

impl KvTab {
    /// The table of `seqs` (buffers, token; at most [`KV_TAB`]).
    fn of(seqs: &[(KvBufs, usize)]) -> KvTab {
        let z16 = [0; KV_TAB];
        let mut t = KvTab { kc: z16, vc: z16, ks: z16, vs: z16, kw: z16, vw: z16, tok: [0; KV_TAB], n: seqs.len() as i32, pad: 0 };
        for (z, (b, tok)) in seqs.iter().enumerate() {
            (t.kc[z], t.vc[z]) = (b.cells[0].ptr, b.cells[1].ptr);
            (t.ks[z], t.vs[z]) = (b.sink[0].ptr, b.sink[1].ptr);
            (t.kw[z], t.vw[z]) = (b.win[0].ptr, b.win[1].ptr);
            t.tok[z] = *tok as i32;
        }
        t
    }
}

/// Whether two caches have one geometry and mode (what the kernels take as scalars).
fn same_layout(a: &KvCache, b: &KvCache) -> bool {
    (a.n_head_kv, a.head_dim, a.capacity, a.ty, a.ring, a.rot_k, a.rot_v) == (b.n_head_kv, b.head_dim, b.capacity, b.ty, b.ring, b.rot_k, b.rot_v)
        && (a.shadow.sink, a.shadow.window, a.shadow.slots) == (b.shadow.sink, b.shadow.window, b.shadow.slots)
}

/// [`attention`] for sequences of one token each (`kvs[z]`: its cache's geometry, its
/// resident buffers and its token's index in the pass): `kv_store_seqs` then
/// `attn_kv_seqs`, one launch each per [`KvTab`] of up to 16 sequences, each block what it
/// computes for its sequence alone. False (nothing run) where the single-sequence launches
/// must run instead: caches of different layouts or a host-protocol copy (staging rows,
/// fewer cells than the capacity).
pub fn attention_decode_seqs(
    cx: &mut Cx<'_>,
    ins: &[Opnd<'_>],
    y: Buf,
    out: &TensorMeta,
    kvs: &[(&KvCache, KvBufs, usize)],
    g: AttnGeom,
) -> Result<bool, OpError> {
    let t = out.shape.0[1];
    let Some((kv, _, _)) = kvs.first() else { return Ok(false) };
    if kvs.iter().any(|(k, b, tok)| !same_layout(k, kv) || b.stage.is_some() || b.ncells != k.capacity || *tok >= t) {
        return Ok(false);
    }
    if kv.n_head_kv != g.n_head_kv || kv.head_dim != g.d {
        return Ok(false);
    }
    let pos = host_positions(ins, t)?;
    for (k, _, tok) in kvs {
        k.check_positions(OP, &pos[*tok..*tok + 1])?;
    }
    if g.n_head == 0 {
        return Ok(true);
    }
    head_row_fits(cx, g, ["kv_store_seqs", "attn_kv_seqs"])?;
    let run = |cx: &mut Cx<'_>| -> Result<(), CudaError> {
        let (dd, hkv, h) = (g.d, g.n_head_kv, g.n_head);
        let (q, k, v, dpos) = (ins[0].f32()?, ins[1].f32()?, ins[2].f32()?, ins[3].i32()?);
        let (rb, sh, span) = (kv.ty.row_bytes(dd), &kv.shadow, kv.capacity.max(1));
        let i = |x: usize| x as i32;
        let (rsk, rsv) = (rot_scale(kv.rot_k), rot_scale(kv.rot_v));
        let shared = (dd * 4) as u32;
        // sequences a launch: a table's worth, fewer where their scores rows would not fit
        let per = (SCORES_MAX / (h * span)).clamp(1, KV_TAB);
        let seqs: Vec<(KvBufs, usize)> = kvs.iter().map(|(_, b, tok)| (*b, *tok)).collect();
        let scores = cx.tmp4(h * per.min(seqs.len()) * span)?;
        let d = cx.d;
        for group in seqs.chunks(per) {
            let (tab, n) = (KvTab::of(group), group.len() as u32);
            let s = d.k("kv_store_seqs")?.val(&tab).p(k).p(v).p(dpos).i(ty_code(kv.ty)).i(i(dd)).i(i(hkv)).i(i(rb));
            let s = s.i(i(kv.capacity)).i(i(kv.capacity)).i(kv.ring as i32).i(i(sh.sink)).i(i(sh.slots));
            cx.go(s.i(i(kv.rot_k)).f(rsk).i(i(kv.rot_v)).f(rsv).cfg(cfg(n, hkv as u32, shared)))?;
            let c = d.k("attn_kv_seqs")?.val(&tab).p(q).p(dpos).p(scores).p(y).i(ty_code(kv.ty)).i(i(dd)).i(i(h)).i(i(hkv));
            let c = c.i(i(rb)).i(i(kv.capacity)).i(i(kv.capacity)).i(kv.ring as i32).i(i(sh.sink)).i(i(sh.window)).i(i(sh.slots));
            cx.go(c.i(i(span)).i(i(kv.rot_k)).f(rsk).i(i(kv.rot_v)).f(rsv).f(g.scale).cfg(cfg(h as u32, n, shared)))?;
        }
        Ok(())
    };
    run(cx).map_err(cuda)?;
    Ok(true)
}

fn cfg(x: u32, y: u32, shared: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (x.max(1), y.max(1), 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: shared,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_tables_have_the_kernels_layout() {
        assert!(include_str!("../kernels/attention.cu").contains(&format!("#define KV_TAB {KV_TAB}\n")));
        assert_eq!(std::mem::size_of::<KvTab>(), 6 * 8 * KV_TAB + 4 * KV_TAB + 8);
        let b = |p: u64| Buf { ptr: p, bytes: 64 };
        let seqs: Vec<(KvBufs, usize)> = (0..3u64)
            .map(|z| (KvBufs { cells: [b(z * 100 + 1), b(z * 100 + 2)], sink: [b(z * 100 + 3), b(z * 100 + 4)], win: [b(z * 100 + 5), b(z * 100 + 6)], ncells: 8, stage: None }, 7 + 2 * z as usize))
            .collect();
        let t = KvTab::of(&seqs);
        let w = t.words();
        assert_eq!(w.len(), 6 * KV_TAB + KV_TAB / 2 + 1);
        // the C struct's order: kc, vc, ks, vs, kw, vw (16 each), tok (16), n
        for (a, base) in [1u64, 2, 3, 4, 5, 6].into_iter().enumerate() {
            for z in 0..3 {
                assert_eq!(w[a * KV_TAB + z as usize], z * 100 + base);
            }
            assert_eq!(w[a * KV_TAB + 3], 0, "unused entries are null");
        }
        // then the tokens (two a word), then n
        assert_eq!(w[6 * KV_TAB], 7 | 9 << 32, "tokens 7 and 9");
        assert_eq!(w[6 * KV_TAB + 1], 11, "token 11, then an unused entry");
        assert_eq!(w[6 * KV_TAB + KV_TAB / 2] & 0xffff_ffff, 3, "n");
    }

    #[test]
    fn caches_of_other_layouts_do_not_share_a_launch() {
        let a = KvCache::new(2, 64, 16);
        let mut b = a.clone();
        assert!(same_layout(&a, &b));
        b.ring = true;
        assert!(!same_layout(&a, &b));
        let mut c = a.clone();
        c.shadow.window += 1;
        assert!(!same_layout(&a, &c));
    }

    #[test]
    fn cells_read_by_a_batch() {
        let mut kv = KvCache::new(1, 32, 16);
        assert_eq!(cells_read(&kv, &[0]), 1);
        assert_eq!(cells_read(&kv, &[3, 4, 5]), 6);
        assert_eq!(cells_read(&kv, &[15]), 16);
        kv.ring = true;
        assert_eq!(cells_read(&kv, &[15]), 16);
        assert_eq!(
            cells_read(&kv, &[40]),
            16,
            "a wrapped ring reads every cell"
        );
    }
}

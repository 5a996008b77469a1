//! Per-token history of recurrent states, for speculative decoding's rollback
//! (docs/speculative.md).
//!
//! A verify pass feeds K+1 tokens (the last accepted one and K drafts); only a prefix of
//! them may be kept. Attention KV needs nothing (the rejected cells are overwritten
//! later), but the conv window and the delta-rule matrices are updated in place. While a
//! [`Recording`] of a state is alive, the conv and delta-rule kernels (reference and CPU)
//! also write the state after each of the pass's last `keep` tokens except the final one
//! (that one is the live state); [`Recording::rollback`] then restores the state after
//! any of those tokens without running anything again (llama.cpp's
//! `ggml_gated_delta_net(…, K)` snapshots do the same). Each kept delta-rule state is a
//! buffer laid out as the live one, so a rollback swaps it in (no copy: a copy of the
//! live state moved every recurrent layer's matrices through memory again, ~2 ms of a
//! 15 ms full-dims step); the conv windows (small) are copied.
//!
//! The history lives beside the state, keyed by the state's identity (the address of its
//! ssm buffer, which moves only when a rollback swaps a kept one in: the key follows it),
//! not inside [`RecurrentState`]:
//! the state's layout — what resident backends upload and snapshot — stays as it is.
//! A state is recorded only while its `Recording` lives (dropping it unregisters the
//! state), so an address is never reused for another state during a recording. With no
//! recording anywhere, a kernel's only cost is one atomic load.

use super::RecurrentState;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

/// The history buffers of one recorded state.
#[derive(Debug, Default)]
pub struct Hist {
    /// States kept: those after each of the pass's last `keep` tokens but the final one.
    pub keep: usize,
    /// `[keep-1][d_conv-1][C]`: conv windows, entry `e` after token `t - keep + e`.
    pub conv: Vec<f32>,
    /// `[keep-1]` delta-rule states, each `[Hv][Dv·Dk]` as the live `ssm` (entry `e`
    /// after token `t - keep + e`; each head's task writes its rows of every entry:
    /// [`head_entries`]).
    pub ssm: Vec<Vec<f32>>,
    /// Tokens of the last pass the conv / delta-rule kernel recorded (0: none yet).
    pub conv_t: usize,
    pub ssm_t: usize,
    /// Tokens of that pass the delta-rule state holds now (`ssm_t` after the pass, less
    /// after a rollback: the entry swapped in then holds the pass's last state).
    kept: usize,
}

impl Hist {
    /// Entries kept per pass.
    pub fn entries(&self) -> usize {
        self.keep.saturating_sub(1)
    }
    /// For a pass of `t` tokens: the first token whose state is kept (entry 0) and how
    /// many are (tokens `first..t-1`).
    pub fn span(&self, t: usize) -> (usize, usize) {
        let n = self.entries().min(t.saturating_sub(1));
        (t - 1 - n, n)
    }
    /// For the delta-rule kernels: the entries are written for a pass of `t` tokens.
    pub fn wrote_ssm(&mut self, t: usize) {
        self.ssm_t = t;
        self.kept = t;
    }
}

struct Entry {
    key: usize,
    /// The recording that owns it (a newer recording of the state replaces it).
    id: u64,
    /// Taken by a kernel while it writes (None then).
    hist: Option<Hist>,
}

static ACTIVE: AtomicUsize = AtomicUsize::new(0);
/// Buffers of dropped recordings, reused by the next ones: a verify pass records K
/// states per layer (MBs on a large model), and fresh allocations would be zeroed and
/// page-faulted in on every pass.
static POOL: Mutex<Vec<Vec<f32>>> = Mutex::new(Vec::new());
/// At most this many bytes wait in the pool (the rest is freed).
const POOL_MAX_BYTES: usize = 1 << 30;

/// A buffer of `n` floats from the pool (its contents are stale: every entry a rollback
/// reads is written by the pass first), or a new one.
fn buffer(n: usize) -> Vec<f32> {
    let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
    let mut b = match pool.iter().position(|b| b.capacity() >= n) {
        Some(i) => pool.swap_remove(i),
        None => pool.pop().unwrap_or_default(),
    };
    if b.len() > n {
        b.truncate(n);
    } else {
        b.resize(n, 0.0);
    }
    b
}

fn recycle(h: Hist) {
    let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
    let mut bytes: usize = pool.iter().map(|b| b.capacity() * 4).sum();
    for b in std::iter::once(h.conv).chain(h.ssm) {
        if b.capacity() > 0 && bytes + b.capacity() * 4 <= POOL_MAX_BYTES {
            bytes += b.capacity() * 4;
            pool.push(b);
        }
    }
}
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
static TABLE: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

fn key(st: &RecurrentState) -> usize {
    st.ssm.as_ptr() as usize
}

fn table() -> std::sync::MutexGuard<'static, Vec<Entry>> {
    TABLE.lock().unwrap_or_else(|e| e.into_inner())
}

/// For a kernel: the history buffers of `st` if it is being recorded (give them back
/// with [`put`]). `None` (one atomic load) when nothing is recorded.
pub fn take(st: &RecurrentState) -> Option<Hist> {
    if ACTIVE.load(Ordering::Acquire) == 0 {
        return None;
    }
    let k = key(st);
    table().iter_mut().find(|e| e.key == k).and_then(|e| e.hist.take())
}

/// Give back what [`take`] returned.
pub fn put(st: &RecurrentState, h: Hist) {
    let k = key(st);
    if let Some(e) = table().iter_mut().find(|e| e.key == k) {
        e.hist = Some(h);
    }
}

/// A scoped recording of some recurrent states (see the module doc).
#[derive(Debug)]
pub struct Recording {
    id: u64,
}

impl Recording {
    /// Record `states` during the next passes: keep the states after each of a pass's
    /// last `keep` tokens (`keep` ≥ 1; 1 keeps nothing but the live state).
    pub fn start<'a>(states: impl IntoIterator<Item = &'a RecurrentState>, keep: usize) -> Recording {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let mut t = table();
        for st in states {
            let k = key(st);
            let n = keep.saturating_sub(1);
            let h = Hist {
                keep: keep.max(1),
                conv: buffer(n * st.conv.len()),
                ssm: (0..n).map(|_| buffer(st.ssm.len())).collect(),
                conv_t: 0,
                ssm_t: 0,
                kept: 0,
            };
            // a state is recorded by its newest recording only
            if let Some(i) = t.iter().position(|e| e.key == k) {
                if let Some(old) = t.swap_remove(i).hist {
                    recycle(old);
                }
            }
            t.push(Entry { key: k, id, hist: Some(h) });
        }
        ACTIVE.fetch_add(1, Ordering::AcqRel);
        Recording { id }
    }

    /// Put `st` back to its state after the first `n_keep` tokens of the last pass of
    /// `t` tokens (`n_keep == t`: the live state, nothing to do; again with a smaller
    /// `n_keep`: shrinks further; the same: nothing to do). Errors (expected vs found)
    /// when the state was not recorded, the kernels kept no history for a pass of `t`
    /// tokens (a backend that does not record), or `n_keep` is out of reach.
    pub fn rollback(&self, st: &mut RecurrentState, t: usize, n_keep: usize) -> Result<(), String> {
        if n_keep == t {
            return Ok(());
        }
        let k = key(st);
        let mut tab = table();
        let e = match tab.iter_mut().find(|e| e.key == k) {
            None => return Err("this recurrent state is not part of the recording".into()),
            Some(e) if e.id != self.id => return Err("the state was recorded again by a later pass: only the latest pass can be rolled back".into()),
            Some(e) => e,
        };
        let h = e.hist.as_mut().ok_or("the history is still being written")?;
        if h.conv_t != t || h.ssm_t != t {
            return Err(format!(
                "expected a per-token history of the last pass of {t} tokens, found conv {} / delta rule {} (the backend keeps no history: speculative decoding needs one that does)",
                h.conv_t, h.ssm_t
            ));
        }
        let (first, n) = h.span(t);
        if n_keep == 0 || n_keep > t || n_keep - 1 < first {
            return Err(format!("expected to keep {}..={t} tokens of the pass, found {n_keep}", first + 1));
        }
        if n_keep > h.kept {
            return Err(format!("the state keeps {} tokens of the pass already: cannot grow back to {n_keep}", h.kept));
        }
        if n_keep == h.kept {
            return Ok(());
        }
        let ent = n_keep - 1 - first;
        debug_assert!(ent < n);
        if h.ssm[ent].len() != st.ssm.len() {
            return Err(format!("expected a kept state of {} floats, found {}", st.ssm.len(), h.ssm[ent].len()));
        }
        let cl = st.conv.len();
        st.conv.copy_from_slice(&h.conv[ent * cl..(ent + 1) * cl]);
        // the kept state becomes the live one; the entry takes the pass's later state (no
        // smaller rollback reads it) and the table follows the state's new buffer
        std::mem::swap(&mut st.ssm, &mut h.ssm[ent]);
        h.kept = n_keep;
        e.key = key(st);
        Ok(())
    }
}

impl Drop for Recording {
    fn drop(&mut self) {
        let mut t = table();
        let mut i = 0;
        while i < t.len() {
            if t[i].id == self.id {
                if let Some(h) = t.swap_remove(i).hist {
                    recycle(h);
                }
            } else {
                i += 1;
            }
        }
        ACTIVE.fetch_sub(1, Ordering::AcqRel);
    }
}

/// For the conv kernels: with `win(r)` the window rows (`ns` state rows then the `t`
/// tokens, `c` channels each), write the window after each kept token into `h`.
pub fn write_conv<'w>(h: &mut Hist, t: usize, ns: usize, c: usize, win: &dyn Fn(usize) -> &'w [f32]) {
    let (first, n) = h.span(t);
    for e in 0..n {
        let ti = first + e;
        // the window after token ti: rows ti+1 .. ti+1+ns
        let dst = &mut h.conv[e * ns * c..(e + 1) * ns * c];
        for j in 0..ns {
            dst[j * c..(j + 1) * c].copy_from_slice(win(ti + 1 + j));
        }
    }
    h.conv_t = t;
}

/// For the delta-rule kernels: each V head's rows (`per` floats) of every kept state,
/// `out[hd][e]` (so each head's task writes its own).
pub fn head_entries(ssm: &mut [Vec<f32>], per: usize) -> Vec<Vec<&mut [f32]>> {
    let n = ssm.len();
    let mut out: Vec<Vec<&mut [f32]>> = Vec::new();
    for entry in ssm.iter_mut() {
        for (hd, rows) in entry.chunks_exact_mut(per.max(1)).enumerate() {
            if out.len() <= hd {
                out.push(Vec::with_capacity(n));
            }
            out[hd].push(rows);
        }
    }
    out
}

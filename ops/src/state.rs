//! Per-sequence, per-layer state that stateful ops read and update.
//!
//! KV caches come in four cell formats ([`KvType`]): f32, f16, q8_0, q4_0 (docs/kv-cache.md).
//! Quantized caches store K (with Q) and V rotated by a Walsh–Hadamard matrix as llama.cpp
//! does (spec §9.1); the default q4_0 cache also keeps f16 shadows of the first `sink`
//! positions and of the most recent `window` positions, which are read instead of the q4_0
//! cells (attention sinks and the local context carry most of the attention mass, so
//! their precision decides near-ties).

pub mod history;
pub mod kv;

pub use kv::{KvType, Overflow};

use crate::OpError;

/// One sequence of a pass (a row of the sequence table a multi-sequence pass gives the
/// stateful ops): tokens `start..start + len` of every activation (the token axis is the
/// outermost one, sequences one after another), updating that sequence's layer state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeqSpan {
    pub start: usize,
    pub len: usize,
}

impl SeqSpan {
    /// The spans of sequences of `lens` tokens, back to back from token 0.
    pub fn table(lens: &[usize]) -> Vec<SeqSpan> {
        let mut start = 0;
        lens.iter()
            .map(|&len| {
                let s = SeqSpan { start, len };
                start += len;
                s
            })
            .collect()
    }
    /// The token range.
    pub fn range(&self) -> std::ops::Range<usize> {
        self.start..self.start + self.len
    }
}

/// Checks that `spans` cover tokens `0..t` back to back, one per state (`n_states`).
pub fn check_spans(op: &'static str, spans: &[SeqSpan], n_states: usize, t: usize) -> Result<(), OpError> {
    let bad = |msg: String| Err(OpError::Invalid { op, msg });
    if spans.len() != n_states {
        return bad(format!("{} sequences but {n_states} layer states", spans.len()));
    }
    let mut next = 0;
    for s in spans {
        if s.start != next || s.len == 0 {
            return bad(format!("sequence table {spans:?} does not cover {t} tokens back to back"));
        }
        next += s.len;
    }
    if next != t {
        return bad(format!("sequence table covers {next} tokens, the pass has {t}"));
    }
    Ok(())
}

/// The layer state a stateful op reads and updates, inferred with the op's shapes
/// ([`crate::Op::state_shape`]); [`StateShape::check`] is the one check of a layer state
/// against it, for every backend (the runner per pass, the op-level entry points per call).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StateShape {
    /// A KV cache (any format, capacity, shadows and mode).
    Kv { n_head_kv: usize, head_dim: usize },
    /// A conv window of `d_conv − 1` inputs over `channels`.
    Conv { d_conv: usize, channels: usize },
    /// Delta-rule matrices: `hv` V heads of `dk` × `dv`.
    Delta { hv: usize, dk: usize, dv: usize },
}

impl std::fmt::Display for StateShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            StateShape::Kv { n_head_kv, head_dim } => write!(f, "a KV cache of {n_head_kv} heads × {head_dim} dims"),
            StateShape::Conv { d_conv, channels } => write!(f, "a conv window of {} × {channels} channels", d_conv.saturating_sub(1)),
            StateShape::Delta { hv, dk, dv } => write!(f, "a delta-rule state of {hv} V heads, Dk {dk}, Dv {dv}"),
        }
    }
}

impl StateShape {
    /// Whether `st` is a state of this shape (a KV cache also with consistent buffers):
    /// `OpError::Shape` with what was expected and what was found (`Invalid` for a state
    /// of another kind).
    pub fn check(&self, op: &'static str, st: &LayerState) -> Result<(), OpError> {
        // None: a state of another kind
        let ok = match (*self, st) {
            (StateShape::Kv { n_head_kv, head_dim }, LayerState::Kv(kv)) => {
                Some(kv.n_head_kv == n_head_kv && kv.head_dim == head_dim && kv.consistent())
            }
            (StateShape::Conv { d_conv, channels }, LayerState::Recurrent(r)) => {
                Some(d_conv > 0 && r.conv_channels == channels && Some(r.conv.len()) == (d_conv - 1).checked_mul(channels))
            }
            (StateShape::Delta { hv, dk, dv }, LayerState::Recurrent(r)) => Some(
                (r.n_v_heads, r.head_k_dim, r.head_v_dim) == (hv, dk, dv)
                    && Some(r.ssm.len()) == hv.checked_mul(dv).and_then(|n| n.checked_mul(dk)),
            ),
            _ => None,
        };
        if ok == Some(true) {
            return Ok(());
        }
        let found = match st {
            LayerState::Kv(kv) => format!(
                "a KV cache of {} heads × {} dims ({} cells, {}{})",
                kv.n_head_kv,
                kv.head_dim,
                kv.capacity,
                kv.ty,
                if kv.consistent() { "" } else { ", buffers of other lengths" }
            ),
            LayerState::Recurrent(r) => format!(
                "a recurrent state: conv window of {} values over {} channels, delta-rule state of {} V heads, Dk {}, Dv {} ({} values)",
                r.conv.len(),
                r.conv_channels,
                r.n_v_heads,
                r.head_k_dim,
                r.head_v_dim,
                r.ssm.len()
            ),
            LayerState::None => "no layer state".into(),
        };
        match ok {
            Some(_) => Err(OpError::Shape { op, expected: self.to_string(), found }),
            None => Err(OpError::Invalid { op, msg: format!("needs {self}, found {found}") }),
        }
    }
}

/// KV cache of one attention layer, layout `[n_head_kv][capacity][head_dim]` in the cell
/// format `ty`. Cell `p` holds the key/value of position `p` (K after RoPE), or of
/// `p % capacity` in [`Overflow::Ring`] mode.
#[derive(Clone, Debug, PartialEq)]
pub struct KvCache {
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub capacity: usize,
    pub ty: KvType,
    /// f32 cells (`ty == F32`; empty otherwise).
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    /// Encoded cells, `ty.row_bytes(head_dim)` each (f16 / q8_0 / q4_0; empty for f32).
    pub kq: Vec<u8>,
    pub vq: Vec<u8>,
    /// f16 copies of sink and recent positions (rotated like the cells).
    pub shadow: Shadows,
    /// Ring mode: cell = pos % capacity, queries see the last `capacity` positions.
    pub ring: bool,
    /// Hadamard chunk applied to Q and K (0 = none; set to 0 only to measure without it).
    pub rot_k: usize,
    /// Hadamard chunk applied to V and the attention output (0 = none).
    pub rot_v: usize,
}

/// f16 shadows: positions `< sink` in `k_sink`/`v_sink` (`[n_head_kv][sink][head_dim]`),
/// recent positions in a ring of `slots = window + SEG` (`[n_head_kv][slots][head_dim]`,
/// slot = pos % slots). A query at position p reads position j from
/// - the sink shadow if j < sink,
/// - else the window shadow if j + window > p,
/// - else the main cell.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Shadows {
    pub sink: usize,
    pub window: usize,
    pub slots: usize,
    pub k_sink: Vec<u16>,
    pub v_sink: Vec<u16>,
    pub k_win: Vec<u16>,
    pub v_win: Vec<u16>,
}

/// Where a query reads one position from.
pub enum Cell<'a> {
    F32(&'a [f32]),
    Enc(&'a [u8]),
    F16(&'a [u16]),
}

impl KvCache {
    /// An f32 cache (exact; what the oracle tests use).
    pub fn new(n_head_kv: usize, head_dim: usize, capacity: usize) -> KvCache {
        KvCache::with_type(n_head_kv, head_dim, capacity, KvType::F32)
    }

    /// A cache in format `ty` (quantized formats need `head_dim % 32 == 0` and fall back
    /// to f16 otherwise) with the format's default shadows.
    pub fn with_type(n_head_kv: usize, head_dim: usize, capacity: usize, ty: KvType) -> KvCache {
        let (sink, window) = ty.for_head_dim(head_dim).default_shadows();
        KvCache::with_shadows(n_head_kv, head_dim, capacity, ty, sink, window)
    }

    /// A cache with explicit shadow sizes (any format; 0 = none).
    pub fn with_shadows(n_head_kv: usize, head_dim: usize, capacity: usize, ty: KvType, sink: usize, window: usize) -> KvCache {
        let ty = ty.for_head_dim(head_dim);
        let cells = n_head_kv * capacity;
        let (f, e) = if ty == KvType::F32 { (cells * head_dim, 0) } else { (0, cells * ty.row_bytes(head_dim)) };
        let slots = if window > 0 { window + kv::SEG } else { 0 };
        let shadow = Shadows {
            sink,
            window,
            slots,
            k_sink: vec![0; n_head_kv * sink * head_dim],
            v_sink: vec![0; n_head_kv * sink * head_dim],
            k_win: vec![0; n_head_kv * slots * head_dim],
            v_win: vec![0; n_head_kv * slots * head_dim],
        };
        KvCache {
            n_head_kv,
            head_dim,
            capacity,
            ty,
            k: vec![0.0; f],
            v: vec![0.0; f],
            kq: vec![0; e],
            vq: vec![0; e],
            shadow,
            ring: false,
            rot_k: ty.rot_k(head_dim),
            rot_v: ty.rot_v(head_dim),
        }
    }

    /// Bytes a cache of this geometry takes (cells + default shadows), without building it.
    pub fn bytes_for(n_head_kv: usize, head_dim: usize, capacity: usize, ty: KvType) -> usize {
        let ty = ty.for_head_dim(head_dim);
        let (sink, window) = ty.default_shadows();
        let slots = if window > 0 { window + kv::SEG } else { 0 };
        2 * n_head_kv * (capacity * ty.row_bytes(head_dim) + (sink + slots) * head_dim * 2)
    }

    /// Offset (in elements of an f32 cache) of cell `cell` of KV head `h`.
    pub fn cell(&self, h: usize, cell: usize) -> usize {
        (h * self.capacity + cell) * self.head_dim
    }
    fn row_bytes(&self) -> usize {
        self.ty.row_bytes(self.head_dim)
    }
    pub fn bytes(&self) -> usize {
        let s = &self.shadow;
        (self.k.len() + self.v.len()) * 4
            + self.kq.len()
            + self.vq.len()
            + (s.k_sink.len() + s.v_sink.len() + s.k_win.len() + s.v_win.len()) * 2
    }

    /// Whether its buffers have the lengths its geometry and format give (what
    /// [`StateShape::check`] asks of a KV cache besides heads and dims).
    fn consistent(&self) -> bool {
        let cells = self.n_head_kv.checked_mul(self.capacity);
        let (f, e) = if self.ty == KvType::F32 {
            (cells.and_then(|c| c.checked_mul(self.head_dim)), Some(0))
        } else {
            (Some(0), cells.and_then(|c| c.checked_mul(self.row_bytes())))
        };
        let s = &self.shadow;
        let nd = self.n_head_kv * self.head_dim;
        self.ty == self.ty.for_head_dim(self.head_dim)
            && f == Some(self.k.len())
            && f == Some(self.v.len())
            && e == Some(self.kq.len())
            && e == Some(self.vq.len())
            && s.k_sink.len() == nd * s.sink
            && s.v_sink.len() == nd * s.sink
            && s.slots == if s.window > 0 { s.window + kv::SEG } else { 0 }
            && s.k_win.len() == nd * s.slots
            && s.v_win.len() == nd * s.slots
            && (self.rot_k == 0 || self.rot_k == self.ty.rot_k(self.head_dim))
            && (self.rot_v == 0 || self.rot_v == self.ty.rot_v(self.head_dim))
    }

    /// Positions must be ≥ 0, and < capacity unless in ring mode.
    pub fn check_positions(&self, op: &'static str, pos: &[i32]) -> Result<(), OpError> {
        for &p in pos {
            if p < 0 {
                return Err(OpError::Invalid { op, msg: format!("negative position {p}") });
            }
            let p = p as usize;
            if !self.ring && p >= self.capacity {
                return Err(OpError::ContextFull { pos: p, need: p + 1, capacity: self.capacity });
            }
        }
        Ok(())
    }

    /// The first position a query at `p` attends to.
    pub fn first_visible(&self, p: usize) -> usize {
        if self.ring {
            (p + 1).saturating_sub(self.capacity)
        } else {
            0
        }
    }

    /// Split a batch (positions `pos`) into runs `[a, b)` that the kernels process as
    /// "write all k/v of the run, then attend": within a run no write overwrites a cell
    /// or shadow an earlier query of the run reads. Without ring mode and shadows this
    /// is the whole batch (one run: no allocation).
    pub fn runs(&self, pos: &[i32]) -> smallvec::SmallVec<[(usize, usize); 4]> {
        let mut out = smallvec::SmallVec::new();
        if pos.is_empty() {
            return out;
        }
        let (mut a, mut lo, mut hi) = (0, pos[0], pos[0]);
        for (t, &p) in pos.iter().enumerate().skip(1) {
            let (nl, nh) = (lo.min(p), hi.max(p));
            let wraps = self.ring && p as usize >= self.capacity;
            let spans = self.shadow.window > 0 && (nh - nl) as usize > kv::SEG;
            if wraps || spans {
                out.push((a, t));
                (a, lo, hi) = (t, p, p);
            } else {
                (lo, hi) = (nl, nh);
            }
        }
        out.push((a, pos.len()));
        out
    }

    fn main_cell(&self, p: usize) -> usize {
        if self.ring {
            p % self.capacity
        } else {
            p
        }
    }

    /// Store k, v (`head_dim` each, as computed by the model) of position `p`, KV head `g`:
    /// rotated when the format asks for it, encoded into the cell, and copied to the
    /// shadows in f16. `p` must have passed [`KvCache::check_positions`].
    pub fn write(&mut self, g: usize, p: usize, k: &[f32], v: &[f32]) {
        // the rotated rows in per-thread buffers: no allocation per token
        thread_local! {
            static ROWS: std::cell::RefCell<(Vec<f32>, Vec<f32>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
        }
        ROWS.with(|r| {
            let (kr, vr) = &mut *r.borrow_mut();
            kr.clear();
            kr.extend_from_slice(k);
            vr.clear();
            vr.extend_from_slice(v);
            self.write_rotated(g, p, kr, vr);
        })
    }

    fn write_rotated(&mut self, g: usize, p: usize, kr: &mut [f32], vr: &mut [f32]) {
        let d = self.head_dim;
        kv::hadamard(kr, self.rot_k);
        kv::hadamard(vr, self.rot_v);
        let c = g * self.capacity + self.main_cell(p);
        if self.ty == KvType::F32 {
            self.k[c * d..(c + 1) * d].copy_from_slice(kr);
            self.v[c * d..(c + 1) * d].copy_from_slice(vr);
        } else {
            let rb = self.row_bytes();
            kv::encode_row(self.ty, kr, &mut self.kq[c * rb..(c + 1) * rb]);
            kv::encode_row(self.ty, vr, &mut self.vq[c * rb..(c + 1) * rb]);
        }
        let s = &mut self.shadow;
        if p < s.sink {
            let o = (g * s.sink + p) * d;
            kv::to_f16(kr, &mut s.k_sink[o..o + d]);
            kv::to_f16(vr, &mut s.v_sink[o..o + d]);
        }
        if s.slots > 0 {
            let o = (g * s.slots + p % s.slots) * d;
            kv::to_f16(kr, &mut s.k_win[o..o + d]);
            kv::to_f16(vr, &mut s.v_win[o..o + d]);
        }
    }

    /// Where a query at position `p` reads K (`key`) or V of position `j ≤ p`, KV head `g`.
    pub fn source(&self, key: bool, g: usize, j: usize, p: usize) -> Cell<'_> {
        let d = self.head_dim;
        let s = &self.shadow;
        if j < s.sink {
            let o = (g * s.sink + j) * d;
            return Cell::F16(if key { &s.k_sink[o..o + d] } else { &s.v_sink[o..o + d] });
        }
        if j + s.window > p {
            let o = (g * s.slots + j % s.slots) * d;
            return Cell::F16(if key { &s.k_win[o..o + d] } else { &s.v_win[o..o + d] });
        }
        let c = g * self.capacity + self.main_cell(j);
        if self.ty == KvType::F32 {
            Cell::F32(if key { &self.k[c * d..(c + 1) * d] } else { &self.v[c * d..(c + 1) * d] })
        } else {
            let rb = self.row_bytes();
            Cell::Enc(if key { &self.kq[c * rb..(c + 1) * rb] } else { &self.vq[c * rb..(c + 1) * rb] })
        }
    }

    /// Whether queries at positions `a` and `b` (both ≥ `j`) read position `j` from the
    /// same place ([`KvCache::source`] depends on the query only through the window test).
    pub fn same_source(&self, j: usize, a: usize, b: usize) -> bool {
        let w = self.shadow.window;
        j < self.shadow.sink || (j + w > a) == (j + w > b)
    }

    /// Decode what [`KvCache::source`] points at into `out` (`head_dim` f32).
    pub fn read(&self, key: bool, g: usize, j: usize, p: usize, out: &mut [f32]) {
        match self.source(key, g, j, p) {
            Cell::F32(x) => out.copy_from_slice(x),
            Cell::Enc(b) => kv::decode_row(self.ty, b, out),
            Cell::F16(h) => kv::from_f16(h, out),
        }
    }

    /// Rotate a query head like the keys (no-op unless K is rotated).
    pub fn rotate_q(&self, q: &mut [f32]) {
        kv::hadamard(q, self.rot_k);
    }
    /// Undo the V rotation on an attention output head (no-op unless V is rotated).
    pub fn unrotate_o(&self, o: &mut [f32]) {
        kv::hadamard(o, self.rot_v);
    }

    /// Copy of the state after positions `0..pos` were written: the used cells of every
    /// head (`min(pos, capacity)`), the sink shadows of positions `< pos` and the window
    /// shadows of the last `window` positions (all a later query can read).
    pub fn snapshot(&self, pos: usize) -> KvSnapshot {
        let used = pos.min(self.capacity);
        let (d, rb) = (self.head_dim, self.row_bytes());
        let sh = &self.shadow;
        let (n_sink, n_win) = (pos.min(sh.sink), pos.min(sh.window));
        let mut s = KvSnapshot { ty: self.ty, pos, used, sink: sh.sink, window: sh.window, ..Default::default() };
        for g in 0..self.n_head_kv {
            let c = g * self.capacity;
            if self.ty == KvType::F32 {
                s.k.extend_from_slice(&self.k[c * d..(c + used) * d]);
                s.v.extend_from_slice(&self.v[c * d..(c + used) * d]);
            } else {
                s.kq.extend_from_slice(&self.kq[c * rb..(c + used) * rb]);
                s.vq.extend_from_slice(&self.vq[c * rb..(c + used) * rb]);
            }
            let o = g * sh.sink * d;
            s.k_sh.extend_from_slice(&sh.k_sink[o..o + n_sink * d]);
            s.v_sh.extend_from_slice(&sh.v_sink[o..o + n_sink * d]);
            for j in pos - n_win..pos {
                let o = (g * sh.slots + j % sh.slots) * d;
                s.k_sh.extend_from_slice(&sh.k_win[o..o + d]);
                s.v_sh.extend_from_slice(&sh.v_win[o..o + d]);
            }
        }
        s
    }

    /// Whether [`KvCache::restore`] takes `s` (same geometry, format, shadows and mode).
    pub fn accepts(&self, s: &KvSnapshot) -> bool {
        let (d, rb, n, nh) = (self.head_dim, self.row_bytes(), s.used, self.n_head_kv);
        let shadow_cells = s.pos.min(s.sink) + s.pos.min(s.window);
        n == s.pos.min(self.capacity)
            && (self.ring || s.pos <= self.capacity)
            && s.ty == self.ty
            && s.sink == self.shadow.sink
            && s.window == self.shadow.window
            && s.k_sh.len() == nh * shadow_cells * d
            && s.v_sh.len() == s.k_sh.len()
            && if self.ty == KvType::F32 {
                s.k.len() == nh * n * d && s.v.len() == s.k.len() && s.kq.is_empty()
            } else {
                s.kq.len() == nh * n * rb && s.vq.len() == s.kq.len() && s.k.is_empty()
            }
    }

    /// Put a snapshot of a cache of the same geometry and format back. Cells and shadows
    /// a snapshot does not hold keep their content: they are never read before being
    /// written again.
    pub fn restore(&mut self, s: &KvSnapshot) -> Result<(), String> {
        if !self.accepts(s) {
            return Err(format!("snapshot of {} positions ({}) does not fit this {} KV cache of {} cells", s.pos, s.ty, self.ty, self.capacity));
        }
        let (d, rb, n, pos) = (self.head_dim, self.row_bytes(), s.used, s.pos);
        let (n_sink, n_win) = (pos.min(s.sink), pos.min(s.window));
        let per_head = (n_sink + n_win) * d;
        for g in 0..self.n_head_kv {
            let c = g * self.capacity;
            if self.ty == KvType::F32 {
                self.k[c * d..(c + n) * d].copy_from_slice(&s.k[g * n * d..(g + 1) * n * d]);
                self.v[c * d..(c + n) * d].copy_from_slice(&s.v[g * n * d..(g + 1) * n * d]);
            } else {
                self.kq[c * rb..(c + n) * rb].copy_from_slice(&s.kq[g * n * rb..(g + 1) * n * rb]);
                self.vq[c * rb..(c + n) * rb].copy_from_slice(&s.vq[g * n * rb..(g + 1) * n * rb]);
            }
            let sh = &mut self.shadow;
            let (ks, vs) = (&s.k_sh[g * per_head..(g + 1) * per_head], &s.v_sh[g * per_head..(g + 1) * per_head]);
            let o = g * sh.sink * d;
            sh.k_sink[o..o + n_sink * d].copy_from_slice(&ks[..n_sink * d]);
            sh.v_sink[o..o + n_sink * d].copy_from_slice(&vs[..n_sink * d]);
            for (i, j) in (pos - n_win..pos).enumerate() {
                let o = (g * sh.slots + j % sh.slots) * d;
                let src = (n_sink + i) * d;
                sh.k_win[o..o + d].copy_from_slice(&ks[src..src + d]);
                sh.v_win[o..o + d].copy_from_slice(&vs[src..src + d]);
            }
        }
        Ok(())
    }

    fn clear(&mut self) {
        self.k.fill(0.0);
        self.v.fill(0.0);
        self.kq.fill(0);
        self.vq.fill(0);
        let s = &mut self.shadow;
        for b in [&mut s.k_sink, &mut s.v_sink, &mut s.k_win, &mut s.v_win] {
            b.fill(0);
        }
    }
}

/// What a later query can read of a [`KvCache`] after `pos` positions: `[n_head_kv][used]`
/// cells, and per head the sink shadows of positions `< min(pos, sink)` followed by the
/// window shadows of the last `min(pos, window)` positions.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KvSnapshot {
    pub ty: KvType,
    pub pos: usize,
    pub used: usize,
    pub sink: usize,
    pub window: usize,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub kq: Vec<u8>,
    pub vq: Vec<u8>,
    pub k_sh: Vec<u16>,
    pub v_sh: Vec<u16>,
}

impl KvSnapshot {
    pub fn bytes(&self) -> usize {
        (self.k.len() + self.v.len()) * 4 + self.kq.len() + self.vq.len() + (self.k_sh.len() + self.v_sh.len()) * 2
    }
}

/// State of one Gated-DeltaNet layer: the causal-conv window and the delta-rule matrices.
#[derive(Clone, Debug, PartialEq)]
pub struct RecurrentState {
    /// `[d_conv - 1][channels]`: the last d_conv-1 pre-conv inputs, oldest first.
    pub conv: Vec<f32>,
    pub conv_channels: usize,
    /// `[Hv][Dv][Dk]`: `ssm[h][j][i] = S_h[i][j]` (ggml layout, spec §4.4).
    pub ssm: Vec<f32>,
    pub n_v_heads: usize,
    pub head_k_dim: usize,
    pub head_v_dim: usize,
}

impl RecurrentState {
    pub fn new(d_conv: usize, channels: usize, n_v_heads: usize, dk: usize, dv: usize) -> Self {
        RecurrentState {
            conv: written_zeros((d_conv - 1) * channels),
            conv_channels: channels,
            ssm: written_zeros(n_v_heads * dv * dk),
            n_v_heads,
            head_k_dim: dk,
            head_v_dim: dv,
        }
    }
    pub fn bytes(&self) -> usize {
        (self.conv.len() + self.ssm.len()) * 4
    }
}

/// `n` zeros written into fresh pages (a memset), not `calloc`'d: the recurrence reads its
/// state before writing it, and a calloc'd buffer's pages first map the shared zero page
/// on that read, then fault again on the write (copy on write and a TLB shootdown to the
/// other cores, ~15 µs a 4 KB page on a VM): a fresh sequence's first token took 70 ms
/// instead of 14 on full-dims (docs/perf.md "Session 32").
fn written_zeros(n: usize) -> Vec<f32> {
    let mut v = Vec::with_capacity(n);
    // (the pointer escapes first, so the allocation and the memset cannot be fused back
    // into a zeroed allocation)
    std::hint::black_box(v.as_mut_ptr());
    v.resize(n, 0.0);
    v
}

/// The state one layer keeps for one sequence.
#[derive(Clone, Debug, PartialEq)]
pub enum LayerState {
    Kv(KvCache),
    Recurrent(RecurrentState),
    /// A layer without state (e.g. a layer type that needs none).
    None,
}

/// A copy of one layer's state: the used KV cells, or the whole recurrent state.
#[derive(Clone, Debug, PartialEq)]
pub enum LayerSnapshot {
    Kv(KvSnapshot),
    Recurrent(RecurrentState),
    None,
}

impl LayerSnapshot {
    pub fn bytes(&self) -> usize {
        match self {
            LayerSnapshot::Kv(k) => k.bytes(),
            LayerSnapshot::Recurrent(r) => r.bytes(),
            LayerSnapshot::None => 0,
        }
    }
}

impl LayerState {
    pub fn bytes(&self) -> usize {
        match self {
            LayerState::Kv(k) => k.bytes(),
            LayerState::Recurrent(r) => r.bytes(),
            LayerState::None => 0,
        }
    }
    /// Back to the state of a fresh sequence (zero conv/ssm; KV contents are masked by
    /// position so they need not be cleared, but are, so stale data can never leak).
    pub fn reset(&mut self) {
        match self {
            LayerState::Kv(k) => k.clear(),
            LayerState::Recurrent(r) => {
                r.conv.fill(0.0);
                r.ssm.fill(0.0);
            }
            LayerState::None => {}
        }
    }
    /// Copy of the state after positions `0..pos` were processed.
    pub fn snapshot(&self, pos: usize) -> LayerSnapshot {
        match self {
            LayerState::Kv(k) => LayerSnapshot::Kv(k.snapshot(pos)),
            LayerState::Recurrent(r) => LayerSnapshot::Recurrent(r.clone()),
            LayerState::None => LayerSnapshot::None,
        }
    }
    /// Whether [`LayerState::restore`] takes `s`.
    pub fn accepts(&self, s: &LayerSnapshot) -> bool {
        match (self, s) {
            (LayerState::Kv(k), LayerSnapshot::Kv(s)) => k.accepts(s),
            (LayerState::Recurrent(r), LayerSnapshot::Recurrent(s)) => r.conv.len() == s.conv.len() && r.ssm.len() == s.ssm.len(),
            (LayerState::None, LayerSnapshot::None) => true,
            _ => false,
        }
    }
    pub fn restore(&mut self, s: &LayerSnapshot) -> Result<(), String> {
        match (self, s) {
            (LayerState::Kv(k), LayerSnapshot::Kv(s)) => k.restore(s),
            (LayerState::Recurrent(r), LayerSnapshot::Recurrent(s)) => {
                if r.conv.len() != s.conv.len() || r.ssm.len() != s.ssm.len() {
                    return Err("recurrent snapshot of another geometry".into());
                }
                r.conv.copy_from_slice(&s.conv);
                r.ssm.copy_from_slice(&s.ssm);
                Ok(())
            }
            (LayerState::None, LayerSnapshot::None) => Ok(()),
            _ => Err("snapshot of another layer kind".into()),
        }
    }
}

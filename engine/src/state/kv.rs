//! Choosing and allocating a sequence's state: KV format, max_seq, overflow behaviour
//! (flags, then environment), the bytes a choice costs, and the memory ladder
//! (docs/kv-cache.md).

use super::SeqState;
use crate::model::Model;
use crate::runner::Runner;
use pn_ops::{KvCache, KvType, LayerState, Overflow};
use thiserror::Error;

/// Default KV capacity in positions.
pub const DEFAULT_MAX_SEQ: usize = 4096;
/// `max_seq` is clamped to this range.
pub const MIN_MAX_SEQ: usize = 16;
pub const MAX_MAX_SEQ: usize = 262_144;

/// What a sequence state is allocated with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateConfig {
    pub max_seq: usize,
    pub kv: KvType,
    pub overflow: Overflow,
}

impl Default for StateConfig {
    fn default() -> Self {
        StateConfig { max_seq: DEFAULT_MAX_SEQ, kv: KvType::default(), overflow: Overflow::Error }
    }
}

#[derive(Debug, Error, Clone, PartialEq)]
pub enum StateError {
    #[error("{what}: {msg}")]
    Bad { what: &'static str, msg: String },
    #[error(
        "not enough memory for the sequence state: max_seq {max_seq} needs {need} bytes with {kv} KV \
         ({q4} with q4_0) but {avail} bytes are available (lower --max-seq)"
    )]
    TooLarge { max_seq: usize, kv: KvType, need: u64, q4: u64, avail: u64 },
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|s| !s.trim().is_empty())
}

/// The KV format: `flag`, else `PN_KV_TYPE`, else `QWEN35_KV_Q4` (`0` → f32, anything
/// else → q4_0), else q4_0.
pub fn resolve_kv_type(flag: Option<&str>) -> Result<KvType, StateError> {
    if let Some(s) = flag {
        return s.parse().map_err(|msg| StateError::Bad { what: "--kv-type", msg });
    }
    if let Some(s) = env("PN_KV_TYPE") {
        return s.parse().map_err(|msg| StateError::Bad { what: "PN_KV_TYPE", msg });
    }
    if let Some(s) = env("QWEN35_KV_Q4") {
        return Ok(if s.trim() == "0" { KvType::F32 } else { KvType::Q4_0 });
    }
    Ok(KvType::default())
}

/// `max_seq`: `flag`, else `PN_MAX_SEQ`, else `QWEN35_MAX_SEQ`, else 4096; clamped to
/// [16, 262144]. Returns the value and a warning when it was clamped.
pub fn resolve_max_seq(flag: Option<usize>) -> Result<(usize, Option<String>), StateError> {
    let (n, src) = match flag {
        Some(n) => (n, "--max-seq"),
        None => {
            let from = |name: &'static str| -> Option<Result<(usize, &'static str), StateError>> {
                env(name).map(|s| {
                    s.trim()
                        .parse::<usize>()
                        .map(|n| (n, name))
                        .map_err(|_| StateError::Bad { what: name, msg: format!("expected a number of positions, found {s:?}") })
                })
            };
            match from("PN_MAX_SEQ").or_else(|| from("QWEN35_MAX_SEQ")) {
                Some(r) => r?,
                None => (DEFAULT_MAX_SEQ, "default"),
            }
        }
    };
    let c = n.clamp(MIN_MAX_SEQ, MAX_MAX_SEQ);
    let warn = (c != n).then(|| format!("warning: {src} {n} clamped to {c} (allowed: {MIN_MAX_SEQ}..={MAX_MAX_SEQ})"));
    Ok((c, warn))
}

/// The overflow behaviour: `flag`, else `PN_CONTEXT_OVERFLOW`, else error.
pub fn resolve_overflow(flag: Option<&str>) -> Result<Overflow, StateError> {
    match flag.map(str::to_string).or_else(|| env("PN_CONTEXT_OVERFLOW")) {
        Some(s) => s.parse().map_err(|msg| StateError::Bad { what: "--context-overflow", msg }),
        None => Ok(Overflow::Error),
    }
}

/// Bytes of a sequence state, by part.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StateBytes {
    /// KV cells and shadows of every attention layer.
    pub kv: u64,
    /// Conv and delta-rule states (independent of max_seq).
    pub recurrent: u64,
    pub kv_layers: usize,
}

impl StateBytes {
    pub fn total(&self) -> u64 {
        self.kv + self.recurrent
    }
}

/// What a state of `max_seq` positions in format `kv` costs, without allocating the cells.
pub fn state_bytes(model: &dyn Model, max_seq: usize, kv: KvType) -> StateBytes {
    let mut b = StateBytes::default();
    for l in model.new_state(0) {
        match l {
            LayerState::Kv(c) => {
                b.kv += KvCache::bytes_for(c.n_head_kv, c.head_dim, max_seq, kv) as u64;
                b.kv_layers += 1;
            }
            other => b.recurrent += other.bytes() as u64,
        }
    }
    b
}

/// `MemAvailable` from /proc/meminfo, in bytes (None where it cannot be read).
pub fn mem_available() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The memory ladder: the requested format if the state fits in `avail` bytes, else q4_0
/// (with a note saying so), else an error with the numbers. `avail` None: no check.
pub fn choose_kv(model: &dyn Model, max_seq: usize, kv: KvType, avail: Option<u64>) -> Result<(KvType, Option<String>), StateError> {
    let need = state_bytes(model, max_seq, kv).total();
    let Some(avail) = avail else { return Ok((kv, None)) };
    if need <= avail {
        return Ok((kv, None));
    }
    let q4 = state_bytes(model, max_seq, KvType::Q4_0).total();
    if kv != KvType::Q4_0 && q4 <= avail {
        let note = format!(
            "note: the sequence state with {kv} KV needs {need} bytes for max_seq {max_seq} but {avail} bytes are available: using q4_0 KV ({q4} bytes)"
        );
        return Ok((KvType::Q4_0, Some(note)));
    }
    Err(StateError::TooLarge { max_seq, kv, need, q4, avail })
}

impl Runner {
    /// A fresh sequence state with `max_seq` positions of KV in format `kv` (overflow:
    /// error). [`Runner::new_state`] is the f32 case.
    pub fn new_state_with(&self, max_seq: usize, kv: KvType) -> SeqState {
        SeqState::new(self.model().new_state_with(max_seq, kv), max_seq)
    }

    /// Allocate a state for `cfg` through the memory ladder (MemAvailable): returns the
    /// state and the notes to show (e.g. the fallback to q4_0).
    pub fn alloc_state(&self, cfg: &StateConfig) -> Result<(SeqState, Vec<String>), StateError> {
        self.alloc_state_within(cfg, mem_available())
    }

    /// [`Runner::alloc_state`] with an explicit memory budget (None: unchecked).
    pub fn alloc_state_within(&self, cfg: &StateConfig, avail: Option<u64>) -> Result<(SeqState, Vec<String>), StateError> {
        let (kv, note) = choose_kv(self.model(), cfg.max_seq, cfg.kv, avail)?;
        let mut st = self.new_state_with(cfg.max_seq, kv);
        // a fresh state is on the host: nothing to move
        st.set_overflow(cfg.overflow).map_err(|e| StateError::Bad { what: "overflow", msg: e.to_string() })?;
        Ok((st, note.into_iter().collect()))
    }
}

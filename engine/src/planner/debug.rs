//! `PN_DEBUG` for the runner: 1 = one line per segment per step (time, ops, transfer
//! bytes) plus capture counters and the step's host ↔ device copies ([`Moves`]); 2 = also a per-op-kind timing table (count, total,
//! mean, % of step time), printed when the runner is dropped (so `pn run` shows one table
//! for the whole generation); 3 = also a value summary line per executed op.
//! `PN_PROFILE=nodes` (with `PN_DEBUG≥2`) splits the timing table by node name with the
//! layer indices taken out (`MatMul blk.ffn_up_shexp`: that projection in every layer).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// The `PN_DEBUG` level (0 when unset or not a number).
pub fn level_from_env() -> u8 {
    std::env::var("PN_DEBUG")
        .ok()
        .and_then(|v| v.trim().parse::<u8>().ok())
        .unwrap_or(0)
}

/// Whether `PN_PROFILE=nodes` asks for the timing table by node (read once).
pub fn profile_by_node() -> bool {
    static BY_NODE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *BY_NODE.get_or_init(|| std::env::var("PN_PROFILE").is_ok_and(|v| v.trim() == "nodes"))
}

/// The timing table's row for an op: its kind, or with [`profile_by_node`] the kind and
/// the node's name without its digits (every layer's copy of a node shares one row).
/// Names are interned: one leaked string per distinct row, bounded by the graph's names.
pub fn op_row(kind: &'static str, name: &str) -> &'static str {
    if !profile_by_node() {
        return kind;
    }
    static ROWS: Mutex<BTreeSet<&'static str>> = Mutex::new(BTreeSet::new());
    let row = node_row(kind, name);
    let mut rows = ROWS.lock().expect("profile rows lock");
    if let Some(&r) = rows.get(row.as_str()) {
        return r;
    }
    let leaked: &'static str = Box::leak(row.into_boxed_str());
    rows.insert(leaked);
    leaked
}

/// `"MatMul ffn_up_shexp-"` for node `ffn_up_shexp-17`: the kind, the name without digits.
fn node_row(kind: &str, name: &str) -> String {
    format!("{kind} {}", name.chars().filter(|c| !c.is_ascii_digit()).collect::<String>())
}

/// Counters and timings of a runner.
#[derive(Default)]
pub struct Profile {
    pub steps: AtomicU64,
    /// Segment runs that happened uncaptured on a capturable unit (the first run).
    pub captures: AtomicU64,
    /// Segment runs replayed from a captured unit.
    pub replays: AtomicU64,
    /// Bytes copied between dies.
    pub transfer_bytes: AtomicU64,
    /// Host ↔ resident-backend traffic (see [`Moves`]).
    moves: [AtomicU64; N_MOVES],
    step_ns: AtomicU64,
    ops: Mutex<BTreeMap<&'static str, (u64, u64)>>,
}

/// A snapshot of the counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub steps: u64,
    pub captures: u64,
    pub replays: u64,
    pub transfer_bytes: u64,
    /// Host → resident backend copies of activations (graph inputs, values arriving from
    /// a host die or staged between two backends) and their bytes.
    pub uploads: u64,
    pub upload_bytes: u64,
    /// Resident backend → host copies (values leaving for a host die, the graph output,
    /// observer copies) and their bytes.
    pub downloads: u64,
    pub download_bytes: u64,
    /// Die-to-die copies done by a backend hook (`Backend::copy_from`), and their bytes.
    pub device_copies: u64,
    pub device_copy_bytes: u64,
    /// Layer states moved by the runner to / from resident backends, and their bytes.
    pub state_uploads: u64,
    pub state_downloads: u64,
    pub state_bytes: u64,
}

const N_MOVES: usize = 9;

/// Host ↔ device traffic of one step (same fields as in [`Counters`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Moves {
    pub uploads: u64,
    pub upload_bytes: u64,
    pub downloads: u64,
    pub download_bytes: u64,
    pub device_copies: u64,
    pub device_copy_bytes: u64,
    pub state_uploads: u64,
    pub state_downloads: u64,
    pub state_bytes: u64,
}

impl Moves {
    fn array(&self) -> [u64; N_MOVES] {
        [
            self.uploads,
            self.upload_bytes,
            self.downloads,
            self.download_bytes,
            self.device_copies,
            self.device_copy_bytes,
            self.state_uploads,
            self.state_downloads,
            self.state_bytes,
        ]
    }
    pub fn is_zero(&self) -> bool {
        self.array() == [0; N_MOVES]
    }
    /// The `PN_DEBUG` step line's part: `up N (B B), down N (B B), d2d N (B B), state up N down N (B B)`.
    pub fn line(&self) -> String {
        format!(
            "host->device {} ({} B), device->host {} ({} B), die-to-die {} ({} B), state up {} down {} ({} B)",
            self.uploads,
            self.upload_bytes,
            self.downloads,
            self.download_bytes,
            self.device_copies,
            self.device_copy_bytes,
            self.state_uploads,
            self.state_downloads,
            self.state_bytes
        )
    }
}

impl Profile {
    pub fn counters(&self) -> Counters {
        let m: [u64; N_MOVES] = std::array::from_fn(|i| self.moves[i].load(Ordering::Relaxed));
        Counters {
            steps: self.steps.load(Ordering::Relaxed),
            captures: self.captures.load(Ordering::Relaxed),
            replays: self.replays.load(Ordering::Relaxed),
            transfer_bytes: self.transfer_bytes.load(Ordering::Relaxed),
            uploads: m[0],
            upload_bytes: m[1],
            downloads: m[2],
            download_bytes: m[3],
            device_copies: m[4],
            device_copy_bytes: m[5],
            state_uploads: m[6],
            state_downloads: m[7],
            state_bytes: m[8],
        }
    }
    /// Adds one step's host ↔ device traffic.
    pub fn add_moves(&self, m: &Moves) {
        if m.is_zero() {
            return;
        }
        for (a, v) in self.moves.iter().zip(m.array()) {
            a.fetch_add(v, Ordering::Relaxed);
        }
    }
    pub fn add_step(&self, d: Duration) {
        self.steps.fetch_add(1, Ordering::Relaxed);
        self.step_ns
            .fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
    }
    /// Adds per-op-kind timings gathered during one step.
    pub fn add_ops(&self, local: &BTreeMap<&'static str, (u64, u64)>) {
        let mut m = self.ops.lock().expect("profile lock");
        for (k, (n, ns)) in local {
            let e = m.entry(k).or_default();
            e.0 += n;
            e.1 += ns;
        }
    }
    /// The per-op timing table (empty when nothing was timed).
    pub fn op_table(&self) -> String {
        let m = self.ops.lock().expect("profile lock");
        if m.is_empty() {
            return String::new();
        }
        let total = self.step_ns.load(Ordering::Relaxed).max(1) as f64;
        let mut rows: Vec<_> = m.iter().collect();
        let w = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0).max(14);
        rows.sort_by_key(|(_, (_, ns))| std::cmp::Reverse(*ns));
        let mut s = format!(
            "[pn] per-op timing over {} steps\n",
            self.steps.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            s,
            "[pn] {:<w$} {:>9} {:>12} {:>11} {:>7}",
            "op", "count", "total ms", "mean us", "% step"
        );
        for (k, (n, ns)) in rows {
            let _ = writeln!(
                s,
                "[pn] {k:<w$} {n:>9} {:>12.3} {:>11.2} {:>6.1}%",
                *ns as f64 / 1e6,
                *ns as f64 / 1e3 / (*n).max(1) as f64,
                100.0 * *ns as f64 / total
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_node_row_names_every_layer_copy_alike() {
        assert_eq!(super::node_row("MatMul", "blk.17.ffn_up_shexp"), "MatMul blk..ffn_up_shexp");
        assert_eq!(super::node_row("MatMul", "blk.3.ffn_up_shexp"), super::node_row("MatMul", "blk.30.ffn_up_shexp"));
        assert_ne!(super::node_row("MatMul", "z-1"), super::node_row("Unary", "z-1"));
    }
}

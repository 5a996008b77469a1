//! `PN_DEBUG` for the runner: 1 = one line per segment per step (time, ops, transfer
//! bytes) plus capture counters and the step's host ↔ device copies ([`Counters`]); 2 =
//! also a per-op-kind timing table (count, total, mean, % of step time), printed when the
//! runner is dropped (so `pn run` shows one table for the whole generation); 3 = also a
//! value summary line per executed op.
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

/// Declares [`Counters`] (fields with their docs) and its field-wise sum.
macro_rules! counters {
    ($($(#[doc = $d:literal])* $f:ident),* $(,)?) => {
        /// A runner's counters: its totals ([`Profile::counters`]), or one step's, which
        /// the runner gathers during the step and adds to the totals at its end.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct Counters {
            $($(#[doc = $d])* pub $f: u64,)*
        }
        impl std::ops::AddAssign<&Counters> for Counters {
            fn add_assign(&mut self, o: &Counters) {
                $(self.$f += o.$f;)*
            }
        }
    };
}

counters! {
    steps,
    /// Segment runs that happened uncaptured on a capturable unit (the first run).
    captures,
    /// Segment runs replayed from a captured unit.
    replays,
    /// Bytes copied between dies.
    transfer_bytes,
    /// Host → resident backend copies of activations (graph inputs, values arriving from
    /// a host die or staged between two backends) and their bytes.
    uploads,
    upload_bytes,
    /// Resident backend → host copies (values leaving for a host die, the graph output,
    /// observer copies) and their bytes.
    downloads,
    download_bytes,
    /// Die-to-die copies done by a backend hook (`Backend::copy_from`), and their bytes.
    device_copies,
    device_copy_bytes,
    /// Layer states moved by the runner to / from resident backends, and their bytes.
    state_uploads,
    state_downloads,
    state_bytes,
}

impl Counters {
    /// The `PN_DEBUG` step line's part: the host ↔ device traffic.
    pub fn moves_line(&self) -> String {
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

/// Counters and timings of a runner.
#[derive(Default)]
pub struct Profile {
    totals: Mutex<Counters>,
    step_ns: AtomicU64,
    ops: Mutex<BTreeMap<&'static str, (u64, u64)>>,
}

impl Profile {
    pub fn counters(&self) -> Counters {
        *self.totals.lock().expect("profile lock")
    }
    /// Adds one step: its counters and its time.
    pub fn add_step(&self, step: &Counters, d: Duration) {
        let mut t = self.totals.lock().expect("profile lock");
        *t += step;
        t.steps += 1;
        self.step_ns.fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
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
        let mut s = format!("[pn] per-op timing over {} steps\n", self.counters().steps);
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

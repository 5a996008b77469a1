//! `PN_DEBUG` for the runner: 1 = one line per segment per step (time, ops, transfer
//! bytes) plus capture counters; 2 = also a per-op-kind timing table (count, total,
//! mean, % of step time), printed when the runner is dropped (so `pn run` shows one table
//! for the whole generation); 3 = also a value summary line per executed op.

use std::collections::BTreeMap;
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
}

impl Profile {
    pub fn counters(&self) -> Counters {
        Counters {
            steps: self.steps.load(Ordering::Relaxed),
            captures: self.captures.load(Ordering::Relaxed),
            replays: self.replays.load(Ordering::Relaxed),
            transfer_bytes: self.transfer_bytes.load(Ordering::Relaxed),
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
        rows.sort_by_key(|(_, (_, ns))| std::cmp::Reverse(*ns));
        let mut s = format!(
            "[pn] per-op timing over {} steps\n",
            self.steps.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            s,
            "[pn] {:<14} {:>9} {:>12} {:>11} {:>7}",
            "op", "count", "total ms", "mean us", "% step"
        );
        for (k, (n, ns)) in rows {
            let _ = writeln!(
                s,
                "[pn] {k:<14} {n:>9} {:>12.3} {:>11.2} {:>6.1}%",
                *ns as f64 / 1e6,
                *ns as f64 / 1e3 / (*n).max(1) as f64,
                100.0 * *ns as f64 / total
            );
        }
        s
    }
}

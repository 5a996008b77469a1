//! When a resident segment is captured as a CUDA graph, replayed, or run directly (host
//! logic, unit tested without a GPU; the device side is segment.rs).
//!
//! A stable segment (`SegmentRun::stable`: one token per step, e.g. decode) defers its
//! commands (exec.rs) and, at its end, compares their [`fingerprint`](crate::exec::fingerprint)
//! — every kernel, launch geometry, address and scalar — with
//! - the graph held for the segment's key: equal → **replay** the graph;
//! - the previous run of the key: equal → **capture** (the work repeats step after step),
//!   then replay;
//! - otherwise → run the commands directly (**eager**) and remember the fingerprint.
//!
//! So a graph is only ever replayed for exactly the work it recorded: a changed address
//! (another sequence's state, a regrown buffer), a changed scalar or launch shape means
//! no replay, and the new work is captured once it repeats (a re-capture: the old graph
//! is dropped). Nothing that differs between steps can be baked into a replay; what must
//! change per step inside a graph (positions, the attention context, KV write offsets)
//! is read by the kernels from device memory. A key whose capture failed is not captured
//! again (its segments run eagerly).

use crate::exec::Cmd;
use crate::graphs::GraphKey;
use pn_engine::SegmentRun;
use std::collections::{HashMap, HashSet};

/// What to do with a deferred segment's commands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    Replay,
    Capture,
    Eager,
}

/// The graph key of a segment: its arena (runner and die), index, token count and
/// logits mode (the commands themselves are compared exactly, so a collision of two
/// segments' keys only costs a re-capture, never a wrong replay).
pub fn seg_key(run: &SegmentRun) -> GraphKey {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for x in [
        run.arena,
        run.segment as u64,
        run.n_tokens as u64,
        run.all_logits as u64,
    ] {
        for b in x.to_le_bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// Per key: the fingerprint of its last direct run, whether its capture failed, and its
/// arena (graphs are dropped with their runner's slots).
#[derive(Default)]
pub struct CapturePolicy {
    last: HashMap<GraphKey, Vec<u64>>,
    failed: HashSet<GraphKey>,
    arena: HashMap<GraphKey, u64>,
}

impl CapturePolicy {
    /// `graph_matches`: the graph held for `key` was captured for exactly `fp`.
    pub fn decide(
        &mut self,
        key: GraphKey,
        arena: u64,
        fp: &[u64],
        graph_matches: bool,
    ) -> Decision {
        self.arena.insert(key, arena);
        if graph_matches {
            return Decision::Replay;
        }
        if self.failed.contains(&key) {
            return Decision::Eager;
        }
        if self.last.get(&key).is_some_and(|l| l[..] == *fp) {
            return Decision::Capture;
        }
        self.last.insert(key, fp.to_vec());
        Decision::Eager
    }
    /// The capture of `key` failed: run its segments directly from now on.
    pub fn capture_failed(&mut self, key: GraphKey) {
        self.failed.insert(key);
        self.last.remove(&key);
    }
    /// Forgets the keys of `arena` (its slots are freed); returns them (graphs to drop).
    pub fn forget_arena(&mut self, arena: u64) -> Vec<GraphKey> {
        let keys: Vec<GraphKey> = self
            .arena
            .iter()
            .filter(|(_, &a)| a == arena)
            .map(|(&k, _)| k)
            .collect();
        for k in &keys {
            self.arena.remove(k);
            self.last.remove(k);
            self.failed.remove(k);
        }
        keys
    }
}

/// The segment between `begin_segment` and `end_segment`.
pub struct OpenSeg {
    pub run: SegmentRun,
    pub key: GraphKey,
    /// Commands are collected (a stable segment with graphs on) instead of launched.
    pub defer: bool,
    pub pending: Vec<Cmd>,
    /// An op failed: the commands collected so far are launched directly at the end.
    pub failed: bool,
    /// Something needed the stream in the middle (a download for the observer, an
    /// upload): the collected commands were launched then, the rest go directly.
    pub flushed: bool,
    /// Commands issued in the segment.
    pub issued: usize,
}

impl OpenSeg {
    pub fn new(run: SegmentRun, graphs: bool) -> OpenSeg {
        OpenSeg {
            run,
            key: seg_key(&run),
            defer: graphs && run.stable,
            pending: Vec::new(),
            failed: false,
            flushed: false,
            issued: 0,
        }
    }
    /// Commands to launch directly now (a flush); afterwards nothing is deferred.
    pub fn take_for_flush(&mut self) -> Vec<Cmd> {
        if self.defer {
            self.defer = false;
            self.flushed = true;
        }
        std::mem::take(&mut self.pending)
    }
    /// Whether the collected commands are a candidate for replay / capture at the end.
    pub fn capturable(&self) -> bool {
        self.defer && !self.failed && !self.flushed && !self.pending.is_empty()
    }
}

/// What the resident path did (since the backend was made).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ResidentStats {
    pub uploads: u64,
    pub upload_bytes: u64,
    pub downloads: u64,
    pub download_bytes: u64,
    /// Die-to-die copies received (`copy_from`).
    pub device_copies: u64,
    pub device_copy_bytes: u64,
    pub state_uploads: u64,
    pub state_downloads: u64,
    pub state_copies: u64,
    pub state_releases: u64,
    /// In-place resets (`state_reset`: device memsets, nothing crosses the bus).
    pub state_resets: u64,
    /// Ranged snapshot copies (`state_snapshot`) and the bytes they brought to the host.
    pub state_snapshots: u64,
    pub state_snapshot_bytes: u64,
    /// Ops run (`execute_resident`, `execute_multi_resident`) and commands they issued.
    pub ops: u64,
    pub commands: u64,
    pub segments: u64,
    pub segments_replayed: u64,
    pub segments_captured: u64,
    /// Stable segments run directly (first run, changed work, failed capture, flushed).
    pub segments_eager: u64,
    /// Deferred commands launched early (something needed the stream mid-segment).
    pub flushes: u64,
    /// Host waits for the device: downloads and state downloads.
    pub syncs: u64,
    /// Now: slots and their bytes, layer states and their bytes, scratch bytes.
    pub slots: u64,
    pub slot_bytes: u64,
    pub states: u64,
    pub state_bytes: u64,
    pub scratch_bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(segment: usize, n_tokens: usize) -> SegmentRun {
        SegmentRun {
            arena: 7,
            segment,
            n_tokens,
            all_logits: false,
            stable: n_tokens == 1,
            replay: false,
        }
    }

    #[test]
    fn capture_once_the_work_repeats_then_replay() {
        let mut p = CapturePolicy::default();
        let k = seg_key(&run(0, 1));
        let a = [1u64, 2, 3];
        assert_eq!(
            p.decide(k, 7, &a, false),
            Decision::Eager,
            "first run: direct, remembered"
        );
        assert_eq!(
            p.decide(k, 7, &a, false),
            Decision::Capture,
            "the same work again: capture"
        );
        assert_eq!(p.decide(k, 7, &a, true), Decision::Replay);
        // other work (another sequence's state, a regrown buffer): direct, then re-captured
        let b = [1u64, 2, 4];
        assert_eq!(p.decide(k, 7, &b, false), Decision::Eager);
        assert_eq!(p.decide(k, 7, &b, false), Decision::Capture);
        // alternating work is never captured
        let c = [9u64];
        for _ in 0..3 {
            assert_eq!(p.decide(k, 7, &c, false), Decision::Eager);
            assert_eq!(p.decide(k, 7, &a, false), Decision::Eager);
        }
    }

    #[test]
    fn failed_capture_and_released_arena() {
        let mut p = CapturePolicy::default();
        let (k0, k1) = (seg_key(&run(0, 1)), seg_key(&run(1, 1)));
        assert_ne!(k0, k1);
        p.decide(k0, 7, &[1], false);
        assert_eq!(p.decide(k0, 7, &[1], false), Decision::Capture);
        p.capture_failed(k0);
        assert_eq!(p.decide(k0, 7, &[1], false), Decision::Eager);
        assert_eq!(
            p.decide(k0, 7, &[1], false),
            Decision::Eager,
            "not captured again"
        );
        p.decide(k1, 8, &[2], false);
        let mut gone = p.forget_arena(7);
        gone.sort();
        assert_eq!(gone, vec![k0]);
        assert_eq!(
            p.decide(k1, 8, &[2], false),
            Decision::Capture,
            "other arenas keep their history"
        );
        assert_eq!(
            p.decide(k0, 7, &[1], false),
            Decision::Eager,
            "a new arena starts over"
        );
    }

    #[test]
    fn keys_name_the_geometry() {
        let base = run(2, 1);
        let mut keys = vec![seg_key(&base)];
        for r in [
            SegmentRun { arena: 8, ..base },
            SegmentRun { segment: 3, ..base },
            SegmentRun {
                n_tokens: 4,
                ..base
            },
            SegmentRun {
                all_logits: true,
                ..base
            },
        ] {
            keys.push(seg_key(&r));
        }
        let n = keys.len();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), n);
        assert_eq!(
            seg_key(&SegmentRun {
                replay: true,
                ..base
            }),
            seg_key(&base),
            "the runner's hint is not part of the key"
        );
    }

    #[test]
    fn what_is_deferred() {
        let stable = OpenSeg::new(run(0, 1), true);
        assert!(stable.defer, "decode segments are deferred for capture");
        assert!(
            !OpenSeg::new(run(0, 5), true).defer,
            "prefill runs directly"
        );
        assert!(
            !OpenSeg::new(run(0, 1), false).defer,
            "graphs off (PN_CUDA_GRAPHS=0)"
        );
        let mut s = stable;
        assert!(!s.capturable(), "nothing collected");
        s.pending.push(Cmd::Copy {
            dst: 1,
            src: 2,
            bytes: 4,
        });
        assert!(s.capturable());
        assert_eq!(s.take_for_flush().len(), 1);
        assert!(
            !s.defer && s.flushed && !s.capturable(),
            "flushed: the rest runs directly"
        );
        let mut f = OpenSeg::new(run(0, 1), true);
        f.pending.push(Cmd::Copy {
            dst: 1,
            src: 2,
            bytes: 4,
        });
        f.failed = true;
        assert!(!f.capturable(), "an op failed: never captured");
    }
}

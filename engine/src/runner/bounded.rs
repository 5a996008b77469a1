//! The runner's per-geometry caches (graphs, compiled plans), bounded: least recently
//! used out first.
//!
//! A compiled geometry (graph, plan, program, executables) takes ~940 bytes per graph
//! node: 442 KB on the built-in model (8 layers, 472 nodes), 223 KB on a 4-layer
//! real-dims file, so ~2.2 MB on the 40-layer Qwen3.5-35B-A3B; compiling one takes ~0.7 ms
//! on the built-in model (`tests/tests/arena.rs` `geometry_bytes`). A server
//! meets many geometries (mixed passes: k decode tokens beside a prefill chunk of any
//! length), so unbounded caches grew without end under load (docs/server.md "Load and
//! faults"). The bound is a byte budget over that estimate (256 MiB unless the loader's
//! `PN_GEOMETRY_CACHE_MB` says otherwise) or a count (`PN_GEOMETRIES`); a geometry dropped
//! and met again is compiled again (the same plan, the same bits).

use std::collections::HashMap;
use std::hash::Hash;

/// Bytes a compiled geometry takes per graph node (936 on the built-in model and the
/// full-dims file, 930 on a 4-layer real-dims file: `geometry_bytes`).
pub const BYTES_PER_NODE: usize = 940;

/// Default budget of the compiled geometries, MiB.
pub const DEFAULT_BUDGET_MB: usize = 256;

/// Fewest geometries kept whatever the budget: a decode step, its last-token and
/// all-logits prefill passes and the lanes' shares stay warm.
pub const MIN_ENTRIES: usize = 32;

/// A map whose entries weigh at most `cap` together (1 each, unless inserted with a
/// weight: then e.g. bytes), dropping the least recently used; the newest entry is kept
/// whatever it weighs.
pub struct Bounded<K, V> {
    /// Value, last use, weight.
    map: HashMap<K, (V, u64, usize)>,
    tick: u64,
    cap: usize,
    /// The entries' weights summed.
    weight: usize,
    /// Entries dropped so far.
    pub evicted: u64,
}

impl<K: Hash + Eq + Clone, V: Clone> Bounded<K, V> {
    pub fn new(cap: usize) -> Self {
        Bounded { map: HashMap::new(), tick: 0, cap: cap.max(1), weight: 0, evicted: 0 }
    }

    pub fn get(&mut self, k: &K) -> Option<V> {
        self.tick += 1;
        let t = self.tick;
        self.map.get_mut(k).map(|(v, at, _)| {
            *at = t;
            v.clone()
        })
    }

    /// Inserts (or refreshes) `k`, then drops the least recently used entries above the
    /// cap; returns the keys dropped.
    pub fn insert(&mut self, k: K, v: V) -> Vec<K> {
        self.insert_weighted(k, v, 1)
    }

    /// [`Bounded::insert`] of an entry weighing `w`.
    pub fn insert_weighted(&mut self, k: K, v: V, w: usize) -> Vec<K> {
        self.tick += 1;
        if let Some((_, _, old)) = self.map.insert(k, (v, self.tick, w)) {
            self.weight -= old;
        }
        self.weight += w;
        self.trim()
    }

    pub fn set_cap(&mut self, cap: usize) -> Vec<K> {
        self.cap = cap.max(1);
        self.trim()
    }

    pub fn cap(&self) -> usize {
        self.cap
    }

    fn trim(&mut self) -> Vec<K> {
        let mut out = Vec::new();
        while self.weight > self.cap && self.map.len() > 1 {
            // a scan: inserts are compilations (milliseconds), the map a few thousand long
            let Some(old) = self.map.iter().min_by_key(|(_, (_, at, _))| *at).map(|(k, _)| k.clone()) else { break };
            if let Some((_, _, w)) = self.map.remove(&old) {
                self.weight -= w;
            }
            self.evicted += 1;
            out.push(old);
        }
        out
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// The entries' weights summed (their count, unless inserted with weights).
    pub fn weight(&self) -> usize {
        self.weight
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.map.keys()
    }

    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.map.values().map(|(v, _, _)| v)
    }
}

/// Geometries that fit `mb` MiB at [`BYTES_PER_NODE`] (at least [`MIN_ENTRIES`]).
pub fn cap_for(nodes: usize, mb: usize) -> usize {
    (mb << 20)
        .checked_div(nodes.max(1) * BYTES_PER_NODE)
        .unwrap_or(0)
        .max(MIN_ENTRIES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn least_recently_used_goes_first() {
        let mut b: Bounded<u32, u32> = Bounded::new(2);
        assert!(b.insert(1, 10).is_empty());
        assert!(b.insert(2, 20).is_empty());
        assert_eq!(b.get(&1), Some(10)); // 2 is now the oldest
        assert_eq!(b.insert(3, 30), vec![2]);
        assert_eq!(b.get(&2), None);
        assert_eq!((b.get(&1), b.get(&3)), (Some(10), Some(30)));
        assert_eq!(b.set_cap(1), vec![1]);
        assert_eq!(b.len(), 1);
        assert_eq!(b.evicted, 2);
    }

    #[test]
    fn weights_bound_the_sum_and_the_newest_stays() {
        let mut b: Bounded<u32, u32> = Bounded::new(100);
        assert!(b.insert_weighted(1, 10, 40).is_empty());
        assert!(b.insert_weighted(2, 20, 40).is_empty());
        assert_eq!(b.weight(), 80);
        // 3 pushes the sum to 110: the oldest goes
        assert_eq!(b.insert_weighted(3, 30, 30), vec![1]);
        assert_eq!(b.weight(), 70);
        // re-inserting 2 replaces its weight
        assert!(b.insert_weighted(2, 21, 10).is_empty());
        assert_eq!((b.weight(), b.get(&2)), (40, Some(21)));
        // heavier than the cap alone: everything else goes, it stays
        assert_eq!(b.insert_weighted(4, 40, 500).len(), 2);
        assert_eq!((b.len(), b.weight(), b.get(&4)), (1, 500, Some(40)));
    }

    #[test]
    fn budget_gives_a_count() {
        // the built-in model: 472 nodes, 256 MiB -> 605 geometries
        assert_eq!(cap_for(472, 256), 605);
        // a huge graph still keeps the minimum
        assert_eq!(cap_for(1_000_000, 256), MIN_ENTRIES);
        assert_eq!(cap_for(330, 0), MIN_ENTRIES);
    }
}

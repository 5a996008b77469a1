//! Host-side bookkeeping of CUDA graphs and events (no device calls here, so it is unit
//! tested without a GPU); the device side is in `stream.rs`.
//!
//! A graph is captured for a key (a segment of the model the engine names, e.g. "decode,
//! layers 0..40") and a geometry: everything its kernel arguments bake in. INVARIANT:
//! a captured graph replays the exact launches it recorded — the same device addresses
//! and the same scalars. So
//! - every buffer used inside a capture must stay allocated at the same address for as
//!   long as the graph may be replayed (no free / realloc / move; only its contents may
//!   change, which is how new inputs reach a replay), and
//! - the geometry must encode every scalar and address that can change between steps
//!   (token count, shapes, the buffers' addresses or an allocation generation). A replay
//!   with another geometry is refused (`replay` -> false) and the caller captures again
//!   (a re-capture: the old graph is dropped when the new capture begins).

use crate::CudaError;
use std::collections::HashMap;

/// Names a captured segment (chosen by the caller).
pub type GraphKey = u64;
/// Names a recorded event; ids are never reused, so a stale id is an error.
pub type EventId = u64;

/// Counters of the graph cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GraphStats {
    /// Captures that produced a graph (first captures and re-captures).
    pub captures: u64,
    /// Of those, captures that replaced a graph of the same key.
    pub recaptures: u64,
    /// Graph launches.
    pub replays: u64,
    /// Captures abandoned (error, empty capture, explicit abort).
    pub aborts: u64,
}

struct Entry<G> {
    geometry: Vec<u64>,
    graph: G,
}

struct Capturing {
    key: GraphKey,
    geometry: Vec<u64>,
    /// A graph of this key existed when the capture began (dropped then).
    replaces: bool,
}

/// Captured graphs by key, the capture in progress (at most one: the backend has one
/// stream), and the counters. `G` is the device graph (a dummy in the tests).
pub struct GraphTable<G> {
    graphs: HashMap<GraphKey, Entry<G>>,
    capturing: Option<Capturing>,
    stats: GraphStats,
}

impl<G> Default for GraphTable<G> {
    fn default() -> Self {
        GraphTable {
            graphs: HashMap::new(),
            capturing: None,
            stats: GraphStats::default(),
        }
    }
}

fn graph_err(msg: String) -> CudaError {
    CudaError::Graph(msg)
}

impl<G> GraphTable<G> {
    pub fn stats(&self) -> GraphStats {
        self.stats
    }
    /// The key being captured, if a capture is in progress.
    pub fn capturing(&self) -> Option<GraphKey> {
        self.capturing.as_ref().map(|c| c.key)
    }
    /// Graphs held.
    pub fn len(&self) -> usize {
        self.graphs.len()
    }
    pub fn is_empty(&self) -> bool {
        self.graphs.is_empty()
    }
    /// Whether `key` holds a graph captured for exactly `geometry`.
    pub fn has(&self, key: GraphKey, geometry: &[u64]) -> bool {
        self.graphs
            .get(&key)
            .is_some_and(|e| e.geometry == geometry)
    }

    /// Launch the graph of `key` with `launch` when it was captured for `geometry`
    /// (`Ok(true)`, counted); `Ok(false)` when there is none or its geometry differs
    /// (the caller runs the work, capturing it again). Refused during a capture.
    pub fn replay(
        &mut self,
        key: GraphKey,
        geometry: &[u64],
        launch: impl FnOnce(&G) -> Result<(), CudaError>,
    ) -> Result<bool, CudaError> {
        if let Some(c) = &self.capturing {
            return Err(graph_err(format!(
                "replay of graph {key} while graph {} is being captured",
                c.key
            )));
        }
        match self.graphs.get(&key) {
            Some(e) if e.geometry == geometry => {
                launch(&e.graph)?;
                self.stats.replays += 1;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Start capturing `key` for `geometry`. A graph this key already holds is dropped
    /// now (its buffers may be about to move; it will be replaced, a re-capture).
    pub fn begin(&mut self, key: GraphKey, geometry: &[u64]) -> Result<(), CudaError> {
        if let Some(c) = &self.capturing {
            return Err(graph_err(format!(
                "capture of graph {key} requested while graph {} is being captured",
                c.key
            )));
        }
        let replaces = self.graphs.remove(&key).is_some();
        self.capturing = Some(Capturing {
            key,
            geometry: geometry.to_vec(),
            replaces,
        });
        Ok(())
    }

    /// Finish the capture of `key` with its graph.
    pub fn end(&mut self, key: GraphKey, graph: G) -> Result<(), CudaError> {
        self.check_end(key)?;
        let c = self.capturing.take().expect("checked");
        self.stats.captures += 1;
        if c.replaces {
            self.stats.recaptures += 1;
        }
        self.graphs.insert(
            key,
            Entry {
                geometry: c.geometry,
                graph,
            },
        );
        Ok(())
    }

    /// Whether `capture_end(key)` is the right call now.
    pub fn check_end(&self, key: GraphKey) -> Result<(), CudaError> {
        match &self.capturing {
            Some(c) if c.key == key => Ok(()),
            Some(c) => Err(graph_err(format!(
                "capture_end({key}) while graph {} is being captured",
                c.key
            ))),
            None => Err(graph_err(format!(
                "capture_end({key}) without capture_begin"
            ))),
        }
    }

    /// Abandon the capture in progress (if any); returns its key.
    pub fn abort(&mut self) -> Option<GraphKey> {
        let c = self.capturing.take()?;
        self.stats.aborts += 1;
        Some(c.key)
    }

    /// Drop the graph of `key` (its buffers are going away); true if there was one.
    pub fn invalidate(&mut self, key: GraphKey) -> bool {
        self.graphs.remove(&key).is_some()
    }

    /// Drop every graph.
    pub fn clear(&mut self) {
        self.graphs.clear();
    }
}

/// Recorded events by id, with a pool of released event objects for reuse.
pub struct EventTable<E> {
    live: HashMap<EventId, E>,
    free: Vec<E>,
    next: EventId,
}

impl<E> Default for EventTable<E> {
    fn default() -> Self {
        EventTable {
            live: HashMap::new(),
            free: Vec::new(),
            next: 1,
        }
    }
}

impl<E> EventTable<E> {
    /// A released event object to record again, if the pool has one.
    pub fn reuse(&mut self) -> Option<E> {
        self.free.pop()
    }
    /// Track a recorded event; returns its new id.
    pub fn insert(&mut self, e: E) -> EventId {
        let id = self.next;
        self.next += 1;
        self.live.insert(id, e);
        id
    }
    pub fn get(&self, id: EventId) -> Result<&E, CudaError> {
        self.live
            .get(&id)
            .ok_or_else(|| graph_err(format!("unknown or released event {id}")))
    }
    /// Return the event of `id` to the pool; false if the id is not live.
    pub fn release(&mut self, id: EventId) -> bool {
        match self.live.remove(&id) {
            Some(e) => {
                self.free.push(e);
                true
            }
            None => false,
        }
    }
    /// Events recorded and not released.
    pub fn live(&self) -> usize {
        self.live.len()
    }
    /// Event objects waiting in the pool.
    pub fn pooled(&self) -> usize {
        self.free.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake graph: counts its launches.
    #[derive(Default)]
    struct Fake(std::cell::Cell<u32>);

    fn launch(g: &Fake) -> Result<(), CudaError> {
        g.0.set(g.0.get() + 1);
        Ok(())
    }

    #[test]
    fn capture_then_replay_same_geometry() {
        let mut t = GraphTable::<Fake>::default();
        assert!(
            !t.replay(1, &[4, 100], launch).unwrap(),
            "nothing captured yet"
        );
        t.begin(1, &[4, 100]).unwrap();
        assert_eq!(t.capturing(), Some(1));
        t.end(1, Fake::default()).unwrap();
        assert_eq!(t.capturing(), None);
        assert!(t.has(1, &[4, 100]));
        for _ in 0..3 {
            assert!(t.replay(1, &[4, 100], launch).unwrap());
        }
        let s = t.stats();
        assert_eq!(
            (s.captures, s.recaptures, s.replays, s.aborts),
            (1, 0, 3, 0)
        );
        assert_eq!(t.graphs[&1].graph.0.get(), 3);
    }

    #[test]
    fn geometry_change_means_recapture() {
        let mut t = GraphTable::<Fake>::default();
        t.begin(7, &[1, 0xdead]).unwrap();
        t.end(7, Fake::default()).unwrap();
        // another token count / buffer address: no replay, the caller captures again
        assert!(!t.replay(7, &[2, 0xdead], launch).unwrap());
        assert!(!t.replay(7, &[1, 0xbeef], launch).unwrap());
        t.begin(7, &[2, 0xdead]).unwrap();
        assert!(
            !t.has(7, &[1, 0xdead]),
            "the stale graph is dropped when the capture begins"
        );
        t.end(7, Fake::default()).unwrap();
        assert!(t.replay(7, &[2, 0xdead], launch).unwrap());
        assert!(!t.replay(7, &[1, 0xdead], launch).unwrap());
        let s = t.stats();
        assert_eq!((s.captures, s.recaptures, s.replays), (2, 1, 1));
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn keys_are_independent() {
        let mut t = GraphTable::<Fake>::default();
        for k in [1, 2, 3] {
            t.begin(k, &[k]).unwrap();
            t.end(k, Fake::default()).unwrap();
        }
        assert_eq!(t.len(), 3);
        assert!(t.replay(2, &[2], launch).unwrap());
        assert!(!t.replay(2, &[3], launch).unwrap());
        assert!(t.invalidate(3));
        assert!(!t.invalidate(3));
        assert!(!t.replay(3, &[3], launch).unwrap());
        assert_eq!(t.stats().recaptures, 0);
        t.clear();
        assert!(t.is_empty());
    }

    #[test]
    fn one_capture_at_a_time_and_matching_end() {
        let mut t = GraphTable::<Fake>::default();
        assert!(t.end(1, Fake::default()).is_err(), "end without begin");
        t.begin(1, &[]).unwrap();
        assert!(t.begin(2, &[]).is_err(), "nested capture");
        assert!(t.end(2, Fake::default()).is_err(), "end of another key");
        assert!(t.replay(1, &[], launch).is_err(), "replay during a capture");
        assert_eq!(t.capturing(), Some(1), "errors leave the capture running");
        assert_eq!(t.abort(), Some(1));
        assert_eq!(t.abort(), None);
        assert!(t.is_empty());
        let s = t.stats();
        assert_eq!((s.captures, s.aborts), (0, 1));
        // an aborted re-capture leaves the key empty (its old graph was dropped at begin)
        t.begin(1, &[5]).unwrap();
        t.end(1, Fake::default()).unwrap();
        t.begin(1, &[6]).unwrap();
        t.abort();
        assert!(!t.replay(1, &[5], launch).unwrap());
    }

    #[test]
    fn failed_launch_is_not_counted() {
        let mut t = GraphTable::<Fake>::default();
        t.begin(1, &[1]).unwrap();
        t.end(1, Fake::default()).unwrap();
        let r = t.replay(1, &[1], |_| Err(CudaError::Driver("boom".into())));
        assert!(r.is_err());
        assert_eq!(t.stats().replays, 0);
    }

    #[test]
    fn events_ids_and_pool() {
        let mut e = EventTable::<&'static str>::default();
        assert!(e.reuse().is_none());
        let a = e.insert("a");
        let b = e.insert("b");
        assert_ne!(a, b);
        assert_eq!(*e.get(a).unwrap(), "a");
        assert_eq!(e.live(), 2);
        assert!(e.release(a));
        assert!(!e.release(a), "double release");
        assert!(e.get(a).is_err(), "a released id is unknown");
        assert_eq!((e.live(), e.pooled()), (1, 1));
        let reused = e.reuse().unwrap();
        let c = e.insert(reused);
        assert!(c > b, "ids are never reused");
        assert_eq!(*e.get(c).unwrap(), "a");
        assert!(e.get(999).is_err());
    }
}

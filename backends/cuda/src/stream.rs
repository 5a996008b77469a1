//! CUDA graphs and events on the backend's stream: the device primitives for the
//! engine's device-resident steps (capture a segment once, replay it every decode step;
//! record an event after a step and poll it instead of blocking).
//!
//! Capture covers device work only: `execute` (which uploads inputs and downloads the
//! output with host tensors) is refused while a capture is in progress, since a host copy
//! or a synchronization inside a capture invalidates it. The invariant of graphs.rs
//! applies: buffers used inside a capture never move while the graph may be replayed.
//!
//! Nothing here has run on a GPU yet (docs/cuda.md); `graph_selftest` is the check a
//! GPU session runs (tests/gpu_parity.rs calls it when a device is present).

use crate::device::{drv, go, grid1};
use crate::graph_capture::{ensure_idle, CaptureStream, DevStream};
use crate::graphs::{EventId, GraphKey, GraphStats};
use crate::{CudaBackend, CudaError};
use cudarc::driver::{CudaEvent, PushKernelArg};
use std::sync::MutexGuard;

fn poisoned<T>(_: T) -> CudaError {
    CudaError::Driver("cuda backend lock poisoned".into())
}

impl CudaBackend {
    fn op_lock(&self) -> Result<MutexGuard<'_, ()>, CudaError> {
        let g = self.lock.lock().map_err(poisoned)?;
        self.dev.ctx.bind_to_thread().map_err(drv)?;
        Ok(g)
    }

    /// Start capturing the backend's stream into graph `key` for `geometry` (see
    /// graphs.rs: every scalar and buffer address the captured launches bake in). The
    /// device work issued until [`CudaBackend::capture_end`] is recorded, not run.
    /// Capture mode thread-local: the capturing thread may not make unsafe calls
    /// (synchronize, host copies) until the end.
    pub fn capture_begin(&self, key: GraphKey, geometry: &[u64]) -> Result<(), CudaError> {
        let _op = self.op_lock()?;
        let mut t = self.graphs.lock().map_err(poisoned)?;
        t.begin(key, geometry)?;
        if let Err(e) = DevStream(&self.dev.stream).begin() {
            t.abort();
            return Err(e);
        }
        Ok(())
    }

    /// End the capture of `key`: instantiate the graph (and upload it, so the first
    /// replay is not slower) and keep it for [`CudaBackend::replay`]. The captured work
    /// has NOT run: replay it (or run it directly) to get its results. On any error the
    /// stream is left out of capture mode (graph_capture.rs).
    pub fn capture_end(&self, key: GraphKey) -> Result<(), CudaError> {
        // not op_lock: its bind_to_thread returns an error stored by cudarc first, and
        // the capture must end whatever it is (DevStream binds the context itself)
        let _op = self.lock.lock().map_err(poisoned)?;
        let mut t = self.graphs.lock().map_err(poisoned)?;
        t.check_end(key)?;
        let ds = DevStream(&self.dev.stream);
        let ended = ds.end().or_else(|e| {
            ensure_idle(&ds)?;
            Err(e)
        });
        match ended.and_then(|g| {
            let g = g.ok_or_else(|| {
                CudaError::Graph(format!("capture of graph {key} recorded no work"))
            })?;
            g.upload()?;
            Ok(g)
        }) {
            Ok(g) => t.end(key, g),
            Err(e) => {
                t.abort();
                Err(e)
            }
        }
    }

    /// Abandon the capture in progress, if any (after an error between begin and end):
    /// the stream is out of capture mode after it, whatever the table says.
    pub fn capture_abort(&self) {
        let Ok(_op) = self.lock.lock() else { return };
        if let Ok(mut t) = self.graphs.lock() {
            t.abort();
        }
        let _ = ensure_idle(&DevStream(&self.dev.stream));
    }

    /// Launch graph `key` if it was captured for `geometry`: `Ok(true)`. `Ok(false)`:
    /// none, or captured for another geometry — run the work (capturing it again).
    /// Asynchronous: record an event or synchronize to wait for it.
    pub fn replay(&self, key: GraphKey, geometry: &[u64]) -> Result<bool, CudaError> {
        let _op = self.op_lock()?;
        let mut t = self.graphs.lock().map_err(poisoned)?;
        t.replay(key, geometry, |g| g.launch())
    }

    /// Whether a capture is in progress (then `execute` is refused).
    pub fn capturing(&self) -> Option<GraphKey> {
        self.graphs.lock().ok().and_then(|t| t.capturing())
    }

    /// Counters: captures, re-captures, replays, aborts.
    pub fn graph_stats(&self) -> GraphStats {
        self.graphs.lock().map(|t| t.stats()).unwrap_or_default()
    }

    /// Drop graph `key` (its buffers are about to be freed or moved).
    pub fn invalidate_graph(&self, key: GraphKey) -> bool {
        self.graphs
            .lock()
            .map(|mut t| t.invalidate(key))
            .unwrap_or(false)
    }

    /// Record an event after the work issued so far on the backend's stream.
    pub fn record_event(&self) -> Result<EventId, CudaError> {
        let _op = self.op_lock()?;
        if let Some(k) = self.capturing() {
            return Err(CudaError::Graph(format!(
                "record_event during the capture of graph {k}"
            )));
        }
        let mut ev = self.events.lock().map_err(poisoned)?;
        let e: CudaEvent = match ev.reuse() {
            Some(e) => e,
            None => self.dev.ctx.new_event(None).map_err(drv)?,
        };
        e.record(&self.dev.stream).map_err(drv)?;
        Ok(ev.insert(e))
    }

    /// Whether the work before event `id` has finished (does not block). Errors of that
    /// work (a failed kernel) are reported here.
    pub fn event_done(&self, id: EventId) -> Result<bool, CudaError> {
        let ev = self.events.lock().map_err(poisoned)?;
        ev.get(id)?.try_is_complete().map_err(drv)
    }

    /// Block until the work before event `id` has finished.
    pub fn event_wait(&self, id: EventId) -> Result<(), CudaError> {
        let ev = self.events.lock().map_err(poisoned)?;
        ev.get(id)?.synchronize().map_err(drv)
    }

    /// Forget event `id` (its object goes back to a pool); false if it was not live.
    pub fn event_release(&self, id: EventId) -> bool {
        self.events
            .lock()
            .map(|mut e| e.release(id))
            .unwrap_or(false)
    }

    /// Block until all work issued on the backend's stream has finished.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        let _op = self.op_lock()?;
        self.dev.stream.synchronize().map_err(drv)
    }

    /// Device check of the primitives above (for a GPU session): capture a kernel over
    /// two resident buffers, replay it after changing the input's contents in place,
    /// re-capture on a geometry change, and wait on an event.
    pub fn graph_selftest(&self) -> Result<GraphStats, CudaError> {
        const KEY: GraphKey = u64::MAX;
        let n = 4096usize;
        let host: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let (mut x, mut y) = {
            let _op = self.op_lock()?;
            (self.dev.upload(&host)?, self.dev.alloc::<f32>(n)?)
        };
        let before = self.graph_stats();
        // y = s·x (unary_f32, op 4 = scale), captured
        let capture = |y: &mut cudarc::driver::CudaSlice<f32>,
                       x: &cudarc::driver::CudaSlice<f32>,
                       s: f32,
                       geo: &[u64]| {
            self.capture_begin(KEY, geo)?;
            let r = (|| {
                let (ni, op) = (n as i64, 4i32);
                let mut b = self.dev.launch("unary_f32")?;
                b.arg(x).arg(y).arg(&ni).arg(&op).arg(&s);
                go(b, grid1(n, 256))
            })();
            if let Err(e) = r {
                self.capture_abort();
                return Err(e);
            }
            self.capture_end(KEY)
        };
        let check = |y: &cudarc::driver::CudaSlice<f32>,
                     want: &dyn Fn(usize) -> f32|
         -> Result<(), CudaError> {
            let _op = self.op_lock()?;
            let got = self.dev.download(y, n)?;
            match (0..n).find(|&i| got[i] != want(i)) {
                None => Ok(()),
                Some(i) => Err(CudaError::Graph(format!(
                    "selftest: y[{i}] = {}, expected {}",
                    got[i],
                    want(i)
                ))),
            }
        };
        capture(&mut y, &x, 2.0, &[n as u64, 2])?;
        if !self.replay(KEY, &[n as u64, 2])? {
            return Err(CudaError::Graph("selftest: no replay after capture".into()));
        }
        check(&y, &|i| 2.0 * i as f32)?;
        // new input in the same buffer, same graph
        {
            let _op = self.op_lock()?;
            let h2: Vec<f32> = (0..n).map(|i| -(i as f32)).collect();
            self.dev.stream.memcpy_htod(&h2, &mut x).map_err(drv)?;
        }
        let ev0 = self.record_event()?;
        self.event_wait(ev0)?;
        self.replay(KEY, &[n as u64, 2])?;
        let ev = self.record_event()?;
        self.event_wait(ev)?;
        if !self.event_done(ev)? {
            return Err(CudaError::Graph(
                "selftest: event not done after wait".into(),
            ));
        }
        self.event_release(ev0);
        self.event_release(ev);
        check(&y, &|i| -2.0 * i as f32)?;
        // another geometry: no replay, re-capture
        if self.replay(KEY, &[n as u64, 3])? {
            return Err(CudaError::Graph(
                "selftest: replayed another geometry".into(),
            ));
        }
        capture(&mut y, &x, 3.0, &[n as u64, 3])?;
        self.replay(KEY, &[n as u64, 3])?;
        self.synchronize()?;
        check(&y, &|i| -3.0 * i as f32)?;
        self.invalidate_graph(KEY);
        let after = self.graph_stats();
        Ok(GraphStats {
            captures: after.captures - before.captures,
            recaptures: after.recaptures - before.recaptures,
            replays: after.replays - before.replays,
            aborts: after.aborts - before.aborts,
        })
    }
}

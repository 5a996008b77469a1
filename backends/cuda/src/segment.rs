//! Compiled segments and CUDA graphs: a segment's [`SegExec`] (what
//! `Backend::compile` returns) runs its ops between `seg_begin` / `seg_end` (capture.rs
//! decides, this file does it on the device).
//!
//! A stable segment's ops defer their commands (exec.rs); at the end the commands are
//! replayed from the segment's graph, captured into a new graph and replayed, or launched
//! directly (capture.rs). Other segments (prefill, several sequences) launch as they go.
//! Capture records the deferred commands on the backend's stream in thread-local capture
//! mode: nothing else (no allocation, no host copy, no synchronization) happens inside it.

use crate::capture::{Decision, OpenSeg};
use crate::exec::{fingerprint, launch, Cmd};
use crate::graph_capture::{ensure_idle, Capture, DevGraph, DevStream};
use crate::graphs::GraphKey;
use crate::resident::ResState;
use crate::{CudaBackend, CudaError};
use pn_engine::{ExecError, Executable, PassIo, SegmentCode, SegmentRun, StateKey};
use pn_ops::{OpError, Shape, Tensor, TensorData};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A segment compiled for the device: its ops over fixed slots. Each run opens the
/// segment (capture or replay is decided at its end, capture.rs) and closes it, even
/// when an op failed.
pub(crate) struct SegExec {
    be: Arc<CudaBackend>,
    seg: SegmentCode,
    /// Whether it ran before (a stable segment's later runs are replays).
    ran: AtomicBool,
}

impl SegExec {
    pub(crate) fn new(be: Arc<CudaBackend>, seg: SegmentCode) -> SegExec {
        SegExec { be, seg, ran: AtomicBool::new(false) }
    }

    fn ops(&self, io: &mut PassIo<'_, '_>) -> Result<(), ExecError> {
        let lens: Vec<usize> = io.spans.iter().map(|s| s.len).collect();
        let mut keys: Vec<StateKey> = Vec::with_capacity(io.ids.len());
        for (i, oc) in self.seg.ops.iter().enumerate() {
            let inputs = oc.resolve(io.weights);
            keys.clear();
            if let Some(l) = oc.state {
                keys.extend(io.ids.iter().map(|&seq| StateKey { seq, layer: l as u32 }));
            }
            // stateful ops of several sequences, and LastRows, take the sequence lengths
            let lens = (keys.len() > 1 || matches!(oc.op, pn_ops::Op::LastRows { .. })).then_some(&lens[..]);
            self.be
                .exec_resident(&oc.op, &inputs, &oc.meta, &keys, lens, oc.out)
                .map_err(ExecError::at(i))?;
            if let Some(t) = io.timing.as_mut() {
                t(i);
            }
            if let Some(obs) = io.observe.as_mut() {
                // the observer gets a downloaded copy
                let mut t = Tensor { shape: Shape::d1(0), data: TensorData::F32(Vec::new()) };
                self.be.download_slot(oc.out, &oc.meta, &mut t).map_err(ExecError::at(i))?;
                obs(i, &t);
            }
        }
        Ok(())
    }
}

impl Executable for SegExec {
    fn run(&self, io: &mut PassIo<'_, '_>) -> Result<(), ExecError> {
        let replay = self.seg.stable && self.ran.swap(true, Ordering::Relaxed);
        let run = self.seg.run_info(replay);
        self.be.seg_begin(&run).map_err(ExecError::segment)?;
        let res = self.ops(io);
        // the segment is closed even when an op failed (the capture ends)
        let end = self.be.seg_end(&run).map_err(ExecError::segment);
        res.and(end)
    }
}

fn seg_err(what: &'static str, msg: String) -> OpError {
    OpError::Invalid { op: what, msg }
}

/// How a segment ran (for `PN_DEBUG=1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ran {
    /// Launched as the ops came (not stable, or graphs off).
    Direct,
    Replayed,
    Captured,
    /// Stable, but run directly: first run / new work / failed capture / flushed / op error.
    Eager(&'static str),
}

impl CudaBackend {
    pub(crate) fn seg_begin(&self, run: &SegmentRun) -> Result<(), OpError> {
        const OP: &str = "begin_segment";
        let (_g, mut r) = self.res(OP)?;
        if let Some(o) = &r.seg {
            return Err(seg_err(
                OP,
                format!(
                    "segment {} begins while segment {} is open",
                    run.segment, o.run.segment
                ),
            ));
        }
        // no deferred command names older scratch chunks now
        r.scratch.trim();
        r.seg = Some(OpenSeg::new(*run, self.graphs_on));
        r.stats.segments += 1;
        Ok(())
    }

    pub(crate) fn seg_end(&self, run: &SegmentRun) -> Result<(), OpError> {
        const OP: &str = "end_segment";
        let (_g, mut r) = self.res(OP)?;
        let Some(s) = r.seg.take() else {
            return Err(seg_err(
                OP,
                format!("segment {} ends, none is open", run.segment),
            ));
        };
        let ran = self
            .finish(&mut r, &s)
            .map_err(|e| crate::dispatch::to_op_error(OP, e));
        if self.debug >= 1 {
            let g = self.graphs.lock().map(|t| t.stats()).unwrap_or_default();
            eprintln!(
                "[pn] {} seg {} ({} tokens): {} commands, {}; graphs: {} captured ({} re-captures), {} replays, {} aborted",
                self.label,
                s.run.segment,
                s.run.n_tokens,
                s.issued,
                match ran {
                    Ok(Ran::Direct) => "launched directly".to_string(),
                    Ok(Ran::Replayed) => "graph replayed".to_string(),
                    Ok(Ran::Captured) => "graph captured".to_string(),
                    Ok(Ran::Eager(why)) => format!("launched directly ({why})"),
                    Err(ref e) => format!("error: {e}"),
                },
                g.captures,
                g.recaptures,
                g.replays,
                g.aborts
            );
        }
        ran?;
        if s.run != *run {
            return Err(seg_err(
                OP,
                format!("segment {} ends, open: {:?}", run.segment, s.run),
            ));
        }
        Ok(())
    }

    /// Runs a closed segment's deferred commands (see the module doc).
    fn finish(&self, r: &mut ResState, s: &OpenSeg) -> Result<Ran, CudaError> {
        let d = &self.dev;
        let direct = |why| -> Result<Ran, CudaError> {
            s.pending.iter().try_for_each(|c| launch(d, c))?;
            Ok(Ran::Eager(why))
        };
        if !s.defer && !s.flushed {
            return Ok(Ran::Direct);
        }
        if !s.capturable() {
            let why = if s.failed {
                "an op failed"
            } else if s.flushed {
                "the stream was needed mid-segment"
            } else {
                "no commands"
            };
            r.stats.segments_eager += 1;
            return direct(why);
        }
        let fp = fingerprint(&s.pending);
        let has = self
            .graphs
            .lock()
            .map(|t| t.has(s.key, &fp))
            .unwrap_or(false);
        match r.policy.decide(s.key, s.run.arena, &fp, has) {
            Decision::Replay => {
                let mut t = self
                    .graphs
                    .lock()
                    .map_err(|_| CudaError::Graph("graph table lock poisoned".into()))?;
                if t.replay(s.key, &fp, |g| g.launch())? {
                    r.stats.segments_replayed += 1;
                    return Ok(Ran::Replayed);
                }
                drop(t);
                r.stats.segments_eager += 1;
                direct("graph gone")
            }
            Decision::Eager => {
                r.stats.segments_eager += 1;
                direct("first run of this work")
            }
            Decision::Capture => match self.capture_cmds(s.key, &fp, &s.pending) {
                Ok(()) => {
                    let mut t = self
                        .graphs
                        .lock()
                        .map_err(|_| CudaError::Graph("graph table lock poisoned".into()))?;
                    if !t.replay(s.key, &fp, |g| g.launch())? {
                        return Err(CudaError::Graph(format!(
                            "graph {} missing right after its capture",
                            s.key
                        )));
                    }
                    r.stats.segments_captured += 1;
                    Ok(Ran::Captured)
                }
                Err(e) => {
                    if self.debug >= 1 {
                        eprintln!("[pn] {}: capture of segment {} failed ({e}); it runs without a graph from now on", self.label, s.run.segment);
                    }
                    r.policy.capture_failed(s.key);
                    r.stats.segments_eager += 1;
                    // a capture left open would record (or refuse) the direct launches
                    ensure_idle(&DevStream(&d.stream))?;
                    direct("capture failed")
                }
            },
        }
    }

    /// Captures `cmds` on the stream into graph `key` for `fp` (not run: replay it). The
    /// capture ends on every path (graph_capture.rs).
    fn capture_cmds(&self, key: GraphKey, fp: &[u64], cmds: &[Cmd]) -> Result<(), CudaError> {
        let d = &self.dev;
        let mut t = self
            .graphs
            .lock()
            .map_err(|_| CudaError::Graph("graph table lock poisoned".into()))?;
        t.begin(key, fp)?;
        let ds = DevStream(&d.stream);
        let record = || -> Result<DevGraph, CudaError> {
            let cap = Capture::begin(&ds)?;
            cmds.iter().try_for_each(|c| launch(d, c))?;
            let g = cap.finish()?.ok_or_else(|| {
                CudaError::Graph(format!("capture of graph {key} recorded no work"))
            })?;
            g.upload()?;
            Ok(g)
        };
        match record() {
            Ok(g) => t.end(key, g),
            Err(e) => {
                t.abort();
                Err(e)
            }
        }
    }
}

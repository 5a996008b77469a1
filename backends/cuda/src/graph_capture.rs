//! Stream capture that always ends, and the device graph it makes.
//!
//! If anything fails between `cuStreamBeginCapture` and `cuStreamEndCapture`, the stream
//! stays in capture mode and every later launch on it fails (or is silently recorded).
//! So a capture is a [`Capture`] guard: ended by [`Capture::finish`] or, on any other
//! exit path (an error, `?`, a panic), by its drop, the partial graph discarded. Ending
//! calls `cuStreamEndCapture` directly: cudarc's `end_capture` first returns an error
//! stored by an earlier call and then never ends the capture. [`ensure_idle`] checks
//! the capture status (and ends a capture left open) before the caller falls back to
//! launching directly. The logic is written against [`CaptureStream`] so the tests
//! drive it with a mock stream; [`DevStream`] is the backend's stream.

use crate::device::drv;
use crate::CudaError;
use cudarc::driver::sys::{self, CUgraphInstantiate_flags, CUstreamCaptureStatus};
use cudarc::driver::{result, CudaStream};
use std::sync::Arc;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaptureState {
    Idle,
    Active,
    /// An error happened inside the capture: it must still be ended.
    Invalidated,
}

/// A stream that can be captured.
pub trait CaptureStream {
    type Graph;
    fn begin(&self) -> Result<(), CudaError>;
    /// Ends the capture (whatever error is pending elsewhere): the graph, or None when
    /// nothing was recorded.
    fn end(&self) -> Result<Option<Self::Graph>, CudaError>;
    fn state(&self) -> Result<CaptureState, CudaError>;
}

/// A capture in progress; ended on every exit path (see the module doc).
pub struct Capture<'s, S: CaptureStream> {
    s: &'s S,
    open: bool,
}

impl<'s, S: CaptureStream> Capture<'s, S> {
    pub fn begin(s: &'s S) -> Result<Capture<'s, S>, CudaError> {
        s.begin()?;
        Ok(Capture { s, open: true })
    }

    /// Ends the capture: the graph (None: nothing recorded). On an error the stream is
    /// left idle (or the error says it could not be).
    pub fn finish(mut self) -> Result<Option<S::Graph>, CudaError> {
        self.open = false;
        match self.s.end() {
            Ok(g) => Ok(g),
            Err(e) => match ensure_idle(self.s) {
                Ok(()) => Err(e),
                Err(e2) => Err(CudaError::Graph(format!(
                    "ending a capture: {e}; then {e2}"
                ))),
            },
        }
    }
}

impl<S: CaptureStream> Drop for Capture<'_, S> {
    fn drop(&mut self) {
        if self.open {
            drop(self.s.end());
            let _ = ensure_idle(self.s);
        }
    }
}

/// The stream is not capturing: a capture left open is ended (discarded) first. Call it
/// before launching directly after a failed capture.
pub fn ensure_idle<S: CaptureStream>(s: &S) -> Result<(), CudaError> {
    if s.state()? == CaptureState::Idle {
        return Ok(());
    }
    drop(s.end());
    match s.state()? {
        CaptureState::Idle => Ok(()),
        st => Err(CudaError::Graph(format!(
            "the stream is still capturing ({st:?}) after its capture was ended: direct launches refused"
        ))),
    }
}

/// The backend's stream, captured in thread-local mode.
pub struct DevStream<'a>(pub &'a Arc<CudaStream>);

impl DevStream<'_> {
    fn bind(&self) {
        // SAFETY: the stream's context is alive (the stream holds it).
        let _ = unsafe { result::ctx::set_current(self.0.context().cu_ctx()) };
    }
}

impl CaptureStream for DevStream<'_> {
    type Graph = DevGraph;

    fn begin(&self) -> Result<(), CudaError> {
        self.bind();
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        // SAFETY: a live stream of the bound context.
        unsafe { result::stream::begin_capture(self.0.cu_stream(), mode) }.map_err(drv)
    }

    fn end(&self) -> Result<Option<DevGraph>, CudaError> {
        self.bind();
        // SAFETY: a live stream; a non-null graph returned is owned by us from here on.
        let graph = unsafe { result::stream::end_capture(self.0.cu_stream()) }.map_err(drv)?;
        if graph.is_null() {
            return Ok(None);
        }
        // SAFETY: `graph` is the valid graph just returned.
        match unsafe { result::graph::instantiate(graph, CUgraphInstantiate_flags(0)) } {
            Ok(exec) => Ok(Some(DevGraph {
                graph,
                exec,
                stream: self.0.clone(),
            })),
            Err(e) => {
                // SAFETY: not instantiated, destroyed once.
                let _ = unsafe { result::graph::destroy(graph) };
                Err(drv(e))
            }
        }
    }

    fn state(&self) -> Result<CaptureState, CudaError> {
        self.bind();
        // SAFETY: a live stream.
        let st = unsafe { result::stream::is_capturing(self.0.cu_stream()) }.map_err(drv)?;
        Ok(match st {
            CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE => CaptureState::Idle,
            CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE => CaptureState::Active,
            _ => CaptureState::Invalidated,
        })
    }
}

/// A captured, instantiated graph, launched on the stream it was captured from. Raw
/// handles are not `Send`; every use goes through the backend's `graphs` mutex, which
/// serializes them.
pub struct DevGraph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    stream: Arc<CudaStream>,
}

// SAFETY: only touched with the `graphs` mutex held (see above).
unsafe impl Send for DevGraph {}

impl DevGraph {
    pub fn launch(&self) -> Result<(), CudaError> {
        self.stream.context().bind_to_thread().map_err(drv)?;
        // SAFETY: a live instantiated graph and the stream it belongs to.
        unsafe { result::graph::launch(self.exec, self.stream.cu_stream()) }.map_err(drv)
    }

    /// Uploads the graph's resources, so the first launch is not slower.
    pub fn upload(&self) -> Result<(), CudaError> {
        self.stream.context().bind_to_thread().map_err(drv)?;
        // SAFETY: as for `launch`.
        unsafe { result::graph::upload(self.exec, self.stream.cu_stream()) }.map_err(drv)
    }
}

impl Drop for DevGraph {
    fn drop(&mut self) {
        let _ = self.stream.context().bind_to_thread();
        // SAFETY: both handles are owned by this object and destroyed once.
        unsafe {
            let _ = result::graph::exec_destroy(self.exec);
            let _ = result::graph::destroy(self.graph);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::{Cell, RefCell};

    /// A stream whose `end` can fail without ending (`stuck` times: cudarc's stored
    /// error) or fail and end (`invalid`: an error inside the capture).
    #[derive(Default)]
    struct Mock {
        capturing: Cell<bool>,
        invalid: Cell<bool>,
        stuck: Cell<u32>,
        calls: RefCell<Vec<&'static str>>,
    }

    impl CaptureStream for Mock {
        type Graph = &'static str;
        fn begin(&self) -> Result<(), CudaError> {
            self.calls.borrow_mut().push("begin");
            assert!(!self.capturing.get(), "begin while capturing");
            self.capturing.set(true);
            Ok(())
        }
        fn end(&self) -> Result<Option<&'static str>, CudaError> {
            self.calls.borrow_mut().push("end");
            if self.stuck.get() > 0 {
                self.stuck.set(self.stuck.get() - 1);
                return Err(CudaError::Driver("stored error".into()));
            }
            if !self.capturing.replace(false) {
                return Err(CudaError::Driver("not capturing".into()));
            }
            if self.invalid.replace(false) {
                return Err(CudaError::Driver(
                    "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED".into(),
                ));
            }
            Ok(Some("graph"))
        }
        fn state(&self) -> Result<CaptureState, CudaError> {
            Ok(match (self.capturing.get(), self.invalid.get()) {
                (false, _) => CaptureState::Idle,
                (true, false) => CaptureState::Active,
                (true, true) => CaptureState::Invalidated,
            })
        }
    }

    fn record(s: &Mock, fail_at: Option<usize>) -> Result<Option<&'static str>, CudaError> {
        let cap = Capture::begin(s)?;
        for i in 0..3 {
            if fail_at == Some(i) {
                return Err(CudaError::Driver(format!("launch {i} failed")));
            }
        }
        cap.finish()
    }

    #[test]
    fn a_capture_ends_on_every_exit_path() {
        let s = Mock::default();
        assert_eq!(record(&s, None).unwrap(), Some("graph"));
        assert_eq!(s.state().unwrap(), CaptureState::Idle);

        // an error between begin and end (returned with `?`): the drop ends it
        assert!(record(&s, Some(1)).is_err());
        assert_eq!(s.state().unwrap(), CaptureState::Idle);

        // a panic in between: unwinding drops the guard
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _cap = Capture::begin(&s).unwrap();
            panic!("op panicked");
        }));
        assert!(r.is_err());
        assert_eq!(s.state().unwrap(), CaptureState::Idle);
        assert_eq!(
            s.calls.borrow().iter().filter(|c| **c == "begin").count(),
            3
        );
    }

    #[test]
    fn a_failed_end_still_leaves_the_stream_idle() {
        // end fails once without ending (a stored error): finish reports it, ends again
        let s = Mock::default();
        let cap = Capture::begin(&s).unwrap();
        s.stuck.set(1);
        let e = cap.finish().unwrap_err().to_string();
        assert!(e.contains("stored error"), "{e}");
        assert_eq!(s.state().unwrap(), CaptureState::Idle);
        assert_eq!(*s.calls.borrow(), ["begin", "end", "end"]);

        // an invalidated capture: end fails and ends it
        let s = Mock::default();
        let cap = Capture::begin(&s).unwrap();
        s.invalid.set(true);
        assert_eq!(s.state().unwrap(), CaptureState::Invalidated);
        assert!(cap
            .finish()
            .unwrap_err()
            .to_string()
            .contains("INVALIDATED"));
        assert_eq!(s.state().unwrap(), CaptureState::Idle);
    }

    #[test]
    fn direct_launches_wait_for_an_idle_stream() {
        let s = Mock::default();
        assert!(ensure_idle(&s).is_ok(), "idle already");
        s.begin().unwrap();
        ensure_idle(&s).unwrap();
        assert_eq!(
            s.state().unwrap(),
            CaptureState::Idle,
            "a capture left open is ended"
        );

        // a stream that cannot be ended: refused, with the state
        s.begin().unwrap();
        s.stuck.set(u32::MAX);
        let e = ensure_idle(&s).unwrap_err().to_string();
        assert!(
            e.contains("still capturing (Active)") && e.contains("refused"),
            "{e}"
        );
        // and a guard over it reports both errors
        s.stuck.set(0);
        s.capturing.set(false);
        let cap = Capture::begin(&s).unwrap();
        s.stuck.set(2);
        let e = cap.finish().unwrap_err().to_string();
        assert!(
            e.contains("stored error") && e.contains("still capturing"),
            "{e}"
        );
    }
}

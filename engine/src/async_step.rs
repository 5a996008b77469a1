//! Async decode steps: [`Slots::step_begin`] launches a step and returns at once,
//! [`Slots::step_poll`] reaps it (logits out, positions advanced).
//!
//! On the CPU backend the step runs on a worker thread (one per slot table, started by
//! the first async step and kept, so its thread-local scratch stays warm; the kernels
//! still use the backend's own thread pool), so the caller can tokenize, sample, detokenize or
//! prefill the next request meanwhile. The slots in the step are busy until it is reaped:
//! using one is [`SlotError::Busy`]; the others can be bound, unbound or stepped.
//! The default is per backend ([`async_for`]): asynchronous on a device-memory
//! backend, synchronous on the CPU, where the worker and the caller would compete for the
//! same cores (slower, measured in docs/serving.md). `PN_ASYNC=1` / `PN_ASYNC=0` (or
//! `QWEN35_ASYNC_SCHED`) force either mode. A synchronous step runs inside `step_begin`,
//! which says so ([`Launch::Sync`]), and `step_poll` hands the result over. Results are
//! bitwise the same either way.

use crate::runner::{Logits, RunError, Runner};
use crate::slots::{run_step, SlotError, SlotHandle, Slots};
use crate::state::SeqState;
use std::sync::mpsc::{channel, Receiver, Sender, TryRecvError};
use std::sync::Arc;

/// How a step was launched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launch {
    /// Running on a worker thread; reap it with `step_poll` / `step_wait`.
    Async,
    /// Already run, synchronously, inside `step_begin` (async disabled); the result waits
    /// for `step_poll`.
    Sync,
}

type Done = (Vec<SeqState>, Result<Logits, RunError>);

type Job = (Arc<Runner>, Vec<SeqState>, Vec<(SlotHandle, u32)>);

enum Pending {
    Running,
    Ready(Done),
}

/// The step thread of a slot table: jobs in, results out; it ends when the table drops.
pub(crate) struct Worker {
    jobs: Sender<Job>,
    done: Receiver<Done>,
}

impl Worker {
    fn start() -> std::io::Result<Worker> {
        let (jobs, job_rx) = channel::<Job>();
        let (done_tx, done) = channel();
        std::thread::Builder::new().name("pn-step".into()).spawn(move || {
            for (r, mut states, batch) in job_rx {
                let res = run_step(&r, &mut states, &batch);
                if done_tx.send((states, res)).is_err() {
                    break;
                }
            }
        })?;
        Ok(Worker { jobs, done })
    }
}

pub(crate) struct InFlight {
    idx: Vec<usize>,
    pending: Pending,
}

/// The environment's choice: `PN_ASYNC` (or `QWEN35_ASYNC_SCHED`) `0`/`false`/`off`/`no`
/// → off, `1`/`true`/`on`/`yes` → on; None when unset (or anything else).
fn async_env() -> Option<bool> {
    let read = |name: &str| {
        std::env::var(name).ok().and_then(|v| match v.trim().to_ascii_lowercase().as_str() {
            "0" | "false" | "off" | "no" => Some(false),
            "1" | "true" | "on" | "yes" => Some(true),
            _ => None,
        })
    };
    match (read("PN_ASYNC"), read("QWEN35_ASYNC_SCHED")) {
        (Some(false), _) | (_, Some(false)) => Some(false),
        (a, b) => a.or(b),
    }
}

/// Whether steps may run asynchronously at all: not when `PN_ASYNC` or
/// `QWEN35_ASYNC_SCHED` is `0` (or `false`/`off`).
pub fn async_enabled() -> bool {
    async_env().unwrap_or(true)
}

/// Whether steps on `runner` run asynchronously by default ([`Slots::step_begin`]): the
/// environment's choice when set, else only when one of its dies has device memory (a device
/// backend computes while the host samples and prefills). On the CPU the step's kernels
/// and the caller's work share the same cores: a worker thread there only adds
/// contention (measured slower, docs/serving.md), so the step runs in the caller's
/// thread unless `PN_ASYNC=1` asks otherwise.
pub fn async_for(runner: &Runner) -> bool {
    async_env().unwrap_or_else(|| runner.dies().iter().any(|d| d.backend.memory() == crate::backend::Memory::Device))
}

impl Slots {
    /// Launch a step (`batch[i]` = slot, next token). Asynchronous ([`async_for`]: on a
    /// device backend, or with `PN_ASYNC=1`) it returns at once ([`Launch::Async`]);
    /// otherwise the step has run when it returns ([`Launch::Sync`]). One step in flight
    /// at a time.
    pub fn step_begin(&mut self, runner: &Arc<Runner>, batch: &[(SlotHandle, u32)]) -> Result<Launch, SlotError> {
        self.step_begin_with(runner, batch, async_for(runner))
    }

    /// [`Slots::step_begin`] with the mode chosen by the caller (`asynchronous: false`
    /// runs it inline).
    pub fn step_begin_with(&mut self, runner: &Arc<Runner>, batch: &[(SlotHandle, u32)], asynchronous: bool) -> Result<Launch, SlotError> {
        if self.inflight.is_some() {
            return Err(SlotError::InFlight);
        }
        let (idx, mut states) = self.take_batch(batch)?;
        for &i in &idx {
            self.slots[i].busy = true;
        }
        let (pending, launch) = if asynchronous {
            if self.worker.is_none() {
                match Worker::start() {
                    Ok(w) => self.worker = Some(w),
                    Err(e) => {
                        self.put_back(&idx, states);
                        return Err(SlotError::Worker(format!("cannot start the step thread: {e}")));
                    }
                }
            }
            let w = self.worker.as_ref().expect("started above");
            if let Err(e) = w.jobs.send((runner.clone(), states, batch.to_vec())) {
                // the worker is gone (it panicked earlier): the states went with the job
                let (_, states, _) = e.0;
                self.worker = None;
                self.put_back(&idx, states);
                return Err(SlotError::Worker("the step thread ended: try again".into()));
            }
            (Pending::Running, Launch::Async)
        } else {
            let res = run_step(runner, &mut states, batch);
            (Pending::Ready((states, res)), Launch::Sync)
        };
        self.inflight = Some(InFlight { idx, pending });
        Ok(launch)
    }

    /// Whether a step is in flight (launched, not reaped).
    pub fn in_flight(&self) -> bool {
        self.inflight.is_some()
    }

    /// Reap the step in flight if it is done: `None` while it runs, else its logits (one
    /// row per batch entry, in order) with the slots back and their positions advanced.
    /// `Some(Err(NothingInFlight))` when no step was launched.
    pub fn step_poll(&mut self) -> Option<Result<Logits, SlotError>> {
        let Some(f) = self.inflight.as_mut() else { return Some(Err(SlotError::NothingInFlight)) };
        let done = match &mut f.pending {
            Pending::Ready(_) => None,
            Pending::Running => match self.worker.as_ref().expect("a running step has a worker").done.try_recv() {
                Ok(d) => Some(d),
                Err(TryRecvError::Empty) => return None,
                Err(TryRecvError::Disconnected) => return Some(Err(self.lost())),
            },
        };
        let f = self.inflight.take().expect("checked above");
        let (states, res) = match (done, f.pending) {
            (Some(d), _) => d,
            (None, Pending::Ready(d)) => d,
            (None, Pending::Running) => unreachable!("handled above"),
        };
        self.put_back(&f.idx, states);
        Some(res.map_err(SlotError::from))
    }

    /// Block until the step in flight is done and reap it.
    pub fn step_wait(&mut self) -> Result<Logits, SlotError> {
        let Some(f) = self.inflight.as_mut() else { return Err(SlotError::NothingInFlight) };
        if let Pending::Running = f.pending {
            match self.worker.as_ref().expect("a running step has a worker").done.recv() {
                Ok(d) => f.pending = Pending::Ready(d),
                Err(_) => return Err(self.lost()),
            }
        }
        self.step_poll().expect("the step is ready")
    }

    /// The worker died (a panic in a kernel): its slots are freed.
    fn lost(&mut self) -> SlotError {
        self.worker = None;
        let f = self.inflight.take().expect("a step was in flight");
        for &i in &f.idx {
            self.slots[i].busy = false;
            self.slots[i].binding = 0;
            // the row went with the worker: a new one (the old one's device copies are
            // dropped with it)
            self.slots[i].state = Some(SeqState::empty());
        }
        SlotError::Worker("the step's worker thread panicked: its slots were freed".into())
    }
}

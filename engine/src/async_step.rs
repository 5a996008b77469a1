//! Async decode steps: [`Slots::step_begin`] launches a step and returns at once,
//! [`Slots::step_poll`] reaps it (logits out, positions advanced).
//!
//! On the CPU backend the step runs on a worker thread (one per step; the kernels still
//! use the backend's own thread pool), so the caller can tokenize, sample, detokenize or
//! prefill the next request meanwhile. The slots in the step are busy until it is reaped:
//! using one is [`SlotError::Busy`]; the others can be bound, unbound or stepped.
//! `PN_ASYNC=0` (or `QWEN35_ASYNC_SCHED=0`) disables it: the step then runs synchronously
//! inside `step_begin`, which says so ([`Launch::Sync`]), and `step_poll` hands the result
//! over. Results are bitwise the same either way.

use crate::runner::{Logits, RunError, Runner};
use crate::slots::{run_step, SlotError, SlotHandle, Slots};
use crate::state::SeqState;
use std::sync::mpsc::{channel, Receiver, TryRecvError};
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

enum Pending {
    Running(Receiver<Done>),
    Ready(Done),
}

pub(crate) struct InFlight {
    idx: Vec<usize>,
    pending: Pending,
}

/// Whether steps may run asynchronously: not when `PN_ASYNC` or `QWEN35_ASYNC_SCHED` is
/// `0` (or `false`/`off`).
pub fn async_enabled() -> bool {
    let off = |name: &str| {
        std::env::var(name)
            .map(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "0" | "false" | "off" | "no"))
            .unwrap_or(false)
    };
    !(off("PN_ASYNC") || off("QWEN35_ASYNC_SCHED"))
}

impl Slots {
    /// Launch a step (`batch[i]` = slot, next token). With async enabled it returns at
    /// once ([`Launch::Async`]); otherwise the step has run when it returns
    /// ([`Launch::Sync`]). One step in flight at a time.
    pub fn step_begin(&mut self, runner: &Arc<Runner>, batch: &[(SlotHandle, u32)]) -> Result<Launch, SlotError> {
        self.step_begin_with(runner, batch, async_enabled())
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
            let (tx, rx) = channel();
            let (r, b) = (runner.clone(), batch.to_vec());
            let spawned = std::thread::Builder::new().name("pn-step".into()).spawn(move || {
                let res = run_step(&r, &mut states, &b);
                let _ = tx.send((states, res));
            });
            match spawned {
                Ok(_) => (Pending::Running(rx), Launch::Async),
                Err(e) => {
                    // the states went with the closure that failed to spawn: unrecoverable here
                    for &i in &idx {
                        self.slots[i].busy = false;
                        self.slots[i].binding = 0;
                    }
                    return Err(SlotError::Worker(format!("cannot start the step thread: {e} (the slots in the step were lost)")));
                }
            }
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
            Pending::Running(rx) => match rx.try_recv() {
                Ok(d) => Some(d),
                Err(TryRecvError::Empty) => return None,
                Err(TryRecvError::Disconnected) => return Some(Err(self.lost())),
            },
        };
        let f = self.inflight.take().expect("checked above");
        let (states, res) = match (done, f.pending) {
            (Some(d), _) => d,
            (None, Pending::Ready(d)) => d,
            (None, Pending::Running(_)) => unreachable!("handled above"),
        };
        self.put_back(&f.idx, states);
        Some(res.map_err(SlotError::from))
    }

    /// Block until the step in flight is done and reap it.
    pub fn step_wait(&mut self) -> Result<Logits, SlotError> {
        let Some(f) = self.inflight.as_mut() else { return Err(SlotError::NothingInFlight) };
        if let Pending::Running(rx) = &f.pending {
            match rx.recv() {
                Ok(d) => f.pending = Pending::Ready(d),
                Err(_) => return Err(self.lost()),
            }
        }
        self.step_poll().expect("the step is ready")
    }

    /// The worker died (a panic in a kernel): its slots are freed.
    fn lost(&mut self) -> SlotError {
        let f = self.inflight.take().expect("a step was in flight");
        for &i in &f.idx {
            self.slots[i].busy = false;
            self.slots[i].binding = 0;
        }
        SlotError::Worker("the step's worker thread panicked: its slots were freed".into())
    }
}

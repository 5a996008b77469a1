//! The verify pass and its rollback: the last accepted token and the K drafts in ONE
//! forward pass with every row's logits, recording the recurrent states' per-token
//! history (pn_ops::state::history); then the accepted prefix is kept — attention KV by
//! position (the rejected cells are overwritten later), conv and delta-rule states
//! restored from the history — without running anything again.

use super::SpecError;
use crate::runner::{Logits, RunError, Runner, Taps};
use crate::state::SeqState;
use pn_ops::state::history::Recording;
use pn_ops::{LayerState, Overflow};

/// Speculative decoding needs host-owned layer states (the rollback restores them in
/// place) and a context that does not wrap (a ring cache overwrites cells a rollback
/// would need).
pub fn check_runner(r: &Runner) -> Result<(), SpecError> {
    if let Some(d) = r.dies().iter().find(|d| d.backend.memory() == crate::backend::Memory::Device) {
        return Err(SpecError::Unsupported(format!(
            "die {} ({}) keeps the layer states on the device, and rolling back its recurrent states there is not implemented: run speculative decoding on the CPU backend or use --draft none",
            d.device,
            d.backend.name()
        )));
    }
    Ok(())
}

fn check_state(st: &SeqState) -> Result<(), SpecError> {
    if st.overflow == Overflow::Ring {
        return Err(SpecError::Unsupported("--context-overflow ring: a ring KV cache overwrites cells a rollback needs; use --draft none with it".into()));
    }
    if st.is_resident() {
        return Err(SpecError::Unsupported("the sequence's layer states are on a device: rollback there is not implemented".into()));
    }
    Ok(())
}

/// One verify pass: where it started, its length, and the history recording (alive
/// until the next pass, so the kept prefix can still shrink: [`Pass::rollback`]).
pub struct Pass {
    rec: Recording,
    pub start: usize,
    pub t: usize,
}

/// Feeds `tokens` (≥ 1) to `st` in one pass with all logits, recording the history of
/// every recurrent layer; `hidden` receives the rows after `output_norm` (MTP's `h`).
pub fn verify(r: &Runner, st: &mut SeqState, tokens: &[u32], hidden: Option<&mut Vec<f32>>) -> Result<(Logits, Pass), SpecError> {
    check_state(st)?;
    let rec = {
        let layers = st.layers()?;
        Recording::start(
            layers.iter().filter_map(|l| match l {
                LayerState::Recurrent(s) => Some(s),
                _ => None,
            }),
            tokens.len(),
        )
    };
    let start = st.pos;
    let logits = match hidden {
        None => r.forward(st, tokens, true)?,
        Some(h) => forward_hidden(r, st, tokens, true, h)?,
    };
    Ok((logits, Pass { rec, start, t: tokens.len() }))
}

impl Pass {
    /// The record of a pass of `t` tokens from position `start`, recorded by `rec`.
    pub(crate) fn new(rec: Recording, start: usize, t: usize) -> Pass {
        Pass { rec, start, t }
    }

    /// Keep the first `n_keep` (1..=t) tokens of this pass: the position moves back and
    /// every recurrent layer gets its state after token `n_keep − 1`. Valid until the
    /// next pass over `st`; calling it again with a smaller `n_keep` shrinks further.
    pub fn rollback(&self, st: &mut SeqState, n_keep: usize) -> Result<(), SpecError> {
        if n_keep == 0 || n_keep > self.t || st.pos < self.start {
            return Err(SpecError::Rollback(format!("expected to keep 1..={} tokens of the pass at {}, found {n_keep} (sequence at {})", self.t, self.start, st.pos)));
        }
        let cur = st.pos - self.start;
        if n_keep > cur {
            return Err(SpecError::Rollback(format!("the sequence keeps {cur} tokens of the pass already: cannot grow back to {n_keep}")));
        }
        for (i, l) in st.layers_mut()?.iter_mut().enumerate() {
            if let LayerState::Recurrent(s) = l {
                self.rec.rollback(s, self.t, n_keep).map_err(|m| SpecError::Rollback(format!("layer {i}: {m}")))?;
            }
        }
        st.pos = self.start + n_keep;
        Ok(())
    }
}

/// [`Runner::forward`] that also copies out `result_norm` (the hidden rows after
/// `output_norm`, `[n_embd]` per token, every token of the pass) into `hidden`: a second
/// output of the pass ([`crate::runner::Taps::hidden`]), no observer.
pub fn forward_hidden(r: &Runner, st: &mut SeqState, tokens: &[u32], all: bool, hidden: &mut Vec<f32>) -> Result<Logits, RunError> {
    hidden.clear();
    r.forward_hidden(st, tokens, all, hidden)
}

/// [`Runner::forward_multi`] that also copies out every row of `result_norm` (all the
/// sequences' tokens, in order) into `hidden`.
pub fn forward_multi_hidden(r: &Runner, parts: &mut [(&mut SeqState, &[u32])], hidden: &mut Vec<f32>) -> Result<Logits, RunError> {
    hidden.clear();
    r.forward_multi_with(parts, Taps::hidden(hidden))
}

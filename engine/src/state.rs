//! Per-sequence state: layer states (KV caches, conv + delta-rule states) and position.

use pn_ops::LayerState;

/// The state of one sequence. A fresh sequence has zero recurrent state, an empty KV
/// cache and position 0 (spec §10.21).
#[derive(Clone, Debug, PartialEq)]
pub struct SeqState {
    /// Number of tokens processed so far (the next token's position).
    pub pos: usize,
    /// KV capacity in positions.
    pub max_seq: usize,
    pub layers: Vec<LayerState>,
}

impl SeqState {
    pub fn new(layers: Vec<LayerState>, max_seq: usize) -> SeqState {
        SeqState { pos: 0, max_seq, layers }
    }
    pub fn reset(&mut self) {
        self.pos = 0;
        self.layers.iter_mut().for_each(LayerState::reset);
    }
    pub fn bytes(&self) -> usize {
        self.layers.iter().map(LayerState::bytes).sum()
    }
}

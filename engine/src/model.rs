//! What a model architecture provides to the generic runner.

use crate::graph::{GraphBuilder, GraphError};
use pn_ops::{KvCache, KvType, LayerState};

/// The batch geometry a graph is built for. Graphs are cached per geometry.
///
/// The key holds the shape of the pass's sequence table (`seqs` rows), not the lengths in
/// it: those are data, like the positions (the table, `pn_ops::SeqSpan` per sequence,
/// travels with the pass). So a decode step of K slots is `{K, K}` (one graph per K),
/// and prefill chunks of a mixed pass do not multiply the cache by every way a chunk
/// can split among sequences; nothing compiled for a geometry depends on the split.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Geometry {
    /// Tokens in the micro-batch, every sequence's together.
    pub n_tokens: usize,
    /// Sequences in the pass, each with at least one token (`seqs == n_tokens`: a
    /// decode step, one token per sequence).
    pub seqs: usize,
    /// Logits for every token (true) or only the last one (false).
    pub all_logits: bool,
}

impl Geometry {
    /// One sequence of `n_tokens` tokens ([`crate::Runner::forward`]).
    pub const fn one(n_tokens: usize, all_logits: bool) -> Geometry {
        Geometry { n_tokens, seqs: 1, all_logits }
    }
    /// A pass of sequences of `lens` tokens each.
    pub fn of(lens: &[usize], all_logits: bool) -> Geometry {
        Geometry { n_tokens: lens.iter().sum(), seqs: lens.len(), all_logits }
    }
    /// Whether every sequence has one token (a decode step of `seqs` slots).
    pub fn is_decode(&self) -> bool {
        self.seqs == self.n_tokens
    }
}

/// One line of a model's layer map (for `pn info` and dumps).
#[derive(Clone, Debug)]
pub struct LayerInfo {
    pub index: usize,
    pub kind: String,
}

/// A model architecture bound to one GGUF's configuration.
///
/// `build` adds the whole forward pass for a geometry to the builder: inputs `Tokens`
/// and `Positions` (named `inp_tokens`, `inp_pos`), weights by GGUF tensor name, stateful
/// ops referring to layer indices of `new_state`, and exactly one graph output: the
/// logits `[n_vocab, n_out]` named `result_output`.
pub trait Model: Send + Sync {
    fn arch(&self) -> &str;
    fn n_vocab(&self) -> usize;
    /// Layers run by the main forward pass.
    fn n_layer(&self) -> usize;
    fn layers(&self) -> Vec<LayerInfo>;
    /// Trained context length from the metadata.
    fn context_length(&self) -> usize;
    fn build(&self, geom: Geometry, b: &mut GraphBuilder) -> Result<(), GraphError>;
    /// Fresh per-sequence state for one sequence, one entry per layer, with room for
    /// `max_seq` positions in every KV cache.
    fn new_state(&self, max_seq: usize) -> Vec<LayerState>;
    /// The same with KV caches in format `kv` (docs/kv-cache.md). The default builds the
    /// layer list with `new_state(0)` (no cells) and gives every KV layer `max_seq` cells
    /// of `kv`; models override it to allocate once.
    fn new_state_with(&self, max_seq: usize, kv: KvType) -> Vec<LayerState> {
        self.new_state(0)
            .into_iter()
            .map(|l| match l {
                LayerState::Kv(c) => LayerState::Kv(KvCache::with_type(c.n_head_kv, c.head_dim, max_seq, kv)),
                other => other,
            })
            .collect()
    }
    /// Human-readable hyper-parameters, in a stable order.
    fn describe(&self) -> Vec<(String, String)>;
}

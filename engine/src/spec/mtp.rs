//! The MTP ("nextn") drafter (spec §3.6): a model's multi-token-prediction block, run on
//! its own small graphs with its own KV cache.
//!
//! Pair p is (h_p, x_{p+1}): the main model's hidden row after `output_norm` at position
//! p and the token after it; the block predicts x_{p+2} and runs at position p (as it was
//! trained: `train_mtp.py`). Every real pair is fed once (prompt pairs on the first
//! round, accepted ones on later rounds, in one pass), so the block's KV cache holds all
//! of them. Draft k > 1 feeds back the block's normed output as `h` with draft k − 1 at
//! the next position; those cells are overwritten by the real pairs later.
//!
//! Two graphs per pass length (the model builds them, [`MtpBlock`]): the norms
//! (`enorm(embed(x))`, `hnorm(h)`), concatenated here per pair (`[e ; h]`, embedding
//! first), then the block from `eh_proj` to the logits of the last pair.

use super::exec::{Cache, Compiled};
use super::SpecError;
use crate::backend::Backend;
use crate::gguf::Gguf;
use crate::graph::{GraphBuilder, GraphError};
use crate::sampler::argmax;
use pn_ops::{KvType, LayerState};
use std::sync::Arc;

/// What a model provides for its MTP block.
pub trait MtpBlock: Send + Sync {
    fn n_embd(&self) -> usize;
    /// Graph 1 for `t` pairs: inputs `inp_tokens` (x_{p+1}) and the external `inp_h`
    /// `[n_embd, t]`; outputs, in order, enorm(embedding) and hnorm(h), `[n_embd, t]`.
    fn build_norms(&self, t: usize, b: &mut GraphBuilder) -> Result<(), GraphError>;
    /// Graph 2: the external `inp_eh` `[2·n_embd, t]` (per pair [e ; h]) and `inp_pos`;
    /// outputs, in order, the block's normed output of the last pair `[n_embd, 1]` (the
    /// next draft's `h`) and its logits `[n_vocab, 1]`.
    fn build_block(&self, t: usize, b: &mut GraphBuilder) -> Result<(), GraphError>;
    /// The block's own KV cache, `max_seq` cells of `kv`.
    fn new_state(&self, max_seq: usize, kv: KvType) -> LayerState;
}

/// Largest pass of real pairs: longer runs of pairs (a prompt) go in power-of-two
/// chunks, so a drafter compiles at most 7 pair geometries (the KV cache carries over;
/// every row is what one pass gives: the ops are batch-invariant).
const MAX_PAIRS: usize = 64;

/// The block bound to a file and a backend, with its compiled graphs (shared by the
/// drafters of every sequence: `pn batch`, `pn serve`).
pub struct MtpModel {
    block: Arc<dyn MtpBlock>,
    gguf: Arc<Gguf>,
    backend: Arc<dyn Backend>,
    graphs: Cache,
}

impl MtpModel {
    pub fn new(block: Arc<dyn MtpBlock>, gguf: Arc<Gguf>, backend: Arc<dyn Backend>) -> MtpModel {
        MtpModel { block, gguf, backend, graphs: Cache::default() }
    }

    pub fn n_embd(&self) -> usize {
        self.block.n_embd()
    }

    fn compiled(&self, which: u8, t: usize) -> Result<Arc<Compiled>, SpecError> {
        Ok(self.graphs.get((which, t), || {
            let mut b = GraphBuilder::new();
            match which {
                1 => self.block.build_norms(t, &mut b)?,
                _ => self.block.build_block(t, &mut b)?,
            }
            let c = Compiled::new(b.finish(), &self.gguf, self.backend.clone())?;
            // the norms of one pair (every draft round): a few tiny ops
            Ok(if which == 1 && t == 1 { c.inline() } else { c })
        })?)
    }

    /// One block pass over `t` pairs (h rows, next tokens) at positions `pos0..`, with
    /// `state` the block's KV cache: the normed output and the argmax of the last pair's
    /// logits.
    fn pass(&self, state: &mut LayerState, h: &[f32], next: &[u32], pos0: usize) -> Result<(Vec<f32>, u32), SpecError> {
        let (e, t) = (self.n_embd(), next.len());
        let (g1, g2) = (self.compiled(1, t)?, self.compiled(2, t)?);
        let pos: Vec<i32> = (pos0..pos0 + t).map(|p| p as i32).collect();
        let gguf = &*self.gguf;
        let norms = g1.run(gguf, next, &pos, &[("inp_h", h)], None)?;
        let (en, hn) = (norms[0].as_f32(), norms[1].as_f32());
        let mut eh = Vec::with_capacity(2 * e * t);
        for i in 0..t {
            eh.extend_from_slice(&en[i * e..(i + 1) * e]);
            eh.extend_from_slice(&hn[i * e..(i + 1) * e]);
        }
        let out = g2.run(gguf, next, &pos, &[("inp_eh", &eh)], Some(state))?;
        Ok((out[0].as_f32().to_vec(), argmax(out[1].as_f32()) as u32))
    }
}

/// The MTP drafter of one sequence: its block's KV cache and the hidden rows not yet fed.
pub struct MtpDrafter {
    model: Arc<MtpModel>,
    state: LayerState,
    /// Real pairs in the KV cache (pairs 0..real).
    real: usize,
    /// Main-model hidden rows of positions real.. not yet paired (their next token was
    /// not known when they were computed).
    pending_h: Vec<f32>,
    /// Seconds and positions of the block passes that paired hidden rows so far (the
    /// catch-up a round without drafts leaves to the next one: spec/adapt.rs).
    pub caught_up: (f64, u64),
}

impl MtpDrafter {
    pub fn new(block: Arc<dyn MtpBlock>, gguf: Arc<Gguf>, backend: Arc<dyn Backend>, max_seq: usize, kv: KvType) -> MtpDrafter {
        MtpDrafter::with_model(Arc::new(MtpModel::new(block, gguf, backend)), max_seq, kv)
    }

    /// A drafter on a shared model (its compiled graphs).
    pub fn with_model(model: Arc<MtpModel>, max_seq: usize, kv: KvType) -> MtpDrafter {
        let state = model.block.new_state(max_seq, kv);
        MtpDrafter { model, state, real: 0, pending_h: Vec::new(), caught_up: (0.0, 0) }
    }

    /// Hidden rows of main-model positions (in order, following the previous ones).
    pub fn observe_hidden(&mut self, rows: &[f32]) {
        self.pending_h.extend_from_slice(rows);
    }

    /// Drop the last `n` hidden rows given (their tokens were un-fed).
    pub fn unobserve(&mut self, n: usize) {
        let keep = self.pending_h.len().saturating_sub(n * self.model.n_embd());
        self.pending_h.truncate(keep);
    }

    /// Forget everything (a new sequence).
    pub fn reset(&mut self) {
        self.state.reset();
        self.real = 0;
        self.pending_h.clear();
    }

    /// Up to `n` drafts after `tokens` (every fed token, then the pending one). Feeds the
    /// unpaired hidden rows first (their next tokens are the last ones of `tokens`).
    pub fn draft(&mut self, tokens: &[u32], n: usize) -> Result<Vec<u32>, SpecError> {
        let e = self.model.n_embd();
        let np = self.pending_h.len() / e;
        if n == 0 || np == 0 {
            return Ok(Vec::new());
        }
        // pairs real..real+np: h rows pending, next tokens x_{real+1}..=x_{real+np}
        if self.real + np + 1 != tokens.len() {
            return Err(SpecError::Rollback(format!("MTP: {} paired + {np} hidden rows do not precede the {} tokens", self.real, tokens.len())));
        }
        let h = std::mem::take(&mut self.pending_h);
        let m = &*self.model;
        let mut done = 0;
        let mut last = None;
        let t0 = std::time::Instant::now();
        while done < np {
            let left = np - done;
            let t = if left >= MAX_PAIRS { MAX_PAIRS } else { 1 << left.ilog2() };
            let p0 = self.real + done;
            last = Some(m.pass(&mut self.state, &h[done * e..(done + t) * e], &tokens[p0 + 1..p0 + 1 + t], p0)?);
            done += t;
        }
        self.caught_up.0 += t0.elapsed().as_secs_f64();
        self.caught_up.1 += np as u64;
        self.real += np;
        let (mut g, mut d) = last.expect("np > 0");
        let mut out = vec![d];
        while out.len() < n {
            (g, d) = m.pass(&mut self.state, &g, &[d], self.real + out.len() - 1)?;
            out.push(d);
        }
        Ok(out)
    }
}

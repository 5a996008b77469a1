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
//! first), then the block from `eh_proj` to the logits of each sequence's last pair.
//!
//! Several sequences' drafters on one model ([`draft_many`]: decode slots, `pn batch`,
//! `pn serve`) run their block passes together: one pass of every sequence's pairs
//! (each with its own KV cache, like the main model's multi-sequence passes), so the
//! block's weights stream once per draft position for all of them. Every row is what
//! the sequence's own pass gives (the ops are batch-invariant): the same drafts.

use super::exec::{Cache, Compiled};
use super::SpecError;
use crate::backend::Backend;
use crate::gguf::Gguf;
use crate::graph::{GraphBuilder, GraphError};
use crate::sampler::argmax;
use pn_ops::{KvType, LayerState, SeqSpan};
use std::sync::Arc;

/// What a model provides for its MTP block.
pub trait MtpBlock: Send + Sync {
    fn n_embd(&self) -> usize;
    /// Graph 1 for `t` pairs: inputs `inp_tokens` (x_{p+1}) and the external `inp_h`
    /// `[n_embd, t]`; outputs, in order, enorm(embedding) and hnorm(h), `[n_embd, t]`.
    fn build_norms(&self, t: usize, b: &mut GraphBuilder) -> Result<(), GraphError>;
    /// Graph 2 for `t` pairs of `seqs` sequences (their spans given at run time): the
    /// external `inp_eh` `[2·n_embd, t]` (per pair [e ; h]) and `inp_pos`; outputs, in
    /// order, the block's normed output of each sequence's last pair `[n_embd, seqs]`
    /// (its next draft's `h`) and its logits `[n_vocab, seqs]`.
    fn build_block(&self, t: usize, seqs: usize, b: &mut GraphBuilder) -> Result<(), GraphError>;
    /// The block's own KV cache, `max_seq` cells of `kv`.
    fn new_state(&self, max_seq: usize, kv: KvType) -> LayerState;
}

/// Largest pass of real pairs: longer runs of pairs (a prompt) go in power-of-two
/// chunks, so a drafter compiles at most 7 pair geometries (the KV cache carries over;
/// every row is what one pass gives: the ops are batch-invariant).
const MAX_PAIRS: usize = 64;

/// Most pairs a drafter brings to a batched catch-up pass ([`draft_many`]): a round's
/// accepted tokens. More (a prompt, or a run of rounds without drafts) catch up alone.
const BATCH_PAIRS: usize = super::MAX_DRAFT + 1;

/// Bytes of compiled block geometries kept per model (their value slots): a single
/// sequence meets ~14 graphs, several slots one per (pairs, sequences) of their passes;
/// one over a 248k vocabulary holds ~1 MB of logits per sequence.
const GRAPH_BUDGET: usize = 256 << 20;

/// One sequence's part of a block pass: its KV cache, its pairs' h rows and next
/// tokens, and the position of its first pair.
struct PairRun<'a> {
    state: &'a mut LayerState,
    h: &'a [f32],
    next: &'a [u32],
    pos0: usize,
}

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
        MtpModel { block, gguf, backend, graphs: Cache::new(GRAPH_BUDGET) }
    }

    /// The same with the compiled graphs kept within `bytes` (at least the newest).
    pub fn with_graph_budget(mut self, bytes: usize) -> MtpModel {
        self.graphs = Cache::new(bytes);
        self
    }

    pub fn n_embd(&self) -> usize {
        self.block.n_embd()
    }

    /// Compiled block geometries held now, and their bytes.
    pub fn graphs(&self) -> usize {
        self.graphs.len()
    }

    pub fn graph_bytes(&self) -> usize {
        self.graphs.bytes()
    }

    fn compiled(&self, which: u8, t: usize, seqs: usize) -> Result<Arc<Compiled>, SpecError> {
        Ok(self.graphs.get((which, t, seqs), || {
            let mut b = GraphBuilder::new();
            match which {
                1 => self.block.build_norms(t, &mut b)?,
                _ => self.block.build_block(t, seqs, &mut b)?,
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
        let mut one = [PairRun { state, h, next, pos0 }];
        Ok(self.pass_many(&mut one)?.pop().expect("one sequence"))
    }

    /// One block pass over the pairs of several sequences: per sequence, the normed
    /// output and the argmax of its last pair's logits.
    fn pass_many(&self, runs: &mut [PairRun<'_>]) -> Result<Vec<(Vec<f32>, u32)>, SpecError> {
        let (e, k) = (self.n_embd(), runs.len());
        let t: usize = runs.iter().map(|r| r.next.len()).sum();
        let (g1, g2) = (self.compiled(1, t, 1)?, self.compiled(2, t, k)?);
        let (mut h, mut next, mut pos, mut spans) = (Vec::with_capacity(t * e), Vec::with_capacity(t), Vec::with_capacity(t), Vec::with_capacity(k));
        for r in runs.iter() {
            spans.push(SeqSpan { start: next.len(), len: r.next.len() });
            h.extend_from_slice(r.h);
            next.extend_from_slice(r.next);
            pos.extend((r.pos0..r.pos0 + r.next.len()).map(|p| p as i32));
        }
        let gguf = &*self.gguf;
        // the norms are per pair: one span whatever the sequences
        let norms = g1.run(gguf, &next, &pos, &[("inp_h", &h)], None)?;
        let (en, hn) = (norms[0].as_f32(), norms[1].as_f32());
        let mut eh = Vec::with_capacity(2 * e * t);
        for i in 0..t {
            eh.extend_from_slice(&en[i * e..(i + 1) * e]);
            eh.extend_from_slice(&hn[i * e..(i + 1) * e]);
        }
        let mut layers: Vec<&mut [LayerState]> = runs.iter_mut().map(|r| std::slice::from_mut(&mut *r.state)).collect();
        let out = g2.run_seqs(gguf, &next, &pos, &[("inp_eh", &eh)], &spans, &mut layers)?;
        let (n, logits) = (out[0].as_f32(), out[1].as_f32());
        let v = logits.len() / k;
        Ok((0..k).map(|i| (n[i * e..(i + 1) * e].to_vec(), argmax(&logits[i * v..(i + 1) * v]) as u32)).collect())
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

    /// Hidden rows not yet paired; an error unless they and the paired ones precede
    /// `tokens` (pairs real..real+np: next tokens x_{real+1}..=x_{real+np}).
    fn unpaired(&self, tokens: &[u32]) -> Result<usize, SpecError> {
        let np = self.pending_h.len() / self.model.n_embd();
        if np > 0 && self.real + np + 1 != tokens.len() {
            return Err(SpecError::Rollback(format!("MTP: {} paired + {np} hidden rows do not precede the {} tokens", self.real, tokens.len())));
        }
        Ok(np)
    }

    /// Up to `n` drafts after `tokens` (every fed token, then the pending one). Feeds the
    /// unpaired hidden rows first (their next tokens are the last ones of `tokens`).
    pub fn draft(&mut self, tokens: &[u32], n: usize) -> Result<Vec<u32>, SpecError> {
        let e = self.model.n_embd();
        let np = self.unpaired(tokens)?;
        if n == 0 || np == 0 {
            return Ok(Vec::new());
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

/// One drafter's part of [`draft_many`]: every token it was fed then the pending one,
/// and the most drafts it takes.
pub struct DraftJob<'a> {
    pub drafter: &'a mut MtpDrafter,
    pub tokens: &'a [u32],
    pub n: usize,
}

/// The drafts of several drafters (up to each one's `n`), their block passes batched:
/// one pass pairs every drafter's pending hidden rows (a round's accepted tokens) and
/// gives each its first draft, then one pass per further draft position for the drafters
/// that take it. A drafter with more rows to pair (a prompt, a run of rounds without
/// drafts) or on another model drafts alone. The drafts are those of
/// [`MtpDrafter::draft`], each sequence's catch-up time charged in proportion to its
/// pairs.
pub fn draft_many(jobs: &mut [DraftJob<'_>]) -> Result<Vec<Vec<u32>>, SpecError> {
    let mut out = vec![Vec::new(); jobs.len()];
    let mut batch = Vec::new();
    let model = jobs.iter().find(|j| j.n > 0).map(|j| j.drafter.model.clone());
    for (i, j) in jobs.iter_mut().enumerate() {
        let np = j.drafter.unpaired(j.tokens)?;
        if j.n == 0 || np == 0 {
            continue;
        }
        if np > BATCH_PAIRS || !model.as_ref().is_some_and(|m| Arc::ptr_eq(m, &j.drafter.model)) {
            out[i] = j.drafter.draft(j.tokens, j.n)?;
        } else {
            batch.push(i);
        }
    }
    if batch.len() < 2 {
        // alone: the single-sequence path
        for &i in &batch {
            out[i] = jobs[i].drafter.draft(jobs[i].tokens, jobs[i].n)?;
        }
        return Ok(out);
    }
    let m = model.expect("a drafter takes drafts");
    let e = m.n_embd();
    // the batched jobs, in `batch`'s order
    let mut bj: Vec<&mut DraftJob<'_>> = jobs.iter_mut().enumerate().filter(|(i, _)| batch.contains(i)).map(|(_, j)| j).collect();
    // the catch-up pass: every drafter's pending pairs, its first draft
    let t0 = std::time::Instant::now();
    let hs: Vec<Vec<f32>> = bj.iter_mut().map(|j| std::mem::take(&mut j.drafter.pending_h)).collect();
    let mut cur = {
        let mut runs: Vec<PairRun<'_>> = bj
            .iter_mut()
            .zip(&hs)
            .map(|(j, h)| {
                let (d, np) = (&mut *j.drafter, h.len() / e);
                PairRun { next: &j.tokens[d.real + 1..d.real + 1 + np], pos0: d.real, state: &mut d.state, h }
            })
            .collect();
        m.pass_many(&mut runs)?
    };
    let (secs, pairs) = (t0.elapsed().as_secs_f64(), hs.iter().map(Vec::len).sum::<usize>() / e);
    for (b, (j, h)) in bj.iter_mut().zip(&hs).enumerate() {
        let (d, np) = (&mut *j.drafter, h.len() / e);
        d.caught_up.0 += secs * np as f64 / pairs as f64;
        d.caught_up.1 += np as u64;
        d.real += np;
        out[batch[b]].push(cur[b].1);
    }
    // further draft positions: each drafter's last normed output as h, its last draft
    loop {
        let live: Vec<bool> = bj.iter().zip(&batch).map(|(j, &i)| out[i].len() < j.n).collect();
        if !live.contains(&true) {
            return Ok(out);
        }
        let toks: Vec<[u32; 1]> = cur.iter().map(|c| [c.1]).collect();
        let next = {
            let mut runs: Vec<PairRun<'_>> = bj
                .iter_mut()
                .enumerate()
                .filter(|(b, _)| live[*b])
                .map(|(b, j)| {
                    let d = &mut *j.drafter;
                    PairRun { pos0: d.real + out[batch[b]].len() - 1, state: &mut d.state, h: &cur[b].0, next: &toks[b] }
                })
                .collect();
            m.pass_many(&mut runs)?
        };
        for (b, r) in (0..bj.len()).filter(|&b| live[b]).zip(next) {
            out[batch[b]].push(r.1);
            cur[b] = r;
        }
    }
}

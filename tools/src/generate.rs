//! The generation loop shared by `pn run` and `pn chat`: prefill (with a token progress
//! bar when long), then sample and stream until end of text, the token limit, a full
//! context, a stop string or Ctrl-C. Stop strings go through the engine's
//! [`StopMatcher`]: text that could still become one is held back, a match is never shown.

use crate::load;
use anyhow::Result;
use pn_engine::runner::Logits;
use pn_engine::sampler::Sampler;
use pn_engine::spec::Speculator;
use pn_engine::stop::StopMatcher;
use pn_engine::tensor_dump::TensorRecorder;
use pn_engine::tokenizer::{StreamDecoder, Tokenizer};
use pn_engine::{Runner, SeqState};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// Why generation ended (the end line's `stopped: …`).
#[derive(Clone, Debug, PartialEq)]
pub enum StopReason {
    EndOfText,
    Length,
    ContextFull,
    StopString(String),
    Interrupted,
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StopReason::EndOfText => write!(f, "end of text"),
            StopReason::Length => write!(f, "length"),
            StopReason::ContextFull => write!(f, "context full"),
            StopReason::StopString(s) => write!(f, "stop string {s:?}"),
            StopReason::Interrupted => write!(f, "interrupted"),
        }
    }
}

/// What to generate.
pub struct Spec<'a> {
    /// Most tokens (None: until end of text or a full context).
    pub limit: Option<usize>,
    pub ignore_eos: bool,
    pub stops: &'a [String],
    /// Feed every shown token, so the state holds exactly the text (chat: the next turn
    /// continues from it); `pn run` skips the last, unneeded forward pass.
    pub feed_last: bool,
    pub interrupt: Option<&'a AtomicBool>,
}

pub struct Generated {
    /// Every decoded token's text, including a matched stop string (what the state saw).
    pub text: String,
    pub tokens: usize,
    pub reason: StopReason,
    pub prefill_s: f64,
    pub gen_s: f64,
}

/// Prompts at least this long get a progress bar (in ubatch-sized forward passes).
const PREFILL_BAR_TOKENS: usize = 512;

/// Feed `ids` (last-token logits, or all rows with `all`): one pass, or ubatch-sized passes
/// with a progress bar for a long prompt; `rec` observes every node when dumping.
pub fn prefill(r: &Runner, st: &mut SeqState, ids: &[u32], all: bool, rec: Option<&mut TensorRecorder>) -> Result<Logits> {
    if let Some(rec) = rec {
        return Ok(r.forward_observed(st, ids, all, Some(&mut |n, t| rec.record(n, t)))?);
    }
    if ids.len() < PREFILL_BAR_TOKENS || !crate::progress::enabled() {
        return Ok(r.forward(st, ids, all)?);
    }
    let pb = crate::progress::bar(ids.len() as u64, "prompt", "tokens");
    let mut out: Option<Logits> = None;
    for chunk in ids.chunks(r.ubatch.max(1)) {
        let l = r.forward(st, chunk, all)?;
        out = Some(match out {
            Some(mut o) if all => {
                o.data.extend_from_slice(&l.data);
                o
            }
            _ => l,
        });
        pb.inc(chunk.len() as u64);
    }
    pb.finish_and_clear();
    Ok(out.expect("ids is not empty"))
}

/// One decode step, observed when dumping.
fn step(r: &Runner, st: &mut SeqState, id: u32, rec: Option<&mut TensorRecorder>) -> Result<Logits> {
    prefill(r, st, &[id], false, rec)
}

/// Prefill `ids`, then generate as `spec` says, passing each piece of text to `emit`
/// (with a speculator: [`generate_drafted`]).
#[allow(clippy::too_many_arguments)]
pub fn generate(
    r: &Runner,
    tok: &Tokenizer,
    st: &mut SeqState,
    sampler: &mut Sampler,
    ids: &[u32],
    spec: &Spec,
    mut rec: Option<&mut TensorRecorder>,
    emit: &mut dyn FnMut(&str) -> Result<()>,
) -> Result<Generated> {
    let t0 = Instant::now();
    sampler.observe(ids);
    let logits = prefill(r, st, ids, false, rec.as_deref_mut())?;
    let prefill_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let mut stop = StopMatcher::new(spec.stops).map_err(anyhow::Error::msg)?;
    let mut dec = StreamDecoder::new();
    let (mut text, mut tokens) = (String::new(), 0usize);
    let interrupted = || spec.interrupt.is_some_and(|f| f.load(Ordering::SeqCst));
    let reason = if spec.limit == Some(0) {
        StopReason::Length
    } else {
        let mut next = sampler.sample(load::finite(logits.last())?);
        loop {
            if interrupted() {
                break StopReason::Interrupted;
            }
            if !spec.ignore_eos && tok.is_eog(next) {
                break StopReason::EndOfText;
            }
            let piece = dec.push(tok, next);
            text.push_str(&piece);
            tokens += 1;
            let o = stop.push(&piece);
            emit(&o.emit)?;
            let matched = o.stopped.map(StopReason::StopString);
            let done = matched.or_else(|| (spec.limit == Some(tokens)).then_some(StopReason::Length));
            if !st.fits(1) {
                break done.unwrap_or(StopReason::ContextFull);
            }
            if let (Some(d), false) = (&done, spec.feed_last) {
                break d.clone();
            }
            let logits = step(r, st, next, rec.as_deref_mut())?;
            if let Some(d) = done {
                break d;
            }
            next = sampler.sample(load::finite(logits.last())?);
        }
    };
    let rest = dec.flush();
    text.push_str(&rest);
    if !matches!(reason, StopReason::StopString(_)) {
        let o = stop.push(&rest);
        emit(&o.emit)?;
        emit(&stop.finish())?;
    }
    Ok(Generated { text, tokens, reason, prefill_s, gen_s: t1.elapsed().as_secs_f64() })
}

/// [`generate`] with speculative decoding: each round feeds the pending token and the
/// drafts in one verify pass; accepted drafts are shown without a pass of their own. The
/// same tokens, stops and limits as plain decoding (greedy: token for token; sampling:
/// the same distribution). Where generation stops inside a round, the drafts fed past
/// the last shown token are un-fed (with `feed_last`, the state holds exactly the text).
#[allow(clippy::too_many_arguments)]
pub fn generate_drafted(
    r: &Runner,
    tok: &Tokenizer,
    st: &mut SeqState,
    sampler: &mut Sampler,
    sp: &mut Speculator,
    ids: &[u32],
    spec: &Spec,
    emit: &mut dyn FnMut(&str) -> Result<()>,
) -> Result<Generated> {
    let t0 = Instant::now();
    sampler.observe(ids);
    let logits = sp.prefill(r, st, ids)?;
    let prefill_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let mut stop = StopMatcher::new(spec.stops).map_err(anyhow::Error::msg)?;
    let mut dec = StreamDecoder::new();
    let (mut text, mut tokens) = (String::new(), 0usize);
    let interrupted = || spec.interrupt.is_some_and(|f| f.load(Ordering::SeqCst));
    // accepted drafts (fed, not shown yet), then the pending token (not fed)
    let mut queue: VecDeque<u32> = VecDeque::new();
    let reason = if spec.limit == Some(0) {
        StopReason::Length
    } else {
        let mut next = sampler.sample(load::finite(logits.last())?);
        loop {
            let (id, fed) = match queue.pop_front() {
                Some(t) => (t, true),
                None => (next, false),
            };
            let unshown = queue.len() + usize::from(fed);
            if interrupted() {
                sp.unfeed(st, unshown)?;
                break StopReason::Interrupted;
            }
            if !spec.ignore_eos && tok.is_eog(id) {
                sp.unfeed(st, unshown)?;
                break StopReason::EndOfText;
            }
            let piece = dec.push(tok, id);
            text.push_str(&piece);
            tokens += 1;
            let o = stop.push(&piece);
            emit(&o.emit)?;
            let matched = o.stopped.map(StopReason::StopString);
            let done = matched.or_else(|| (spec.limit == Some(tokens)).then_some(StopReason::Length));
            if fed {
                if let Some(d) = done {
                    sp.unfeed(st, queue.len())?;
                    break d;
                }
                continue;
            }
            if !st.fits(1) {
                break done.unwrap_or(StopReason::ContextFull);
            }
            if let Some(d) = done {
                if spec.feed_last {
                    sp.prefill(r, st, &[id])?;
                }
                break d;
            }
            let (acc, n) = sp.round(r, st, id, sampler)?;
            queue.extend(acc);
            next = n;
        }
    };
    let rest = dec.flush();
    text.push_str(&rest);
    if !matches!(reason, StopReason::StopString(_)) {
        let o = stop.push(&rest);
        emit(&o.emit)?;
        emit(&stop.finish())?;
    }
    Ok(Generated { text, tokens, reason, prefill_s, gen_s: t1.elapsed().as_secs_f64() })
}

/// `N tokens in S s (R tok/s)`.
pub fn rate(n: usize, secs: f64) -> String {
    format!("{n} tokens in {secs:.2}s ({:.1} tok/s)", n as f64 / secs.max(1e-9))
}

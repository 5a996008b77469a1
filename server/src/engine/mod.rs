//! The engine thread: it alone owns the runner, the decode slots and the prefix cache.
//! Every call into `Slots` / `Runner` / `PrefixCache` the server makes is in this module
//! (`prefill.rs`, `step.rs`), so an engine API change is adapted here.
//!
//! Loop: take new jobs (bounded queue, counted by `Metrics::queue_depth`), drop the
//! cancelled ones (client gone: its event channel is closed; deadline passed), admit
//! waiting jobs while a slot is free (bound + prefilling ≤ slots), then one pass over
//! every bound sequence's decode token and the prefill passes the step budget allows
//! (`schedule.rs`, `step.rs`), and hand each sequence its logits row. A finished
//! sequence's answer goes out at once; its last token is fed in one more step so the
//! prefix cache holds the whole turn (prompt + answer), then the slot is free.

mod prefill;
mod schedule;
mod speculate;
mod step;

use crate::error::ApiError;
use crate::generation::{Delta, Finish, Generation, Step};
use crate::metrics::Metrics;
use crate::params::GenParams;
use crate::prompt::PromptIndex;
use pn_engine::prefix_cache::{PrefixCache, PrefixCacheConfig};
use pn_engine::slots::slot_ladder;
use pn_engine::state::kv::{self, StateConfig};
use pn_engine::tokenizer::{DecodeOptions, Tokenizer};
use pn_engine::{Runner, SeqState, SlotHandle, Slots};
use prefill::PrefillTask;
use schedule::StepCosts;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;

/// How long an idle engine waits for the next job of a burst, and for the whole burst.
const GATHER_GAP: Duration = Duration::from_millis(2);
const GATHER_MAX: Duration = Duration::from_millis(20);

/// Prompt tokens a wave may spend before its streams start (`--wave-tokens`): 8 passes
/// of the default ubatch.
pub const DEFAULT_WAVE_TOKENS: usize = 2048;

/// A loaded model and how to serve it.
pub struct ModelSpec {
    /// The id clients name in `model`.
    pub id: String,
    /// What the ready line shows.
    pub name: String,
    pub runner: Runner,
    pub tokenizer: Tokenizer,
    pub state: StateConfig,
    /// Slots wanted (the memory ladder may give fewer).
    pub slots: usize,
    pub cache: PrefixCacheConfig,
    /// Prefill pass size (divides the cache interval).
    pub prefill_chunk: usize,
    /// Run decode steps on the slots' worker thread, overlapping the next prefill pass
    /// (off by default: on a 2-core CPU both compete for the same cores and the overlap
    /// measured slower than running them one after the other).
    pub async_steps: bool,
    /// The most a decode step with prefill work in it may cost, relative to a plain decode
    /// step, while more streams run than prompts wait (> 1; `schedule.rs`).
    pub step_budget: f64,
    /// `--draft mtp|lookup --draft-n N`: each sequence's drafts verified in the step's
    /// pass (`speculate.rs`); None: plain decoding.
    pub draft: Option<DraftSpec>,
    /// While no stream runs, the prompts prefilled meanwhile start streaming together once
    /// the last is done or this many prompt tokens were spent (0: each as soon as it is
    /// done; `step.rs`, "waves").
    pub wave_tokens: usize,
}

/// Speculative decoding in the server: what makes each sequence's drafter, the most
/// drafts per round, and which rounds draft (`adaptive`: where drafting measures faster
/// for the number of streams in the round; pn_engine spec/adapt.rs).
#[derive(Clone)]
pub struct DraftSpec {
    pub factory: pn_engine::spec::DraftFactory,
    pub n: usize,
    pub policy: pn_engine::spec::DraftPolicy,
}

/// What the HTTP side knows of the loaded model.
pub struct ModelInfo {
    pub id: String,
    pub name: String,
    pub tokenizer: Arc<Tokenizer>,
    pub n_ctx: usize,
    pub ring: bool,
    pub n_slots: usize,
    pub created: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt: usize,
    pub completion: usize,
    pub cached: usize,
    /// With a predicted output: (accepted, rejected) draft tokens.
    pub predicted: Option<(usize, usize)>,
}

pub enum Event {
    Delta(Delta),
    Done { finish: Finish, usage: Usage },
    Error(ApiError),
}

pub struct Job {
    pub id: String,
    pub tokens: Vec<u32>,
    /// The prompt's text, when it has one (remembered in the [`PromptIndex`]).
    pub text: Option<String>,
    pub params: GenParams,
    /// (the model writes `<think>` blocks, the prompt opened one)
    pub reasoning: (bool, bool),
    pub events: UnboundedSender<Event>,
    pub arrived: Instant,
    pub deadline: Option<Instant>,
    /// The tokens of the request's predicted output (`prediction`): lookup drafts match
    /// them.
    pub prediction: Option<std::sync::Arc<[u32]>>,
}

pub enum Msg {
    Job(Box<Job>),
    /// End every generation now (the shutdown grace period is over).
    CancelAll,
}

/// One slot's row in `GET /slots`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SlotView {
    pub slot: usize,
    /// idle, prefilling, generating or finishing (feeding the last token to the cache)
    pub state: &'static str,
    pub request: Option<String>,
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    /// Prompt tokens still to prefill.
    pub prefill_remaining: usize,
    pub generated: usize,
    pub max_tokens: Option<usize>,
}

/// State shared with the HTTP side.
#[derive(Default)]
pub struct Shared {
    pub metrics: Metrics,
    pub index: PromptIndex,
    pub slots: Mutex<Vec<SlotView>>,
    pub info: std::sync::OnceLock<Arc<ModelInfo>>,
}

/// A request between admission and its end.
struct Seq {
    job: Box<Job>,
    gen: Generation,
    /// Tokens in the sequence's state: the prompt, then each generated token once fed.
    fed: Vec<u32>,
    prompt_len: usize,
    cached: usize,
    last_token: Instant,
    /// `--draft`: this sequence's drafter.
    drafter: Option<pn_engine::spec::Drafter>,
    /// Draft tokens verified and accepted for this sequence.
    drafts: (usize, usize),
    /// `--draft mtp` with the prefix cache on: (row width, the hidden row of every fed
    /// token), cached with the answer's state so a later turn restores them too.
    hidden: Option<(usize, Vec<f32>)>,
}

struct Live {
    seq: Seq,
    h: SlotHandle,
    next: u32,
    /// The answer is complete (how it ended): this step feeds its last token, then the
    /// slot is freed and the client told (so its next turn finds the cached answer).
    finishing: Option<Finish>,
}

struct Engine {
    runner: Arc<Runner>,
    tok: Arc<Tokenizer>,
    slots: Slots,
    cache: PrefixCache,
    state_cfg: StateConfig,
    chunk: usize,
    async_steps: bool,
    draft: Option<DraftSpec>,
    /// `--draft-policy adaptive`: which verify rounds draft.
    adapt: Option<pn_engine::spec::Adaptive>,
    /// Measured step costs: how much prefill goes into each step.
    costs: StepCosts,
    spare: Vec<SeqState>,
    waiting: VecDeque<Box<Job>>,
    prefilling: VecDeque<(Seq, PrefillTask)>,
    /// Prompts of a wave that are done, waiting for the rest of the wave (`step.rs`).
    wave: Vec<(Seq, PrefillTask)>,
    /// Prompt tokens the current wave has spent, and the most it may.
    wave_spent: usize,
    wave_tokens: usize,
    live: Vec<Live>,
    shared: Arc<Shared>,
    closed: bool,
}

/// Build the engine for `spec` (memory ladders: KV format, then slots) and publish the
/// model's info; returns the engine and the notes the ladders printed.
fn build(spec: ModelSpec, shared: Arc<Shared>) -> anyhow::Result<(Engine, Vec<String>)> {
    let ModelSpec { id, name, runner, tokenizer, mut state, slots, cache, prefill_chunk, async_steps, step_budget, draft, wave_tokens } = spec;
    if let Some(d) = &draft {
        pn_engine::spec::Speculator::check(&runner, d.n)?;
        if state.overflow == pn_ops::Overflow::Ring {
            anyhow::bail!("--draft: a ring KV cache (--context-overflow ring) overwrites cells a rollback needs; use --draft none with it");
        }
    }
    let iv = cache.interval;
    if prefill_chunk == 0 || (iv > 0 && !iv.is_multiple_of(prefill_chunk)) {
        anyhow::bail!("--prefill-chunk: expected a divisor of the prefix-cache interval {iv}, found {prefill_chunk}");
    }
    if !(step_budget.is_finite() && step_budget > 1.0) {
        anyhow::bail!("--step-budget: expected a ratio above 1 (a step with prefill work over a plain decode step), found {step_budget}");
    }
    let mut notes = Vec::new();
    let avail = kv::mem_available();
    let (kv_ty, note) = kv::choose_kv(runner.model(), state.max_seq, state.kv, avail)?;
    state.kv = kv_ty;
    notes.extend(note);
    let arenas: u64 = runner.memory_reservation()?.iter().map(|(_, b)| *b as u64).sum();
    let (n_slots, note) = slot_ladder(runner.model(), &state, slots, arenas + cache.budget_bytes as u64, avail)?;
    notes.extend(note);
    let created = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    warm_geometries(&runner, n_slots)?;
    let tok = Arc::new(tokenizer);
    let info = ModelInfo { id, name, tokenizer: tok.clone(), n_ctx: state.max_seq, ring: state.overflow == pn_ops::Overflow::Ring, n_slots, created };
    shared.metrics.n_slots.store(n_slots as u64, Ordering::Relaxed);
    let _ = shared.info.set(Arc::new(info));
    let e = Engine {
        runner: Arc::new(runner),
        tok,
        slots: Slots::new(n_slots),
        cache: PrefixCache::new(cache),
        state_cfg: state,
        chunk: prefill_chunk,
        async_steps,
        adapt: draft.as_ref().and_then(|d| d.policy.tracker()),
        draft,
        costs: StepCosts::new(step_budget, n_slots),
        spare: Vec::new(),
        waiting: VecDeque::new(),
        prefilling: VecDeque::new(),
        wave: Vec::new(),
        wave_spent: 0,
        wave_tokens,
        live: Vec::new(),
        shared,
        closed: false,
    };
    e.publish();
    Ok((e, notes))
}

/// Build the graphs the engine runs most before serving: decode steps of 2..=`n_slots`
/// streams (`{K, K}`, or, when the runner has lanes (docs/serving.md "Lanes"), the lanes'
/// shares of them), then single-sequence passes by length up to `ubatch`, as many as the
/// runner's bounded cache of compiled geometries holds (runner/bounded.rs: the least
/// recently used make room for the mixed passes met while serving). A server that met a new
/// pass size now and then grew for minutes under load (docs/server.md, "Load and faults");
/// compiled up front, the common ones are there from the start, and the cache's bound
/// keeps the resident memory flat.
fn warm_geometries(runner: &Runner, n_slots: usize) -> anyhow::Result<()> {
    use pn_engine::Geometry;
    let decode = |k: usize| Geometry { n_tokens: k, seqs: k, all_logits: true };
    match runner.lanes() {
        1 => (2..=n_slots).try_for_each(|k| runner.plan(decode(k)).map(drop))?,
        n => (1..=n_slots.div_ceil(n)).try_for_each(|k| runner.plan_lanes(decode(k)))?,
    }
    let room = runner.geometry_cache().0.saturating_sub(runner.geometries().len());
    let one = (1..=runner.ubatch.max(1)).flat_map(|n| [Geometry::one(n, false), Geometry::one(n, true)]);
    one.take(room).try_for_each(|g| runner.plan(g).map(drop))?;
    Ok(())
}

/// Load (`load` runs on the engine thread, so `/health` answers 503 meanwhile), then run
/// the loop until every sender of `rx` is gone and the work is done. `ready` is told
/// the outcome of the load (the notes of the memory ladders, or the error).
pub fn run(load: impl FnOnce() -> anyhow::Result<ModelSpec>, rx: Receiver<Msg>, shared: Arc<Shared>, ready: impl FnOnce(anyhow::Result<Vec<String>>)) {
    let built = load().and_then(|spec| build(spec, shared));
    match built {
        Ok((mut e, notes)) => {
            ready(Ok(notes));
            e.run(rx);
        }
        Err(err) => ready(Err(err)),
    }
}

impl Engine {
    /// The live streams for a step, in slot order: the same slots give the same sequence
    /// table whichever requests they hold (a slot's row keeps its state ids), so a device
    /// replays its captured step across requests that come and go (docs/serving.md).
    fn take_live(&mut self) -> Vec<Live> {
        let mut v = std::mem::take(&mut self.live);
        v.sort_by_key(|l| l.h.slot());
        v
    }

    fn idle(&self) -> bool {
        self.waiting.is_empty() && self.prefilling.is_empty() && self.wave.is_empty() && self.live.is_empty()
    }

    fn run(&mut self, rx: Receiver<Msg>) {
        loop {
            if self.idle() {
                if self.closed {
                    return;
                }
                match rx.recv() {
                    Ok(m) => self.take(m),
                    Err(_) => return,
                }
                self.gather(&rx);
            }
            loop {
                match rx.try_recv() {
                    Ok(m) => self.take(m),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        self.closed = true;
                        break;
                    }
                }
            }
            self.drop_cancelled();
            self.admit();
            self.iterate();
            self.publish();
        }
    }

    /// A job woke the idle engine: the requests sent with it (a burst of clients) are
    /// usually a few ms behind. Take them while they keep coming (each within
    /// `GATHER_GAP`, for `GATHER_MAX` at most), so the first pass prefills them together
    /// instead of starting one stream that every later prompt then stalls.
    fn gather(&mut self, rx: &Receiver<Msg>) {
        let t0 = Instant::now();
        while t0.elapsed() < GATHER_MAX {
            match rx.recv_timeout(GATHER_GAP) {
                Ok(m) => self.take(m),
                Err(RecvTimeoutError::Timeout) => return,
                Err(RecvTimeoutError::Disconnected) => {
                    self.closed = true;
                    return;
                }
            }
        }
    }

    fn take(&mut self, m: Msg) {
        match m {
            Msg::Job(j) => self.waiting.push_back(j),
            Msg::CancelAll => {
                let err = || Event::Error(ApiError::unavailable("the server is shutting down: the generation was ended"));
                for j in self.waiting.drain(..) {
                    let _ = j.events.send(err());
                    self.shared.metrics.queue_depth.fetch_sub(1, Ordering::Relaxed);
                }
                let prefills = std::mem::take(&mut self.prefilling).into_iter().chain(std::mem::take(&mut self.wave));
                for (s, t) in prefills {
                    let _ = s.job.events.send(err());
                    self.spare.push(t.st);
                }
                for l in std::mem::take(&mut self.live) {
                    match l.finishing {
                        Some(f) => self.finish(l, f),
                        None => {
                            let _ = l.seq.job.events.send(err());
                            self.release(l.h);
                        }
                    }
                }
            }
        }
    }

    /// Whether a job is over before its end: its client went away or its deadline passed
    /// (then it is told, with what the generation held back).
    fn expired(job: &Job, gen: Option<&mut Generation>, usage: Usage) -> bool {
        if job.events.is_closed() {
            return true;
        }
        if job.deadline.is_some_and(|d| Instant::now() >= d) {
            if let Some(g) = gen {
                let d = g.end_text();
                if !d.is_empty() {
                    let _ = job.events.send(Event::Delta(d));
                }
            }
            let _ = job.events.send(Event::Done { finish: Finish::Timeout, usage });
            return true;
        }
        false
    }

    fn drop_cancelled(&mut self) {
        let shared = self.shared.clone();
        let m = &shared.metrics;
        let before = self.waiting.len();
        self.waiting.retain(|j| !Engine::expired(j, None, Usage { prompt: j.tokens.len(), ..Usage::default() }));
        let gone = (before - self.waiting.len()) as u64;
        m.queue_depth.fetch_sub(gone, Ordering::Relaxed);
        m.cancelled.fetch_add(gone, Ordering::Relaxed);
        let keep = |all: &mut dyn Iterator<Item = (Seq, PrefillTask)>, spare: &mut Vec<SeqState>| {
            let mut kept = Vec::new();
            for (mut s, t) in all {
                let u = s.usage();
                if Engine::expired(&s.job, Some(&mut s.gen), u) {
                    m.cancelled.fetch_add(1, Ordering::Relaxed);
                    spare.push(t.st);
                } else {
                    kept.push((s, t));
                }
            }
            kept
        };
        self.prefilling = keep(&mut std::mem::take(&mut self.prefilling).into_iter(), &mut self.spare).into();
        self.wave = keep(&mut std::mem::take(&mut self.wave).into_iter(), &mut self.spare);
        for mut l in std::mem::take(&mut self.live) {
            let u = l.seq.usage();
            if l.finishing.is_none() && Engine::expired(&l.seq.job, Some(&mut l.seq.gen), u) {
                m.cancelled.fetch_add(1, Ordering::Relaxed);
                self.release(l.h);
            } else {
                self.live.push(l);
            }
        }
    }

    /// Unbind a slot and keep its state for the next sequence.
    fn release(&mut self, h: SlotHandle) {
        if let Ok(st) = self.slots.unbind(h) {
            self.spare.push(st);
        }
    }

    /// Start prefills while slots are free.
    fn admit(&mut self) {
        while self.live.len() + self.prefilling.len() + self.wave.len() < self.slots.n_slots() {
            let Some(job) = self.waiting.pop_front() else { break };
            self.shared.metrics.queue_depth.fetch_sub(1, Ordering::Relaxed);
            let st = match self.spare.pop() {
                Some(s) => s,
                None => match self.runner.alloc_state_within(&self.state_cfg, None) {
                    Ok((s, _)) => s,
                    Err(e) => {
                        let _ = job.events.send(Event::Error(ApiError::internal(format!("cannot allocate a sequence state: {e}"))));
                        continue;
                    }
                },
            };
            let ring = self.state_cfg.overflow == pn_ops::Overflow::Ring;
            let room = if ring { usize::MAX } else { self.state_cfg.max_seq.saturating_sub(job.tokens.len()) };
            let gen = match Generation::new(job.params.clone(), &job.tokens, room, job.reasoning.0, job.reasoning.1) {
                Ok(g) => g,
                Err(e) => {
                    let _ = job.events.send(Event::Error(ApiError::invalid("stop", e)));
                    self.spare.push(st);
                    continue;
                }
            };
            let hidden = self.draft.as_ref().is_some_and(|d| d.factory.needs_hidden());
            let task = PrefillTask::start(&mut self.cache, &self.runner, st, job.tokens.clone(), self.chunk, hidden);
            let drafter = self.draft.as_ref().map(|d| d.factory.drafter_with(self.state_cfg.max_seq, job.prediction.as_ref()));
            let m = &self.shared.metrics;
            m.prompt_tokens.fetch_add(job.tokens.len() as u64, Ordering::Relaxed);
            m.cached_tokens.fetch_add(task.reused as u64, Ordering::Relaxed);
            let seq = Seq { fed: job.tokens.clone(), prompt_len: job.tokens.len(), cached: task.reused, gen, job, last_token: Instant::now(), drafter, drafts: (0, 0), hidden: None };
            self.prefilling.push_back((seq, task));
        }
    }

    /// A step failed: its sequences end with the error (their slots freed).
    fn fail(&mut self, stepping: Vec<Live>, msg: &str) {
        for l in stepping {
            match l.finishing {
                // the answer is complete: only its caching failed
                Some(f) => self.finish(l, f),
                None => {
                    let _ = l.seq.job.events.send(Event::Error(ApiError::internal(msg.to_string())));
                    self.release(l.h);
                }
            }
        }
    }

    /// A bound sequence's row after a step.
    fn after_step(&mut self, mut l: Live, row: &[f32]) -> Option<Live> {
        l.seq.fed.push(l.next);
        if let Some(f) = l.finishing {
            self.finish(l, f);
            return None;
        }
        // a client gone during the step: cancelled within one step
        if l.seq.job.events.is_closed() {
            self.shared.metrics.cancelled.fetch_add(1, Ordering::Relaxed);
            self.release(l.h);
            return None;
        }
        self.shared.metrics.observe_inter_token(l.seq.last_token.elapsed());
        match l.seq.token(&self.tok, row, &self.shared.metrics) {
            Some(step) => self.settle(l, step),
            None => {
                self.release(l.h);
                None
            }
        }
    }

    /// After a sampled token: keep generating, or finish (feeding the last token first
    /// when it belongs in the cached turn and fits).
    fn settle(&mut self, mut l: Live, step: Step) -> Option<Live> {
        l.next = step.token;
        let Some(finish) = step.finish else { return Some(l) };
        let fits = self.slots.state(l.h).is_ok_and(|st| st.fits(1));
        if step.feed && fits {
            l.finishing = Some(finish);
            return Some(l);
        }
        self.finish(l, finish);
        None
    }

    /// The turn is over: snapshot prompt + answer into the prefix cache (and remember its
    /// text), free the slot, tell the client.
    fn finish(&mut self, l: Live, finish: Finish) {
        if let Ok(st) = self.slots.unbind(l.h) {
            if st.pos == l.seq.fed.len() {
                let rows = l.seq.hidden.as_ref().filter(|(e, h)| h.len() == e * l.seq.fed.len()).map(|(_, h)| &h[..]);
                self.cache.insert_state_with(&l.seq.fed, &st, rows);
                if let Some(text) = &l.seq.job.text {
                    let answer = self.tok.decode_with(&l.seq.fed[l.seq.prompt_len..], DecodeOptions { special: true });
                    self.shared.index.insert(format!("{text}{answer}"), l.seq.fed.clone());
                }
            }
            self.spare.push(st);
        }
        let _ = l.seq.job.events.send(Event::Done { finish, usage: l.seq.usage() });
    }

    /// Publish what each slot does (GET /slots) and the busy-slot gauge.
    fn publish(&self) {
        let n = self.slots.n_slots();
        let mut v: Vec<SlotView> = (0..n)
            .map(|slot| SlotView { slot, state: "idle", request: None, prompt_tokens: 0, cached_tokens: 0, prefill_remaining: 0, generated: 0, max_tokens: None })
            .collect();
        let fill = |v: &mut SlotView, s: &Seq, state: &'static str, remaining: usize| {
            *v = SlotView {
                slot: v.slot,
                state,
                request: Some(s.job.id.clone()),
                prompt_tokens: s.prompt_len,
                cached_tokens: s.cached,
                prefill_remaining: remaining,
                generated: s.gen.generated.len(),
                max_tokens: s.job.params.max_tokens,
            };
        };
        for l in &self.live {
            if let Some(v) = v.get_mut(l.h.slot()) {
                fill(v, &l.seq, if l.finishing.is_some() { "finishing" } else { "generating" }, 0);
            }
        }
        // prefills hold the free slots they will take
        let mut free = (0..n).filter(|&i| !self.live.iter().any(|l| l.h.slot() == i));
        for (s, t) in self.wave.iter().chain(&self.prefilling) {
            if let Some(i) = free.next() {
                fill(&mut v[i], s, "prefilling", t.remaining());
            }
        }
        let busy = self.live.len() + self.prefilling.len() + self.wave.len();
        self.shared.metrics.busy_slots.store(busy as u64, Ordering::Relaxed);
        *self.shared.slots.lock().unwrap_or_else(|e| e.into_inner()) = v;
    }
}

impl Seq {
    fn usage(&self) -> Usage {
        // a lookup drafter drafts from the prediction; another drafter does not read it
        let (drafted, accepted) = if matches!(self.drafter, Some(pn_engine::spec::Drafter::Lookup(_))) { self.drafts } else { (0, 0) };
        let predicted = self.job.prediction.as_ref().map(|_| (accepted, drafted - accepted));
        Usage { prompt: self.prompt_len, completion: self.gen.generated.len(), cached: self.cached, predicted }
    }

    /// Sample from `row` and send what it adds; None when the sequence ended with an error.
    fn token(&mut self, tok: &Tokenizer, row: &[f32], m: &Metrics) -> Option<Step> {
        if let Some(bad) = row.iter().position(|x| !x.is_finite()) {
            let msg = format!("the model produced a non-finite logit (token {bad}: {}); the weights may contain NaN/Inf", row[bad]);
            let _ = self.job.events.send(Event::Error(ApiError::internal(msg)));
            return None;
        }
        let before = self.gen.generated.len();
        let mut step = self.gen.next(tok, row);
        self.last_token = Instant::now();
        m.record_generated((self.gen.generated.len() - before) as u64);
        if !step.delta.is_empty() {
            let _ = self.job.events.send(Event::Delta(std::mem::take(&mut step.delta)));
        }
        Some(step)
    }
}

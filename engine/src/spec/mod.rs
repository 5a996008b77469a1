//! Speculative decoding (docs/speculative.md): a drafter proposes K tokens, the main model
//! checks them in ONE verify pass of K + 1 tokens (the last accepted token and the
//! drafts, every row's logits), the longest acceptable prefix is kept plus one token of
//! the model's own, and the sequence state rolls back to it without re-running
//! (verify.rs). Greedy output is token for token what plain decoding gives; with
//! sampling, rejection sampling keeps the model's distribution exactly (accept.rs).
//!
//! Drafters: prompt lookup (lookup.rs, no weights) and the model's MTP block (mtp.rs).

pub mod accept;
pub mod adapt;
pub mod exec;
pub mod lookup;
pub mod mtp;
pub mod slots;
pub mod stats;
pub mod verify;

pub use adapt::{Adaptive, DraftPolicy};
pub use lookup::Lookup;
pub use mtp::{MtpBlock, MtpDrafter, MtpModel};
pub use stats::SpecStats;
pub use verify::Pass;

use crate::runner::{Logits, RunError, Runner};
use crate::sampler::Sampler;
use crate::state::{MoveError, SeqState};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum SpecError {
    #[error("speculative decoding: {0}")]
    Unsupported(String),
    #[error("speculative decoding rollback: {0}")]
    Rollback(String),
    #[error(transparent)]
    Run(#[from] RunError),
    #[error(transparent)]
    Move(#[from] MoveError),
}

/// `--draft`: which drafter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DraftKind {
    None,
    Lookup,
    Mtp,
}

impl std::str::FromStr for DraftKind {
    type Err = String;
    fn from_str(s: &str) -> Result<DraftKind, String> {
        match s {
            "none" => Ok(DraftKind::None),
            "lookup" => Ok(DraftKind::Lookup),
            "mtp" => Ok(DraftKind::Mtp),
            _ => Err(format!("--draft: expected mtp, lookup or none, found {s:?}")),
        }
    }
}

impl std::fmt::Display for DraftKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DraftKind::None => "none",
            DraftKind::Lookup => "lookup",
            DraftKind::Mtp => "mtp",
        })
    }
}

/// Largest `--draft-n`.
pub const MAX_DRAFT: usize = 16;

/// A drafter.
pub enum Drafter {
    Lookup(Lookup),
    Mtp(Box<MtpDrafter>),
}

impl Drafter {
    fn wants_hidden(&self) -> bool {
        matches!(self, Drafter::Mtp(_))
    }

    /// Seconds and positions of catch-up so far (an MTP drafter pairs the hidden rows of
    /// rounds without drafts at its next draft; prompt lookup has none).
    pub fn caught_up(&self) -> (f64, u64) {
        match self {
            Drafter::Mtp(m) => m.caught_up,
            Drafter::Lookup(_) => (0.0, 0),
        }
    }

    /// Gives a prompt-lookup drafter a predicted output to draft from (lookup.rs); false
    /// for a drafter that cannot use one (MTP).
    pub fn set_reference(&mut self, reference: std::sync::Arc<[u32]>) -> bool {
        match self {
            Drafter::Lookup(l) => {
                l.set_reference(reference);
                true
            }
            Drafter::Mtp(_) => false,
        }
    }

    /// Up to `n` drafts after `ctx` (every fed token, then the pending one).
    pub fn draft(&mut self, ctx: &[u32], n: usize) -> Result<Vec<u32>, SpecError> {
        match self {
            Drafter::Lookup(l) => Ok(l.draft(ctx, n)),
            Drafter::Mtp(m) => m.draft(ctx, n),
        }
    }

    /// Feeds a prompt to `st` (last-token logits), keeping what the drafter needs of it:
    /// an MTP drafter the hidden rows of every token.
    pub fn prefill(&mut self, r: &Runner, st: &mut SeqState, ids: &[u32]) -> Result<Logits, SpecError> {
        Ok(match self {
            Drafter::Mtp(m) => {
                let mut hidden = Vec::new();
                let l = verify::forward_hidden(r, st, ids, false, &mut hidden)?;
                m.observe_hidden(&hidden);
                l
            }
            Drafter::Lookup(_) => r.forward(st, ids, false)?,
        })
    }
}

/// Where a speculator's rounds spend their time (seconds).
#[derive(Clone, Copy, Debug, Default)]
pub struct RoundTimes {
    pub draft: f64,
    pub verify: f64,
    pub accept: f64,
}

impl RoundTimes {
    fn add(&mut self, d: std::time::Duration, v: std::time::Duration, a: std::time::Duration) {
        self.draft += d.as_secs_f64();
        self.verify += v.as_secs_f64();
        self.accept += a.as_secs_f64();
    }
}

/// Makes the drafter of each sequence (the MTP block's compiled graphs shared).
#[derive(Clone)]
pub enum DraftFactory {
    Lookup,
    Mtp(std::sync::Arc<MtpModel>),
}

impl DraftFactory {
    /// A fresh drafter for a sequence of up to `max_seq` positions, with a predicted
    /// output (`reference`) when it has one and the drafter reads it (lookup).
    pub fn drafter_with(&self, max_seq: usize, reference: Option<&std::sync::Arc<[u32]>>) -> Drafter {
        let mut d = self.drafter(max_seq);
        if let Some(r) = reference {
            d.set_reference(r.clone());
        }
        d
    }

    /// A fresh drafter for a sequence of up to `max_seq` positions.
    pub fn drafter(&self, max_seq: usize) -> Drafter {
        match self {
            DraftFactory::Lookup => Drafter::Lookup(Lookup::default()),
            // the block's own cache in f32 whatever --kv-type: one layer (small), and its
            // drafts are accepted more often than with a quantized cache
            DraftFactory::Mtp(m) => Drafter::Mtp(Box::new(MtpDrafter::with_model(m.clone(), max_seq, pn_ops::KvType::F32))),
        }
    }
    pub fn kind(&self) -> DraftKind {
        match self {
            DraftFactory::Lookup => DraftKind::Lookup,
            DraftFactory::Mtp(_) => DraftKind::Mtp,
        }
    }
    /// Whether a drafter needs the hidden row of every prompt token (no cached prefix).
    pub fn needs_hidden(&self) -> bool {
        matches!(self, DraftFactory::Mtp(_))
    }
}

/// Speculative decoding of one sequence: its drafter, the draft length and counters.
pub struct Speculator {
    pub drafter: Drafter,
    pub n_draft: usize,
    pub stats: SpecStats,
    /// Seconds spent drafting, in verify passes, and accepting + rolling back.
    pub times: RoundTimes,
    /// The drafts of the last round.
    pub last_drafts: Vec<u32>,
    /// Every token fed to the sequence so far.
    tokens: Vec<u32>,
    hidden: Vec<f32>,
    last: Option<(Pass, usize)>,
    debug: bool,
    /// `--draft-policy adaptive`: which rounds draft (adapt.rs); None: every round.
    pub adapt: Option<Adaptive>,
}

impl Speculator {
    pub fn new(r: &Runner, drafter: Drafter, n_draft: usize) -> Result<Speculator, SpecError> {
        Speculator::check(r, n_draft)?;
        let debug = std::env::var("PN_DEBUG").is_ok_and(|v| !v.is_empty() && v != "0");
        Ok(Speculator { drafter, n_draft, stats: SpecStats::default(), times: RoundTimes::default(), last_drafts: Vec::new(), tokens: Vec::new(), hidden: Vec::new(), last: None, debug, adapt: None })
    }

    /// Draft in every round, or in those where drafting measures faster (adapt.rs).
    pub fn with_policy(mut self, p: DraftPolicy) -> Speculator {
        self.adapt = p.tracker();
        self
    }

    /// Whether `r` can run speculative decoding with `n_draft` drafts per round.
    pub fn check(r: &Runner, n_draft: usize) -> Result<(), SpecError> {
        verify::check_runner(r)?;
        if n_draft == 0 || n_draft > MAX_DRAFT {
            return Err(SpecError::Unsupported(format!("--draft-n: expected 1..={MAX_DRAFT} draft tokens, found {n_draft}")));
        }
        Ok(())
    }

    /// Feeds the prompt (last-token logits), keeping what the drafter needs of it.
    pub fn prefill(&mut self, r: &Runner, st: &mut SeqState, ids: &[u32]) -> Result<Logits, SpecError> {
        // the last round can no longer be undone (and its recording stops)
        self.last = None;
        let logits = self.drafter.prefill(r, st, ids)?;
        self.tokens.extend_from_slice(ids);
        Ok(logits)
    }

    /// One round. `pending`: the token chosen after the fed ones (not fed yet). Feeds it
    /// and up to `n_draft` drafts in one pass, keeps the accepted drafts and returns them
    /// (they are fed) and the next pending token, chosen by `sampler` (greedy or
    /// rejection sampling, accept.rs).
    ///
    /// The round runs inside one [`crate::backend::Backend::enter`] of die A's backend:
    /// its draft and verify passes start on the backend's threads without a hand-over
    /// each (on the CPU: one hand-over per round instead of one per pass).
    pub fn round(&mut self, r: &Runner, st: &mut SeqState, pending: u32, sampler: &mut Sampler) -> Result<(Vec<u32>, u32), SpecError> {
        entered(r, || self.round_here(r, st, pending, sampler))
    }

    fn round_here(&mut self, r: &Runner, st: &mut SeqState, pending: u32, sampler: &mut Sampler) -> Result<(Vec<u32>, u32), SpecError> {
        self.tokens.push(pending);
        // room for the pass: the pending token and the drafts
        let room = st.max_seq.saturating_sub(st.pos + 1);
        let drafting = self.adapt.as_mut().is_none_or(|a| a.draft(1));
        let caught = self.drafter.caught_up();
        let n = if drafting { self.n_draft.min(room) } else { 0 };
        let t0 = std::time::Instant::now();
        let drafts = self.drafter.draft(&self.tokens, n)?;
        let t1 = std::time::Instant::now();
        let mut pass_toks = Vec::with_capacity(drafts.len() + 1);
        pass_toks.push(pending);
        pass_toks.extend_from_slice(&drafts);
        let want_h = self.drafter.wants_hidden();
        let (logits, pass) = verify::verify(r, st, &pass_toks, want_h.then_some(&mut self.hidden))?;
        let t2 = std::time::Instant::now();
        let (n_acc, next) = accept::accept(sampler, &logits, &drafts);
        pass.rollback(st, n_acc + 1)?;
        if !drafts.is_empty() {
            self.stats.record(drafts.len(), n_acc);
        }
        if let Drafter::Mtp(m) = &mut self.drafter {
            let e = self.hidden.len() / pass_toks.len();
            m.observe_hidden(&self.hidden[..(n_acc + 1) * e]);
        }
        if self.debug {
            eprintln!("[pn] spec round: drafted {:?}, accepted {n_acc}, next {next}", drafts);
        }
        self.tokens.extend_from_slice(&drafts[..n_acc]);
        self.last = Some((pass, n_acc + 1));
        self.times.add(t1 - t0, t2 - t1, t2.elapsed());
        if let Some(a) = &mut self.adapt {
            let now = self.drafter.caught_up();
            a.record(1, drafting, n_acc + 1, t0.elapsed().as_secs_f64(), adapt::since(caught, now));
        }
        self.last_drafts.clone_from(&drafts);
        Ok((drafts[..n_acc].to_vec(), next))
    }

    /// Un-feed the last `n` accepted drafts of the last round (generation stopped inside
    /// it; the pending token stays unfed): the state then holds exactly the shown text.
    pub fn unfeed(&mut self, st: &mut SeqState, n: usize) -> Result<(), SpecError> {
        if n == 0 {
            return Ok(());
        }
        let (pass, kept) = self.last.as_mut().ok_or_else(|| SpecError::Rollback("no round to undo".into()))?;
        if n >= *kept {
            return Err(SpecError::Rollback(format!("the last round fed {} drafts, cannot un-feed {n}", *kept - 1)));
        }
        pass.rollback(st, *kept - n)?;
        *kept -= n;
        self.tokens.truncate(self.tokens.len() - n);
        if let Drafter::Mtp(m) = &mut self.drafter {
            m.unobserve(n);
        }
        Ok(())
    }
}

/// `f` run inside one [`crate::backend::Backend::enter`] of `r`'s backend (a speculative
/// round: its passes start on the backend's threads without a hand-over each).
pub(crate) fn entered<T: Send>(r: &Runner, mut f: impl FnMut() -> Result<T, SpecError> + Send) -> Result<T, SpecError> {
    let mut res = None;
    r.backend().enter(&mut || res = Some(f()));
    res.unwrap_or_else(|| Err(SpecError::Unsupported(format!("backend {} did not run the round", r.backend().name()))))
}

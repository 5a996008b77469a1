//! One sequence's generation, token by token, given its logits rows: penalties and bias,
//! sampling, logprobs, UTF-8-safe detokenization, stop strings (held back, never
//! emitted), the reasoning split, and when to finish. No engine calls: the engine loop
//! feeds it rows and feeds back the tokens it returns.

use crate::params::GenParams;
use crate::think::ThinkSplit;
use pn_engine::runner::Logits;
use pn_engine::sampler::Sampler;
use pn_engine::spec::accept;
use pn_engine::stop::StopMatcher;
use pn_engine::tokenizer::{StreamDecoder, Tokenizer};
use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// End-of-generation token or a stop string.
    Stop,
    /// max_tokens or the context.
    Length,
    /// The caller's deadline.
    Timeout,
}

impl Finish {
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
            Finish::Timeout => "timeout",
        }
    }
}

/// One alternative of a token's logprobs.
#[derive(Clone, Debug, PartialEq)]
pub struct Alt {
    pub id: u32,
    pub text: String,
    pub bytes: Vec<u8>,
    pub logprob: f32,
}

/// A generated token's logprob and the most likely alternatives.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub token: Alt,
    pub top: Vec<Alt>,
    /// Byte offset of the token's text in the completion.
    pub offset: usize,
}

/// What one token adds to the answer.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Delta {
    pub content: String,
    pub reasoning: String,
    pub logprobs: Vec<TokenLogprob>,
}

impl Delta {
    pub fn is_empty(&self) -> bool {
        self.content.is_empty() && self.reasoning.is_empty() && self.logprobs.is_empty()
    }
}

/// What [`Generation::accept`] decided for a sampled token.
pub struct Step {
    pub token: u32,
    pub delta: Delta,
    pub finish: Option<Finish>,
    /// Whether `token` belongs in the sequence's state (its text was produced): feed it
    /// next (or, when finished, to cache the whole answer).
    pub feed: bool,
}

pub struct Generation {
    sampler: Sampler,
    p: GenParams,
    /// Occurrences of each generated token (presence / frequency penalties).
    counts: HashMap<u32, u32>,
    dec: StreamDecoder,
    stop: StopMatcher,
    think: Option<ThinkSplit>,
    /// Logprobs waiting for their token's text to leave the stop matcher: (end byte of
    /// the token's text in the pushed text, entry).
    held_lp: VecDeque<(usize, TokenLogprob)>,
    pushed: usize,
    emitted: usize,
    /// Tokens generated (end-of-generation excluded).
    pub generated: Vec<u32>,
    limit: usize,
}

/// log-softmax of one row at `id`, and the `k` most likely tokens.
fn logprobs(row: &[f32], id: u32, k: usize) -> (f32, Vec<(u32, f32)>) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = max as f64 + row.iter().map(|&x| ((x - max) as f64).exp()).sum::<f64>().ln();
    let lp = |i: u32| (row[i as usize] as f64 - lse) as f32;
    let mut top: Vec<u32> = Vec::with_capacity(k + 1);
    if k > 0 {
        let mut idx: Vec<u32> = (0..row.len() as u32).collect();
        let k = k.min(idx.len());
        idx.select_nth_unstable_by(k - 1, |&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
        idx.truncate(k);
        idx.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
        top = idx;
    }
    (lp(id), top.into_iter().map(|i| (i, lp(i))).collect())
}

fn alt(tok: &Tokenizer, id: u32, logprob: f32) -> Alt {
    let bytes = tok.token_piece(id, false).to_vec();
    Alt { id, text: String::from_utf8_lossy(&bytes).into_owned(), bytes, logprob }
}

impl Generation {
    /// `prompt`: the tokens before the answer (they count for the repetition penalty);
    /// `room`: tokens the context has left; `in_think`: the prompt opened a reasoning
    /// block; `reasoning`: the model may write one.
    pub fn new(p: GenParams, prompt: &[u32], room: usize, reasoning: bool, in_think: bool) -> Result<Generation, String> {
        let mut sampler = Sampler::new(p.sampler.clone());
        sampler.observe(prompt);
        let stop = StopMatcher::new(&p.stop)?;
        let limit = p.max_tokens.unwrap_or(usize::MAX).min(room);
        Ok(Generation {
            sampler,
            counts: HashMap::new(),
            dec: StreamDecoder::new(),
            stop,
            think: reasoning.then(|| ThinkSplit::new(in_think)),
            held_lp: VecDeque::new(),
            pushed: 0,
            emitted: 0,
            generated: Vec::new(),
            limit,
            p,
        })
    }

    /// Most tokens this generation may produce.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Sample the next token from `row` (the model's logits) and take it.
    pub fn next(&mut self, tok: &Tokenizer, row: &[f32]) -> Step {
        let id = self.sample(row);
        self.take(tok, row, id)
    }

    fn sample(&mut self, row: &[f32]) -> u32 {
        let l = self.adjusted(row);
        self.sampler.sample(&l)
    }

    /// `row` with the logit bias and the presence / frequency penalties of the tokens
    /// generated so far.
    fn adjusted<'r>(&self, row: &'r [f32]) -> Cow<'r, [f32]> {
        let (pp, fp) = (self.p.presence_penalty, self.p.frequency_penalty);
        if self.p.logit_bias.is_empty() && ((pp == 0.0 && fp == 0.0) || self.counts.is_empty()) {
            return Cow::Borrowed(row);
        }
        let mut l = row.to_vec();
        for &(t, b) in &self.p.logit_bias {
            l[t as usize] += b;
        }
        for (&t, &c) in &self.counts {
            l[t as usize] -= pp + fp * c as f32;
        }
        Cow::Owned(l)
    }

    /// Take `id` chosen from `row` (its logprobs from the model's row).
    fn take(&mut self, tok: &Tokenizer, row: &[f32], id: u32) -> Step {
        let lp = self.p.logprobs.map(|k| {
            let (l, top) = logprobs(row, id, k);
            TokenLogprob { token: alt(tok, id, l), top: top.into_iter().map(|(i, l)| alt(tok, i, l)).collect(), offset: 0 }
        });
        self.accept(tok, id, lp)
    }

    /// A verify pass's rows for `drafts` (`rows.rows()` = drafts + 1; row i: the
    /// distribution after draft i − 1): each draft kept or replaced by the sampler's
    /// rejection rule (pn_engine::spec::accept) on the row as [`Generation::next`] adjusts
    /// it, each kept token taken in order. Returns the steps (the accepted drafts, then
    /// the token after them; fewer when one finishes the generation) and how many of
    /// them are accepted drafts. Greedy: the steps plain decoding takes, token for token.
    pub fn speculate(&mut self, tok: &Tokenizer, rows: &Logits, drafts: &[u32]) -> (Vec<Step>, usize) {
        let mut steps = Vec::with_capacity(drafts.len() + 1);
        for (i, &d) in drafts.iter().enumerate() {
            let row = rows.row(i);
            let adj = self.adjusted(row).into_owned();
            let (id, ok) = match accept::check(&mut self.sampler, &adj, d) {
                Ok(()) => (d, true),
                Err(t) => (t, false),
            };
            let step = self.take(tok, row, id);
            let done = step.finish.is_some();
            steps.push(step);
            if !ok {
                return (steps, i);
            }
            if done {
                return (steps, i + 1);
            }
        }
        steps.push(self.next(tok, rows.row(drafts.len())));
        (steps, drafts.len())
    }

    /// Take token `id` (sampled with logprob entry `lp`).
    pub fn accept(&mut self, tok: &Tokenizer, id: u32, lp: Option<TokenLogprob>) -> Step {
        if !self.p.ignore_eos && tok.is_eog(id) {
            let mut delta = self.end_text();
            delta.logprobs.extend(self.held_lp.drain(..).map(|(_, l)| l));
            return Step { token: id, delta, finish: Some(Finish::Stop), feed: true };
        }
        self.generated.push(id);
        *self.counts.entry(id).or_insert(0) += 1;
        let piece = self.dec.push(tok, id);
        self.pushed += piece.len();
        if let Some(mut l) = lp {
            l.offset = self.pushed - piece.len();
            self.held_lp.push_back((self.pushed, l));
        }
        let out = self.stop.push(&piece);
        let mut delta = self.route(&out.emit);
        if out.stopped.is_some() {
            // tokens whose text started before the stop string still count
            let cut = self.emitted;
            delta.logprobs.extend(self.held_lp.drain(..).filter(|(_, l)| l.offset < cut).map(|(_, l)| l));
            self.dec = StreamDecoder::new();
            let rest = self.think.as_mut().map(ThinkSplit::finish).unwrap_or_default();
            delta.reasoning.push_str(&rest.reasoning);
            delta.content.push_str(&rest.content);
            return Step { token: id, delta, finish: Some(Finish::Stop), feed: false };
        }
        while self.held_lp.front().is_some_and(|(end, _)| *end <= self.emitted) {
            delta.logprobs.push(self.held_lp.pop_front().expect("checked").1);
        }
        if self.generated.len() >= self.limit {
            let mut end = self.end_text();
            end.logprobs.extend(self.held_lp.drain(..).map(|(_, l)| l));
            delta.content.push_str(&end.content);
            delta.reasoning.push_str(&end.reasoning);
            delta.logprobs.extend(end.logprobs);
            return Step { token: id, delta, finish: Some(Finish::Length), feed: true };
        }
        Step { token: id, delta, finish: None, feed: true }
    }

    /// The text still held (decoder, stop matcher, think split) at the end.
    pub fn end_text(&mut self) -> Delta {
        let tail = self.dec.flush();
        let mut text = self.stop.push(&tail).emit;
        text.push_str(&self.stop.finish());
        let mut d = self.route(&text);
        if let Some(t) = self.think.as_mut() {
            let s = t.finish();
            d.reasoning.push_str(&s.reasoning);
            d.content.push_str(&s.content);
        }
        d
    }

    /// Released text through the reasoning split.
    fn route(&mut self, text: &str) -> Delta {
        self.emitted += text.len();
        match self.think.as_mut() {
            None => Delta { content: text.to_string(), ..Delta::default() },
            Some(t) => {
                let s = t.push(text);
                Delta { content: s.content, reasoning: s.reasoning, logprobs: vec![] }
            }
        }
    }
}

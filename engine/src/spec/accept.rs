//! Which drafts a verify pass accepts, and the token that follows them.
//!
//! Drafts are point masses (the drafters propose one token, deterministically), so the
//! rejection sampling of Leviathan et al. 2023 accepts draft `d` at a position whose
//! target distribution is `p` with probability min(1, p(d) / 1) = `p(d)`, and on
//! rejection draws from the residual `max(p − δ_d, 0)` (`p` without `d`, renormalized).
//! Here that rule runs in its coupled form: the sampler draws the position's token from
//! `p` exactly as plain decoding would (one uniform number), and the draft is accepted
//! when the draw equals it. The draft is then kept with probability p(d), and a rejected
//! position's token is a draw from `p` conditioned on not being `d`, i.e. the residual:
//! the same acceptance rate and output distribution as the two-draw form, and the same
//! random numbers as decoding without drafts, so a seed gives the same text with drafts
//! or without (greedy is the special case: accept while the draft is the argmax). After K
//! accepted drafts the bonus token is drawn from the last row. `p` is the sampler's own
//! distribution (repetition penalty over the recent tokens, temperature, top-k/p, min-p),
//! with each accepted token observed before the next position.

use crate::runner::Logits;
use crate::sampler::Sampler;

/// How many of `drafts` row `i` of `rows` accepts, and the token after them. `rows` has
/// `drafts.len() + 1` rows: row `i` is the distribution after draft `i − 1` (row 0:
/// after the last accepted token). Every returned token is observed by the sampler.
pub fn accept(s: &mut Sampler, rows: &Logits, drafts: &[u32]) -> (usize, u32) {
    accept_with(s, rows, drafts, Rule::Exact)
}

/// The acceptance rule ([`Rule::ResampleFromTarget`] is a known-wrong rule, kept so the
/// statistical test can show it fails: it accepts with probability p(d), but on rejection
/// draws from `p` itself, which over-weights the draft).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    Exact,
    ResampleFromTarget,
}

pub fn accept_with(s: &mut Sampler, rows: &Logits, drafts: &[u32], rule: Rule) -> (usize, u32) {
    for (i, &d) in drafts.iter().enumerate() {
        if let Err(tok) = check_with(s, rows.row(i), d, rule) {
            return (i, tok);
        }
    }
    (drafts.len(), s.sample(rows.row(drafts.len())))
}

/// One draft position: `row` the (adjusted) logits there. Ok: draft `d` is accepted;
/// Err(t): rejected, `t` drawn in its place. Either way the kept token is observed by
/// the sampler. (For callers that adjust each row by what was accepted before it: the
/// server's presence / frequency penalties.)
pub fn check(s: &mut Sampler, row: &[f32], d: u32) -> Result<(), u32> {
    check_with(s, row, d, Rule::Exact)
}

fn check_with(s: &mut Sampler, row: &[f32], d: u32, rule: Rule) -> Result<(), u32> {
    match rule {
        Rule::Exact => match s.sample(row) {
            t if t == d => Ok(()),
            t => Err(t),
        },
        Rule::ResampleFromTarget => {
            let p = s.distribution(row);
            let ok = if p.point { p.ids[0] == d } else { s.uniform() < p.prob(d) };
            let t = if ok { d } else { s.draw(&p) };
            s.observe(&[t]);
            if ok {
                Ok(())
            } else {
                Err(t)
            }
        }
    }
}

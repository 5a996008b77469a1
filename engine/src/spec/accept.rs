//! Which drafts a verify pass accepts, and the token that follows them.
//!
//! Drafts are point masses (the drafters propose one token, deterministically), so the
//! rejection sampling of Leviathan et al. 2023 takes a simple exact form: draft `d` at
//! a position whose target distribution is `p` is accepted with probability `p(d)`;
//! on rejection the token is drawn from the residual `max(p − δ_d, 0)`, i.e. `p` without
//! `d`, renormalized. Then P(out = d) = p(d) and P(out = x ≠ d) = (1 − p(d))·p(x)/(1 −
//! p(d)) = p(x): the output distribution is exactly the model's. After K accepted
//! drafts the bonus token is drawn from the last row. Greedy (a point-mass `p`): accept
//! while the draft is the argmax, then take the argmax. `p` is the sampler's own
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
/// statistical test can show it fails: on rejection it draws from `p` itself, which
/// over-weights the draft).
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
    let p = s.distribution(row);
    let ok = if p.point { p.ids[0] == d } else { s.uniform() < p.prob(d) };
    if ok {
        s.observe(&[d]);
        return Ok(());
    }
    let tok = if p.point {
        p.ids[0]
    } else {
        match (rule, p.without(d)) {
            (Rule::Exact, Some(res)) => s.draw(&res),
            _ => s.draw(&p),
        }
    };
    s.observe(&[tok]);
    Err(tok)
}

//! Lanes: a pass of several sequences split into groups of whole sequences, each group
//! run by its own replica of the runner (a one-thread backend), all groups at once.
//!
//! For a model whose weights sit in the caches (the built-in default model: 13 MB), a
//! step of K sequences on T threads spends more at the pass's fork and join points
//! (every op's parallel loop, the light ops one thread runs while the others wait) than
//! reading the weights T times would cost: T lanes of K/T sequences each run with no
//! synchronization at all. For a model read from memory the opposite holds (every lane
//! streams the weights again), so the loader turns lanes on by the weights' size
//! (tools: `load.rs`). The kernels are batch-invariant, so every row is bitwise what one
//! pass over all the sequences gives (tests/tests/slots.rs).

use super::{Logits, RunError, Runner, Taps};
use crate::state::SeqState;

/// Group boundaries: `lens` (tokens per sequence, in order) cut into at most `lanes`
/// contiguous non-empty groups of about equal token counts. Returns each group's end.
pub(crate) fn split(lens: &[usize], lanes: usize) -> Vec<usize> {
    let groups = lanes.min(lens.len()).max(1);
    let total: usize = lens.iter().sum();
    let mut ends = Vec::with_capacity(groups);
    let mut acc = 0;
    for (i, &n) in lens.iter().enumerate() {
        acc += n;
        let g = ends.len();
        // the rest must still give every later group a sequence
        let left_after = lens.len() - (i + 1);
        let full = acc * groups >= total * (g + 1);
        if g + 1 < groups && (full || left_after == groups - g - 1) {
            ends.push(i + 1);
        }
    }
    ends.push(lens.len());
    ends
}

/// What a lane hands back: its logits (once run) and its hidden rows.
type LaneOut = (Option<Result<Logits, RunError>>, Vec<f32>);

/// The replicas and the threads that run lanes 1.. (lane 0 runs on the caller's).
pub(crate) struct Lanes {
    pub(crate) runners: Vec<Runner>,
    pool: rayon::ThreadPool,
}

impl Lanes {
    pub(crate) fn new(runners: Vec<Runner>) -> Result<Lanes, String> {
        let n = runners.len() - 1;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .thread_name(|i| format!("pn-lane-{}", i + 1))
            .build()
            .map_err(|e| format!("cannot start {n} lane threads: {e}"))?;
        Ok(Lanes { runners, pool })
    }
}

impl Runner {
    /// Compiles `geom` on every lane now (no lanes: nothing), so a server meets its
    /// lanes' decode steps compiled.
    pub fn plan_lanes(&self, geom: crate::model::Geometry) -> Result<(), RunError> {
        for lane in self.lanes.iter().flat_map(|l| &l.runners) {
            lane.plan(geom)?;
        }
        Ok(())
    }

    /// Runs every lane's group beside the others (lane 0 on this thread, each other lane
    /// on a lane thread), then joins their logits rows (and, with `hidden`, their hidden
    /// rows) in the parts' order. The parts were checked by the caller (tokens, room);
    /// `lens` are their token counts.
    pub(crate) fn multi_lanes(&self, lanes: &Lanes, parts: &mut [(&mut SeqState, &[u32])], lens: &[usize], all_logits: bool, hidden: Option<&mut Vec<f32>>) -> Result<Logits, RunError> {
        let ends = split(lens, lanes.runners.len());
        let mut groups = Vec::with_capacity(ends.len());
        let (mut rest, mut at) = (parts, 0);
        for &end in &ends {
            let (g, r) = rest.split_at_mut(end - at);
            groups.push(g);
            (rest, at) = (r, end);
        }
        let want_h = hidden.is_some();
        let mut results: Vec<LaneOut> = (0..groups.len()).map(|_| (None, Vec::new())).collect();
        let (first, others) = results.split_first_mut().expect("at least one group");
        let run = move |lane: &Runner, g: &mut [(&mut SeqState, &[u32])], out: &mut LaneOut| {
            let taps = if want_h { Taps::hidden(&mut out.1) } else { Taps::default() };
            out.0 = Some(lane.multi(g, all_logits, taps));
        };
        let mut work = groups.into_iter().zip(&lanes.runners);
        let (g0, lane0) = work.next().expect("at least one group");
        lanes.pool.in_place_scope(|s| {
            for ((g, lane), out) in work.zip(others.iter_mut()) {
                s.spawn(move |_| run(lane, g, out));
            }
            run(lane0, g0, first);
        });
        let mut data = Vec::new();
        let mut rows = hidden;
        for (r, h) in results {
            data.extend_from_slice(&r.expect("every lane ran")?.data);
            if let Some(rows) = rows.as_deref_mut() {
                rows.extend_from_slice(&h);
            }
        }
        Ok(Logits { n_vocab: self.model.n_vocab(), data })
    }
}

#[cfg(test)]
mod tests {
    use super::split;

    #[test]
    fn groups_are_contiguous_balanced_and_never_empty() {
        assert_eq!(split(&[1; 16], 2), vec![8, 16]);
        assert_eq!(split(&[1; 5], 2), vec![3, 5]);
        assert_eq!(split(&[1; 3], 4), vec![1, 2, 3]);
        assert_eq!(split(&[7], 2), vec![1]);
        // a long prefill chunk and decode tokens: the chunk alone in one lane
        assert_eq!(split(&[200, 1, 1, 1], 2), vec![1, 4]);
        assert_eq!(split(&[1, 1, 1, 200], 2), vec![3, 4]);
        // the last groups still get a sequence each
        assert_eq!(split(&[100, 1, 1], 3), vec![1, 2, 3]);
        for lanes in 1..6 {
            for n in 1..20 {
                let lens: Vec<usize> = (0..n).map(|i| 1 + (i * 7919) % 13).collect();
                let ends = split(&lens, lanes);
                assert_eq!(ends.len(), lanes.min(n));
                assert_eq!(*ends.last().unwrap(), n);
                assert!(ends.windows(2).all(|w| w[0] < w[1]) && ends[0] > 0, "{lens:?} {lanes}: {ends:?}");
            }
        }
    }
}

//! Drafted / accepted counters, overall and per draft position.

/// Counters of one run (or one server's lifetime).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SpecStats {
    /// Verify passes.
    pub rounds: u64,
    pub drafted: u64,
    pub accepted: u64,
    /// `[i]`: drafts proposed at position i of a round, and how many were accepted.
    pub pos_drafted: Vec<u64>,
    pub pos_accepted: Vec<u64>,
}

impl SpecStats {
    /// One round: `n_drafted` proposed, the first `n_accepted` accepted.
    pub fn record(&mut self, n_drafted: usize, n_accepted: usize) {
        self.rounds += 1;
        self.drafted += n_drafted as u64;
        self.accepted += n_accepted as u64;
        if self.pos_drafted.len() < n_drafted {
            self.pos_drafted.resize(n_drafted, 0);
            self.pos_accepted.resize(n_drafted, 0);
        }
        for i in 0..n_drafted {
            self.pos_drafted[i] += 1;
            if i < n_accepted {
                self.pos_accepted[i] += 1;
            }
        }
    }
    pub fn add(&mut self, o: &SpecStats) {
        self.rounds += o.rounds;
        self.drafted += o.drafted;
        self.accepted += o.accepted;
        let n = self.pos_drafted.len().max(o.pos_drafted.len());
        self.pos_drafted.resize(n, 0);
        self.pos_accepted.resize(n, 0);
        for i in 0..o.pos_drafted.len() {
            self.pos_drafted[i] += o.pos_drafted[i];
            self.pos_accepted[i] += o.pos_accepted[i];
        }
    }
    /// Accepted / drafted (0 when nothing was drafted).
    pub fn acceptance(&self) -> f64 {
        self.accepted as f64 / (self.drafted as f64).max(1.0)
    }
    /// `drafted 120, accepted 84 (70.0%; per position 80.0% 60.0%)`.
    pub fn line(&self) -> String {
        let per: Vec<String> = self
            .pos_drafted
            .iter()
            .zip(&self.pos_accepted)
            .map(|(&d, &a)| format!("{:.1}%", 100.0 * a as f64 / (d as f64).max(1.0)))
            .collect();
        format!("drafted {}, accepted {} ({:.1}%; per position {})", self.drafted, self.accepted, 100.0 * self.acceptance(), per.join(" "))
    }
}

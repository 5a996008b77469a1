//! Token sampling: greedy, or repetition penalty → temperature → top-k → top-p → min-p →
//! a seeded draw.

/// Sampling parameters. `temperature <= 0` means greedy.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerConfig {
    pub temperature: f32,
    /// 0 = disabled.
    pub top_k: usize,
    /// 1.0 = disabled.
    pub top_p: f32,
    /// 0.0 = disabled.
    pub min_p: f32,
    /// 1.0 = disabled. Divides positive (multiplies negative) logits of recent tokens.
    pub repeat_penalty: f32,
    /// How many recent tokens the repetition penalty looks at.
    pub repeat_last_n: usize,
    pub seed: u64,
}

impl SamplerConfig {
    pub fn greedy() -> SamplerConfig {
        SamplerConfig { temperature: 0.0, top_k: 0, top_p: 1.0, min_p: 0.0, repeat_penalty: 1.0, repeat_last_n: 64, seed: 0 }
    }
    /// Check ranges; the message names the flag, the expected range and the value found.
    pub fn validate(&self) -> Result<(), String> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(format!("--temp: expected a finite value ≥ 0, found {}", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("--top-p: expected a value in (0, 1], found {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(format!("--min-p: expected a value in [0, 1], found {}", self.min_p));
        }
        if !self.repeat_penalty.is_finite() || self.repeat_penalty <= 0.0 {
            return Err(format!("--repeat-penalty: expected a finite value > 0, found {}", self.repeat_penalty));
        }
        Ok(())
    }
}

/// Index of the largest logit (the first one on ties, like llama.cpp's greedy sampler).
pub fn argmax(logits: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best
}

/// splitmix64: a small, well-distributed, seedable generator (reproducible across runs).
#[derive(Clone, Debug)]
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

pub struct Sampler {
    cfg: SamplerConfig,
    rng: Rng,
    recent: Vec<u32>,
}

impl Sampler {
    pub fn new(cfg: SamplerConfig) -> Sampler {
        let rng = Rng(cfg.seed);
        Sampler { cfg, rng, recent: Vec::new() }
    }

    /// Remember tokens of the context (prompt or generated) for the repetition penalty.
    pub fn observe(&mut self, tokens: &[u32]) {
        self.recent.extend_from_slice(tokens);
        let keep = self.cfg.repeat_last_n;
        if self.recent.len() > keep {
            self.recent.drain(..self.recent.len() - keep);
        }
    }

    /// Pick the next token from a row of logits (and remember it).
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let id = self.pick(logits);
        self.observe(&[id]);
        id
    }

    fn pick(&mut self, logits: &[f32]) -> u32 {
        let d = self.distribution(logits);
        if d.point {
            return d.ids[0];
        }
        self.draw(&d)
    }

    /// Whether sampling is greedy (a point mass on the argmax).
    pub fn is_greedy(&self) -> bool {
        self.cfg.temperature <= 0.0
    }

    /// The distribution [`Sampler::sample`] draws from for `logits` (repetition penalty
    /// over the recent tokens, temperature, top-k, top-p, min-p): candidates in
    /// descending logit order with unnormalized weights (greedy: the argmax, weight 1).
    /// Speculative decoding's rejection sampling reads it (crate::spec::accept).
    pub fn distribution(&self, logits: &[f32]) -> Dist {
        let mut l = logits.to_vec();
        if self.cfg.repeat_penalty != 1.0 {
            for &t in &self.recent {
                if let Some(v) = l.get_mut(t as usize) {
                    *v = if *v > 0.0 { *v / self.cfg.repeat_penalty } else { *v * self.cfg.repeat_penalty };
                }
            }
        }
        if self.cfg.temperature <= 0.0 {
            return Dist { ids: vec![argmax(&l) as u32], w: vec![1.0], point: true };
        }
        // candidates sorted by logit, descending (stable: lower id first on ties)
        let mut cand: Vec<(u32, f32)> = l.iter().enumerate().filter(|(_, v)| v.is_finite()).map(|(i, &v)| (i as u32, v)).collect();
        if cand.is_empty() {
            return Dist { ids: vec![argmax(logits) as u32], w: vec![1.0], point: true };
        }
        cand.sort_by(|a, b| b.1.total_cmp(&a.1));
        if self.cfg.top_k > 0 {
            cand.truncate(self.cfg.top_k);
        }
        let inv_t = 1.0 / self.cfg.temperature as f64;
        let max = cand[0].1 as f64;
        let mut p: Vec<f64> = cand.iter().map(|c| ((c.1 as f64 - max) * inv_t).exp()).collect();
        let total: f64 = p.iter().sum();
        p.iter_mut().for_each(|x| *x /= total);
        // top-p: the smallest prefix whose mass reaches top_p
        if self.cfg.top_p < 1.0 {
            let mut acc = 0.0;
            let mut keep = p.len();
            for (i, &x) in p.iter().enumerate() {
                acc += x;
                if acc >= self.cfg.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
            p.truncate(keep);
        }
        // min-p: drop tokens less likely than min_p × the best one
        if self.cfg.min_p > 0.0 {
            let floor = p[0] * self.cfg.min_p as f64;
            let keep = p.iter().take_while(|&&x| x >= floor).count().max(1);
            p.truncate(keep);
        }
        cand.truncate(p.len());
        Dist { ids: cand.into_iter().map(|c| c.0).collect(), w: p, point: false }
    }

    /// A draw from `d` (one uniform number of the seeded generator); not remembered
    /// (call [`Sampler::observe`]).
    pub fn draw(&mut self, d: &Dist) -> u32 {
        let total: f64 = d.w.iter().sum();
        let mut r = self.rng.next_f64() * total;
        for (i, &x) in d.w.iter().enumerate() {
            if r < x {
                return d.ids[i];
            }
            r -= x;
        }
        d.ids[d.w.len() - 1]
    }

    /// A uniform number in [0, 1) from the seeded generator.
    pub fn uniform(&mut self) -> f64 {
        self.rng.next_f64()
    }
}

/// A sampling distribution: token ids and their weights (unnormalized, all > 0 unless
/// underflowed), as [`Sampler::distribution`] gives it.
#[derive(Clone, Debug, PartialEq)]
pub struct Dist {
    pub ids: Vec<u32>,
    pub w: Vec<f64>,
    /// A point mass taken without a draw (greedy, or no finite logit).
    pub point: bool,
}

impl Dist {
    /// The probability of `id` (0 when it is not a candidate).
    pub fn prob(&self, id: u32) -> f64 {
        let total: f64 = self.w.iter().sum();
        match self.ids.iter().position(|&x| x == id) {
            Some(i) if total > 0.0 => self.w[i] / total,
            _ => 0.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_first_max() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, -1.0]), 1);
        let mut s = Sampler::new(SamplerConfig::greedy());
        assert_eq!(s.sample(&[0.0, 0.5, 0.2]), 1);
    }

    #[test]
    fn same_seed_same_tokens_and_top_k_1_is_greedy() {
        let logits: Vec<f32> = (0..50).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        let cfg = SamplerConfig { temperature: 1.0, top_k: 10, top_p: 0.9, min_p: 0.05, repeat_penalty: 1.0, repeat_last_n: 64, seed: 42 };
        let a: Vec<u32> = { let mut s = Sampler::new(cfg.clone()); (0..20).map(|_| s.sample(&logits)).collect() };
        let b: Vec<u32> = { let mut s = Sampler::new(cfg.clone()); (0..20).map(|_| s.sample(&logits)).collect() };
        assert_eq!(a, b);
        let mut k1 = Sampler::new(SamplerConfig { top_k: 1, ..cfg });
        assert_eq!(k1.sample(&logits) as usize, argmax(&logits));
    }

    #[test]
    fn repetition_penalty_demotes_recent_tokens() {
        let mut s = Sampler::new(SamplerConfig { repeat_penalty: 2.0, ..SamplerConfig::greedy() });
        s.observe(&[0]);
        assert_eq!(s.sample(&[1.0, 0.6]), 1);
    }

    #[test]
    fn validate_names_the_flag() {
        let bad = SamplerConfig { top_p: 0.0, ..SamplerConfig::greedy() };
        assert!(bad.validate().unwrap_err().contains("--top-p"));
    }
}

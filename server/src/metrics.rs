//! Counters, gauges and histograms for `GET /metrics` (Prometheus text format 0.0.4).

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Upper bounds (seconds) of the latency buckets.
const BUCKETS: &[f64] = &[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];
/// The window of the tokens/s gauge.
const RATE_WINDOW: Duration = Duration::from_secs(10);

#[derive(Default)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    total: u64,
    sum: f64,
}

impl Histogram {
    fn observe(&mut self, secs: f64) {
        if let Some(i) = BUCKETS.iter().position(|&b| secs <= b) {
            self.counts[i] += 1;
        }
        self.total += 1;
        self.sum += secs;
    }
    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut acc = 0;
        for (b, c) in BUCKETS.iter().zip(self.counts) {
            acc += c;
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {acc}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}\n{name}_sum {}\n{name}_count {}", self.total, self.sum, self.total);
    }
}

#[derive(Default)]
pub struct Metrics {
    /// Responses by HTTP status.
    requests: Mutex<BTreeMap<u16, u64>>,
    pub prompt_tokens: AtomicU64,
    pub cached_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    /// Generations ended because the client went away or the deadline passed.
    pub cancelled: AtomicU64,
    /// Forward passes that decoded streams, and the streams they decoded (their ratio is
    /// the mean batch of a step).
    pub decode_steps: AtomicU64,
    pub decode_step_streams: AtomicU64,
    pub queue_depth: AtomicU64,
    pub busy_slots: AtomicU64,
    pub n_slots: AtomicU64,
    ttft: Mutex<Histogram>,
    inter_token: Mutex<Histogram>,
    /// (when, tokens) of the recent decode steps, for the tokens/s gauge.
    recent: Mutex<VecDeque<(Instant, u64)>>,
    /// `--draft`: drafted / accepted tokens, overall and per draft position.
    drafts: Mutex<pn_engine::spec::SpecStats>,
    /// `--draft`: engine iterations whose verify round drafted, and plain ones
    /// (`--draft-policy adaptive` leaves drafts out where they measure slower).
    pub draft_steps: [AtomicU64; 2],
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Metrics {
    pub fn record_status(&self, status: u16) {
        *lock(&self.requests).entry(status).or_insert(0) += 1;
    }
    pub fn requests_with_status(&self, status: u16) -> u64 {
        lock(&self.requests).get(&status).copied().unwrap_or(0)
    }
    pub fn observe_ttft(&self, d: Duration) {
        lock(&self.ttft).observe(d.as_secs_f64());
    }
    /// A forward pass decoded `k` streams.
    pub fn record_step(&self, k: usize) {
        if k > 0 {
            self.decode_steps.fetch_add(1, Ordering::Relaxed);
            self.decode_step_streams.fetch_add(k as u64, Ordering::Relaxed);
        }
    }
    pub fn observe_inter_token(&self, d: Duration) {
        lock(&self.inter_token).observe(d.as_secs_f64());
    }
    /// `n` tokens were generated now.
    pub fn record_generated(&self, n: u64) {
        self.generated_tokens.fetch_add(n, Ordering::Relaxed);
        let now = Instant::now();
        let mut r = lock(&self.recent);
        r.push_back((now, n));
        while r.front().is_some_and(|(t, _)| now.duration_since(*t) > RATE_WINDOW) {
            r.pop_front();
        }
    }
    /// One sequence's verify round: `drafted` drafts, the first `accepted` kept.
    pub fn record_drafts(&self, drafted: usize, accepted: usize) {
        if drafted > 0 {
            lock(&self.drafts).record(drafted, accepted);
        }
    }
    /// One verify round of the engine: with drafts or without.
    pub fn record_draft_round(&self, drafted: bool) {
        self.draft_steps[usize::from(!drafted)].fetch_add(1, Ordering::Relaxed);
    }
    pub fn drafts(&self) -> pn_engine::spec::SpecStats {
        lock(&self.drafts).clone()
    }
    /// Generated tokens per second over the last [`RATE_WINDOW`].
    pub fn tokens_per_second(&self) -> f64 {
        let now = Instant::now();
        let r = lock(&self.recent);
        let n: u64 = r.iter().filter(|(t, _)| now.duration_since(*t) <= RATE_WINDOW).map(|(_, n)| n).sum();
        n as f64 / RATE_WINDOW.as_secs_f64()
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "# HELP pn_requests_total HTTP responses by status code.\n# TYPE pn_requests_total counter");
        for (s, n) in lock(&self.requests).iter() {
            let _ = writeln!(out, "pn_requests_total{{status=\"{s}\"}} {n}");
        }
        let counters = [
            ("pn_prompt_tokens_total", "Prompt tokens of the requests admitted.", &self.prompt_tokens),
            ("pn_prompt_cache_hit_tokens_total", "Prompt tokens restored from the prefix cache instead of evaluated.", &self.cached_tokens),
            ("pn_generated_tokens_total", "Tokens generated.", &self.generated_tokens),
            ("pn_requests_cancelled_total", "Generations ended early: the client disconnected or the deadline passed.", &self.cancelled),
            ("pn_decode_steps_total", "Forward passes that decoded streams.", &self.decode_steps),
            ("pn_decode_step_streams_total", "Streams decoded, summed over the decode steps (over pn_decode_steps_total: the mean batch).", &self.decode_step_streams),
        ];
        for (name, help, v) in counters {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}", v.load(Ordering::Relaxed));
        }
        let gauges = [
            ("pn_queue_depth", "Requests waiting for a slot.", self.queue_depth.load(Ordering::Relaxed) as f64),
            ("pn_slots_busy", "Slots holding a sequence (prefilling or generating).", self.busy_slots.load(Ordering::Relaxed) as f64),
            ("pn_slots_total", "Decode slots.", self.n_slots.load(Ordering::Relaxed) as f64),
            ("pn_tokens_per_second", "Generated tokens per second over the last 10 s.", self.tokens_per_second()),
        ];
        for (name, help, v) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        }
        self.render_drafts(&mut out);
        lock(&self.ttft).render(&mut out, "pn_time_to_first_token_seconds", "From arrival to the first generated token.");
        lock(&self.inter_token).render(&mut out, "pn_inter_token_seconds", "Between consecutive tokens of one generation.");
        out
    }
}

impl Metrics {
    /// `pn_draft_*`: drafted and accepted tokens (`pn serve --draft`), also per draft
    /// position (1 = the first draft of a round).
    fn render_drafts(&self, out: &mut String) {
        let d = lock(&self.drafts);
        let counters = [
            ("pn_draft_rounds_total", "Verify passes of a sequence with drafts.", d.rounds),
            ("pn_draft_tokens_total", "Draft tokens proposed (speculative decoding).", d.drafted),
            ("pn_draft_accepted_tokens_total", "Draft tokens accepted by the verify pass.", d.accepted),
        ];
        for (name, help, v) in counters {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
        }
        let name = "pn_draft_steps_total";
        let _ = writeln!(out, "# HELP {name} Engine steps of speculative decoding, drafting or plain (--draft-policy adaptive).\n# TYPE {name} counter");
        for (mode, v) in ["draft", "plain"].iter().zip(&self.draft_steps) {
            let _ = writeln!(out, "{name}{{mode=\"{mode}\"}} {}", v.load(Ordering::Relaxed));
        }
        let per = [("pn_draft_position_tokens_total", "Draft tokens proposed at each position of a round.", &d.pos_drafted), ("pn_draft_position_accepted_total", "Draft tokens accepted at each position of a round.", &d.pos_accepted)];
        for (name, help, v) in per {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (i, n) in v.iter().enumerate() {
                let _ = writeln!(out, "{name}{{position=\"{}\"}} {n}", i + 1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prometheus_text() {
        let m = Metrics::default();
        m.record_status(200);
        m.record_status(400);
        m.record_status(200);
        m.observe_ttft(Duration::from_millis(30));
        m.record_generated(5);
        let t = m.render();
        assert!(t.contains("pn_requests_total{status=\"200\"} 2"), "{t}");
        assert!(t.contains("pn_time_to_first_token_seconds_bucket{le=\"0.05\"} 1"), "{t}");
        assert!(t.contains("pn_time_to_first_token_seconds_bucket{le=\"0.025\"} 0"), "{t}");
        assert!(t.contains("pn_generated_tokens_total 5"), "{t}");
        assert!(t.contains("pn_tokens_per_second 0.5"), "{t}");
        assert!(t.contains("pn_draft_tokens_total 0"), "{t}");
    }

    #[test]
    fn renders_draft_counters_per_position() {
        let m = Metrics::default();
        m.record_drafts(3, 1);
        m.record_drafts(2, 2);
        m.record_drafts(0, 0);
        let t = m.render();
        assert!(t.contains("pn_draft_rounds_total 2"), "{t}");
        assert!(t.contains("pn_draft_tokens_total 5\n"), "{t}");
        assert!(t.contains("pn_draft_accepted_tokens_total 3\n"), "{t}");
        assert!(t.contains("pn_draft_position_tokens_total{position=\"3\"} 1"), "{t}");
        assert!(t.contains("pn_draft_position_accepted_total{position=\"1\"} 2"), "{t}");
        assert!(t.contains("pn_draft_position_accepted_total{position=\"2\"} 1"), "{t}");
        assert!(t.contains("pn_draft_position_accepted_total{position=\"3\"} 0"), "{t}");
    }
}

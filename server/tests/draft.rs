//! `pn serve --draft lookup|mtp`: each sequence's drafts verified in the step's pass.
//! Greedy completions are the plain server's, token for token (their text over 48
//! tokens), alone and four streams at once; so are sampled ones with a seed (the coupled
//! acceptance rule takes the random numbers plain decoding takes), drafting in every
//! round and under the adaptive policy; `/metrics` counts the drafts and the steps.

mod common;
use common::*;
use pn_engine::spec::{DraftFactory, DraftPolicy, MtpModel};
use pn_engine::Gguf;
use pn_server::DraftSpec;
use serde_json::json;
use std::sync::Arc;

const PROMPTS: [&str; 4] = [
    // repeats itself: prompt lookup finds drafts at once
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\ndef add(a, b):\n",
    "import os\nimport sys\n",
    "class Parser:\n",
    "def parse_args(argv):",
];

/// A completion of 48 tokens: greedy (`i` = None) or sampled with seed `i`.
async fn complete(s: &Arc<pn_server::Server>, prompt: &str, i: Option<u64>) -> String {
    let body = match i {
        None => json!({"prompt": prompt, "max_tokens": 48, "temperature": 0, "ignore_eos": true}),
        Some(seed) => json!({"prompt": prompt, "max_tokens": 48, "temperature": 0.8, "top_p": 0.95, "seed": seed, "ignore_eos": true}),
    };
    let r = post(s, "/v1/completions", &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["choices"][0]["text"].as_str().unwrap().to_string()
}

/// Every prompt alone (greedy, then sampled), then all four at once (greedy and
/// sampled alternating).
async fn texts(s: &Arc<pn_server::Server>) -> Vec<String> {
    let mut out = Vec::new();
    for (i, p) in PROMPTS.iter().enumerate() {
        out.push(complete(s, p, None).await);
        out.push(complete(s, p, Some(7 + i as u64)).await);
    }
    let tasks: Vec<_> = PROMPTS
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let s = s.clone();
            tokio::spawn(async move { complete(&s, p, (i % 2 == 1).then_some(20 + i as u64)).await })
        })
        .collect();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

fn metric(text: &str, name: &str) -> u64 {
    let line = text.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap_or_else(|| panic!("no {name} in {text}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

async fn check(factory: impl Fn() -> DraftFactory, n: usize) {
    let plain = server(config(), spec(DEFAULT, 4, 512));
    let want = texts(&plain).await;
    plain.stop_engine();
    for policy in [DraftPolicy::Always, DraftPolicy::Adaptive] {
        let mut sp = spec(DEFAULT, 4, 512);
        sp.draft = Some(DraftSpec { factory: factory(), n, policy });
        let s = server(config(), sp);
        let got = texts(&s).await;
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g, w, "completion {i} with drafts ×{n}, {policy:?}");
        }
        let m = send(&s, "GET", "/metrics", None, &[]).await.text();
        let (drafted, accepted) = (metric(&m, "pn_draft_tokens_total"), metric(&m, "pn_draft_accepted_tokens_total"));
        let steps = |mode: &str| metric(&m, &format!("pn_draft_steps_total{{mode=\"{mode}\"}}"));
        eprintln!("drafts ×{n}, {policy:?}: drafted {drafted}, accepted {accepted}; steps drafting {}, plain {}", steps("draft"), steps("plain"));
        if policy == DraftPolicy::Always {
            // both paths ran: drafts kept and drafts rolled back
            assert!(accepted > 0 && accepted < drafted, "drafted {drafted}, accepted {accepted}\n{m}");
            assert!(m.contains("pn_draft_position_accepted_total{position=\"1\"}"), "{m}");
            assert_eq!(steps("plain"), 0, "{m}");
        } else {
            // the policy measures drafting first at every number of streams
            assert!(steps("draft") > 0 && drafted > 0, "{m}");
        }
        s.stop_engine();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lookup_drafts_keep_the_output() {
    check(|| DraftFactory::Lookup, 4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mtp_drafts_keep_the_output() {
    let g = Arc::new(Gguf::open(&repo(DEFAULT)).unwrap());
    let block = pn_models::qwen35moe::mtp::load(&g).unwrap();
    let m = Arc::new(MtpModel::new(block, g, Arc::new(pn_cpu::CpuBackend::new(2))));
    check(|| DraftFactory::Mtp(m.clone()), 2).await;
}

/// A completion of 64 greedy tokens of `prompt`, with a predicted output or none: the
/// body of the answer.
async fn predicted(s: &Arc<pn_server::Server>, prompt: &str, prediction: Option<&str>) -> serde_json::Value {
    let mut body = json!({"prompt": prompt, "max_tokens": 64, "temperature": 0, "ignore_eos": true});
    if let Some(p) = prediction {
        body["prediction"] = json!({"type": "content", "content": p});
    }
    let r = post(s, "/v1/completions", &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

/// OpenAI's predicted outputs (`prediction`) with `--draft lookup`: the answer is the
/// same; a right prediction's tokens come as accepted drafts (under the adaptive policy
/// too: a request with a prediction drafts in every round), a wrong one's are rejected;
/// `usage.completion_tokens_details` counts both.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_predicted_output_is_drafted_from() {
    for policy in [DraftPolicy::Always, DraftPolicy::Adaptive] {
        predictions_under(policy).await;
    }
}

async fn predictions_under(policy: DraftPolicy) {
    let mut sp = spec(DEFAULT, 2, 512);
    sp.draft = Some(DraftSpec { factory: DraftFactory::Lookup, n: 6, policy });
    let s = server(config(), sp);
    // (accepted, rejected) summed over the prompts: right predictions, wrong ones
    let (mut right, mut wrong) = ((0, 0), (0, 0));
    for prompt in &PROMPTS[1..] {
        let plain = predicted(&s, prompt, None).await;
        let text = plain["choices"][0]["text"].as_str().unwrap().to_string();
        assert!(plain["usage"].get("completion_tokens_details").is_none(), "{plain}");
        let details = |v: &serde_json::Value| {
            let d = &v["usage"]["completion_tokens_details"];
            (d["accepted_prediction_tokens"].as_u64().unwrap(), d["rejected_prediction_tokens"].as_u64().unwrap())
        };
        let r = predicted(&s, prompt, Some(&text)).await;
        assert_eq!(r["choices"][0]["text"], text.as_str(), "{prompt:?}");
        let (acc, rej) = details(&r);
        // 64 tokens: most come as accepted drafts (in rounds of 6), few drafts fail
        assert!(acc >= 48 && rej <= 8, "{policy:?} {prompt:?}: accepted {acc}, rejected {rej}");
        let w = predicted(&s, prompt, Some("Lorem ipsum dolor sit amet, consectetur adipiscing elit.")).await;
        assert_eq!(w["choices"][0]["text"], text.as_str(), "{prompt:?}");
        let (acc_w, rej_w) = details(&w);
        eprintln!("{policy:?} {prompt:?}: right prediction {acc} accepted / {rej} rejected, wrong {acc_w} / {rej_w}");
        right = (right.0 + acc, right.1 + rej);
        wrong = (wrong.0 + acc_w, wrong.1 + rej_w);
    }
    // a wrong prediction leaves the context's own matches (this model repeats itself)
    assert!(right.0 >= wrong.0 + 32 && wrong.1 > right.1 + 32, "{policy:?}: right {right:?}, wrong {wrong:?}");
    s.stop_engine();
}

/// A second turn (the first turn's prompt and answer, then more) with `--draft mtp`:
/// the prefix cache restores the first turn with its hidden rows (the MTP drafter's
/// input), the answer is the plain server's, and drafts are still accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mtp_drafting_reuses_cached_turns() {
    let turns = |s: Arc<pn_server::Server>| async move {
        let first = "def parse_args(argv):";
        let a = post(&s, "/v1/completions", &json!({"prompt": first, "max_tokens": 40, "temperature": 0, "ignore_eos": true})).await.json();
        let second = format!("{first}{}\n\ndef main():", a["choices"][0]["text"].as_str().unwrap());
        let b = post(&s, "/v1/completions", &json!({"prompt": second, "max_tokens": 40, "temperature": 0, "ignore_eos": true})).await.json();
        let cached = b["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
        let m = send(&s, "GET", "/metrics", None, &[]).await.text();
        s.stop_engine();
        (a["choices"][0]["text"].as_str().unwrap().to_string(), b["choices"][0]["text"].as_str().unwrap().to_string(), cached, m)
    };
    let (a0, b0, cached0, _) = turns(server(config(), spec(DEFAULT, 2, 512))).await;
    let g = Arc::new(Gguf::open(&repo(DEFAULT)).unwrap());
    let block = pn_models::qwen35moe::mtp::load(&g).unwrap();
    let m = Arc::new(MtpModel::new(block, g, Arc::new(pn_cpu::CpuBackend::new(2))));
    let mut sp = spec(DEFAULT, 2, 512);
    sp.draft = Some(DraftSpec { factory: DraftFactory::Mtp(m), n: 2, policy: DraftPolicy::Always });
    let (a1, b1, cached1, metrics) = turns(server(config(), sp)).await;
    assert_eq!((a1.as_str(), b1.as_str()), (a0.as_str(), b0.as_str()), "answers with MTP drafts and a cached first turn");
    // the first turn (prompt and answer) comes from the cache, as without drafts
    assert!(cached1 > 40 && cached1 == cached0, "cached tokens: {cached1} with MTP, {cached0} without");
    let accepted = metric(&metrics, "pn_draft_accepted_tokens_total");
    assert!(accepted > 10, "{metrics}");
}

/// A long prompt that arrives while a stream drafts is prefilled within the step budget
/// (passes of a 64-token granule or so, each after at least one of the stream's rounds),
/// not a whole 256-token chunk per round: the stream keeps running its rounds meanwhile
/// (it got one round per chunk before: 11 over this prompt).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_long_prompt_does_not_stall_drafting_streams() {
    let mut sp = spec(DEFAULT, 2, 4096);
    sp.draft = Some(DraftSpec { factory: DraftFactory::Lookup, n: 3, policy: DraftPolicy::Always });
    let s = server(config(), sp);
    let (during, prompt) = steps_during_a_long_prompt(&s).await;
    assert!(during >= prompt / 96, "{during} rounds of the stream while {prompt} prompt tokens prefilled");
    s.stop_engine();
}

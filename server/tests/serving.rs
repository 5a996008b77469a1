//! Scheduling behaviour: the prompt cache across chat turns (answers included), a client
//! that disconnects frees its slot within a step, deadlines, a full queue, and the same
//! seed giving the same text alone or beside 15 other streams.

mod common;
use axum::body::Body;
use axum::http::Request;
use common::*;
use futures_util::StreamExt;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tower::ServiceExt;

/// Five chat turns: turn N's cached tokens are every token of turns 1..N-1, the answers
/// included (the previous prompt + its completion, + the end-of-turn token when the
/// answer ended with one). Returns turn 5's cached share of its prompt.
async fn five_turns(model: &str) -> f64 {
    let spec = spec(model, 2, 2048);
    // no control tokens (they render as nothing in the content, so a client cannot send
    // them back): the answer ends by length, at 64 tokens
    let tok = &spec.tokenizer;
    let control: serde_json::Map<String, Value> = (0..tok.n_vocab() as u32)
        .filter(|&i| tok.token_type(i) == Some(pn_engine::tokenizer::token_type::CONTROL) || tok.is_eog(i))
        .map(|i| (i.to_string(), json!(-100)))
        .collect();
    assert!(!control.is_empty());
    let s = server(config(), spec);
    let system = "You are a careful Python programmer. Answer with code only, no prose. Prefer the standard library, small functions, docstrings and clear names.";
    let mut msgs = vec![json!({"role": "system", "content": system})];
    let mut prev: Option<(u64, u64, String)> = None;
    let mut share = 0.0;
    for turn in 1..=5 {
        msgs.push(json!({"role": "user", "content": format!("Write function number {turn}.")}));
        let body = json!({"messages": msgs, "max_tokens": 64, "logit_bias": control, "temperature": 0.7, "seed": turn});
        let v = post(&s, "/v1/chat/completions", &body).await.json();
        let u = &v["usage"];
        let (p, c) = (u["prompt_tokens"].as_u64().unwrap(), u["completion_tokens"].as_u64().unwrap());
        let cached = u["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
        match &prev {
            None => assert_eq!(cached, 0, "{model}: turn 1 is cold"),
            Some((pp, pc, f)) => {
                assert_eq!(f, "length");
                assert_eq!(cached, pp + pc, "{model} turn {turn}: cached {cached} of {p}, previous turn {pp} + {pc}");
            }
        }
        share = cached as f64 / p as f64;
        eprintln!("{model} turn {turn}: {cached} of {p} prompt tokens cached ({:.1}%)", share * 100.0);
        let answer = v["choices"][0]["message"]["content"].as_str().unwrap().to_string();
        prev = Some((p, c, v["choices"][0]["finish_reason"].as_str().unwrap().to_string()));
        msgs.push(json!({"role": "assistant", "content": answer}));
    }
    s.stop_engine();
    share
}

#[tokio::test]
async fn chat_turns_reuse_previous_answers_default_model() {
    let share = five_turns(DEFAULT).await;
    assert!(share >= 0.95, "turn 5 cached {:.1}% of its prompt", share * 100.0);
}

#[tokio::test]
async fn chat_turns_reuse_previous_answers_qwen35moe_fixture() {
    let share = five_turns(KTINY).await;
    assert!(share >= 0.95, "turn 5 cached {:.1}% of its prompt", share * 100.0);
}

fn request(path: &str, body: &Value) -> Request<Body> {
    Request::builder().method("POST").uri(path).body(Body::from(body.to_string())).unwrap()
}

#[tokio::test]
async fn disconnect_cancels_and_frees_the_slot() {
    let s = server(config(), spec(DEFAULT, 2, 4096));
    let body = json!({"prompt": "def main():", "max_tokens": 4000, "ignore_eos": true, "stream": true});
    let r = s.router().oneshot(request("/v1/completions", &body)).await.unwrap();
    let mut frames = r.into_body().into_data_stream();
    // two chunks arrive: the sequence is generating
    for _ in 0..2 {
        frames.next().await.expect("a chunk").unwrap();
    }
    let sh = s.shared().clone();
    assert_eq!(sh.slots.lock().unwrap().iter().filter(|v| v.state == "generating").count(), 1);
    drop(frames);
    eventually("the slot is free after the disconnect", || sh.slots.lock().unwrap().iter().all(|v| v.state == "idle")).await;
    assert_eq!(sh.metrics.cancelled.load(Ordering::Relaxed), 1);
    let m = send(&s, "GET", "/metrics", None, &[]).await.text();
    assert!(m.contains("pn_requests_cancelled_total 1") && m.contains("pn_slots_busy 0"), "{m}");
    s.stop_engine();
}

#[tokio::test]
async fn deadline_ends_the_generation() {
    let s = server(config(), spec(DEFAULT, 1, 4096));
    let body = json!({"prompt": "def main():", "max_tokens": 4000, "ignore_eos": true, "timeout": 0.2});
    let v = post(&s, "/v1/completions", &body).await.json();
    assert_eq!(v["choices"][0]["finish_reason"], "timeout");
    let n = v["usage"]["completion_tokens"].as_u64().unwrap();
    assert!(n < 4000, "{n} tokens");
    // the header form
    let r = send(&s, "POST", "/v1/completions", Some(&json!({"prompt": "x", "max_tokens": 4000, "ignore_eos": true}).to_string()), &[("x-request-timeout", "0.2")]).await;
    assert_eq!(r.json()["choices"][0]["finish_reason"], "timeout");
    let sh = s.shared().clone();
    eventually("slot free", || sh.slots.lock().unwrap().iter().all(|v| v.state == "idle")).await;
    s.stop_engine();
}

#[tokio::test]
async fn full_queue_is_503_with_retry_after() {
    let mut cfg = config();
    cfg.queue = 1;
    let s = server(cfg, spec(DEFAULT, 1, 4096));
    let long = json!({"prompt": "def main():", "max_tokens": 4000, "ignore_eos": true, "stream": true});
    // A takes the only slot, B waits in the only queue place, C is refused
    let a = s.router().oneshot(request("/v1/completions", &long)).await.unwrap();
    let mut a = a.into_body().into_data_stream();
    a.next().await.unwrap().unwrap();
    let b = s.router().oneshot(request("/v1/completions", &long)).await.unwrap();
    let sh = s.shared().clone();
    eventually("B is queued", || sh.metrics.queue_depth.load(Ordering::Relaxed) == 1).await;
    let c = post(&s, "/v1/completions", &json!({"prompt": "x", "max_tokens": 1})).await;
    assert_eq!(c.status.as_u16(), 503);
    assert_eq!(c.headers["retry-after"], "1");
    assert_eq!(c.error()["code"], "queue_full");
    drop(a);
    drop(b);
    eventually("all cancelled", || sh.slots.lock().unwrap().iter().all(|v| v.state == "idle") && sh.metrics.queue_depth.load(Ordering::Relaxed) == 0).await;
    s.stop_engine();
}

/// A sampled (temperature 0.9) completion's text.
async fn sampled(s: &Arc<pn_server::Server>, prompt: &str, seed: u64) -> String {
    let v = post(s, "/v1/completions", &json!({"prompt": prompt, "max_tokens": 32, "temperature": 0.9, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": seed})).await.json();
    v["choices"][0]["text"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn same_seed_same_text_alone_or_beside_fifteen_streams() {
    let s = server(config(), spec(DEFAULT, 16, 512));
    let alone = sampled(&s, "import sys\n", 42).await;
    let mut tasks = Vec::new();
    for i in 0..16u64 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            if i == 7 {
                sampled(&s, "import sys\n", 42).await
            } else {
                sampled(&s, &format!("def helper_{i}(value):"), i).await
            }
        }));
    }
    let mut texts = Vec::new();
    for t in tasks {
        texts.push(t.await.unwrap());
    }
    assert_eq!(texts[7], alone, "the same request and seed beside 15 other streams");
    s.stop_engine();
}

/// Three streaming completions of `prompt_tokens` prompt tokens each, sent together; the
/// decode steps and the streams they decoded (`/metrics`) once all are done.
async fn burst_steps(wave_tokens: usize) -> (u64, u64) {
    let mut sp = spec(DEFAULT, 4, 4096);
    sp.wave_tokens = wave_tokens;
    let s = server(config(), sp);
    // ~700 tokens each: with 256-token passes the three prompts end in different passes
    let long = |i: usize| (0..140).map(|j| format!("v{i}_{j} = {j}\n")).collect::<String>();
    let mut tasks = Vec::new();
    for i in 0..3 {
        let s = s.clone();
        let body = json!({"prompt": long(i), "max_tokens": 6, "ignore_eos": true, "stream": true});
        tasks.push(tokio::spawn(async move { post(&s, "/v1/completions", &body).await }));
    }
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!(r.status.as_u16(), 200, "{}", r.text());
        assert_eq!(stream_text(&r.events()).1.as_deref(), Some("length"));
    }
    let m = &s.shared().metrics;
    let (steps, streams) = (m.decode_steps.load(Ordering::Relaxed), m.decode_step_streams.load(Ordering::Relaxed));
    let text = send(&s, "GET", "/metrics", None, &[]).await.text();
    assert!(text.contains(&format!("pn_decode_steps_total {steps}")) && text.contains(&format!("pn_decode_step_streams_total {streams}")), "{text}");
    s.stop_engine();
    (steps, streams)
}

/// A burst of prompts that arrives while nothing streams starts as one wave: every decode
/// step carries all three streams. Without waves (`wave_tokens` 0) the first prompt done
/// streams alone while the others prefill.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_of_prompts_starts_streaming_together() {
    let (steps, streams) = burst_steps(8192).await;
    assert!(steps > 0 && streams == 3 * steps, "waves: {streams} streams over {steps} steps");
    let (steps, streams) = burst_steps(0).await;
    assert!(streams < 3 * steps, "no waves: {streams} streams over {steps} steps");
}

/// With the decode step on the slots' worker (`pn serve --async-steps`), a long
/// prompt's passes beside it take the step budget too: the
/// running stream keeps stepping while the prompt prefills (it got one step per whole
/// 256-token chunk before: ~9 over this prompt).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn overlapped_steps_keep_streaming_while_a_long_prompt_prefills() {
    let mut sp = spec(DEFAULT, 2, 4096);
    sp.async_steps = true;
    let s = server(config(), sp);
    let (during, prompt) = steps_during_a_long_prompt(&s).await;
    assert!(during >= prompt / 96, "{during} steps of the stream while {prompt} prompt tokens prefilled");
    s.stop_engine();
}

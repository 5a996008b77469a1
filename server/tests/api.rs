//! Every endpoint in-process (the router through `oneshot`), on the built-in model:
//! schemas, streaming, stop strings, logprobs, tokenize, metrics, slots.

mod common;
use common::*;
use serde_json::{json, Value};
use std::sync::{Arc, OnceLock};

/// One server for the tests of this file (4 slots, context 512).
fn srv() -> Arc<pn_server::Server> {
    static S: OnceLock<Arc<pn_server::Server>> = OnceLock::new();
    S.get_or_init(|| server(config(), spec(DEFAULT, 4, 512))).clone()
}

fn chat(content: &str, extra: Value) -> Value {
    let mut b = json!({"model": "test-model", "messages": [{"role": "user", "content": content}], "max_tokens": 24});
    b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    b
}

#[tokio::test]
async fn health_and_models() {
    let s = srv();
    let r = send(&s, "GET", "/health", None, &[]).await;
    assert_eq!((r.status.as_u16(), r.json()), (200, json!({"status": "ok"})));
    let m = send(&s, "GET", "/v1/models", None, &[]).await.json();
    assert_eq!(m["object"], "list");
    assert_eq!(m["data"][0]["id"], "test-model");
    assert_eq!(m["data"][0]["object"], "model");
    assert_eq!(m["data"][0]["meta"]["n_ctx"], 512);
    assert_eq!(send(&s, "GET", "/v1/models/test-model", None, &[]).await.json()["id"], "test-model");
    let r = send(&s, "GET", "/v1/models/gpt-4", None, &[]).await;
    assert_eq!(r.status.as_u16(), 404);
    assert_eq!(r.error()["code"], "model_not_found");
}

#[tokio::test]
async fn chat_completion_schema() {
    let s = srv();
    let r = post(&s, "/v1/chat/completions", &chat("def add(a, b):", json!({"seed": 5}))).await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    let v = r.json();
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(v["object"], "chat.completion");
    assert!(v["created"].as_u64().unwrap() > 1_600_000_000);
    assert_eq!(v["model"], "test-model");
    let c = &v["choices"][0];
    assert_eq!(c["index"], 0);
    assert_eq!(c["message"]["role"], "assistant");
    assert!(c["message"]["content"].is_string());
    assert!(c["logprobs"].is_null());
    let u = &v["usage"];
    let (p, n) = (u["prompt_tokens"].as_u64().unwrap(), u["completion_tokens"].as_u64().unwrap());
    assert_eq!(u["total_tokens"].as_u64().unwrap(), p + n);
    assert!(u["prompt_tokens_details"]["cached_tokens"].is_u64());
    match c["finish_reason"].as_str().unwrap() {
        "length" => assert_eq!(n, 24),
        "stop" => assert!(n < 24),
        f => panic!("finish_reason {f}"),
    }
}

#[tokio::test]
async fn streamed_chat_equals_whole() {
    let s = srv();
    let body = chat("import os\n", json!({"seed": 9, "temperature": 0.8, "top_p": 0.9, "top_k": 20}));
    let whole = post(&s, "/v1/chat/completions", &body).await.json();
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    sb["stream_options"] = json!({"include_usage": true});
    let r = post(&s, "/v1/chat/completions", &sb).await;
    assert_eq!(r.status.as_u16(), 200);
    assert!(r.headers["content-type"].to_str().unwrap().starts_with("text/event-stream"));
    let ev = r.events();
    let first: Value = serde_json::from_str(&ev[0]).unwrap();
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    let (text, finish, usage) = stream_text(&ev);
    assert_eq!(text, whole["choices"][0]["message"]["content"].as_str().unwrap());
    assert_eq!(finish.as_deref(), whole["choices"][0]["finish_reason"].as_str());
    let usage = usage.expect("include_usage sends a usage chunk");
    assert_eq!(usage["completion_tokens"], whole["usage"]["completion_tokens"]);
    // the usage chunk has no choices
    let last: Value = serde_json::from_str(&ev[ev.len() - 2]).unwrap();
    assert_eq!(last["choices"], json!([]));
}

#[tokio::test]
async fn completions_text_tokens_and_echo() {
    let s = srv();
    let r = post(&s, "/v1/completions", &json!({"prompt": "def fib(n):", "max_tokens": 12, "echo": true})).await;
    let v = r.json();
    assert_eq!(v["object"], "text_completion");
    let text = v["choices"][0]["text"].as_str().unwrap();
    assert!(text.starts_with("def fib(n):"), "echo: {text:?}");
    // the same prompt as token ids gives the same completion
    let ids = send(&s, "POST", "/tokenize", Some(r#"{"content": "def fib(n):"}"#), &[]).await.json()["tokens"].clone();
    let v2 = post(&s, "/v1/completions", &json!({"prompt": ids, "max_tokens": 12})).await.json();
    assert_eq!(format!("def fib(n):{}", v2["choices"][0]["text"].as_str().unwrap()), text);
    let r = post(&s, "/v1/completions", &json!({"prompt": "def fib(n):", "max_tokens": 12, "stream": true})).await;
    let (streamed, finish, _) = stream_text(&r.events());
    assert_eq!(streamed, v2["choices"][0]["text"].as_str().unwrap());
    assert_eq!(finish.as_deref(), v2["choices"][0]["finish_reason"].as_str());
}

#[tokio::test]
async fn stop_strings_are_never_emitted() {
    let s = srv();
    let base = json!({"prompt": "class Stack:\n    def __init__(self):", "max_tokens": 40});
    let full = post(&s, "/v1/completions", &base).await.json()["choices"][0]["text"].as_str().unwrap().to_string();
    assert!(full.len() > 20, "need some text to cut: {full:?}");
    // a stop string that starts inside one token and ends in another
    let cut = full.char_indices().map(|(i, _)| i).find(|&i| i >= full.len() / 2).unwrap();
    let stop: String = full[cut..].chars().take(3).collect();
    let want = &full[..full.find(&stop).unwrap()];
    for stream in [false, true] {
        let mut b = base.clone();
        b["stop"] = json!([stop, "never-appears-xyz"]);
        b["stream"] = json!(stream);
        let r = post(&s, "/v1/completions", &b).await;
        let (text, finish) = if stream {
            let (t, f, _) = stream_text(&r.events());
            (t, f.unwrap())
        } else {
            let v = r.json();
            (v["choices"][0]["text"].as_str().unwrap().to_string(), v["choices"][0]["finish_reason"].as_str().unwrap().to_string())
        };
        assert_eq!((text.as_str(), finish.as_str()), (want, "stop"), "stop {stop:?}, stream {stream}");
    }
    // logprobs cover the emitted text: every token before the stop string, and the one it starts in
    let mut b = base.clone();
    b["stop"] = json!(stop);
    b["logprobs"] = json!(0);
    let v = post(&s, "/v1/completions", &b).await.json();
    let toks: String = v["choices"][0]["logprobs"]["tokens"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    assert!(toks.starts_with(want) && toks.len() < want.len() + stop.len() + 16, "{toks:?} vs {want:?}");
}

#[tokio::test]
async fn logprobs_chat_and_completions() {
    let s = srv();
    let v = post(&s, "/v1/chat/completions", &chat("x = [", json!({"logprobs": true, "top_logprobs": 3, "max_tokens": 8}))).await.json();
    let lp = v["choices"][0]["logprobs"]["content"].as_array().unwrap().clone();
    assert_eq!(lp.len() as u64, v["usage"]["completion_tokens"].as_u64().unwrap());
    let text: String = lp.iter().map(|e| e["token"].as_str().unwrap()).collect();
    assert_eq!(text, v["choices"][0]["message"]["content"].as_str().unwrap());
    for e in &lp {
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        // greedy: the chosen token is the most likely
        assert_eq!(e["logprob"], top[0]["logprob"]);
        assert!(e["logprob"].as_f64().unwrap() <= 0.0);
        let mass: f64 = top.iter().map(|t| t["logprob"].as_f64().unwrap().exp()).sum();
        assert!(mass <= 1.0 + 1e-4);
        assert!(e["bytes"].is_array());
    }
    let v = post(&s, "/v1/completions", &json!({"prompt": "x = [", "max_tokens": 6, "logprobs": 2})).await.json();
    let l = &v["choices"][0]["logprobs"];
    let n = l["tokens"].as_array().unwrap().len();
    assert_eq!(n as u64, v["usage"]["completion_tokens"].as_u64().unwrap());
    assert_eq!(l["token_logprobs"].as_array().unwrap().len(), n);
    assert_eq!(l["top_logprobs"][0].as_object().unwrap().len(), 2);
    assert_eq!(l["text_offset"][0], 0);
}

#[tokio::test]
async fn tokenize_detokenize_round_trip() {
    let s = srv();
    let t = send(&s, "POST", "/tokenize", Some(r#"{"content": "def main():\n    pass"}"#), &[]).await.json();
    let ids = t["tokens"].clone();
    assert!(ids.as_array().unwrap().len() > 3);
    let d = post(&s, "/detokenize", &json!({"tokens": ids})).await.json();
    assert_eq!(d["content"], "def main():\n    pass");
    let p = send(&s, "POST", "/tokenize", Some(r#"{"content": "<|im_start|>x", "with_pieces": true}"#), &[]).await.json();
    assert_eq!(p["tokens"][0]["piece"], "<|im_start|>");
    let r = post(&s, "/detokenize", &json!({"tokens": [1, 999999]})).await;
    assert_eq!(r.status.as_u16(), 400);
    assert!(r.error()["message"].as_str().unwrap().contains("tokens[1]"));
}

#[tokio::test]
async fn metrics_and_slots() {
    let s = srv();
    post(&s, "/v1/chat/completions", &chat("print(", json!({}))).await;
    let m = send(&s, "GET", "/metrics", None, &[]).await;
    assert!(m.headers["content-type"].to_str().unwrap().starts_with("text/plain"));
    let t = m.text();
    for name in [
        "pn_requests_total{status=\"200\"}",
        "pn_prompt_tokens_total",
        "pn_prompt_cache_hit_tokens_total",
        "pn_generated_tokens_total",
        "pn_time_to_first_token_seconds_bucket",
        "pn_inter_token_seconds_count",
        "pn_queue_depth",
        "pn_slots_busy",
        "pn_tokens_per_second",
    ] {
        assert!(t.contains(name), "metrics lack {name}:\n{t}");
    }
    let v = send(&s, "GET", "/slots", None, &[]).await.json();
    let slots = v["slots"].as_array().unwrap();
    assert_eq!(slots.len(), 4);
    assert!(slots.iter().all(|x| x["slot"].is_u64() && x["state"].is_string()));
}

#[tokio::test]
async fn cors_preflight_allows_the_origin() {
    let mut cfg = config();
    cfg.cors = vec!["http://localhost:3000".into()];
    let s = server(cfg, spec(DEFAULT, 1, 128));
    let h = [("origin", "http://localhost:3000"), ("access-control-request-method", "POST"), ("access-control-request-headers", "content-type,authorization")];
    let r = send(&s, "OPTIONS", "/v1/chat/completions", None, &h).await;
    assert!(r.status.is_success(), "{}", r.status);
    assert_eq!(r.headers["access-control-allow-origin"], "http://localhost:3000");
    let r = send(&s, "GET", "/v1/models", None, &[("origin", "http://evil.example")]).await;
    assert!(!r.headers.contains_key("access-control-allow-origin"));
    s.stop_engine();
}

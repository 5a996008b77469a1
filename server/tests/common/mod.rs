//! Shared helpers of the server tests: a model spec from a GGUF, a server, requests
//! through the router in-process (`tower::ServiceExt::oneshot`), SSE parsing.
#![allow(dead_code)]

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use pn_engine::prefix_cache::PrefixCacheConfig;
use pn_engine::state::kv::StateConfig;
use pn_engine::tokenizer::Tokenizer;
use pn_engine::{Gguf, Runner};
use pn_server::{Defaults, ModelSpec, Server, ServerConfig};
use serde_json::Value;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tower::ServiceExt;

pub fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}
/// The built-in default model.
pub const DEFAULT: &str = "models/default/pn-default-code-q4_k_m.gguf";
/// A qwen35moe fixture with K-quants (random weights, ChatML template).
pub const KTINY: &str = "tests/fixtures/ktiny-q4_k_m.gguf";

pub fn spec(model: &str, slots: usize, ctx: usize) -> ModelSpec {
    let g = Arc::new(Gguf::open(&repo(model)).expect("model opens"));
    let m = pn_models::load(&g).expect("model loads");
    let mut runner = Runner::new(m, g.clone(), Arc::new(pn_cpu::CpuBackend::new(2))).expect("runner builds");
    // two lanes, as `pn serve` runs these small files (tools/src/load.rs)
    pn_cpu::add_lanes(&mut runner, 2).expect("lanes start");
    let tokenizer = Tokenizer::from_gguf(&g).expect("tokenizer");
    ModelSpec {
        id: "test-model".into(),
        name: model.into(),
        runner,
        tokenizer,
        state: StateConfig { max_seq: ctx, ..StateConfig::default() },
        slots,
        cache: PrefixCacheConfig::default(),
        prefill_chunk: 256,
        async_steps: false,
        step_budget: 1.5,
        draft: None,
        wave_tokens: pn_server::DEFAULT_WAVE_TOKENS,
    }
}

pub fn config() -> ServerConfig {
    ServerConfig {
        host: "127.0.0.1".into(),
        port: 0,
        api_key: None,
        cors: vec![],
        queue: 64,
        max_body: ServerConfig::DEFAULT_MAX_BODY,
        grace: Duration::from_secs(5),
        defaults: Defaults { sampler: pn_engine::sampler::SamplerConfig::greedy(), seed: Some(1) },
    }
}

pub fn server(cfg: ServerConfig, spec: ModelSpec) -> Arc<Server> {
    Server::with_model(cfg, spec).expect("server starts")
}

pub struct Reply {
    pub status: StatusCode,
    pub headers: axum::http::HeaderMap,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    /// The `data:` payloads of an SSE body.
    pub fn events(&self) -> Vec<String> {
        self.text().split("\n\n").filter_map(|e| e.strip_prefix("data: ")).map(str::to_string).collect()
    }
    /// The error object of an OpenAI-style error body.
    pub fn error(&self) -> Value {
        let v = self.json();
        let e = v["error"].clone();
        assert!(e["message"].is_string() && e["type"].is_string(), "not an OpenAI error: {v}");
        assert!(e.get("param").is_some() && e.get("code").is_some(), "error lacks param/code: {v}");
        e
    }
}

pub async fn send(s: &Arc<Server>, method: &str, path: &str, body: Option<&str>, headers: &[(&str, &str)]) -> Reply {
    let mut b = Request::builder().method(method).uri(path);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let req = b.body(body.map(|s| Body::from(s.to_string())).unwrap_or_else(Body::empty)).unwrap();
    let r = s.router().oneshot(req).await.expect("infallible");
    let status = r.status();
    let headers = r.headers().clone();
    let body = r.into_body().collect().await.expect("body").to_bytes().to_vec();
    Reply { status, headers, body }
}

pub async fn post(s: &Arc<Server>, path: &str, body: &Value) -> Reply {
    send(s, "POST", path, Some(&body.to_string()), &[]).await
}

/// Text of a streamed chat (content deltas) or completion (text), its finish reason, and
/// the usage chunk.
pub fn stream_text(events: &[String]) -> (String, Option<String>, Option<Value>) {
    let (mut text, mut finish, mut usage) = (String::new(), None, None);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "stream ends with [DONE]");
    for e in &events[..events.len() - 1] {
        let v: Value = serde_json::from_str(e).unwrap();
        assert!(v.get("error").is_none(), "error in stream: {v}");
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            usage = Some(u.clone());
        }
        for c in v["choices"].as_array().unwrap() {
            if let Some(t) = c["delta"]["content"].as_str().or(c["text"].as_str()) {
                text.push_str(t);
            }
            if let Some(f) = c["finish_reason"].as_str() {
                finish = Some(f.to_string());
            }
        }
    }
    (text, finish, usage)
}

/// Poll until `f` holds (bounded: 10 s), or fail with `what`.
pub async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..1000 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for: {what}");
}

/// One greedy stream of 1500 tokens on `s`, then a ~2300-token prompt sent while it runs:
/// the engine steps of the stream (`decode_steps`) while that prompt prefilled, and the
/// prompt's tokens. Asserts that both complete and that the stream outlasted the prefill
/// (what a test of the prefill's share of the steps needs).
pub async fn steps_during_a_long_prompt(s: &Arc<Server>) -> (u64, u64) {
    let stream = {
        let s = s.clone();
        tokio::spawn(async move { post(&s, "/v1/completions", &serde_json::json!({"prompt": "def parse_args(argv):", "max_tokens": 1500, "temperature": 0, "ignore_eos": true})).await })
    };
    let steps = || s.shared().metrics.decode_steps.load(std::sync::atomic::Ordering::Relaxed);
    eventually("the stream runs", || steps() > 2).await;
    let long: String = (0..250).map(|j| format!("x{j} = {j}\n")).collect();
    let s0 = steps();
    let b = post(s, "/v1/completions", &serde_json::json!({"prompt": long, "max_tokens": 1, "ignore_eos": true})).await;
    let during = steps() - s0;
    assert_eq!(b.status, 200, "{}", b.text());
    let prompt = b.json()["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(prompt > 1200, "{prompt} prompt tokens");
    let a = stream.await.unwrap();
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.json()["usage"]["completion_tokens"].as_u64(), Some(1500), "the stream outlasts the prefill");
    eprintln!("{during} steps of the stream while {prompt} prompt tokens prefilled");
    (during, prompt)
}

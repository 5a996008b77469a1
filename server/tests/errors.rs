//! Every error class, in-process: OpenAI's error object with the right status, a message
//! that names the field, range and value; nothing a client sends panics the server or
//! leaks a slot.

mod common;
use common::*;
use serde_json::json;
use std::sync::{Arc, OnceLock};

fn srv() -> Arc<pn_server::Server> {
    static S: OnceLock<Arc<pn_server::Server>> = OnceLock::new();
    S.get_or_init(|| server(config(), spec(DEFAULT, 2, 128))).clone()
}

async fn bad(path: &str, body: &str, status: u16) -> serde_json::Value {
    let r = send(&srv(), "POST", path, Some(body), &[]).await;
    assert_eq!(r.status.as_u16(), status, "{path} {body}: {}", r.text());
    r.error()
}

#[tokio::test]
async fn malformed_and_unknown_fields_are_400() {
    let e = bad("/v1/chat/completions", "{\"messages\": [", 400).await;
    assert!(e["message"].as_str().unwrap().contains("malformed JSON"), "{e}");
    assert_eq!(e["type"], "invalid_request_error");
    let e = bad("/v1/chat/completions", r#"{"messages": [{"role": "user", "content": "x"}], "temprature": 1}"#, 400).await;
    assert!(e["message"].as_str().unwrap().contains("temprature"), "{e}");
    let e = bad("/v1/chat/completions", r#"{"messages": [{"role": "user", "content": "x"}], "top_p": "high"}"#, 400).await;
    assert_eq!(e["param"], "top_p");
    let e = bad("/v1/completions", r#"{"messages": []}"#, 400).await;
    assert_eq!(e["param"], "messages");
    bad("/v1/chat/completions", "[1, 2]", 400).await;
    bad("/v1/chat/completions", "", 400).await;
    bad("/tokenize", r#"{"text": "x"}"#, 400).await;
}

#[tokio::test]
async fn out_of_range_values_name_field_range_and_value() {
    let msgs = json!([{"role": "user", "content": "x"}]);
    for (field, value, range) in [
        ("temperature", json!(2.5), "[0, 2]"),
        ("top_p", json!(0), "(0, 1]"),
        ("min_p", json!(-0.1), "[0, 1]"),
        ("presence_penalty", json!(3), "[-2, 2]"),
        ("frequency_penalty", json!(-2.5), "[-2, 2]"),
        ("repetition_penalty", json!(0), "(0, 10]"),
        ("max_tokens", json!(0), "[1,"),
        ("top_k", json!(-3), "[-1,"),
        ("top_logprobs", json!(21), "[0, 20]"),
    ] {
        let mut b = json!({"messages": msgs, "logprobs": true});
        b[field] = value.clone();
        let e = bad("/v1/chat/completions", &b.to_string(), 400).await;
        let m = e["message"].as_str().unwrap();
        assert_eq!(e["param"], field, "{m}");
        assert!(m.contains(range) && m.contains(&value.to_string()), "{field}: {m}");
    }
    let e = bad("/v1/chat/completions", &json!({"messages": msgs, "n": 3}).to_string(), 400).await;
    assert!(e["message"].as_str().unwrap().contains("found 3"));
    let e = bad("/v1/chat/completions", &json!({"messages": [{"role": "robot", "content": "x"}]}).to_string(), 400).await;
    assert_eq!(e["param"], "messages[0].role");
    let e = bad("/v1/chat/completions", &json!({"messages": msgs, "stop": ["ok", 5]}).to_string(), 400).await;
    assert_eq!(e["param"], "stop");
    bad("/v1/completions", &json!({"prompt": [1, 99999]}).to_string(), 400).await;
    bad("/v1/chat/completions", &json!({"messages": msgs, "tools": [{"type": "function"}]}).to_string(), 400).await;
}

#[tokio::test]
async fn context_overflow_gives_the_numbers() {
    let long = "x = 1\n".repeat(100);
    let e = bad("/v1/completions", &json!({"prompt": long}).to_string(), 400).await;
    assert_eq!(e["code"], "context_length_exceeded");
    assert!(e["message"].as_str().unwrap().contains("128 tokens"), "{e}");
    let e = bad("/v1/completions", &json!({"prompt": "x = 1", "max_tokens": 500}).to_string(), 400).await;
    let m = e["message"].as_str().unwrap();
    assert!(m.contains("128") && m.contains("500"), "{m}");
}

#[tokio::test]
async fn unknown_route_method_and_model() {
    let s = srv();
    let r = send(&s, "GET", "/v2/nothing", None, &[]).await;
    assert_eq!(r.status.as_u16(), 404);
    assert!(r.error()["message"].as_str().unwrap().contains("/v2/nothing"));
    let r = send(&s, "GET", "/v1/chat/completions", None, &[]).await;
    assert_eq!(r.status.as_u16(), 405);
    r.error();
    let e = bad("/v1/chat/completions", &json!({"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}).to_string(), 404).await;
    assert_eq!(e["code"], "model_not_found");
}

#[tokio::test]
async fn api_key_is_required_except_for_health() {
    let mut cfg = config();
    cfg.api_key = Some("sesame".into());
    let s = server(cfg, spec(DEFAULT, 1, 128));
    assert_eq!(send(&s, "GET", "/health", None, &[]).await.status.as_u16(), 200);
    let r = send(&s, "GET", "/v1/models", None, &[]).await;
    assert_eq!(r.status.as_u16(), 401);
    assert_eq!(r.error()["type"], "authentication_error");
    let r = send(&s, "GET", "/v1/models", None, &[("authorization", "Bearer sesamE")]).await;
    assert_eq!(r.status.as_u16(), 401);
    let r = send(&s, "GET", "/metrics", None, &[("authorization", "Bearer sesame")]).await;
    assert_eq!(r.status.as_u16(), 200);
    s.stop_engine();
}

#[tokio::test]
async fn body_over_the_limit_is_413() {
    let mut cfg = config();
    cfg.max_body = 1000;
    let s = server(cfg, spec(DEFAULT, 1, 128));
    let big = json!({"prompt": "a".repeat(2000)}).to_string();
    let r = send(&s, "POST", "/v1/completions", Some(&big), &[]).await;
    assert_eq!(r.status.as_u16(), 413);
    assert!(r.error()["message"].as_str().unwrap().contains("1000 bytes"));
    s.stop_engine();
}

#[tokio::test]
async fn loading_and_shutting_down_are_503() {
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let (done_tx, done) = std::sync::mpsc::channel();
    let s = pn_server::Server::start(
        config(),
        move || {
            let _ = wait.recv();
            Ok(spec(DEFAULT, 1, 128))
        },
        move |r| {
            let _ = done_tx.send(r.is_ok());
        },
    )
    .unwrap();
    assert_eq!(send(&s, "GET", "/health", None, &[]).await.status.as_u16(), 503);
    let r = send(&s, "POST", "/v1/completions", Some(r#"{"prompt": "x"}"#), &[]).await;
    assert_eq!(r.status.as_u16(), 503);
    assert!(r.headers.contains_key("retry-after"));
    go.send(()).unwrap();
    assert!(done.recv().unwrap());
    assert_eq!(send(&s, "GET", "/health", None, &[]).await.status.as_u16(), 200);
    s.begin_shutdown();
    let r = send(&s, "POST", "/v1/completions", Some(r#"{"prompt": "x", "max_tokens": 2}"#), &[]).await;
    assert_eq!(r.status.as_u16(), 503);
    assert!(r.error()["message"].as_str().unwrap().contains("shutting down"));
    s.stop_engine();
}

#[tokio::test]
async fn hostile_bodies_never_panic_or_leak_a_slot() {
    let s = srv();
    let deep = format!("{}{}", "[".repeat(5000), "]".repeat(5000));
    let bodies = [
        deep.as_str(),
        "null",
        "{\"messages\": null}",
        "{\"messages\": [{\"role\": \"user\"}]}",
        "{\"messages\": [{\"role\": \"user\", \"content\": {\"a\": 1}}]}",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"\\ud800\"}]}",
        "{\"prompt\": \"x\", \"seed\": 1e400}",
        "{\"prompt\": \"x\", \"max_tokens\": 18446744073709551616}",
        "{\"prompt\": \"x\", \"logit_bias\": {\"abc\": 1}}",
        "{\"prompt\": \"x\", \"timeout\": -1}",
        "{\"prompt\": [[1, 2], [3]]}",
        "\u{0}\u{1}\u{2}",
    ];
    for b in bodies {
        for path in ["/v1/chat/completions", "/v1/completions"] {
            let r = send(&s, "POST", path, Some(b), &[]).await;
            assert!(r.status.is_client_error() || r.status.is_success(), "{path} {b:.40}: {}", r.status);
            if !r.status.is_success() {
                r.error();
            }
        }
    }
    // a message without content renders as empty: a real generation, which must end
    let ok = send(&s, "POST", "/v1/chat/completions", Some(r#"{"messages": [{"role": "user"}], "max_tokens": 2}"#), &[]).await;
    assert_eq!(ok.status.as_u16(), 200);
    let sh = s.shared().clone();
    eventually("every slot idle", || sh.slots.lock().unwrap().iter().all(|v| v.state == "idle")).await;
    assert_eq!(send(&s, "GET", "/health", None, &[]).await.status.as_u16(), 200);
}

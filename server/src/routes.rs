//! The HTTP routes: OpenAI's /v1 endpoints, health, metrics, tokenize / detokenize,
//! slots; the API key check, status counting, body limit, CORS and tracing layers.

use crate::engine::{Job, ModelInfo};
use crate::error::ApiError;
use crate::params::{self, Endpoint, Prompt, Request};
use crate::prompt;
use crate::respond::{self, Reply};
use crate::Server;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Request as HttpRequest, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tower_http::cors::{AllowOrigin, Any, CorsLayer};
use tower_http::trace::TraceLayer;

type S = State<Arc<Server>>;

pub fn router(s: Arc<Server>) -> Router {
    let api = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/metrics", get(metrics))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/slots", get(slots))
        .route_layer(middleware::from_fn_with_state(s.clone(), auth));
    let mut r = Router::new()
        .merge(api)
        .route("/health", get(health))
        .merge(crate::web::router())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(s.cfg.max_body))
        .layer(middleware::from_fn_with_state(s.clone(), count_status))
        .layer(TraceLayer::new_for_http());
    if !s.cfg.cors.is_empty() {
        let origin = if s.cfg.cors.iter().any(|o| o == "*") {
            AllowOrigin::any()
        } else {
            AllowOrigin::list(s.cfg.cors.iter().filter_map(|o| HeaderValue::from_str(o).ok()))
        };
        r = r.layer(CorsLayer::new().allow_origin(origin).allow_methods([Method::GET, Method::POST, Method::OPTIONS]).allow_headers(Any));
    }
    r.with_state(s)
}

/// Equal without an early exit: the time does not tell how much of the key was right.
fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() ^ b.len()) as u64;
    for i in 0..a.len().max(b.len()) {
        diff |= (a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0xff)) as u64;
    }
    diff == 0
}

async fn auth(State(s): S, req: HttpRequest, next: Next) -> Response {
    let Some(key) = &s.cfg.api_key else { return next.run(req).await };
    let given = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    match given {
        Some(g) if ct_eq(g.trim().as_bytes(), key.as_bytes()) => next.run(req).await,
        Some(_) => ApiError::unauthorized("incorrect API key provided").into_response(),
        None => ApiError::unauthorized("missing API key: send the header `Authorization: Bearer KEY`").into_response(),
    }
}

async fn count_status(State(s): S, req: HttpRequest, next: Next) -> Response {
    let r = next.run(req).await;
    s.shared.metrics.record_status(r.status().as_u16());
    r
}

async fn not_found(req: HttpRequest) -> ApiError {
    ApiError::not_found(format!("unknown route {} {}", req.method(), req.uri().path()))
}

async fn method_not_allowed(req: HttpRequest) -> ApiError {
    ApiError::method_not_allowed(format!("{} is not allowed on {}", req.method(), req.uri().path()))
}

async fn health(State(s): S) -> Response {
    let unavailable = |status: &str| (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"status": status}))).into_response();
    match s.shared.info.get() {
        _ if s.engine_stopped() => unavailable("error: the engine thread has stopped"),
        Some(_) => Json(json!({"status": "ok"})).into_response(),
        None => unavailable("loading"),
    }
}

fn model_json(m: &ModelInfo) -> serde_json::Value {
    json!({
        "id": m.id, "object": "model", "created": m.created, "owned_by": "pantheon",
        "meta": {"name": m.name, "n_ctx": m.n_ctx, "n_vocab": m.tokenizer.n_vocab(), "slots": m.n_slots},
    })
}

async fn models(State(s): S) -> Result<Json<serde_json::Value>, ApiError> {
    let m = s.model()?;
    Ok(Json(json!({"object": "list", "data": [model_json(&m)]})))
}

async fn model(State(s): S, Path(id): Path<String>) -> Result<Json<serde_json::Value>, ApiError> {
    let m = s.model()?;
    if id != m.id {
        return Err(ApiError::model_not_found(&id, &m.id));
    }
    Ok(Json(model_json(&m)))
}

async fn metrics(State(s): S) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], s.shared.metrics.render()).into_response()
}

async fn slots(State(s): S) -> Json<serde_json::Value> {
    let v = s.shared.slots.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let queued = s.shared.metrics.queue_depth.load(std::sync::atomic::Ordering::Relaxed);
    Json(json!({"slots": v, "queued": queued}))
}

/// The body, or 413 / 400 as OpenAI errors.
fn body(s: &Server, b: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    b.map_err(|e| if e.status() == StatusCode::PAYLOAD_TOO_LARGE { ApiError::too_large(s.cfg.max_body) } else { ApiError::bad_request(e.body_text()) })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenizeReq {
    content: String,
    #[serde(default)]
    add_special: bool,
    #[serde(default)]
    with_pieces: bool,
}

async fn tokenize(State(s): S, b: Result<Bytes, BytesRejection>) -> Result<Json<serde_json::Value>, ApiError> {
    let r: TokenizeReq = params::parse(&body(&s, b)?)?;
    let tok = s.model()?.tokenizer.clone();
    let ids = tokio::task::spawn_blocking(move || {
        let mut ids: Vec<u32> = if r.add_special && tok.add_bos() { tok.bos().into_iter().collect() } else { vec![] };
        ids.extend(tok.encode(&r.content, true));
        if r.with_pieces {
            json!(ids.iter().map(|&i| json!({"id": i, "piece": String::from_utf8_lossy(tok.token_piece(i, true))})).collect::<Vec<_>>())
        } else {
            json!(ids)
        }
    })
    .await
    .map_err(|e| ApiError::internal(format!("tokenize: {e}")))?;
    Ok(Json(json!({"tokens": ids})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DetokenizeReq {
    tokens: Vec<i64>,
}

async fn detokenize(State(s): S, b: Result<Bytes, BytesRejection>) -> Result<Json<serde_json::Value>, ApiError> {
    let r: DetokenizeReq = params::parse(&body(&s, b)?)?;
    let tok = s.model()?.tokenizer.clone();
    let n = tok.n_vocab();
    let ids: Vec<u32> = r
        .tokens
        .iter()
        .enumerate()
        .map(|(i, &t)| u32::try_from(t).ok().filter(|&x| (x as usize) < n).ok_or_else(|| ApiError::invalid("tokens", format!("tokens[{i}]: expected a token id in [0, {n}), found {t}"))))
        .collect::<Result<_, _>>()?;
    Ok(Json(json!({"content": tok.decode(&ids)})))
}

/// A generation request checked up to the prompt: the model, the body, the parameters.
struct Prepared {
    info: Arc<ModelInfo>,
    req: Request,
    params: params::GenParams,
    deadline: Option<Instant>,
}

fn prepare(s: &Server, headers: &HeaderMap, b: Result<Bytes, BytesRejection>, ep: Endpoint) -> Result<Prepared, ApiError> {
    let b = body(s, b)?;
    let info = s.model()?;
    let req = params::parse::<Request>(&b)?;
    if let Some(m) = &req.model {
        if *m != info.id {
            return Err(ApiError::model_not_found(m, &info.id));
        }
    }
    let params = req.gen_params(ep, &s.cfg.defaults, info.tokenizer.n_vocab())?;
    let header_timeout = match headers.get("x-request-timeout") {
        None => None,
        Some(v) => Some(v.to_str().ok().and_then(|t| t.trim().parse::<f64>().ok()).filter(|t| t.is_finite() && *t > 0.0).ok_or_else(|| {
            ApiError::invalid("x-request-timeout", format!("x-request-timeout: expected seconds > 0, found {v:?}"))
        })?),
    };
    let timeout = params.timeout.or(header_timeout.map(Duration::from_secs_f64));
    Ok(Prepared { info, req, params, deadline: timeout.map(|t| Instant::now() + t) })
}

/// 400 when the prompt leaves no room, or prompt + max_tokens exceeds the context.
fn check_context(info: &ModelInfo, n_prompt: usize, max_tokens: Option<usize>) -> Result<(), ApiError> {
    if info.ring {
        return Ok(());
    }
    let n_ctx = info.n_ctx;
    if n_prompt >= n_ctx {
        return Err(ApiError::context_overflow(format!(
            "this model's context holds {n_ctx} tokens, but the prompt has {n_prompt} tokens, which leaves no room for the completion"
        )));
    }
    if let Some(m) = max_tokens {
        if n_prompt + m > n_ctx {
            return Err(ApiError::context_overflow(format!(
                "this model's context holds {n_ctx} tokens, but {} were requested ({n_prompt} in the prompt, {m} for the completion): lower max_tokens to at most {}",
                n_prompt + m,
                n_ctx - n_prompt
            )));
        }
    }
    Ok(())
}

/// Tokenize off the async threads (a long prompt takes milliseconds).
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, ApiError> + Send + 'static) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| ApiError::internal(format!("tokenizer task: {e}")))?
}

/// Queue the job and answer (stream or whole).
async fn launch(s: &Server, p: Prepared, ep: Endpoint, tokens: Vec<u32>, text: Option<String>, reasoning: (bool, bool)) -> Result<Response, ApiError> {
    check_context(&p.info, tokens.len(), p.params.max_tokens)?;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let id = s.request_id(if ep == Endpoint::Chat { "chatcmpl" } else { "cmpl" });
    let echo = (ep == Endpoint::Completions && p.req.echo == Some(true)).then(|| text.clone().unwrap_or_else(|| p.info.tokenizer.decode(&tokens)));
    if echo.is_some() && p.params.logprobs.is_some() {
        return Err(ApiError::invalid("echo", "echo: with logprobs is not supported (prompt logprobs are not computed)"));
    }
    let reply = Reply { id: id.clone(), ep, model: p.info.id.clone(), created: now_secs(), include_usage: p.req.include_usage(), echo, logprobs: p.params.logprobs.is_some() };
    let stream = p.req.stream();
    let prediction = match p.params.prediction.clone() {
        // a predicted output can be a whole file: tokenized off the async threads too
        Some(text) => {
            let tok = p.info.tokenizer.clone();
            Some(blocking(move || Ok(tok.encode(&text, false))).await?.into())
        }
        None => None,
    };
    s.submit(Job { id, tokens, text, params: p.params, reasoning, events: tx, arrived: Instant::now(), deadline: p.deadline, prediction })?;
    if stream {
        Ok(respond::stream(reply, rx))
    } else {
        respond::whole(reply, rx).await
    }
}

fn now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

async fn chat(State(s): S, headers: HeaderMap, b: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let p = prepare(&s, &headers, b, Endpoint::Chat)?;
    let msgs = params::chat_messages(p.req.messages.as_deref())?;
    let (tok, srv) = (p.info.tokenizer.clone(), s.clone());
    let (text, tokens, reasoning) = blocking(move || {
        let text = prompt::render_chat(&tok, &msgs)?;
        let tokens = srv.shared.index.tokenize(&tok, &text);
        let r = prompt::reasoning(&tok, &text);
        Ok((text, tokens, r))
    })
    .await?;
    launch(&s, p, Endpoint::Chat, tokens, Some(text), reasoning).await
}

async fn completions(State(s): S, headers: HeaderMap, b: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let p = prepare(&s, &headers, b, Endpoint::Completions)?;
    let (tok, srv) = (p.info.tokenizer.clone(), s.clone());
    let (tokens, text) = match params::completion_prompt(p.req.prompt.as_ref(), tok.n_vocab())? {
        Prompt::Tokens(t) => (t, None),
        Prompt::Text(text) => blocking(move || Ok((srv.shared.index.tokenize(&tok, &text), Some(text)))).await?,
    };
    launch(&s, p, Endpoint::Completions, tokens, text, (false, false)).await
}

#[cfg(test)]
mod tests {
    use super::ct_eq;

    #[test]
    fn constant_time_compare() {
        assert!(ct_eq(b"secret", b"secret"));
        assert!(!ct_eq(b"secret", b"secreT"));
        assert!(!ct_eq(b"secret", b"secre"));
        assert!(!ct_eq(b"", b"x"));
        assert!(ct_eq(b"", b""));
    }
}

//! Engine events → OpenAI responses: a whole `chat.completion` / `text_completion`, or
//! an SSE stream of chunks ending in `data: [DONE]`.

use crate::engine::{Event, Usage};
use crate::error::ApiError;
use crate::generation::{Alt, Finish, TokenLogprob};
use crate::params::Endpoint;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, StreamExt};
use serde_json::{json, Value};
use std::convert::Infallible;
use tokio::sync::mpsc::UnboundedReceiver;

/// What every chunk or response of one request carries.
pub struct Reply {
    pub id: String,
    pub ep: Endpoint,
    pub model: String,
    pub created: u64,
    pub include_usage: bool,
    /// Completions with `echo`: the prompt text, sent before the completion.
    pub echo: Option<String>,
    /// Logprobs were asked for.
    pub logprobs: bool,
}

fn usage_json(u: &Usage) -> Value {
    let mut v = json!({
        "prompt_tokens": u.prompt,
        "completion_tokens": u.completion,
        "total_tokens": u.prompt + u.completion,
        "prompt_tokens_details": {"cached_tokens": u.cached},
    });
    if let Some((accepted, rejected)) = u.predicted {
        v["completion_tokens_details"] = json!({"accepted_prediction_tokens": accepted, "rejected_prediction_tokens": rejected});
    }
    v
}

fn alt_json(a: &Alt) -> Value {
    json!({"token": a.text, "logprob": a.logprob, "bytes": a.bytes})
}

/// Chat logprobs: `{"content": [{token, logprob, bytes, top_logprobs}], "refusal": null}`.
fn chat_logprobs(lp: &[TokenLogprob]) -> Value {
    let content: Vec<Value> = lp
        .iter()
        .map(|l| {
            let mut v = alt_json(&l.token);
            v["top_logprobs"] = l.top.iter().map(alt_json).collect();
            v
        })
        .collect();
    json!({"content": content, "refusal": null})
}

/// Completions logprobs: parallel lists; `text_offset` counts from `base` bytes.
fn completion_logprobs(lp: &[TokenLogprob], base: usize) -> Value {
    json!({
        "tokens": lp.iter().map(|l| l.token.text.clone()).collect::<Vec<_>>(),
        "token_logprobs": lp.iter().map(|l| l.token.logprob).collect::<Vec<_>>(),
        "top_logprobs": lp.iter().map(|l| l.top.iter().map(|a| (a.text.clone(), json!(a.logprob))).collect::<serde_json::Map<_, _>>()).collect::<Vec<_>>(),
        "text_offset": lp.iter().map(|l| base + l.offset).collect::<Vec<_>>(),
    })
}

impl Reply {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.ep, chunk) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completions, _) => "text_completion",
        }
    }
    fn envelope(&self, chunk: bool, choices: Value) -> Value {
        json!({"id": self.id, "object": self.object(chunk), "created": self.created, "model": self.model, "system_fingerprint": null, "choices": choices})
    }
    fn echo_len(&self) -> usize {
        self.echo.as_ref().map_or(0, String::len)
    }
    /// One choice of a stream chunk.
    fn chunk_choice(&self, content: &str, reasoning: &str, lp: &[TokenLogprob], finish: Option<Finish>, role: bool) -> Value {
        let lp_json = |f: fn(&[TokenLogprob]) -> Value| if lp.is_empty() { Value::Null } else { f(lp) };
        let finish = finish.map(Finish::as_str);
        match self.ep {
            Endpoint::Chat => {
                let mut delta = serde_json::Map::new();
                if role {
                    delta.insert("role".into(), json!("assistant"));
                }
                if !content.is_empty() || role {
                    delta.insert("content".into(), json!(content));
                }
                if !reasoning.is_empty() {
                    delta.insert("reasoning_content".into(), json!(reasoning));
                }
                json!({"index": 0, "delta": delta, "logprobs": lp_json(chat_logprobs), "finish_reason": finish})
            }
            Endpoint::Completions => {
                let lp = if lp.is_empty() { Value::Null } else { completion_logprobs(lp, self.echo_len()) };
                json!({"index": 0, "text": content, "logprobs": lp, "finish_reason": finish})
            }
        }
    }
    fn chunk(&self, choice: Value) -> SseEvent {
        let mut v = self.envelope(true, json!([choice]));
        if self.include_usage {
            v["usage"] = Value::Null;
        }
        SseEvent::default().data(v.to_string())
    }
}

/// The SSE stream of a request: chunks as the engine sends them, the usage chunk when
/// asked for, `[DONE]`. Dropping it (the client went away) closes the event channel,
/// which cancels the generation.
pub fn stream(reply: Reply, rx: UnboundedReceiver<Event>) -> Response {
    let state = (reply, Some(rx), true);
    let s = stream::unfold(state, |(r, rx, first)| async move {
        let mut rx = rx?;
        let mut out: Vec<SseEvent> = Vec::new();
        if first {
            if r.ep == Endpoint::Chat {
                out.push(r.chunk(r.chunk_choice("", "", &[], None, true)));
            } else if let Some(e) = &r.echo {
                out.push(r.chunk(r.chunk_choice(e, "", &[], None, false)));
            }
        }
        let done = match rx.recv().await {
            Some(Event::Delta(d)) => {
                out.push(r.chunk(r.chunk_choice(&d.content, &d.reasoning, &d.logprobs, None, false)));
                false
            }
            Some(Event::Done { finish, usage }) => {
                out.push(r.chunk(r.chunk_choice("", "", &[], Some(finish), false)));
                if r.include_usage {
                    let mut v = r.envelope(true, json!([]));
                    v["usage"] = usage_json(&usage);
                    out.push(SseEvent::default().data(v.to_string()));
                }
                true
            }
            Some(Event::Error(e)) => {
                out.push(SseEvent::default().data(e.body().to_string()));
                true
            }
            None => {
                out.push(SseEvent::default().data(ApiError::internal("the engine ended the request without an answer").body().to_string()));
                true
            }
        };
        if done {
            out.push(SseEvent::default().data("[DONE]"));
        }
        Some((stream::iter(out.into_iter().map(Ok::<_, Infallible>)), (r, (!done).then_some(rx), false)))
    });
    Sse::new(s.flatten()).into_response()
}

/// Wait for the whole answer.
pub async fn whole(reply: Reply, mut rx: UnboundedReceiver<Event>) -> Result<Response, ApiError> {
    let (mut content, mut reasoning, mut lps) = (String::new(), String::new(), Vec::new());
    let (finish, usage) = loop {
        match rx.recv().await {
            Some(Event::Delta(d)) => {
                content.push_str(&d.content);
                reasoning.push_str(&d.reasoning);
                lps.extend(d.logprobs);
            }
            Some(Event::Done { finish, usage }) => break (finish, usage),
            Some(Event::Error(e)) => return Err(e),
            None => return Err(ApiError::internal("the engine ended the request without an answer")),
        }
    };
    let finish = finish.as_str();
    let choice = match reply.ep {
        Endpoint::Chat => {
            let mut msg = json!({"role": "assistant", "content": content, "refusal": null});
            if !reasoning.is_empty() {
                msg["reasoning_content"] = json!(reasoning);
            }
            let lp = if reply.logprobs { chat_logprobs(&lps) } else { Value::Null };
            json!({"index": 0, "message": msg, "logprobs": lp, "finish_reason": finish})
        }
        Endpoint::Completions => {
            let lp = if reply.logprobs { completion_logprobs(&lps, reply.echo_len()) } else { Value::Null };
            let text = format!("{}{content}", reply.echo.as_deref().unwrap_or(""));
            json!({"index": 0, "text": text, "logprobs": lp, "finish_reason": finish})
        }
    };
    let mut v = reply.envelope(false, json!([choice]));
    v["usage"] = usage_json(&usage);
    Ok(Json(v).into_response())
}

//! Request bodies of /v1/chat/completions and /v1/completions: parsed strictly (unknown
//! fields are errors that name the field) and checked against OpenAI's ranges.

use crate::error::ApiError;
use pn_engine::sampler::SamplerConfig;
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Duration;

/// The fields of both endpoints; each endpoint rejects the other's (`messages` vs
/// `prompt`/`echo`). `logprobs` is a bool for chat and a count for completions.
#[derive(Deserialize, Default, Debug)]
#[serde(deny_unknown_fields)]
pub struct Request {
    pub model: Option<String>,
    pub messages: Option<Vec<Message>>,
    pub prompt: Option<Value>,
    pub echo: Option<bool>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub seed: Option<serde_json::Number>,
    pub stop: Option<Value>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub logprobs: Option<Value>,
    pub top_logprobs: Option<i64>,
    pub n: Option<i64>,
    pub best_of: Option<i64>,
    pub logit_bias: Option<BTreeMap<String, f64>>,
    /// Seconds the caller waits at most: generation ends (`finish_reason: "timeout"`).
    pub timeout: Option<f64>,
    /// Extension (llama.cpp's): do not stop at end-of-generation tokens.
    pub ignore_eos: Option<bool>,
    pub user: Option<String>,
    pub response_format: Option<Value>,
    pub tools: Option<Value>,
    pub tool_choice: Option<Value>,
    /// OpenAI's predicted outputs: `{"type": "content", "content": text or text parts}`,
    /// a text the answer is expected to repeat (lookup drafts match it).
    pub prediction: Option<Value>,
}

#[derive(Deserialize, Default, Debug)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
}

/// A chat message. Other keys a client echoes back (`refusal`, `annotations` ...) are
/// ignored; `content` is a string, null, or a list of text parts.
#[derive(Deserialize, Debug)]
pub struct Message {
    pub role: Value,
    #[serde(default)]
    pub content: Value,
}

/// Which endpoint a body is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
}

/// Sampling and stopping, resolved against the server's defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct GenParams {
    /// Most tokens to generate (None: up to the context).
    pub max_tokens: Option<usize>,
    pub sampler: SamplerConfig,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    /// (token, bias) added to the logits before sampling.
    pub logit_bias: Vec<(u32, f32)>,
    pub stop: Vec<String>,
    /// Top alternatives per token when logprobs are asked for (None: no logprobs).
    pub logprobs: Option<usize>,
    pub ignore_eos: bool,
    pub timeout: Option<Duration>,
    /// `prediction`'s text (None: none, or empty).
    pub prediction: Option<String>,
}

/// Server-side defaults for what a request leaves out.
#[derive(Clone, Debug)]
pub struct Defaults {
    pub sampler: SamplerConfig,
    /// Seed for requests without one (None: a fresh one per request).
    pub seed: Option<u64>,
}

/// Parse a body; the message of a bad one names the field (`temperature: invalid type ...`).
pub fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let de = &mut serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if inner.is_syntax() || inner.is_eof() {
            ApiError::bad_request(format!("malformed JSON body: {inner}"))
        } else if path == "." {
            ApiError::bad_request(format!("request body: {inner}"))
        } else {
            ApiError::invalid(path.clone(), format!("{path}: {inner}"))
        }
    })
}

fn range_f(name: &str, v: Option<f64>, lo: f64, hi: f64, lo_open: bool) -> Result<Option<f32>, ApiError> {
    let Some(x) = v else { return Ok(None) };
    let ok = x.is_finite() && (if lo_open { x > lo } else { x >= lo }) && x <= hi;
    if !ok {
        let l = if lo_open { "(" } else { "[" };
        return Err(ApiError::invalid(name, format!("{name}: expected a value in {l}{lo}, {hi}], found {x}")));
    }
    Ok(Some(x as f32))
}

fn range_i(name: &str, v: Option<i64>, lo: i64, hi: i64) -> Result<Option<i64>, ApiError> {
    match v {
        Some(x) if x < lo || x > hi => Err(ApiError::invalid(name, format!("{name}: expected an integer in [{lo}, {hi}], found {x}"))),
        _ => Ok(v),
    }
}

impl Request {
    /// The fields the other endpoint owns, set here by mistake.
    fn check_endpoint(&self, ep: Endpoint) -> Result<(), ApiError> {
        let wrong = |f: &str, use_: &str| ApiError::invalid(f, format!("{f}: unknown field for this endpoint ({use_})"));
        match ep {
            Endpoint::Chat => {
                if self.prompt.is_some() {
                    return Err(wrong("prompt", "chat completions take `messages`; `prompt` is for /v1/completions"));
                }
                if self.echo.is_some() {
                    return Err(wrong("echo", "`echo` is for /v1/completions"));
                }
            }
            Endpoint::Completions => {
                if self.messages.is_some() {
                    return Err(wrong("messages", "completions take `prompt`; `messages` is for /v1/chat/completions"));
                }
                if self.max_completion_tokens.is_some() {
                    return Err(wrong("max_completion_tokens", "completions take `max_tokens`"));
                }
                if self.top_logprobs.is_some() {
                    return Err(wrong("top_logprobs", "completions take `logprobs: N`"));
                }
            }
        }
        Ok(())
    }

    /// Fields OpenAI has that this server cannot honour: a clear 400 rather than a
    /// silently different answer.
    fn check_unsupported(&self) -> Result<(), ApiError> {
        if let Some(n) = self.n {
            if n != 1 {
                return Err(ApiError::invalid("n", format!("n: only 1 choice per request is supported, found {n}")));
            }
        }
        if let Some(b) = self.best_of {
            if b != 1 {
                return Err(ApiError::invalid("best_of", format!("best_of: only 1 is supported, found {b}")));
            }
        }
        if matches!(&self.tools, Some(Value::Array(a)) if !a.is_empty()) {
            return Err(ApiError::invalid("tools", "tools: tool calling is not supported by this server"));
        }
        if matches!(&self.tool_choice, Some(v) if !v.is_null() && v != "none" && v != "auto") {
            return Err(ApiError::invalid("tool_choice", "tool_choice: tool calling is not supported by this server"));
        }
        if let Some(rf) = &self.response_format {
            let ty = rf.get("type").and_then(Value::as_str);
            if ty != Some("text") {
                return Err(ApiError::invalid("response_format", format!("response_format: only {{\"type\": \"text\"}} is supported, found {rf}")));
            }
        }
        Ok(())
    }

    /// The generation parameters, checked (`n_vocab` bounds token ids in `logit_bias`).
    pub fn gen_params(&self, ep: Endpoint, d: &Defaults, n_vocab: usize) -> Result<GenParams, ApiError> {
        self.check_endpoint(ep)?;
        self.check_unsupported()?;
        let max_tokens = match (self.max_completion_tokens, self.max_tokens) {
            (Some(_), Some(_)) => return Err(ApiError::invalid("max_tokens", "max_tokens: give max_tokens or max_completion_tokens, not both")),
            (Some(m), None) => range_i("max_completion_tokens", Some(m), 1, i64::MAX)?,
            (None, m) => range_i("max_tokens", m, 1, i64::MAX)?,
        };
        let mut s = d.sampler.clone();
        if let Some(t) = range_f("temperature", self.temperature, 0.0, 2.0, false)? {
            s.temperature = t;
        }
        if let Some(p) = range_f("top_p", self.top_p, 0.0, 1.0, true)? {
            s.top_p = p;
        }
        if let Some(k) = range_i("top_k", self.top_k, -1, n_vocab as i64)? {
            s.top_k = k.max(0) as usize;
        }
        if let Some(m) = range_f("min_p", self.min_p, 0.0, 1.0, false)? {
            s.min_p = m;
        }
        if let Some(r) = range_f("repetition_penalty", self.repetition_penalty, 0.0, 10.0, true)? {
            s.repeat_penalty = r;
        }
        s.seed = match &self.seed {
            Some(n) => n.as_u64().or_else(|| n.as_i64().map(|i| i as u64)).ok_or_else(|| ApiError::invalid("seed", format!("seed: expected an integer, found {n}")))?,
            None => d.seed.unwrap_or_else(fresh_seed),
        };
        let presence_penalty = range_f("presence_penalty", self.presence_penalty, -2.0, 2.0, false)?.unwrap_or(0.0);
        let frequency_penalty = range_f("frequency_penalty", self.frequency_penalty, -2.0, 2.0, false)?.unwrap_or(0.0);
        let logit_bias = self.logit_bias(n_vocab)?;
        let logprobs = self.logprobs(ep)?;
        let timeout = range_f("timeout", self.timeout, 0.0, 86_400.0, true)?.map(Duration::from_secs_f32);
        Ok(GenParams {
            max_tokens: max_tokens.map(|m| m as usize),
            sampler: s,
            presence_penalty,
            frequency_penalty,
            logit_bias,
            stop: self.stop()?,
            logprobs,
            ignore_eos: self.ignore_eos.unwrap_or(false),
            timeout,
            prediction: self.prediction()?,
        })
    }

    /// `prediction`: `{"type": "content", "content": "..."}` or the content as a list of
    /// `{"type": "text", "text": "..."}` parts (joined).
    fn prediction(&self) -> Result<Option<String>, ApiError> {
        let bad = |what: &str, found: &Value| ApiError::invalid("prediction", format!("prediction{what}: expected {}, found {found}", match what {
            "" => "an object {\"type\": \"content\", \"content\": ...}",
            ".type" => "\"content\"",
            _ => "a string or a list of {\"type\": \"text\", \"text\": string} parts",
        }));
        let p = match &self.prediction {
            None | Some(Value::Null) => return Ok(None),
            Some(Value::Object(o)) => o,
            Some(v) => return Err(bad("", v)),
        };
        if let Some(k) = p.keys().find(|k| *k != "type" && *k != "content") {
            return Err(ApiError::invalid("prediction", format!("prediction.{k}: unknown field (expected type and content)")));
        }
        match p.get("type") {
            Some(Value::String(t)) if t == "content" => {}
            t => return Err(bad(".type", t.unwrap_or(&Value::Null))),
        }
        let text = match p.get("content") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => {
                let mut s = String::new();
                for part in parts {
                    match (part.get("type").and_then(Value::as_str), part.get("text").and_then(Value::as_str)) {
                        (Some("text"), Some(t)) => s.push_str(t),
                        _ => return Err(bad(".content", part)),
                    }
                }
                s
            }
            c => return Err(bad(".content", c.unwrap_or(&Value::Null))),
        };
        Ok((!text.is_empty()).then_some(text))
    }

    fn stop(&self) -> Result<Vec<String>, ApiError> {
        const MAX: usize = 16;
        let bad = |found: &Value| ApiError::invalid("stop", format!("stop: expected a string or a list of at most {MAX} non-empty strings, found {found}"));
        let stops: Vec<String> = match &self.stop {
            None | Some(Value::Null) => vec![],
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Array(a)) if a.len() <= MAX => a.iter().map(|v| v.as_str().map(str::to_string).ok_or_else(|| bad(v))).collect::<Result<_, _>>()?,
            Some(v) => return Err(bad(v)),
        };
        if let Some(i) = stops.iter().position(String::is_empty) {
            return Err(ApiError::invalid("stop", format!("stop[{i}]: expected a non-empty string, found \"\"")));
        }
        Ok(stops)
    }

    fn logprobs(&self, ep: Endpoint) -> Result<Option<usize>, ApiError> {
        const MAX_TOP: i64 = 20;
        match ep {
            Endpoint::Chat => {
                let on = match &self.logprobs {
                    None | Some(Value::Null) => false,
                    Some(Value::Bool(b)) => *b,
                    Some(v) => return Err(ApiError::invalid("logprobs", format!("logprobs: expected true or false, found {v}"))),
                };
                let top = range_i("top_logprobs", self.top_logprobs, 0, MAX_TOP)?;
                if top.is_some() && !on {
                    return Err(ApiError::invalid("top_logprobs", "top_logprobs: requires logprobs: true"));
                }
                Ok(on.then(|| top.unwrap_or(0) as usize))
            }
            Endpoint::Completions => match &self.logprobs {
                None | Some(Value::Null) => Ok(None),
                Some(Value::Number(n)) if n.as_i64().is_some_and(|k| (0..=MAX_TOP).contains(&k)) => Ok(n.as_u64().map(|k| k as usize)),
                Some(v) => Err(ApiError::invalid("logprobs", format!("logprobs: expected an integer in [0, {MAX_TOP}], found {v}"))),
            },
        }
    }

    fn logit_bias(&self, n_vocab: usize) -> Result<Vec<(u32, f32)>, ApiError> {
        let Some(m) = &self.logit_bias else { return Ok(vec![]) };
        m.iter()
            .map(|(k, &v)| {
                let id: u32 = k.parse().ok().filter(|&i: &u32| (i as usize) < n_vocab).ok_or_else(|| {
                    ApiError::invalid("logit_bias", format!("logit_bias: expected token ids in [0, {n_vocab}) as keys, found {k:?}"))
                })?;
                let b = range_f("logit_bias", Some(v), -100.0, 100.0, false)?.unwrap_or(0.0);
                Ok((id, b))
            })
            .collect()
    }

    pub fn stream(&self) -> bool {
        self.stream.unwrap_or(false)
    }
    pub fn include_usage(&self) -> bool {
        self.stream_options.as_ref().and_then(|o| o.include_usage).unwrap_or(false)
    }
}

/// A seed for a request that gave none (the clock, mixed with a counter).
fn fresh_seed() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    t ^ N.fetch_add(1, Ordering::Relaxed).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// The prompt of a completions request: text, or token ids.
#[derive(Clone, Debug, PartialEq)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
}

pub fn completion_prompt(v: Option<&Value>, n_vocab: usize) -> Result<Prompt, ApiError> {
    let bad = |found: &Value| ApiError::invalid("prompt", format!("prompt: expected a string, a list of one string, or a list of token ids, found {found}"));
    let ids = |a: &[Value]| -> Result<Prompt, ApiError> {
        a.iter()
            .map(|x| {
                x.as_u64().filter(|&i| (i as usize) < n_vocab).map(|i| i as u32).ok_or_else(|| {
                    ApiError::invalid("prompt", format!("prompt: expected token ids in [0, {n_vocab}), found {x}"))
                })
            })
            .collect::<Result<Vec<u32>, _>>()
            .map(Prompt::Tokens)
    };
    let p = match v {
        None | Some(Value::Null) => return Err(ApiError::invalid("prompt", "prompt: required")),
        Some(Value::String(s)) => Prompt::Text(s.clone()),
        Some(Value::Array(a)) => match a.as_slice() {
            [Value::String(s)] => Prompt::Text(s.clone()),
            [Value::Array(inner)] => ids(inner)?,
            [first, ..] if first.is_number() => ids(a)?,
            [_, _, ..] if a.iter().all(|x| x.is_string() || x.is_array()) => {
                return Err(ApiError::invalid("prompt", format!("prompt: only one prompt per request is supported, found {}", a.len())))
            }
            _ => return Err(bad(&Value::Array(a.clone()))),
        },
        Some(other) => return Err(bad(other)),
    };
    match &p {
        Prompt::Text(s) if s.is_empty() => Err(ApiError::invalid("prompt", "prompt: expected a non-empty prompt, found \"\"")),
        Prompt::Tokens(t) if t.is_empty() => Err(ApiError::invalid("prompt", "prompt: expected at least one token id, found []")),
        _ => Ok(p),
    }
}

/// Roles a chat message may have (`developer` is rendered as `system`).
const ROLES: &[&str] = &["system", "developer", "user", "assistant", "tool"];

/// The messages as (role, text): content parts joined, roles checked.
pub fn chat_messages(msgs: Option<&[Message]>) -> Result<Vec<(String, String)>, ApiError> {
    let msgs = msgs.ok_or_else(|| ApiError::invalid("messages", "messages: required"))?;
    if msgs.is_empty() {
        return Err(ApiError::invalid("messages", "messages: expected at least one message, found []"));
    }
    msgs.iter()
        .enumerate()
        .map(|(i, m)| {
            let role = match m.role.as_str() {
                Some(r) if ROLES.contains(&r) => if r == "developer" { "system" } else { r }.to_string(),
                _ => return Err(ApiError::invalid(format!("messages[{i}].role"), format!("messages[{i}].role: expected one of {ROLES:?}, found {}", m.role))),
            };
            Ok((role, message_text(i, &m.content)?))
        })
        .collect()
}

fn message_text(i: usize, content: &Value) -> Result<String, ApiError> {
    let field = format!("messages[{i}].content");
    match content {
        Value::Null => Ok(String::new()),
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut out = String::new();
            for (j, p) in parts.iter().enumerate() {
                match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => out.push_str(t),
                    (ty, _) => {
                        let found = ty.map(|t| format!("{t:?}")).unwrap_or_else(|| p.to_string());
                        return Err(ApiError::invalid(field.clone(), format!("{field}[{j}]: expected a text part {{\"type\": \"text\", \"text\": ...}}, found {found}")));
                    }
                }
            }
            Ok(out)
        }
        other => Err(ApiError::invalid(field.clone(), format!("{field}: expected a string or a list of text parts, found {other}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> Defaults {
        Defaults { sampler: SamplerConfig::greedy(), seed: Some(7) }
    }
    fn params(body: &str) -> Result<GenParams, ApiError> {
        parse::<Request>(body.as_bytes())?.gen_params(Endpoint::Chat, &defaults(), 100)
    }

    #[test]
    fn errors_name_the_field_range_and_value() {
        let e = params(r#"{"temperature": 3.5}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("temperature"));
        assert!(e.message.contains("[0, 2]") && e.message.contains("3.5"), "{}", e.message);
        let e = params(r#"{"temperature": "hot"}"#).unwrap_err();
        assert!(e.message.starts_with("temperature:"), "{}", e.message);
        let e = params(r#"{"bogus": 1}"#).unwrap_err();
        assert!(e.message.contains("bogus"), "{}", e.message);
        assert!(params(r#"{"n": 2}"#).unwrap_err().message.contains("found 2"));
        assert!(params(r#"{"top_logprobs": 3}"#).unwrap_err().message.contains("logprobs: true"));
        assert!(params(r#"{"stop": ["a", ""]}"#).unwrap_err().message.contains("stop[1]"));
        assert!(params(r#"{"logit_bias": {"100": 1}}"#).unwrap_err().message.contains("[0, 100)"));
        assert!(parse::<Request>(b"{\"model\":").unwrap_err().message.contains("malformed JSON"));
    }

    #[test]
    fn values_override_defaults() {
        let p = params(r#"{"temperature": 0.5, "top_k": 5, "seed": 3, "stop": "END", "logprobs": true, "top_logprobs": 2, "max_tokens": 9}"#).unwrap();
        assert_eq!((p.sampler.temperature, p.sampler.top_k, p.sampler.seed), (0.5, 5, 3));
        assert_eq!((p.stop, p.logprobs, p.max_tokens), (vec!["END".to_string()], Some(2), Some(9)));
        assert_eq!(params("{}").unwrap().sampler.seed, 7);
        // predicted outputs: a string or text parts; anything else names what is wrong
        assert_eq!(params(r#"{"prediction": {"type": "content", "content": "fn a() {}"}}"#).unwrap().prediction.as_deref(), Some("fn a() {}"));
        let parts = r#"{"prediction": {"type": "content", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}}"#;
        assert_eq!(params(parts).unwrap().prediction.as_deref(), Some("ab"));
        assert_eq!(params(r#"{"prediction": null}"#).unwrap().prediction, None);
        for (body, says) in [
            (r#"{"prediction": "text"}"#, "prediction: expected an object"),
            (r#"{"prediction": {"type": "diff", "content": "x"}}"#, "prediction.type: expected \"content\", found \"diff\""),
            (r#"{"prediction": {"type": "content"}}"#, "prediction.content: expected a string"),
            (r#"{"prediction": {"type": "content", "content": [{"type": "image"}]}}"#, "prediction.content: expected a string"),
            (r#"{"prediction": {"type": "content", "content": "x", "extra": 1}}"#, "prediction.extra: unknown field"),
        ] {
            let e = params(body).unwrap_err().message;
            assert!(e.contains(says), "{body}: {e}");
        }
    }

    #[test]
    fn prompts_and_messages() {
        assert_eq!(completion_prompt(Some(&serde_json::json!([1, 2])), 10).unwrap(), Prompt::Tokens(vec![1, 2]));
        assert_eq!(completion_prompt(Some(&serde_json::json!(["hi"])), 10).unwrap(), Prompt::Text("hi".into()));
        assert!(completion_prompt(Some(&serde_json::json!([1, 20])), 10).unwrap_err().message.contains("found 20"));
        assert!(completion_prompt(Some(&serde_json::json!(["a", "b"])), 10).unwrap_err().message.contains("one prompt"));
        let m: Vec<Message> = serde_json::from_str(r#"[{"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]"#).unwrap();
        assert_eq!(chat_messages(Some(&m)).unwrap(), vec![("system".to_string(), "ab".to_string())]);
        let m: Vec<Message> = serde_json::from_str(r#"[{"role": "wizard", "content": "x"}]"#).unwrap();
        assert_eq!(chat_messages(Some(&m)).unwrap_err().param.as_deref(), Some("messages[0].role"));
    }
}

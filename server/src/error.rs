//! OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}` with the HTTP
//! status that goes with them.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// `invalid_request_error`, `authentication_error`, `not_found_error`, `server_error` ...
    pub kind: &'static str,
    /// The request field at fault, if one is.
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Seconds for a `Retry-After` header (503 queue full).
    pub retry_after: Option<u32>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, message: message.into(), kind, param: None, code: None, retry_after: None }
    }
    /// 400: a field's value is wrong; the message names the field, what was expected and
    /// what was found.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> ApiError {
        let param = param.into();
        let message = message.into();
        ApiError { param: (!param.is_empty()).then_some(param), ..ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message) }
    }
    /// 400 without a single field to blame (malformed JSON, ...).
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }
    pub fn context_overflow(message: impl Into<String>) -> ApiError {
        ApiError { param: Some("messages".into()), code: Some("context_length_exceeded"), ..ApiError::bad_request(message) }
    }
    pub fn unauthorized(message: impl Into<String>) -> ApiError {
        ApiError { code: Some("invalid_api_key"), ..ApiError::new(StatusCode::UNAUTHORIZED, "authentication_error", message) }
    }
    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found_error", message)
    }
    pub fn model_not_found(model: &str, served: &str) -> ApiError {
        ApiError {
            param: Some("model".into()),
            code: Some("model_not_found"),
            ..ApiError::not_found(format!("the model `{model}` does not exist: this server serves `{served}` (GET /v1/models)"))
        }
    }
    pub fn method_not_allowed(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "invalid_request_error", message)
    }
    pub fn too_large(limit: usize) -> ApiError {
        ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "invalid_request_error", format!("request body too large: the limit is {limit} bytes"))
    }
    /// 503 with `Retry-After`: the request queue is full.
    pub fn queue_full(capacity: usize) -> ApiError {
        ApiError {
            code: Some("queue_full"),
            retry_after: Some(1),
            ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", format!("the server is busy: all {capacity} queue places are taken; retry shortly"))
        }
    }
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError { retry_after: Some(1), ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message) }
    }
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    pub fn body(&self) -> serde_json::Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.status.as_u16())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}

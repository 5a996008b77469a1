//! The chat page: `GET /` and its script and style, embedded in the binary (no network
//! fetches; the Content-Security-Policy forbids any origin but this server). The page uses
//! only `POST /v1/chat/completions` (server/static/app.js).

use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

const INDEX: &str = include_str!("../static/index.html");
const SCRIPT: &str = include_str!("../static/app.js");
const STYLE: &str = include_str!("../static/style.css");

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'";

fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type), (header::CONTENT_SECURITY_POLICY, CSP), (header::CACHE_CONTROL, "no-cache")], body).into_response()
}

/// `/`, `/ui/app.js`, `/ui/style.css`; no API key needed (the page asks for it).
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(|| async { asset("text/html; charset=utf-8", INDEX) }))
        .route("/ui/app.js", get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }))
        .route("/ui/style.css", get(|| async { asset("text/css; charset=utf-8", STYLE) }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The page loads nothing from elsewhere: every src/href is one of our routes.
    #[test]
    fn page_refers_only_to_its_own_assets() {
        for attr in ["src=\"", "href=\""] {
            for part in INDEX.split(attr).skip(1) {
                let url = part.split('"').next().unwrap();
                assert!(["/ui/app.js", "/ui/style.css"].contains(&url), "{attr}{url}");
            }
        }
        assert!(!SCRIPT.contains("http://") && !SCRIPT.contains("https://"), "the script fetches only relative URLs");
        assert!(SCRIPT.contains("\"/v1/chat/completions\""));
    }
}

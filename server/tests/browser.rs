//! The chat page in a real browser: headless Chromium (Debian's `chromium` +
//! `chromium-driver`) driven over WebDriver by server/tests/browser.py (Python selenium):
//! send a prompt, see the answer stream in, Stop frees the slot, a reload keeps the
//! conversation. Without the browser or selenium the test says so, and fails only in CI.

mod common;
mod loopback;

use common::*;

#[test]
fn chat_page_in_headless_chromium() {
    let py = loopback::python_with("selenium");
    let chromium = loopback::which("chromium").and(loopback::which("chromedriver"));
    if !loopback::require(py.clone().map(|_| ()).and(chromium.map(|_| ()))) {
        return;
    }
    // 2 slots, the default model (real text); the page sets temperature / max_tokens
    let s = server(config(), spec(DEFAULT, 2, 2048));
    let url = loopback::listen(s);
    // PN_SCREENSHOT=docs/img/server-chat.png (relative to the repo) saves a finished answer
    let shot = std::env::var("PN_SCREENSHOT").map(|p| repo(&p).to_string_lossy().into_owned()).unwrap_or_default();
    let out = loopback::run_script(&py.unwrap(), "server/tests/browser.py", &[&url, &shot]);
    assert!(out.contains("browser: all checks passed"), "{out}");
}

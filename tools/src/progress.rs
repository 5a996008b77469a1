//! Progress on stderr (indicatif) for work that takes seconds: loading, synth, long
//! prefills, batch. Shown only when stderr is a terminal and `--quiet` is not given, so
//! pipes and logs stay clean.

use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

static QUIET: AtomicBool = AtomicBool::new(false);

pub fn set_quiet(q: bool) {
    QUIET.store(q, Ordering::Relaxed);
}

/// `--quiet`: no progress and no load line.
pub fn quiet() -> bool {
    QUIET.load(Ordering::Relaxed)
}

/// Whether bars are drawn at all.
pub fn enabled() -> bool {
    !quiet() && std::io::stderr().is_terminal()
}

/// A spinner naming the current stage (`set_message` to move on); hidden when disabled.
pub fn spinner(msg: impl Into<String>) -> ProgressBar {
    if !enabled() {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new_spinner().with_style(ProgressStyle::with_template("{spinner} {msg} ({elapsed})").expect("valid template"));
    pb.set_message(msg.into());
    pb.enable_steady_tick(Duration::from_millis(120));
    pb
}

/// A bar over `len` units (`unit`: "tokens", "prompts", "bytes"); hidden when disabled.
pub fn bar(len: u64, msg: &str, unit: &str) -> ProgressBar {
    if !enabled() {
        return ProgressBar::hidden();
    }
    let tpl = if unit == "bytes" {
        "{msg} [{bar:30}] {decimal_bytes}/{decimal_total_bytes} ({elapsed}, eta {eta})".to_string()
    } else {
        format!("{{msg}} [{{bar:30}}] {{pos}}/{{len}} {unit} ({{elapsed}}, eta {{eta}})")
    };
    let pb = ProgressBar::new(len).with_style(ProgressStyle::with_template(&tpl).expect("valid template").progress_chars("=> "));
    pb.set_message(msg.to_string());
    pb
}

//! Progress bars go to stderr on a terminal only, and `--quiet` turns them off: `pn synth`
//! in a pseudo-terminal (rexpect) draws its byte bar; piped, or with `--quiet`, it does not.

use rexpect::session::spawn_command;
use std::path::PathBuf;
use std::process::Command;

fn out(name: &str) -> String {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("progress");
    std::fs::create_dir_all(&d).unwrap();
    d.join(name).display().to_string()
}

fn synth(quiet: bool, file: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_pn"));
    if quiet {
        c.arg("--quiet");
    }
    c.args(["synth", "--preset", "small", "--out", file]);
    c
}

#[test]
fn synth_draws_a_bar_on_a_terminal_only() {
    let file = out("bar.gguf");
    let mut p = spawn_command(synth(false, &file), Some(60_000)).unwrap();
    let seen = p.exp_string("wrote ").unwrap();
    assert!(seen.contains("synth [") && seen.contains(" MB"), "{seen:?}");
    let mut p = spawn_command(synth(true, &file), Some(60_000)).unwrap();
    let seen = p.exp_string("wrote ").unwrap();
    assert!(!seen.contains("synth ["), "--quiet: {seen:?}");
    let o = synth(false, &file).output().unwrap();
    assert!(o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("synth [") && err.starts_with("wrote "), "piped: {err:?}");
}

//! `pn chat` as a person uses it, through a pseudo-terminal (rexpect): typing, editing with
//! the arrow keys, a pasted two-line block that stays one turn, a `"""` block, Ctrl-C at
//! the prompt, /set, /system, /save, /load, /reset, /bye, and the history file. And the
//! piped mode: prompts on stderr, answers alone on stdout.
//!
//! The conversation is checked through `/save` (the JSON holds each turn exactly as the
//! model got it). Writes only under CARGO_TARGET_TMPDIR.

use rexpect::session::{spawn_command, PtySession};
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

fn tmp(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("chat_repl");
    std::fs::create_dir_all(&d).unwrap();
    let p = d.join(name);
    let _ = std::fs::remove_file(&p);
    p
}

const PROMPT: &str = ">>> ";

fn chat(history: &std::path::Path) -> PtySession {
    let mut c = Command::new(env!("CARGO_BIN_EXE_pn"));
    c.args(["chat", "--greedy", "-n", "4", "-c", "1024", "--quiet"]).env("PN_HISTORY", history).env("TERM", "xterm");
    for v in ["PN_DIE_A", "PN_DIE_B", "PN_SPLIT_LAYER", "PN_MAX_SEQ"] {
        c.env_remove(v);
    }
    spawn_command(c, Some(60_000)).expect("pn chat starts in a pty")
}

/// Type `s` (rexpect buffers until a flush).
fn keys(p: &mut PtySession, s: &str) {
    p.send(s).unwrap();
    p.flush().unwrap();
}

/// Type `s` and Enter.
fn line(p: &mut PtySession, s: &str) {
    keys(p, &format!("{s}\r"));
}

/// The user messages of a `/save` file.
fn saved_user_turns(p: &std::path::Path) -> Vec<String> {
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    v["messages"].as_array().unwrap().iter().filter(|m| m["role"] == "user").map(|m| m["content"].as_str().unwrap().to_string()).collect()
}

/// Send one turn and wait for its answer's end line and the next prompt.
fn answered(p: &mut PtySession) {
    p.exp_string("stopped: ").unwrap();
    p.exp_string(PROMPT).unwrap();
}

fn save(p: &mut PtySession, file: &std::path::Path) {
    line(p, &format!("/save {}", file.display()));
    p.exp_string("(saved").unwrap();
    p.exp_string(PROMPT).unwrap();
}

#[test]
fn repl_edits_pastes_interrupts_and_saves() {
    let history = tmp("history");
    let conv = tmp("conv.json");
    let mut p = chat(&history);
    p.exp_string("template: ").unwrap();
    p.exp_string("code-completion model").unwrap();
    p.exp_string(PROMPT).unwrap();
    // type "hllo", three Left arrows (cursor after the h), insert "e": "hello"
    keys(&mut p, "hllo");
    keys(&mut p, "\x1b[D\x1b[D\x1b[D");
    keys(&mut p, "e\r");
    answered(&mut p);
    // a bracketed paste of two lines, then Enter: one turn
    keys(&mut p, "\x1b[200~line one\nline two\x1b[201~");
    keys(&mut p, "\r");
    answered(&mut p);
    // a """ block over three lines
    keys(&mut p, "\"\"\"\r");
    keys(&mut p, "def f():\r");
    keys(&mut p, "    pass\r");
    keys(&mut p, "\"\"\"\r");
    answered(&mut p);
    // Alt-Enter adds a line without sending
    keys(&mut p, "first\x1b\rsecond\r");
    answered(&mut p);
    // Ctrl-C drops the typed line; nothing is sent
    keys(&mut p, "dropped text");
    p.send_control('c').unwrap();
    p.exp_string("/bye quits").unwrap();
    p.exp_string(PROMPT).unwrap();
    save(&mut p, &conv);
    assert_eq!(saved_user_turns(&conv), ["hello", "line one\nline two", "def f():\n    pass", "first\nsecond"]);
    // commands: /help, /set, an unknown one (an error, the chat goes on)
    line(&mut p, "/help");
    p.exp_string("/system TEXT").unwrap();
    line(&mut p, "/set temp 0.5");
    p.exp_string("temp 0.5").unwrap();
    line(&mut p, "/set temp -1");
    p.exp_string("error: --temp").unwrap();
    line(&mut p, "/nope");
    p.exp_string("error: /nope: unknown command").unwrap();
    p.exp_string(PROMPT).unwrap();
    // /system keeps the turns; /reset drops them; /load brings them back
    line(&mut p, "/system be brief");
    p.exp_string("(system prompt set)").unwrap();
    line(&mut p, "/reset");
    p.exp_string("(conversation cleared)").unwrap();
    let empty = tmp("empty.json");
    save(&mut p, &empty);
    assert!(saved_user_turns(&empty).is_empty());
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&empty).unwrap()).unwrap();
    assert_eq!(v["messages"][0]["role"], "system", "/reset keeps the system prompt");
    line(&mut p, &format!("/load {}", conv.display()));
    p.exp_string("(loaded 8 messages").unwrap();
    line(&mut p, "next");
    answered(&mut p);
    let again = tmp("again.json");
    save(&mut p, &again);
    assert_eq!(saved_user_turns(&again).len(), 5);
    line(&mut p, "/bye");
    p.exp_eof().unwrap();
    // the history file holds what was typed (and not the dropped line)
    let h = std::fs::read_to_string(&history).unwrap();
    assert!(h.contains("hello") && h.contains("/bye"), "{h}");
    assert!(!h.contains("dropped text"), "{h}");
    // the next session starts with that history: Up recalls the last line
    let mut p = chat(&history);
    p.exp_string(PROMPT).unwrap();
    keys(&mut p, "\x1b[A\r"); // Up: "/bye"
    p.exp_eof().unwrap();
}

#[test]
fn piped_chat_keeps_answers_alone_on_stdout() {
    let mut c = Command::new(env!("CARGO_BIN_EXE_pn"));
    c.args(["chat", "--greedy", "-n", "4"]).env("PN_HISTORY", tmp("unused-history")).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    child.stdin.take().unwrap().write_all(b"hello\n\"\"\"\na\nb\n\"\"\"\n/bye\nnever sent\n").unwrap();
    let o = child.wait_with_output().unwrap();
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(!out.contains(PROMPT) && !out.contains("template") && !out.contains("stopped:"), "stdout: {out:?}");
    assert!(err.contains(PROMPT) && err.contains("template: "), "stderr: {err}");
    assert_eq!(err.matches("stopped: ").count(), 2, "two turns (the block is one), none after /bye:\n{err}");
    assert!(!std::path::Path::new(&tmp("unused-history")).exists(), "no history without a terminal");
}

/// Without $PN_HISTORY the history lives in the user's data dir.
#[test]
fn history_defaults_to_the_data_dir() {
    let data = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("chat_repl").join("xdg-data");
    let _ = std::fs::remove_dir_all(&data);
    let mut c = Command::new(env!("CARGO_BIN_EXE_pn"));
    c.args(["chat", "--greedy", "-n", "2", "--quiet"]).env_remove("PN_HISTORY").env("XDG_DATA_HOME", &data).env("TERM", "xterm");
    let mut p = spawn_command(c, Some(60_000)).unwrap();
    p.exp_string(PROMPT).unwrap();
    line(&mut p, "/bye");
    p.exp_eof().unwrap();
    let h = std::fs::read_to_string(data.join("pantheon/chat_history")).unwrap();
    assert!(h.contains("/bye"), "{h}");
}

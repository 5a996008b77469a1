//! The `pn` surface people use every day: prompts from files and pipes, `-` for stdin and
//! stdout, stop strings, `-n -1` / `-n 0`, the end line's stop reason, llama.cpp-style
//! aliases, broken pipes, flags checked before the model loads, conflicting flags, `pn
//! info`'s verdict, `pn tokenize --pieces`, `pn batch` error lines, `pn perplexity`.
//!
//! Reads only tests/fixtures and the built-in model; writes under CARGO_TARGET_TMPDIR.

use std::io::Write;
use std::process::{Command, Stdio};

mod common;
use common::{fx, Out};

fn tmp(name: &str) -> String {
    common::tmp_in("cli_everyday", name)
}

fn command(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_pn"));
    c.args(args);
    for v in ["PN_DIE_A", "PN_DIE_B", "PN_SPLIT_LAYER", "PN_MAX_SEQ", "QWEN35_MAX_SEQ", "PN_KV_TYPE"] {
        c.env_remove(v);
    }
    c
}

/// Run `pn args` with `stdin` as its input (None: /dev/null).
fn pn_in(args: &[&str], stdin: Option<&str>) -> Out {
    let mut c = command(args);
    c.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() }).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = c.spawn().expect("pn runs");
    if let Some(s) = stdin {
        child.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
    }
    let o = child.wait_with_output().unwrap();
    let out = Out { code: o.status.code().unwrap_or(-1), stdout: String::from_utf8_lossy(&o.stdout).into(), stderr: String::from_utf8_lossy(&o.stderr).into() };
    assert!(!out.stderr.contains("panicked"), "pn {args:?} panicked:\n{}", out.stderr);
    out
}
fn pn(args: &[&str]) -> Out {
    pn_in(args, None)
}
fn ok(args: &[&str]) -> Out {
    let o = pn(args);
    assert_eq!(o.code, 0, "pn {args:?}:\n{}", o.stderr);
    o
}
/// Fails with one `error:` line (on its own line) naming every `want`.
fn fails(args: &[&str], want: &[&str]) -> Out {
    let o = pn(args);
    assert_ne!(o.code, 0, "pn {args:?} should fail:\n{}", o.stderr);
    let errors: Vec<&str> = o.stderr.lines().filter(|l| l.contains("error:")).collect();
    assert_eq!(errors.len(), 1, "pn {args:?}: one error line expected:\n{}", o.stderr);
    assert!(errors[0].starts_with("error: "), "pn {args:?}: the error starts its line:\n{}", o.stderr);
    for w in want {
        assert!(errors[0].contains(w), "pn {args:?}: error should name {w:?}:\n{}", o.stderr);
    }
    o
}

/// The stop reason of `pn run`'s end line.
fn stopped(stderr: &str) -> String {
    let l = stderr.lines().rev().find(|l| l.contains("stopped: ")).unwrap_or_else(|| panic!("no end line:\n{stderr}"));
    l.split("stopped: ").nth(1).unwrap().trim_end_matches(']').to_string()
}

const M: &str = "tiny-f16.gguf";

#[test]
fn prompts_from_flags_files_and_pipes() {
    let m = fx(M);
    let want = ok(&["run", "-m", &m, "-p", "hello world", "-n", "4", "--greedy", "--ignore-eos"]).stdout;
    assert!(want.starts_with("hello world"));
    let file = tmp("prompt.txt");
    std::fs::write(&file, "hello world").unwrap();
    for (args, input) in [
        (vec!["-f", file.as_str()], None),
        (vec!["--file", file.as_str()], None),
        (vec!["-p", "-"], Some("hello world")),
        (vec!["-f", "-"], Some("hello world")),
        (vec![], Some("hello world")), // piped stdin without -p
    ] {
        let mut a = vec!["run", "-m", &m, "-n", "4", "--greedy", "--ignore-eos"];
        a.extend(args.iter());
        let o = pn_in(&a, input);
        assert_eq!(o.code, 0, "{a:?}: {}", o.stderr);
        assert_eq!(o.stdout, want, "{a:?}");
    }
    // -e: escapes in the prompt
    let o = ok(&["run", "-m", &m, "-p", r"hello\tworld", "-e", "-n", "1", "--greedy"]);
    assert!(o.stdout.starts_with("hello\tworld"), "{:?}", o.stdout);
    // the built-in model still has its default prompt when stdin is empty; a file model needs one
    assert!(ok(&["run", "-n", "1", "--greedy"]).stdout.starts_with("def fibonacci(n):"));
    fails(&["run", "-m", &m, "-n", "1"], &["--prompt"]);
    fails(&["run", "-m", &m, "-f", &fx("no-such-prompt.txt"), "-n", "1"], &["-f", "no-such-prompt.txt"]);
    fails(&["run", "-m", &m, "-p", "x", "-f", &file], &["--prompt", "--file"]);
}

#[test]
fn token_limits_and_the_end_line() {
    let m = fx(M);
    // -n 0: the prompt is read, nothing generated
    let o = ok(&["run", "-m", &m, "-p", "hello", "-n", "0"]);
    assert_eq!(o.stdout, "hello\n");
    assert_eq!(stopped(&o.stderr), "length");
    // -n N
    let o = ok(&["run", "-m", &m, "-p", "hello", "-n", "3", "--ignore-eos", "--greedy"]);
    assert_eq!(stopped(&o.stderr), "length");
    assert!(o.stderr.contains("generated 3 tokens"), "{}", o.stderr);
    // -n -1: until the context is full (max_seq 16 holds the prompt and all but the last
    // generated token, which is never fed)
    let o = ok(&["run", "-m", &m, "-p", "hello", "-n", "-1", "-c", "16", "--ignore-eos", "--greedy"]);
    assert_eq!(stopped(&o.stderr), "context full");
    let count = |what: &str| -> usize { o.stderr.split(what).nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap() };
    assert_eq!(count("prompt ") + count("generated "), 17, "{}", o.stderr);
    assert!(o.stderr.contains("context 16"), "the load line names the context:\n{}", o.stderr);
    // end of text: the built-in model ends a short answer sooner or later at temp 0
    let o = ok(&["run", "-p", "def add(a, b):\n    return a + b\n", "-n", "-1", "--greedy", "-c", "512"]);
    assert!(["end of text", "context full"].contains(&stopped(&o.stderr).as_str()), "{}", o.stderr);
    fails(&["run", "-m", &m, "-p", "x", "-n", "-2"], &["-n", "-2"]);
}

#[test]
fn stop_strings_are_never_printed() {
    // the greedy continuation of the built-in model, then a stop string from its middle
    let full = ok(&["run", "-p", "def fibonacci(n):", "-n", "24", "--greedy", "--ignore-eos"]).stdout;
    let gen = full.strip_prefix("def fibonacci(n):").unwrap().trim_end_matches('\n').to_string();
    let chars: Vec<char> = gen.chars().collect();
    assert!(chars.len() > 12, "{gen:?}");
    // a 3-char stop string starting at char 6 (likely across token boundaries)
    let stop: String = chars[6..9].iter().collect();
    let at = gen.find(&stop).unwrap();
    let o = ok(&["run", "-p", "def fibonacci(n):", "-n", "24", "--greedy", "--ignore-eos", "--stop", "NEVER-THERE", "--stop", &stop]);
    assert_eq!(o.stdout, format!("def fibonacci(n):{}\n", &gen[..at]), "stop {stop:?}");
    assert_eq!(stopped(&o.stderr), format!("stop string {stop:?}"));
    // -e unescapes --stop too; an empty stop string is an error
    let o = ok(&["run", "-p", "def fibonacci(n):", "-n", "24", "--greedy", "--ignore-eos", "-e", "--stop", r"\n"]);
    assert!(!o.stdout.strip_suffix('\n').unwrap().contains('\n'), "{:?}", o.stdout);
    assert_eq!(stopped(&o.stderr), r#"stop string "\n""#);
    fails(&["run", "-p", "x", "--stop", ""], &["--stop"]);
}

#[test]
fn llama_cpp_aliases_and_negative_numbers() {
    let m = fx(M);
    let a = ok(&["run", "--model", &m, "-p", "hi", "-n", "6", "--seed", "7", "--threads", "1", "--max-seq", "64", "--ignore-eos"]);
    let b = ok(&["run", "-m", &m, "-p", "hi", "-n", "6", "-s", "7", "-t", "1", "-c", "64", "--ignore-eos"]);
    assert_eq!(a.stdout, b.stdout);
    let c = ok(&["run", "-m", &m, "-p", "hi", "-n", "6", "-s", "7", "-t", "-1", "--ctx-size", "64", "--ignore-eos"]);
    assert_eq!(a.stdout, c.stdout, "-t -1 = all cores, same tokens");
    // --seed -1 = random (printed at the end); --temp 0 = greedy = --top-k 0 greedy
    let r = ok(&["run", "-m", &m, "-p", "hi", "-n", "2", "-s", "-1"]);
    assert!(r.stderr.contains("seed "), "{}", r.stderr);
    let g = ok(&["run", "-m", &m, "-p", "hi", "-n", "6", "--greedy", "--ignore-eos"]);
    let t = ok(&["run", "-m", &m, "-p", "hi", "-n", "6", "--temp", "0", "--top-k", "0", "--repeat-penalty", "1", "--ignore-eos"]);
    assert_eq!(g.stdout, t.stdout);
}

#[test]
fn conflicting_flags_name_both() {
    let m = fx(M);
    fails(&["run", "-m", &m, "-p", "x", "--greedy", "--temp", "0.5"], &["--greedy", "--temp"]);
    // tiny-f16 has 4 layers
    fails(&["run", "-m", &m, "-p", "x", "--dies", "cpu:0,cpu:1", "--split-layer", "99"], &["--split-layer 99", "4 layers"]);
    fails(&["run", "-m", &m, "-p", "x", "--split-layer", "3"], &["--split-layer 3", "two dies", "cpu:0"]);
    fails(&["run", "-m", &m, "-p", "x", "--dies", "cpu:0", "--split-layer", "3"], &["split layer 3", "cpu:0"]);
    ok(&["run", "-m", &m, "-p", "x", "-n", "1", "--dies", "cpu:0,cpu:1", "--split-layer", "2"]);
}

#[test]
fn flags_and_output_paths_are_checked_before_the_model_loads() {
    // a model that would fail to load: every flag error must come first
    let bad = fx("hostile_models/missing-tensor.gguf");
    for (args, want) in [
        (vec!["info", &bad, "--kv-type", "bogus"], "--kv-type"),
        (vec!["logits", "-m", &bad, "--tokens", "1", "--out", "/nonexistent-dir/x.json"], "/nonexistent-dir/x.json"),
        (vec!["logits", "-m", &bad, "--tokens", "1", "--out", "-", "--kv-type", "q9"], "--kv-type"),
        (vec!["run", "-m", &bad, "-p", "x", "--top-p", "2"], "--top-p"),
        (vec!["run", "-m", &bad, "-p", "x", "--load", "fast"], "--load"),
        (vec!["run", "-m", &bad, "-p", "x", "--ubatch", "0"], "--ubatch"),
        (vec!["run", "-m", &bad, "-p", "x", "--stop", ""], "--stop"),
        (vec!["chat", "-m", &bad, "-n", "0"], "-n"),
        (vec!["batch", "-m", &bad, "--prompts-file", "/nonexistent-dir/p.txt"], "--prompts-file"),
        (vec!["perplexity", "-m", &bad, "-f", "/nonexistent-dir/t.txt"], "/nonexistent-dir/t.txt"),
        (vec!["tokenize", "-m", &bad, "--text", "x", "--out", "/nonexistent-dir/t.json"], "/nonexistent-dir/t.json"),
    ] {
        let o = fails(&args, &[want]);
        assert!(o.stdout.is_empty(), "{args:?} printed before failing:\n{}", o.stdout);
        assert!(!o.stderr.contains("cannot load model"), "{args:?}: the model was loaded first:\n{}", o.stderr);
    }
}

/// Start `pn args`, close its stdout at once (like `| head -0`), and wait: a broken pipe is
/// a quiet success.
fn broken_pipe(args: &[&str], stdin: Option<&str>) {
    let mut c = command(args);
    c.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() }).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    drop(child.stdout.take());
    if let Some(s) = stdin {
        let _ = child.stdin.take().unwrap().write_all(s.as_bytes());
    }
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "pn {args:?} on a closed pipe:\n{err}");
    assert!(!err.contains("error") && !err.contains("panicked"), "pn {args:?} on a closed pipe:\n{err}");
}

#[test]
fn a_closed_pipe_is_a_quiet_success_in_every_command() {
    let m = fx(M);
    let prompts = tmp("pipe-prompts.txt");
    std::fs::write(&prompts, "a\nb\n").unwrap();
    let text = tmp("pipe-text.txt");
    std::fs::write(&text, "hello world ".repeat(40)).unwrap();
    broken_pipe(&["run", "-m", &m, "-p", "hi", "-n", "2"], None);
    broken_pipe(&["info", &m], None);
    broken_pipe(&["tokenize", "-m", &m, "--text", "hi", "--pieces"], None);
    broken_pipe(&["tokenize", "-m", &m, "--text", "hi", "--out", "-"], None);
    broken_pipe(&["logits", "-m", &m, "--tokens", "1,2", "--out", "-"], None);
    broken_pipe(&["batch", "-m", &m, "--prompts-file", &prompts, "-n", "2"], None);
    broken_pipe(&["bench", "-m", &m, "--prompt-len", "4", "--gen", "1", "--reps", "1"], None);
    broken_pipe(&["dump", "-m", &m], None);
    broken_pipe(&["perplexity", "-m", &m, "-f", &text, "-c", "16", "--chunks", "1"], None);
    broken_pipe(&["chat", "-m", &m, "-n", "2"], Some("hi\n"));
}

/// `pn bench`'s JSON: the best repetition's rates and the first repetition's prefill (a
/// fresh process's first prompt), never above the best.
#[test]
fn bench_reports_best_and_first_prefill() {
    let o = ok(&["bench", "-m", &fx(M), "--prompt-len", "8", "--gen", "2", "--reps", "3"]);
    let v: serde_json::Value = serde_json::from_str(o.stdout.trim()).unwrap();
    let (best, first) = (v["pp_tok_s"].as_f64().unwrap(), v["first_pp_tok_s"].as_f64().unwrap());
    assert!(first > 0.0 && first <= best, "first {first}, best {best}: {v}");
    assert!(v["tg_tok_s"].as_f64().is_some_and(|x| x > 0.0), "{v}");
}

#[test]
fn dash_is_stdin_and_stdout() {
    let m = fx(M);
    let o = pn_in(&["tokenize", "-m", &m, "--text-file", "-"], Some("hello\nworld\n"));
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(o.stdout.lines().count(), 2);
    let o = pn_in(&["tokenize", "-m", &m, "--text-file", "-", "--out", "-"], Some("hello\n"));
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(v["cases"][0]["text"], "hello");
    let o = ok(&["logits", "-m", &m, "--tokens", "1,2,3", "--out", "-"]);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(v["logits"].as_array().unwrap().len(), 3);
    assert!(!std::path::Path::new("-").exists(), "no file named -");
    let o = pn_in(&["batch", "-m", &m, "--prompts-file", "-", "-n", "2", "--greedy"], Some("a\nb\n"));
    assert_eq!(o.stdout.lines().count(), 2, "{}", o.stderr);
}

#[test]
fn logits_honours_max_seq() {
    let m = fx(M);
    let ids: Vec<String> = (1..=20).map(|i| i.to_string()).collect();
    let ids = ids.join(",");
    fails(&["logits", "-m", &m, "--tokens", &ids, "--out", "-", "--max-seq", "16"], &["context full", "16"]);
    let mut c = command(&["logits", "-m", &m, "--tokens", &ids, "--out", "-"]);
    let o = c.env("PN_MAX_SEQ", "16").stdin(Stdio::null()).output().unwrap();
    assert_ne!(o.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&o.stderr).contains("context full"));
    ok(&["logits", "-m", &m, "--tokens", &ids, "--out", "-", "-c", "32"]);
}

#[test]
fn info_ends_with_its_verdict() {
    let o = ok(&["info"]);
    assert!(o.stdout.trim_end().ends_with("loads: yes"), "{}", o.stdout);
    assert!(o.stdout.contains("general.file_type = 15 (mostly Q4_K_M)"), "{}", o.stdout);
    assert!(o.stdout.contains(" M parameters ("), "{}", o.stdout);
    let o = fails(&["info", &fx("hostile_models/qkv-wrong-rows.gguf")], &["cannot run this model", "blk.0.attn_qkv.weight", "expected shape"]);
    assert!(o.stdout.contains("== tensors"), "what it could read is still shown");
    // the cause is given once, not repeated by the error chain
    let err = o.stderr.lines().find(|l| l.starts_with("error:")).unwrap();
    assert_eq!(err.matches("expected shape").count(), 1, "{err}");
}

#[test]
fn tokenize_shows_pieces() {
    let o = ok(&["tokenize", "--text", "def f(x):", "--pieces"]);
    let lines: Vec<&str> = o.stdout.lines().collect();
    let ids: Vec<u64> = serde_json::from_str::<Vec<u64>>(lines[0]).unwrap();
    assert_eq!(lines.len(), 1 + ids.len());
    let pieces: String = lines[1..].iter().map(|l| serde_json::from_str::<String>(l.trim_start().split_once("  ").unwrap().1.trim()).unwrap()).collect();
    assert_eq!(pieces, "def f(x):");
    let o = ok(&["tokenize", "--text", "def f(x):", "--pieces", "--out", "-"]);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(v["cases"][0]["pieces"].as_array().unwrap().len(), ids.len());
}

#[test]
fn batch_reports_a_too_long_prompt_and_goes_on() {
    let m = fx(M);
    let f = tmp("long-prompts.txt");
    std::fs::write(&f, format!("hello\n{}\nworld\n", "word ".repeat(40))).unwrap();
    let o = pn(&["batch", "-m", &m, "--prompts-file", &f, "-n", "2", "--greedy", "-c", "16"]);
    assert_eq!(o.code, 1, "{}", o.stderr);
    let lines: Vec<serde_json::Value> = o.stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 3);
    assert!(lines[1]["error"].as_str().unwrap().contains("context holds 16"), "{:?}", lines[1]);
    assert!(lines[0]["completion"].is_string() && lines[2]["completion"].is_string());
    assert!(o.stderr.lines().last().unwrap().starts_with("error: 1 of 3 prompts"), "{}", o.stderr);
}

/// `pn perplexity --chunks 1` equals the second-half NLL computed from `pn logits` of the
/// same window (the built-in model adds no BOS, so the window is the text's first tokens).
#[test]
fn perplexity_is_llama_perplexity_method() {
    let text = tmp("ppl.py");
    std::fs::write(&text, "def add(a, b):\n    return a + b\n\n\nclass Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n        self.items.append(x)\n".repeat(3)).unwrap();
    let ctx = 32;
    let o = ok(&["perplexity", "-f", &text, "-c", "32", "--chunks", "1"]);
    let ppl: f64 = o.stdout.split_whitespace().nth(1).unwrap().parse().unwrap();
    // --text-file splits lines: the whole text goes in as one --text
    let ids_out = ok(&["tokenize", "--out", "-", "--text", &std::fs::read_to_string(&text).unwrap()]);
    let v: serde_json::Value = serde_json::from_str(&ids_out.stdout).unwrap();
    let ids: Vec<u64> = v["cases"][0]["ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
    assert!(ids.len() >= 2 * ctx);
    let window: Vec<String> = ids[..ctx].iter().map(|i| i.to_string()).collect();
    let l = ok(&["logits", "--tokens", &window.join(","), "--out", "-"]);
    let v: serde_json::Value = serde_json::from_str(&l.stdout).unwrap();
    let rows = v["logits"].as_array().unwrap();
    let mut nll = 0.0;
    for j in ctx / 2..ctx - 1 {
        let row: Vec<f64> = rows[j].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let lse = row.iter().map(|x| (x - max).exp()).sum::<f64>().ln() + max;
        nll += lse - row[ids[j + 1] as usize];
    }
    let want = (nll / (ctx - ctx / 2 - 1) as f64).exp();
    assert!((ppl - want).abs() < 1e-3 * want, "pn perplexity {ppl}, from the logits {want}");
    fails(&["perplexity", "-f", &text, "-c", "4096"], &["8192 tokens"]);
}

/// stdout and stderr on one terminal-like stream: an error after streamed text starts its
/// own line (no `hierror:`).
#[test]
fn an_error_after_streamed_text_starts_its_own_line() {
    let m = fx("hostile_models/nonfinite-weights.gguf");
    let o = Command::new("sh").arg("-c").arg(format!("'{}' run -m '{m}' -p hi -n 2 2>&1", env!("CARGO_BIN_EXE_pn"))).output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert_ne!(o.status.code(), Some(0));
    assert!(text.lines().any(|l| l == "hi"), "{text:?}");
    assert!(text.lines().any(|l| l.starts_with("error: the model produced")), "{text:?}");
}

//! The `pn` binary on bad input: missing/invalid flags, unreadable paths, directories,
//! empty and non-GGUF files, hostile GGUFs and hostile models, out-of-range token ids and
//! sampler values. Every failure must exit non-zero with one `error: ...` line naming what
//! was expected, and nothing may panic. Runs use the small fixtures and small -n.
//!
//! Reads only files inside the repository (tests/fixtures); writes only under
//! CARGO_TARGET_TMPDIR.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

mod common;
use common::{fx, Out};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}
fn tmp(name: &str) -> String {
    common::tmp_in("cli_robustness", name)
}

fn pn(args: &[&str]) -> Out {
    pn_env(args, &[])
}

fn pn_env(args: &[&str], vars: &[(&str, &str)]) -> Out {
    let o = Command::new(env!("CARGO_BIN_EXE_pn"))
        .args(args)
        .envs(vars.iter().copied())
        .env_remove("PN_DIE_A")
        .env_remove("PN_DIE_B")
        .env_remove("PN_SPLIT_LAYER")
        .stdin(Stdio::null())
        .output()
        .expect("pn runs");
    let out = Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    };
    for s in [&out.stdout, &out.stderr] {
        assert!(!s.contains("panicked"), "pn {args:?} panicked:\n{s}");
        assert!(!s.contains("RUST_BACKTRACE"), "pn {args:?} panicked:\n{s}");
    }
    assert!(o.status.code().is_some(), "pn {args:?} was killed by a signal (abort?):\n{}", out.stderr);
    out
}

/// A failure of ours (exit 1): exactly one `error: ` line, the last one, mentioning every
/// string in `want`.
fn fails(args: &[&str], want: &[&str]) -> String {
    let o = pn(args);
    assert_ne!(o.code, 0, "pn {args:?} should fail; stdout:\n{}\nstderr:\n{}", o.stdout, o.stderr);
    let lines: Vec<&str> = o.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    let errors: Vec<&&str> = lines.iter().filter(|l| l.starts_with("error")).collect();
    assert_eq!(errors.len(), 1, "pn {args:?}: expected one error line, stderr:\n{}", o.stderr);
    let last = lines.last().copied().unwrap_or("");
    if o.code == 2 {
        // clap: `error: ...` first, then usage
        assert!(lines[0].starts_with("error: "), "pn {args:?}: stderr:\n{}", o.stderr);
    } else {
        assert_eq!(o.code, 1, "pn {args:?}: exit code {}", o.code);
        assert!(last.starts_with("error: "), "pn {args:?}: the last stderr line should be the error:\n{}", o.stderr);
        assert!(last.len() > 20, "pn {args:?}: error too terse: {last}");
    }
    for w in want {
        assert!(o.stderr.contains(w), "pn {args:?}: error should mention {w:?}, stderr:\n{}", o.stderr);
    }
    o.stderr
}

fn succeeds(args: &[&str]) -> Out {
    let o = pn(args);
    assert_eq!(o.code, 0, "pn {args:?} should succeed; stderr:\n{}", o.stderr);
    o
}

/// Subcommands `pn --help` lists (besides `help`).
fn subcommands() -> Vec<String> {
    let o = pn(&["--help"]);
    assert_eq!(o.code, 0);
    let mut cmds = Vec::new();
    let mut in_cmds = false;
    for line in o.stdout.lines() {
        if line.starts_with("Commands:") {
            in_cmds = true;
            continue;
        }
        if in_cmds {
            if line.trim().is_empty() || !line.starts_with("  ") {
                break;
            }
            let name = line.split_whitespace().next().unwrap().to_string();
            if name != "help" {
                cmds.push(name);
            }
        }
    }
    for c in ["run", "logits", "info", "tokenize", "bench"] {
        assert!(cmds.iter().any(|x| x == c), "pn --help should list {c}: {cmds:?}");
    }
    cmds
}

/// An empty file and a non-GGUF text file (the latter a fixture).
fn bad_files() -> Vec<(String, &'static str)> {
    let empty = tmp("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    let dir = fx("");
    vec![
        (dir.trim_end_matches('/').to_string(), "directory"),
        (fx("does-not-exist.gguf"), "does-not-exist.gguf"),
        (empty, "empty.gguf"),
        (fx("tokenizer-cases.txt"), "GGUF"),
        (fx("hostile/bad-magic.gguf"), "GGUF"),
        (fx("hostile/truncated-header.gguf"), "truncated"),
        (fx("hostile/huge-array-count.gguf"), "count"),
    ]
}

#[test]
fn every_subcommand_rejects_unknown_flags_and_bad_model_paths() {
    let out = tmp("x.json");
    for cmd in subcommands() {
        fails(&[&cmd, "--definitely-not-a-flag"], &["--definitely-not-a-flag"]);
        let help = pn(&[&cmd, "--help"]);
        assert_eq!(help.code, 0, "pn {cmd} --help");
        if !help.stdout.contains("--model") {
            continue;
        }
        for (path, want) in bad_files() {
            // the other flags a command needs, so the model path is what fails
            let mut args: Vec<&str> = vec![&cmd, "--model", &path];
            match cmd.as_str() {
                "logits" => args.extend(["--tokens", "1", "--out", &out]),
                "tokenize" => args.extend(["--text", "hi"]),
                "run" => args.extend(["-p", "hi", "-n", "1"]),
                _ => {}
            }
            let o = pn(&args);
            assert_ne!(o.code, 0, "pn {args:?} should fail:\n{}", o.stderr);
            assert!(o.stderr.lines().any(|l| l.starts_with("error")), "pn {args:?}: no error line:\n{}", o.stderr);
            if ["run", "logits", "info", "tokenize", "bench"].contains(&cmd.as_str()) {
                fails(&args, &[want]);
            }
        }
    }
    // `pn info` also takes the model as a positional argument
    for (path, want) in bad_files() {
        fails(&["info", &path], &[want]);
    }
    let o = pn(&[]);
    assert_ne!(o.code, 0, "pn without a command should fail");
    fails(&["no-such-command"], &["no-such-command"]);
}

#[test]
fn run_flags() {
    let m = fx("tiny-f16.gguf");
    let base = |extra: &[&'static str]| -> Vec<String> {
        let mut v: Vec<String> = ["run", "--model", &m, "-p", "hi", "--seed", "1"].iter().map(|s| s.to_string()).collect();
        if !extra.contains(&"-n") {
            v.extend(["-n".to_string(), "2".to_string()]);
        }
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let check = |extra: &[&'static str], want: &[&str]| {
        let a = base(extra);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        fails(&a, want);
    };
    check(&["-n", "-3"], &["--n-predict", "-3"]);
    check(&["--min-p", "-0.5"], &["--min-p", "-0.5"]);
    check(&["-n", "abc"], &["abc"]);
    check(&["-n", "99999999999999999999999"], &["99999999999999999999999"]);
    check(&["--temp", "-1"], &["--temp", "found -1"]);
    check(&["--temp", "NaN"], &["--temp", "NaN"]);
    check(&["--temp", "inf"], &["--temp"]);
    check(&["--top-p", "2"], &["--top-p", "found 2"]);
    check(&["--top-p", "0"], &["--top-p"]);
    check(&["--top-p", "nan"], &["--top-p", "NaN"]);
    check(&["--min-p", "nan"], &["--min-p"]);
    check(&["--min-p", "1.5"], &["--min-p"]);
    check(&["--repeat-penalty", "0"], &["--repeat-penalty"]);
    check(&["--repeat-penalty", "NaN"], &["--repeat-penalty"]);
    check(&["--top-k", "-1"], &["-1"]);
    fails(&["run", "--model", &m, "-p", "hi", "--seed", "x"], &["--seed", "x"]);
    check(&["--threads", "1000000"], &["--threads", "1000000"]);
    check(&["--threads", "-2"], &["--threads", "-2"]);
    fails(&["run", "--model", &m, "-p", "hi", "-n", "1", "--seed", "-2"], &["--seed", "-2"]);
    check(&["--ubatch", "0"], &["--ubatch", "found 0"]);
    check(&["--max-seq", "abc"], &["abc"]);
    // a prompt longer than the context
    let long = "hello ".repeat(64);
    fails(&["run", "--model", &m, "-p", &long, "--max-seq", "16", "-n", "1"], &["prompt", "--max-seq"]);
    // no prompt for a file model
    fails(&["run", "--model", &m, "-n", "1"], &["--prompt"]);
    // --max-seq 0 is clamped (with a warning), a huge -n is capped by the context
    let o = succeeds(&["run", "--model", &m, "-p", "hi", "-n", "1", "--max-seq", "0", "--greedy"]);
    assert!(o.stderr.contains("warning: --max-seq 0"), "{}", o.stderr);
    let o = succeeds(&["run", "--model", &m, "-p", "hi", "-n", "1000000", "--max-seq", "20", "--greedy", "--ignore-eos"]);
    assert!(o.stderr.contains("warning: generating"), "{}", o.stderr);
    assert!(o.stderr.contains("stopped: context full"), "{}", o.stderr);
    // an empty prompt: nothing to evaluate (this model adds no BOS)
    fails(&["run", "--model", &m, "-p", "", "-n", "1"], &["--prompt"]);
}

#[test]
fn logits_flags() {
    let m = fx("tiny-f16.gguf");
    let out = tmp("logits.json");
    let l = |extra: &[&str], want: &[&str]| {
        let mut a = vec!["logits", "--model", m.as_str(), "--out", out.as_str()];
        a.extend_from_slice(extra);
        fails(&a, want);
    };
    l(&["--tokens", "1,2,1027"], &["token id 1027", "1027 tokens"]);
    l(&["--tokens", "4294967295"], &["4294967295"]);
    l(&["--tokens", "4294967296"], &["--tokens", "4294967296"]);
    l(&["--tokens=-1"], &["--tokens", "-1"]);
    l(&["--tokens", "-1"], &["--tokens", "-1"]);
    l(&["--tokens", "1,-2"], &["--tokens", "-2"]);
    l(&["--tokens", "abc"], &["--tokens", "abc"]);
    l(&["--tokens", "1;2"], &["--tokens"]);
    l(&["--tokens", ""], &["--tokens"]);
    l(&["--tokens", ",,,"], &["--tokens"]);
    l(&["--tokens", "1.5"], &["--tokens", "1.5"]);
    l(&["--tokens", "1", "--prompt", "x"], &["--prompt"]);
    l(&[], &["--tokens or --prompt"]);
    l(&["--prompt", ""], &["--prompt"]);
    l(&["--tokens", "1", "--ubatch", "0"], &["--ubatch"]);
    l(&["--tokens", "1", "--threads", "99999999999"], &["--threads"]);
    fails(&["logits", "--model", &m, "--tokens", "1"], &["--out"]);
    let dir_out = fx("");
    fails(&["logits", "--model", &m, "--tokens", "1", "--out", dir_out.trim_end_matches('/')], &["cannot create"]);
    fails(&["logits", "--model", &m, "--tokens", "1", "--out", &fx("no-such-dir/x.json")], &["cannot create", "no-such-dir"]);
    // the good path still works (and with a tiny ubatch)
    succeeds(&["logits", "--model", &m, "--tokens", "1,2,3", "--ubatch", "1", "--out", &out]);
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(v["logits"].as_array().unwrap().len(), 3);
}

#[test]
fn info_tokenize_bench_flags() {
    let m = fx("tiny-f16.gguf");
    let o = succeeds(&["info", &m]);
    assert!(o.stdout.contains("qwen35moe"));
    fails(&["info", &m, "--model", &m], &["--model"]);
    // tokenize
    fails(&["tokenize", "--model", &m], &["--text or --text-file"]);
    fails(&["tokenize", "--model", &m, "--text-file", &fx("no-such-file.txt")], &["cannot read", "no-such-file.txt"]);
    let d = fx("");
    fails(&["tokenize", "--model", &m, "--text-file", d.trim_end_matches('/')], &["cannot read"]);
    fails(&["tokenize", "--model", &m, "--text", "a", "--text-file", &fx("tokenizer-cases.txt")], &["--text"]);
    // a GGUF without a tokenizer
    fails(&["tokenize", "--model", &fx("hostile_models/tq1_0-weight.gguf"), "--text", "hi"], &["tokenizer"]);
    let o = succeeds(&["tokenize", "--model", &m, "--text", "<|im_start|>\u{1}\u{fffd}<|im_end|"]);
    assert!(o.stdout.starts_with('['));
    // bench
    let b = |extra: &[&str], want: &[&str]| {
        let mut a = vec!["bench", "--model", m.as_str()];
        a.extend_from_slice(extra);
        fails(&a, want);
    };
    b(&["--prompt-len", "0"], &["--prompt-len"]);
    b(&["--gen", "0"], &["--gen"]);
    b(&["--reps", "0"], &["--reps"]);
    b(&["--prompt-len", "18446744073709551615", "--gen", "1"], &["--prompt-len"]);
    b(&["--prompt-len", "100000000", "--gen", "1"], &["--prompt-len"]);
    b(&["--threads", "5000"], &["--threads"]);
    b(&["--ubatch", "0"], &["--ubatch"]);
    succeeds(&["bench", "--model", &m, "--prompt-len", "4", "--gen", "2", "--reps", "1", "--threads", "1"]);
}

/// The loader's settings from the environment: a bad value fails with one clear line
/// naming the variable and what it found; good ones run (a cap of 2 compiled geometries
/// recompiles as it goes).
#[test]
fn environment_settings() {
    let m = fx("tiny-f16.gguf");
    let args = ["bench", "--model", m.as_str(), "--prompt-len", "5", "--gen", "3", "--reps", "1", "--threads", "2"];
    for (var, val) in [("PN_GEOMETRIES", "0"), ("PN_GEOMETRIES", "lots"), ("PN_GEOMETRY_CACHE_MB", "-1"), ("PN_LANES", "many")] {
        let o = pn_env(&args, &[(var, val)]);
        assert_eq!(o.code, 1, "{var}={val}: stderr:\n{}", o.stderr);
        let last = o.stderr.lines().rfind(|l| !l.trim().is_empty()).unwrap_or("");
        assert!(last.starts_with("error: ") && last.contains(var) && last.contains(val), "{var}={val}: {last}");
    }
    // lanes asked for where they cannot run: said, not ignored
    let mut two = args.to_vec();
    two.extend(["--dies", "cpu:0,cpu:1"]);
    let o = pn_env(&two, &[("PN_LANES", "2")]);
    assert!(o.code == 1 && o.stderr.contains("PN_LANES=2") && o.stderr.contains("cpu:0,cpu:1"), "{}", o.stderr);
    assert_eq!(pn_env(&two, &[("PN_LANES", "0")]).code, 0);
    for (var, val) in [("PN_GEOMETRIES", "2"), ("PN_GEOMETRY_CACHE_MB", "1"), ("PN_LANES", "0")] {
        let o = pn_env(&args, &[(var, val)]);
        assert_eq!(o.code, 0, "{var}={val}: stderr:\n{}", o.stderr);
        assert!(o.stdout.contains("tg_tok_s"), "{var}={val}: {}", o.stdout);
    }
}

/// Every committed hostile model: `pn logits` and `pn run` fail with one clear line;
/// `pn info` shows what it can without panicking.
#[test]
fn hostile_models() {
    let dir = root().join("tests/fixtures/hostile_models");
    let out = tmp("hostile.json");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().and_then(|x| x.to_str()) != Some("gguf") {
            continue;
        }
        n += 1;
        let p = p.display().to_string();
        let name = Path::new(&p).file_name().unwrap().to_string_lossy().into_owned();
        let want: &[&str] = match name.as_str() {
            "nonfinite-weights.gguf" => &["non-finite"],
            "vocab-smaller-than-tokens.gguf" => &["token id 100", "out of range"],
            "unknown-arch.gguf" => &["unknown architecture", "qwen35moe"],
            "tq1_0-weight.gguf" => &["TQ1_0"],
            _ => &["cannot load model"],
        };
        fails(&["logits", "--model", &p, "--tokens", "0,100", "--out", &out], want);
        let o = pn(&["run", "--model", &p, "-p", "zz", "-n", "2", "--greedy"]);
        assert_ne!(o.code, 0, "pn run {name} should fail:\n{}", o.stderr);
        // info runs the load validation: the last line is the verdict
        let info = pn(&["info", &p]);
        match name.as_str() {
            // these load; they fail only when run
            "nonfinite-weights.gguf" | "vocab-smaller-than-tokens.gguf" => {
                assert_eq!(info.code, 0, "pn info {name}:\n{}", info.stderr);
                assert!(info.stdout.trim_end().ends_with("loads: yes"), "pn info {name}:\n{}", info.stdout);
            }
            _ => {
                let want_reason: Vec<&str> = want.iter().copied().filter(|w| *w != "cannot load model").collect();
                let err = fails(&["info", &p], &want_reason);
                assert!(err.contains("error: cannot run this model: "), "pn info {name}:\n{err}");
                assert!(!info.stdout.contains("loads: yes"), "pn info {name}:\n{}", info.stdout);
            }
        }
    }
    assert!(n >= 10, "expected the committed hostile models, found {n}");
    // the micro model's tokenizer has ids up to 258, its embedding 64 rows: 'z' is id 122
    fails(&["run", "--model", &fx("hostile_models/vocab-smaller-than-tokens.gguf"), "-p", "zz", "-n", "2"], &["token id 122", "out of range"]);
}

/// Every committed hostile GGUF (tests/fixtures/hostile) fails in every command that opens one.
#[test]
fn hostile_ggufs() {
    let out = tmp("hostile-gguf.json");
    for e in std::fs::read_dir(root().join("tests/fixtures/hostile")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().and_then(|x| x.to_str()) != Some("gguf") {
            continue;
        }
        let p = p.display().to_string();
        fails(&["info", &p], &[]);
        fails(&["tokenize", "--model", &p, "--text", "hi"], &[]);
        fails(&["logits", "--model", &p, "--tokens", "1", "--out", &out], &["cannot load model"]);
    }
}

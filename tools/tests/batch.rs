//! `pn batch`: one JSON line per prompt in input order, each completion equal to
//! `pn run --greedy` for that prompt alone (continuous batching over fewer slots than
//! prompts, sync and async steps, prefix-cache hits).

use std::path::PathBuf;
use std::process::{Command, Stdio};

/// (slots, environment, extra flags) of one `pn batch` run.
type Case = (&'static str, Vec<(&'static str, &'static str)>, Vec<&'static str>);

fn tmp(name: &str, text: &str) -> String {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("batch");
    std::fs::create_dir_all(&d).unwrap();
    let p = d.join(name);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

fn pn(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_pn"));
    c.args(args).stdin(Stdio::null());
    for v in ["PN_DIE_A", "PN_DIE_B", "PN_SPLIT_LAYER", "PN_ASYNC", "QWEN35_ASYNC_SCHED", "PN_PREFIX_INTERVAL", "PN_PREFIX_CACHE_MB", "PN_MAX_SLOTS"] {
        c.env_remove(v);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c.output().expect("pn runs");
    (o.status.code().unwrap_or(-1), String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

/// `pn run --greedy` for one prompt: the completion (stdout minus the echoed prompt and
/// the final newline).
fn run_alone(prompt: &str, n: &str) -> String {
    let (code, out, err) = pn(&["run", "-p", prompt, "-n", n, "--greedy"], &[]);
    assert_eq!(code, 0, "{err}");
    out.strip_prefix(prompt).unwrap().strip_suffix('\n').unwrap().to_string()
}

fn batch_lines(file: &str, n: &str, slots: &str, env: &[(&str, &str)]) -> (Vec<serde_json::Value>, String) {
    batch_lines_with(file, n, slots, env, &[])
}

fn batch_lines_with(file: &str, n: &str, slots: &str, env: &[(&str, &str)], extra: &[&str]) -> (Vec<serde_json::Value>, String) {
    let mut args = vec!["batch", "--prompts-file", file, "-n", n, "--slots", slots, "--greedy"];
    args.extend_from_slice(extra);
    let (code, out, err) = pn(&args, env);
    assert_eq!(code, 0, "{err}");
    (out.lines().map(|l| serde_json::from_str(l).expect("one JSON object per line")).collect(), err)
}

const PROMPTS: [&str; 6] = ["def fibonacci(n):", "class Stack:", "import os", "def add(a, b):", "    return", "for i in range(10):"];

#[test]
fn batch_equals_run_per_prompt_in_input_order() {
    let file = tmp("prompts.txt", &(PROMPTS.join("\n") + "\n\n"));
    let want: Vec<String> = PROMPTS.iter().map(|p| run_alone(p, "10")).collect();
    // the CPU default is synchronous steps with new prompts prefilled in chunks inside
    // them (mixed passes); PN_ASYNC=1 overlaps whole prefills with async steps
    let cases: [Case; 5] = [
        ("3", vec![], vec![]),
        ("16", vec![], vec![]),
        ("2", vec![], vec!["--prefill-chunk", "2"]),
        ("2", vec![("PN_ASYNC", "1")], vec![]),
        ("1", vec![("QWEN35_ASYNC_SCHED", "0")], vec![]),
    ];
    for (slots, env, extra) in cases {
        let (lines, err) = batch_lines_with(&file, "10", slots, &env, &extra);
        assert_eq!(lines.len(), PROMPTS.len(), "one line per prompt");
        for (i, l) in lines.iter().enumerate() {
            assert_eq!(l["index"], i, "input order");
            assert_eq!(l["prompt"], PROMPTS[i]);
            assert_eq!(l["completion"].as_str().unwrap(), want[i], "prompt {i} with {slots} slots {env:?} {extra:?}");
            assert!(l["tokens"].as_u64().unwrap() <= 10);
        }
        assert!(err.contains("tok/s aggregate"), "{err}");
        let mode = if env == [("PN_ASYNC", "1")] { "async" } else { "sync" };
        assert!(err.contains(&format!("{slots} slots ({mode})")), "{err}");
    }
}

#[test]
fn batch_prefix_cache_hits_equal_run() {
    // a shared head of > 128 tokens: with a 64-token interval, later prompts restore it
    let head = "# ".to_string() + &"compute the value of the item in the list and return it ".repeat(12);
    let prompts: Vec<String> = ["def f(x):", "class A:", "x = 1"].iter().map(|t| format!("{head}{t}")).collect();
    let file = tmp("shared.txt", &prompts.join("\n"));
    let env = [("PN_PREFIX_INTERVAL", "64")];
    let (lines, err) = batch_lines(&file, "6", "1", &env);
    let cached: Vec<u64> = lines.iter().map(|l| l["cached_tokens"].as_u64().unwrap()).collect();
    assert_eq!(cached[0], 0);
    assert!(cached[1] >= 128 && cached[2] >= 128, "{cached:?} {err}");
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(l["completion"].as_str().unwrap(), run_alone(&prompts[i], "6"), "prompt {i} after a cache hit");
    }
    // two slots: the later prompts are prefilled in chunks inside the first one's steps
    let (mixed, err) = batch_lines_with(&file, "6", "2", &env, &["--prefill-chunk", "16"]);
    for (i, l) in mixed.iter().enumerate() {
        assert_eq!(l["completion"], lines[i]["completion"], "prompt {i}, mixed passes: {err}");
    }
    assert!(mixed[1]["cached_tokens"].as_u64().unwrap() >= 128, "{err}");
    let (off, _) = batch_lines(&file, "6", "1", &[("PN_PREFIX_CACHE_MB", "0")]);
    assert!(off.iter().all(|l| l["cached_tokens"] == 0));
}

#[test]
fn batch_bad_input_is_an_error() {
    let empty = tmp("empty.txt", "\n\n");
    let (code, _, err) = pn(&["batch", "--prompts-file", &empty, "-n", "4"], &[]);
    assert_ne!(code, 0);
    assert!(err.contains("expected at least one prompt"), "{err}");
    let (code, _, err) = pn(&["batch", "--prompts-file", "/nonexistent/p.txt", "-n", "4"], &[]);
    assert_ne!(code, 0);
    assert!(err.contains("cannot read"), "{err}");
    let one = tmp("one.txt", "x = 1\n");
    let (code, _, err) = pn(&["batch", "--prompts-file", &one, "-n", "4", "--slots", "0"], &[]);
    assert_ne!(code, 0);
    assert!(err.contains("--slots"), "{err}");
    assert!(!err.contains("panicked"));
}

#[test]
fn bench_slots_prints_one_json_line() {
    let (code, out, err) = pn(&["bench", "--slots", "3", "--prompt-len", "4", "--gen", "2", "--reps", "1", "--threads", "2"], &[]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 1, "{out}");
    let v: serde_json::Value = serde_json::from_str(lines[0]).expect("a JSON line");
    assert_eq!(v["seqs"], 3);
    assert_eq!((v["prompt_len"].as_u64(), v["gen"].as_u64()), (Some(4), Some(2)));
    for k in ["agg_tg_tok_s", "agg_tok_s", "pp_tok_s"] {
        assert!(v[k].as_f64().is_some_and(|x| x > 0.0), "{k}: {v}");
    }
    // the mode pn batch uses: synchronous on the CPU unless PN_ASYNC=1
    assert_eq!(v["async"], false, "{v}");
    let (code, out, err) = pn(&["bench", "--slots", "2", "--prompt-len", "3", "--gen", "2", "--reps", "2", "--threads", "2"], &[("PN_ASYNC", "1")]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("a JSON line");
    assert_eq!((v["async"].as_bool(), v["seqs"].as_u64()), (Some(true), Some(2)), "{v}");
    assert!(v["agg_tg_tok_s"].as_f64().is_some_and(|x| x > 0.0), "{v}");
    assert!(v.get("k1_over_single").is_none(), "only K = 1 compares with one sequence: {v}");
    // K = 1: the single-sequence decode of the same streams, alternated in the process
    let (code, out, err) = pn(&["bench", "--slots", "1", "--prompt-len", "3", "--gen", "2", "--reps", "3", "--threads", "2"], &[]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("a JSON line");
    assert!(v["single_tg_tok_s"].as_f64().is_some_and(|x| x > 0.0), "{v}");
    assert!(v["k1_over_single"].as_f64().is_some_and(|x| x > 0.0 && x.is_finite()), "{v}");
    let (code, _, err) = pn(&["bench", "--slots", "0", "--gen", "1", "--reps", "1"], &[]);
    assert_ne!(code, 0);
    assert!(err.contains("--slots: expected 1..=256"), "{err}");
}

//! `--draft mtp|lookup` on the CLI: `pn run` and `pn batch` print what `--draft none`
//! prints (greedy, and sampled with a seed), under both `--draft-policy` values, and the
//! end line reports drafted / accepted tokens (and, adaptive, the rounds that drafted);
//! bad flags are clear errors.

use std::process::{Command, Stdio};

/// A folder of its own for test `name` under the target's scratch folder.
fn scratch(name: &str) -> std::path::PathBuf {
    let d = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `text` written to `file` in `scratch(dir)`: its path.
fn write_file(dir: &str, file: &str, text: &str) -> String {
    let f = scratch(dir).join(file);
    std::fs::write(&f, text).unwrap();
    f.display().to_string()
}

fn pn(args: &[&str]) -> (i32, String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_pn"));
    c.args(args).stdin(Stdio::null());
    for v in ["PN_DIE_A", "PN_DIE_B", "PN_SPLIT_LAYER", "PN_ASYNC", "PN_MAX_SLOTS", "PN_DEBUG"] {
        c.env_remove(v);
    }
    let o = c.output().expect("pn runs");
    (o.status.code().unwrap_or(-1), String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

#[test]
fn run_with_drafts_prints_the_plain_greedy_text() {
    for p in ["def parse_args(argv):", "import os"] {
        let (code, want, err) = pn(&["run", "-p", p, "-n", "60", "--greedy", "-t", "2"]);
        assert_eq!(code, 0, "{err}");
        for d in [["--draft", "lookup", "--draft-n", "3"], ["--draft", "mtp", "--draft-n", "1"], ["--draft", "mtp", "--draft-n", "3"]] {
            for policy in ["always", "adaptive"] {
                let mut args = vec!["run", "-p", p, "-n", "60", "--greedy", "-t", "2", "--draft-policy", policy];
                args.extend(d);
                let (code, got, err) = pn(&args);
                assert_eq!(code, 0, "{err}");
                assert_eq!(got, want, "{d:?} {policy} on {p:?}");
                let line = match policy {
                    "always" => format!("[draft {} ×{}: drafted ", d[1], d[3]),
                    _ => format!("[draft {} ×{} (adaptive: ", d[1], d[3]),
                };
                assert!(err.contains(&line), "{err}");
            }
        }
    }
}

/// Sampled with a seed: the same text with drafts as without (accept.rs's coupled rule).
#[test]
fn sampled_run_with_drafts_is_the_plain_sampled_text() {
    let base = ["run", "-p", "import os", "-n", "40", "--seed", "3", "--temp", "0.9", "-t", "2"];
    let (code, want, err) = pn(&base);
    assert_eq!(code, 0, "{err}");
    for d in [["--draft", "mtp", "--draft-n", "2"], ["--draft", "lookup", "--draft-n", "3"]] {
        let mut args = base.to_vec();
        args.extend(d);
        let (code, out, err) = pn(&args);
        assert_eq!(code, 0, "{err}");
        assert!(out.starts_with("import os"), "{out}");
        assert_eq!(out, want, "{d:?}");
        assert!(err.contains("accepted"), "{err}");
    }
}

#[test]
fn batch_with_drafts_matches_plain_batch() {
    let f = write_file("draft", "prompts.txt", "def parse_args(argv):\nimport os\nclass Parser:\n");
    let (code, want, err) = pn(&["batch", "--prompts-file", &f, "-n", "40", "--greedy", "--slots", "2"]);
    assert_eq!(code, 0, "{err}");
    for (kind, line) in [("lookup", "[draft lookup ×3: drafted "), ("mtp", "[draft mtp ×1: drafted ")] {
        let (code, got, err) = pn(&["batch", "--prompts-file", &f, "-n", "40", "--greedy", "--slots", "2", "--draft", kind, "--draft-policy", "always"]);
        assert_eq!(code, 0, "{err}");
        assert_eq!(got, want, "--draft {kind}");
        assert!(err.contains(line), "{err}");
        let (code, got, err) = pn(&["batch", "--prompts-file", &f, "-n", "40", "--greedy", "--slots", "2", "--draft", kind]);
        assert_eq!(code, 0, "{err}");
        assert_eq!(got, want, "--draft {kind}, adaptive");
        assert!(err.contains("rounds drafted): drafted "), "{err}");
    }
}

/// `pn batch --draft mtp` with prompts that extend earlier ones: a prompt restores the
/// earlier one's cached state with its hidden rows (the MTP drafter's input), and every
/// completion is the plain batch's.
#[test]
fn batch_with_mtp_drafts_reuses_cached_prompts() {
    let f = write_file("draft-cache", "prompts.txt", "def parse_args(argv):\ndef parse_args(argv): pass\nclass Parser:\nclass Parser: pass\n");
    let rows = |out: &str| -> Vec<serde_json::Value> { out.lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect() };
    let (code, want, err) = pn(&["batch", "--prompts-file", &f, "-n", "40", "--greedy", "--slots", "2"]);
    assert_eq!(code, 0, "{err}");
    let (code, got, err) = pn(&["batch", "--prompts-file", &f, "-n", "40", "--greedy", "--slots", "2", "--draft", "mtp", "--draft-policy", "always"]);
    assert_eq!(code, 0, "{err}");
    let (want, got) = (rows(&want), rows(&got));
    assert_eq!(want.len(), 4);
    for (w, g) in want.iter().zip(&got) {
        assert_eq!((&g["completion"], &g["index"]), (&w["completion"], &w["index"]));
    }
    // the prompts that extend an earlier one restore it
    for i in [1, 3] {
        assert!(got[i]["cached_tokens"].as_u64().unwrap() >= 3, "{}", got[i]);
    }
    assert!(err.contains("[draft mtp ×1: drafted "), "{err}");
}

#[test]
fn bad_draft_flags_are_clear_errors() {
    let cases: [(&[&str], &str); 8] = [
        (&["run", "-p", "x", "--draft", "eagle"], "expected mtp, lookup or none"),
        (&["run", "-p", "x", "--draft", "lookup", "--draft-n", "0"], "--draft-n: expected 1..=16"),
        (&["run", "-p", "x", "--draft-n", "2"], "needs --draft mtp or --draft lookup"),
        (&["run", "-p", "x", "--draft", "lookup", "--draft-policy", "sometimes"], "expected adaptive or always, found \"sometimes\""),
        (&["run", "-p", "x", "--draft", "mtp", "--draft-ref", "Cargo.toml"], "--draft-ref: needs --draft lookup (found --draft mtp)"),
        (&["run", "-p", "x", "--draft", "lookup", "--draft-ref", "/no/such/file.txt"], "--draft-ref: expected a readable text file, found /no/such/file.txt"),
        (&["serve", "--draft", "lookup", "--draft-ref", "Cargo.toml"], "a request gives its predicted output in its `prediction` field"),
        (&["bench", "--draft", "mtp", "--predict-answer"], "--predict-answer: needs --draft lookup and no --draft-ref (found --draft mtp)"),
    ];
    for (args, says) in cases {
        let (code, _, err) = pn(args);
        assert_ne!(code, 0, "{args:?}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

/// `--draft-ref FILE` (a predicted output): the same text, and with the answer itself as
/// the reference nearly every draft is accepted.
#[test]
fn a_draft_reference_is_drafted_from() {
    let base = ["run", "-p", "class Parser:", "-n", "64", "--greedy", "-t", "2", "--draft", "lookup", "--draft-n", "6", "--draft-policy", "always"];
    let (code, want, err) = pn(&base);
    assert_eq!(code, 0, "{err}");
    let counts = |err: &str| {
        let line = err.lines().find(|l| l.starts_with("[draft lookup")).unwrap_or_else(|| panic!("{err}"));
        let n = |after: &str| line.split(after).nth(1).and_then(|t| t.split(|c: char| !c.is_ascii_digit()).next()).and_then(|t| t.parse::<u64>().ok()).unwrap_or_else(|| panic!("{line}"));
        (n("drafted "), n("accepted "))
    };
    let (drafted, accepted) = counts(&err);
    // the answer without the prompt it repeats
    let f = write_file("draft-ref", "answer.txt", want.strip_prefix("class Parser:").expect("the prompt is echoed"));
    let mut args = base.to_vec();
    args.extend(["--draft-ref", &f]);
    let (code, got, err) = pn(&args);
    assert_eq!(code, 0, "{err}");
    assert_eq!(got, want);
    let (drafted_r, accepted_r) = counts(&err);
    assert!(accepted_r >= 48 && drafted_r - accepted_r <= 8 && accepted_r > accepted + 16, "without: {drafted} drafted, {accepted} accepted; with: {drafted_r}, {accepted_r}");
}

/// `pn synth --nextn 1` writes an MTP block that `--draft mtp` runs (random weights: the
/// text is still the plain greedy text); a file without one is a clear error.
#[test]
fn synth_nextn_block_drafts_and_a_file_without_one_is_refused() {
    let d = scratch("draft");
    let (with, without) = (d.join("nextn.gguf").display().to_string(), d.join("plain.gguf").display().to_string());
    for (f, extra) in [(&with, vec!["--nextn", "1"]), (&without, vec![])] {
        let mut args = vec!["synth", "--preset", "tiny", "--type", "q8_0", "-t", "2", "--out", f];
        args.extend(extra);
        let (code, _, err) = pn(&args);
        assert_eq!(code, 0, "{err}");
    }
    let base = ["run", "--model", &with, "-p", "a b c", "-n", "24", "--greedy", "-t", "2"];
    let (code, want, err) = pn(&base);
    assert_eq!(code, 0, "{err}");
    let (code, got, err) = pn(&[&base[..], &["--draft", "mtp", "--draft-n", "3"]].concat());
    assert_eq!(code, 0, "{err}");
    assert_eq!(got, want);
    let (code, _, err) = pn(&["run", "--model", &without, "-p", "a", "-n", "4", "--draft", "mtp"]);
    assert_ne!(code, 0);
    assert!(err.contains("no MTP (nextn) block") && err.contains("--draft lookup"), "{err}");
}

//! `pn synth`: synthetic models load and run (`pn run`, `pn logits`: finite logits) for
//! every weight type; the full-dims preset has the real layer dims; a seed gives the same
//! bytes whatever the thread count; bad flags give one `error:` line. Writes only under
//! CARGO_TARGET_TMPDIR.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

fn tmp(name: &str) -> String {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("synth");
    std::fs::create_dir_all(&d).unwrap();
    d.join(name).display().to_string()
}

fn pn(args: &[&str]) -> Output {
    let o = Command::new(env!("CARGO_BIN_EXE_pn"))
        .args(args)
        .env_remove("PN_DIE_A")
        .env_remove("PN_DIE_B")
        .env_remove("PN_KV_TYPE")
        .stdin(Stdio::null())
        .output()
        .expect("pn runs");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "pn {args:?} panicked:\n{err}");
    o
}

fn ok(args: &[&str]) -> (String, String) {
    let o = pn(args);
    let (out, err) = (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned());
    assert!(o.status.success(), "pn {args:?} failed:\n{err}");
    (out, err)
}

/// Exactly one `error:` line mentioning `want`, exit status 1 or 2 (clap), no panic.
fn fails(args: &[&str], want: &str) {
    let o = pn(args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(matches!(o.status.code(), Some(1 | 2)), "pn {args:?}: status {:?}\n{err}", o.status);
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error")).collect();
    assert_eq!(errors.len(), 1, "pn {args:?}: expected one error line:\n{err}");
    assert!(errors[0].starts_with("error: ") && err.contains(want), "pn {args:?}: should mention {want:?}:\n{err}");
}

/// The logits JSON's rows, checked finite (`pn logits` itself fails on NaN/Inf).
fn logits(model: &str, tokens: &str) -> Vec<Vec<f64>> {
    let out = tmp(&format!("{}.json", model.rsplit('/').next().unwrap()));
    ok(&["logits", "--model", model, "--tokens", tokens, "--out", &out, "-t", "2"]);
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let rows: Vec<Vec<f64>> = v["logits"].as_array().unwrap().iter().map(|r| r.as_array().unwrap().iter().map(|x| x.as_f64().expect("finite")).collect()).collect();
    assert!(rows.iter().flatten().all(|x| x.is_finite()));
    rows
}

#[test]
fn tiny_model_runs_and_gives_finite_logits() {
    let m = tmp("tiny-q4_k_m.gguf");
    let (_, err) = ok(&["synth", "--preset", "tiny", "--type", "q4_k_m", "--seed", "3", "--out", &m]);
    assert!(err.contains("wrote") && err.contains("vocab 1027"), "{err}");
    let rows = logits(&m, "1,2,3,4,5");
    assert_eq!((rows.len(), rows[0].len()), (5, 1027));
    let (out, _) = ok(&["run", "--model", &m, "-p", "hello world", "-n", "8", "--seed", "1", "-t", "2"]);
    assert!(out.starts_with("hello world"), "{out}");
    // the tokenizer: byte-level with merged pairs, round trip
    let (out, _) = ok(&["tokenize", "--model", &m, "--text", "the cat"]);
    assert!(!out.trim().is_empty());
}

#[test]
fn every_type_loads_and_runs() {
    let types = [
        "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_nl", "iq4_xs", "mxfp4",
        "q4_k_m", "q5_k_m",
    ];
    for ty in types {
        let m = tmp(&format!("ktiny-{ty}.gguf"));
        ok(&["synth", "--preset", "ktiny", "--type", ty, "--vocab", "300", "--experts", "2", "--out", &m]);
        let (info, _) = ok(&["info", &m]);
        assert!(info.contains("qwen35moe"), "{ty}: {info}");
        let rows = logits(&m, "1,2,3");
        assert_eq!(rows[0].len(), 303, "{ty}");
    }
}

#[test]
fn full_dims_has_the_real_layer_dims() {
    // 4 layers (3 DeltaNet + 1 attention) and 2 experts keep it ~110 MB
    let m = tmp("full-dims-small.gguf");
    ok(&["synth", "--preset", "full-dims", "--type", "q4_k_m", "--layers", "4", "--experts", "2", "--out", &m]);
    let (info, _) = ok(&["info", &m, "--tensors"]);
    for want in [
        "embedding_length = 2048",
        "attention.head_count = 16",
        "attention.head_count_kv = 2",
        "attention.key_length = 256",
        "rope.dimension_count = 64",
        "rope.dimension_sections = [11, 11, 10, 0]",
        "expert_feed_forward_length = 512",
        "expert_shared_feed_forward_length = 512",
        "ssm.inner_size = 4096",
        "ssm.state_size = 128",
        "ssm.group_count = 16",
        "ssm.time_step_rank = 32",
        "full_attention_interval = 4",
    ] {
        assert!(info.contains(want), "pn info should show {want:?}:\n{info}");
    }
    let rows = logits(&m, "5,6");
    assert_eq!(rows[0].len(), 4099);
}

#[test]
fn a_seed_gives_the_same_bytes() {
    let gen = |name: &str, seed: &str, threads: &str| {
        let p = tmp(name);
        ok(&["synth", "--preset", "ktiny", "--type", "q4_k_m", "--seed", seed, "-t", threads, "--out", &p]);
        std::fs::read(p).unwrap()
    };
    let a = gen("seed-a.gguf", "7", "1");
    let b = gen("seed-b.gguf", "7", "3");
    let c = gen("seed-c.gguf", "8", "2");
    assert!(a == b, "same seed, different thread counts: the files differ");
    assert!(a != c && a.len() == c.len(), "another seed: other weights, same layout");
}

#[test]
fn bad_flags_give_one_error_line() {
    let out = tmp("bad.gguf");
    fails(&["synth", "--preset", "huge", "--out", &out], "--preset");
    fails(&["synth", "--type", "q9_9", "--out", &out], "q4_k_m");
    fails(&["synth", "--layers", "0", "--out", &out], "--layers");
    fails(&["synth", "--experts", "4", "--experts-used", "5", "--out", &out], "--experts-used");
    fails(&["synth", "--vocab", "10", "--out", &out], "--vocab");
    fails(&["synth", "--seed", "x", "--out", &out], "--seed");
    fails(&["synth", "--out", env!("CARGO_TARGET_TMPDIR")], "directory");
    fails(&["synth", "--out", "/nonexistent-dir/x.gguf"], "cannot create");
    fails(&["synth", "--preset", "tiny"], "--out");
    fails(&["synth", "--out", &out, "--bogus"], "--bogus");
    assert!(!std::path::Path::new(&out).exists(), "no file is left behind by a failure");
}

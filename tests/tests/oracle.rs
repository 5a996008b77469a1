//! Logits against llama.cpp (the oracle fixtures in tests/fixtures).

use pn_tests::*;

fn check(name: &str, min_argmax: f64, min_pearson: f64) -> Agreement {
    let o = oracle(&format!("{name}.logits.json"));
    let r = runner(&format!("{name}.gguf"), 2);
    let ours = all_logits(&r, &o.tokens);
    let a = agreement(&ours, &o.logits);
    eprintln!("{name}: argmax agreement {:.3}, mean Pearson r {:.5}, max |Δ| {:.3e}", a.argmax, a.mean_pearson, a.max_abs);
    assert!(a.argmax >= min_argmax, "{name}: argmax agreement {:.3} < {min_argmax}", a.argmax);
    assert!(a.mean_pearson >= min_pearson, "{name}: mean Pearson {:.5} < {min_pearson}", a.mean_pearson);
    a
}

#[test]
fn f32_matches_llama_cpp_exactly() {
    let a = check("tiny-f32", 1.0, 0.9999);
    assert!(a.max_abs <= 1e-3, "tiny-f32: max |Δ| {} > 1e-3", a.max_abs);
}

#[test]
fn f32_greedy_continuation_matches_llama_cpp() {
    let (prompt, expected) = greedy_oracle("tiny-f32.greedy.json");
    assert_eq!(greedy(&runner("tiny-f32.gguf", 2), &prompt, expected.len()), expected);
}

macro_rules! oracle_case {
    ($fn:ident, $name:expr) => {
        #[test]
        fn $fn() {
            check($name, 0.8, 0.99);
        }
    };
}

oracle_case!(f16, "tiny-f16");
oracle_case!(bf16, "tiny-bf16");
oracle_case!(q8_0, "tiny-q8_0");
oracle_case!(q4_0, "tiny-q4_0");
oracle_case!(tied_head_f16, "tiny-tied-f16");
oracle_case!(mtp_block_skipped_f16, "tiny-mtp-f16");
oracle_case!(q4_k_m, "ktiny-q4_k_m");
oracle_case!(q5_k_m, "ktiny-q5_k_m");
oracle_case!(q6_k, "ktiny-q6_k");
oracle_case!(iq4_xs, "ktiny-iq4_xs");
oracle_case!(mxfp4, "ktiny-mxfp4");
oracle_case!(iq3_s, "ktiny-iq3_s");

#[test]
fn default_model_matches_llama_cpp() {
    let o = oracle("pn-default-code-q4_k_m.logits.json");
    let g = std::sync::Arc::new(pn_engine::Gguf::open(&std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/default/pn-default-code-q4_k_m.gguf")).unwrap());
    let m = pn_models::load(&g).unwrap();
    let r = pn_engine::Runner::new(m, g, std::sync::Arc::new(pn_cpu::CpuBackend::new(2))).unwrap();
    let a = agreement(&all_logits(&r, &o.tokens), &o.logits);
    eprintln!("default model: argmax agreement {:.3}, mean Pearson r {:.5}, max |Δ| {:.3e}", a.argmax, a.mean_pearson, a.max_abs);
    assert!(a.argmax >= 0.97 && a.mean_pearson >= 0.999, "{a:?}");
}

// Other architectures through the same runner and ops.
oracle_case!(dense_qwen35_f16, "qwen35-tiny-f16");
oracle_case!(dense_qwen35_q4_k_m, "qwen35-ktiny-q4_k_m");
oracle_case!(qwen3moe_f16, "qwen3moe-tiny-f16");
oracle_case!(qwen3moe_q4_k_m, "qwen3moe-ktiny-q4_k_m");

#[test]
fn default_model_greedy_continuation_matches_llama_cpp() {
    let (prompt, expected) = greedy_oracle("pn-default-code-q4_k_m.greedy.json");
    let g = std::sync::Arc::new(pn_engine::Gguf::open(&std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/default/pn-default-code-q4_k_m.gguf")).unwrap());
    let r = pn_engine::Runner::new(pn_models::load(&g).unwrap(), g, std::sync::Arc::new(pn_cpu::CpuBackend::new(2))).unwrap();
    assert_eq!(greedy(&r, &prompt, expected.len()), expected, "32 greedy tokens of the trained model");
}

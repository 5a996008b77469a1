//! Sequence state: a prompt fed in one batch, in chunks, or token by token gives the same
//! logits; thread count does not change results; bad inputs are errors.

use pn_engine::RunError;
use pn_tests::*;

fn last_logits_by(r: &pn_engine::Runner, tokens: &[u32], chunk: usize) -> Vec<f32> {
    let mut st = r.new_state(256);
    let mut last = Vec::new();
    for c in tokens.chunks(chunk) {
        last = r.forward(&mut st, c, false).unwrap().last().to_vec();
    }
    assert_eq!(st.pos, tokens.len());
    last
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

#[test]
fn batch_chunked_and_one_by_one_agree() {
    let o = oracle("tiny-f32.logits.json");
    let r = runner("tiny-f32.gguf", 2);
    let whole = last_logits_by(&r, &o.tokens, o.tokens.len());
    for chunk in [1, 3, 7, 16] {
        let d = max_abs_diff(&whole, &last_logits_by(&r, &o.tokens, chunk));
        assert!(d <= 1e-4, "chunk {chunk}: max |Δ| {d}");
    }
    // every position's logits, not only the last: ubatch splitting inside one call
    let mut r3 = runner("tiny-f32.gguf", 2);
    r3.ubatch = 5;
    let split = all_logits(&r3, &o.tokens);
    let one = all_logits(&r, &o.tokens);
    for (a, b) in split.iter().zip(&one) {
        assert!(max_abs_diff(a, b) <= 1e-4);
    }
}

#[test]
fn quantized_model_state_carry_agrees() {
    let o = oracle("ktiny-q4_k_m.logits.json");
    let r = runner("ktiny-q4_k_m.gguf", 2);
    let whole = last_logits_by(&r, &o.tokens, o.tokens.len());
    let d = max_abs_diff(&whole, &last_logits_by(&r, &o.tokens, 1));
    assert!(d <= 1e-3, "one by one: max |Δ| {d}");
}

#[test]
fn results_do_not_depend_on_thread_count() {
    let o = oracle("ktiny-q4_k_m.logits.json");
    let a = all_logits(&runner("ktiny-q4_k_m.gguf", 1), &o.tokens);
    let b = all_logits(&runner("ktiny-q4_k_m.gguf", 2), &o.tokens);
    let c = all_logits(&runner("ktiny-q4_k_m.gguf", 3), &o.tokens);
    assert!(a == b && b == c, "logits differ with the thread count");
}

#[test]
fn reset_state_reproduces_fresh_sequence() {
    let o = oracle("tiny-f16.logits.json");
    let r = runner("tiny-f16.gguf", 2);
    let mut st = r.new_state(128);
    let first = r.forward(&mut st, &o.tokens[..10], false).unwrap();
    st.reset();
    let again = r.forward(&mut st, &o.tokens[..10], false).unwrap();
    assert_eq!(first, again);
}

#[test]
fn bad_tokens_and_full_context_are_errors() {
    let r = runner("tiny-f16.gguf", 2);
    let mut st = r.new_state(16);
    match r.forward(&mut st, &[1, 5000], false) {
        Err(RunError::BadToken { id: 5000, n_vocab: 1027 }) => {}
        other => panic!("expected BadToken, got {other:?}"),
    }
    assert!(matches!(r.forward(&mut st, &[], false), Err(RunError::Empty)));
    let toks: Vec<u32> = (0..16).collect();
    r.forward(&mut st, &toks, false).unwrap();
    match r.forward(&mut st, &[1], false) {
        Err(e @ RunError::ContextFull { .. }) => assert!(e.to_string().contains("context full")),
        other => panic!("expected ContextFull, got {other:?}"),
    }
}

//! Multi-turn chat keeps the conversation in the model state: feeding only each turn's
//! template delta gives the same logits as prefilling the whole conversation at once.

use pn_engine::conversation::Conversation;
use pn_engine::sampler::argmax;
use pn_engine::tokenizer::Tokenizer;
use pn_engine::{Gguf, Runner};
use std::sync::Arc;

fn default_model() -> (Runner, Tokenizer) {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/default/pn-default-code-q4_k_m.gguf");
    let g = Arc::new(Gguf::open(&path).unwrap());
    let tok = Tokenizer::from_gguf(&g).unwrap();
    let m = pn_models::load(&g).unwrap();
    (Runner::new(m, g, Arc::new(pn_cpu::CpuBackend::new(2))).unwrap(), tok)
}

#[test]
fn incremental_turns_equal_a_full_prefill() {
    let (r, tok) = default_model();
    let mut conv = Conversation::new(Some("You write Python."), r.new_state(512));
    let mut fed: Vec<u32> = Vec::new();
    // (tokens fed up to the end of a user prompt, logits there)
    let mut checkpoints: Vec<(usize, Vec<f32>)> = Vec::new();
    for (turn, user) in ["def add(a, b):", "class Stack:", "import os"].iter().enumerate() {
        let ids = conv.user_turn(&tok, user).unwrap();
        assert!(turn == 0 || ids.len() < 24, "turn {turn} fed {} tokens: only the delta is fed", ids.len());
        fed.extend(&ids);
        let mut logits = r.forward(&mut conv.st, &ids, false).unwrap().last().to_vec();
        checkpoints.push((fed.len(), logits.clone()));
        let mut answer = Vec::new();
        for _ in 0..6 {
            let next = argmax(&logits) as u32;
            if tok.is_eog(next) {
                break;
            }
            answer.push(next);
            fed.push(next);
            logits = r.forward(&mut conv.st, &[next], false).unwrap().last().to_vec();
        }
        conv.assistant_turn(tok.decode(&answer));
    }
    assert_eq!(conv.re_prefills, 0, "ChatML never re-renders earlier turns");
    assert_eq!(conv.st.pos, fed.len(), "the state holds exactly the fed tokens");
    for (end, logits) in checkpoints {
        let mut fresh = r.new_state(512);
        let full = r.forward(&mut fresh, &fed[..end], false).unwrap();
        let d = full.last().iter().zip(&logits).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(d <= 1e-3, "after {end} tokens: incremental vs full prefill max |Δ| {d}");
    }
}

#[test]
fn cancelled_turn_leaves_the_conversation_unchanged() {
    let (r, tok) = default_model();
    let mut conv = Conversation::new(None, r.new_state(64));
    let ids = conv.user_turn(&tok, "def f():").unwrap();
    r.forward(&mut conv.st, &ids, false).unwrap();
    conv.assistant_turn(String::new());
    let before = conv.messages.clone();
    let _ = conv.user_turn(&tok, &"x = 1\n".repeat(50)).unwrap();
    conv.cancel_user_turn();
    assert_eq!(conv.messages, before);
    let again = conv.user_turn(&tok, "y = 2").unwrap();
    assert!(again.len() < 20, "after a cancel only the new delta is fed");
}

//! KV formats end to end: llama.cpp's quantized-KV fixtures, max_seq resolution and
//! clamps, context overflow (error and ring), snapshot / restore, the memory ladder.

use pn_engine::state::kv::{choose_kv, resolve_kv_type, resolve_max_seq, resolve_overflow, state_bytes, StateConfig, StateError};
use pn_engine::{RunError, Runner, SeqState};
use pn_ops::{KvType, Overflow};
use pn_tests::*;

fn logits_with(r: &Runner, st: &mut SeqState, tokens: &[u32]) -> Vec<Vec<f32>> {
    let l = r.forward(st, tokens, true).expect("forward");
    (0..l.rows()).map(|i| l.row(i).to_vec()).collect()
}

fn kv_agreement(ty: KvType, json: &str) -> Agreement {
    let o = oracle(json);
    let r = runner("tiny-f16.gguf", 2);
    let mut st = r.new_state_with(o.tokens.len().max(16), ty);
    assert_eq!(st.kv_type(), Some(ty));
    let a = agreement(&logits_with(&r, &mut st, &o.tokens), &o.logits);
    eprintln!("{json} vs our {ty} KV: argmax {:.3}, mean pearson {:.6}, max |Δ| {:.4}", a.argmax, a.mean_pearson, a.max_abs);
    a
}

#[test]
fn q8_0_kv_matches_llama_cpp() {
    let a = kv_agreement(KvType::Q8_0, "tiny-f16.kvq8_0.logits.json");
    assert!(a.argmax >= 0.8 && a.mean_pearson >= 0.99, "{a:?}");
}

#[test]
fn q4_0_kv_matches_llama_cpp() {
    let a = kv_agreement(KvType::Q4_0, "tiny-f16.kvq4_0.logits.json");
    assert!(a.argmax >= 0.8 && a.mean_pearson >= 0.99, "{a:?}");
}

#[test]
fn default_state_is_f32_and_exact() {
    let o = oracle("tiny-f32.logits.json");
    let r = runner("tiny-f32.gguf", 2);
    let mut st = r.new_state(o.tokens.len().max(16));
    assert_eq!(st.kv_type(), Some(KvType::F32));
    let a = agreement(&logits_with(&r, &mut st, &o.tokens), &o.logits);
    assert!(a.max_abs <= 1e-3, "{a:?}");
}

#[test]
fn every_format_is_split_and_thread_independent() {
    let o = oracle("ktiny-q4_k_m.logits.json");
    let (r1, r3) = (runner("ktiny-q4_k_m.gguf", 1), runner("ktiny-q4_k_m.gguf", 3));
    for ty in KvType::ALL {
        let whole = logits_with(&r1, &mut r1.new_state_with(64, ty), &o.tokens);
        assert_eq!(whole, logits_with(&r3, &mut r3.new_state_with(64, ty), &o.tokens), "{ty}: thread count");
        let mut st = r1.new_state_with(64, ty);
        let mut last = Vec::new();
        for t in &o.tokens {
            last = r1.forward(&mut st, &[*t], false).unwrap().last().to_vec();
        }
        let d = whole.last().unwrap().iter().zip(&last).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
        assert!(d <= 1e-3, "{ty}: one by one differs by {d}");
    }
}

#[test]
fn max_seq_and_kv_type_resolution() {
    assert_eq!(resolve_max_seq(Some(4096)).unwrap(), (4096, None));
    let (n, w) = resolve_max_seq(Some(3)).unwrap();
    assert_eq!(n, 16);
    assert!(w.unwrap().contains("clamped to 16"));
    let (n, w) = resolve_max_seq(Some(1 << 30)).unwrap();
    assert_eq!(n, 262_144);
    assert!(w.is_some());
    assert_eq!(resolve_kv_type(Some("q8_0")).unwrap(), KvType::Q8_0);
    assert!(resolve_kv_type(Some("q3")).is_err());
    assert_eq!(resolve_overflow(Some("ring")).unwrap(), Overflow::Ring);
    assert!(resolve_overflow(Some("wrap")).is_err());
    // the environment (only this test touches these variables)
    for v in ["PN_MAX_SEQ", "QWEN35_MAX_SEQ", "PN_KV_TYPE", "QWEN35_KV_Q4"] {
        std::env::remove_var(v);
    }
    assert_eq!(resolve_max_seq(None).unwrap(), (4096, None));
    assert_eq!(resolve_kv_type(None).unwrap(), KvType::Q4_0);
    std::env::set_var("QWEN35_MAX_SEQ", "8");
    assert_eq!(resolve_max_seq(None).unwrap().0, 16);
    std::env::set_var("PN_MAX_SEQ", "1000");
    assert_eq!(resolve_max_seq(None).unwrap(), (1000, None));
    assert_eq!(resolve_max_seq(Some(20)).unwrap(), (20, None), "the flag wins");
    std::env::set_var("PN_MAX_SEQ", "lots");
    assert!(resolve_max_seq(None).is_err());
    std::env::set_var("QWEN35_KV_Q4", "0");
    assert_eq!(resolve_kv_type(None).unwrap(), KvType::F32);
    std::env::set_var("QWEN35_KV_Q4", "1");
    assert_eq!(resolve_kv_type(None).unwrap(), KvType::Q4_0);
    std::env::set_var("PN_KV_TYPE", "f16");
    assert_eq!(resolve_kv_type(None).unwrap(), KvType::F16);
    assert_eq!(resolve_kv_type(Some("f32")).unwrap(), KvType::F32, "the flag wins");
    for v in ["PN_MAX_SEQ", "QWEN35_MAX_SEQ", "PN_KV_TYPE", "QWEN35_KV_Q4"] {
        std::env::remove_var(v);
    }
}

#[test]
fn context_full_is_an_error_by_default() {
    let r = runner("tiny-f16.gguf", 2);
    let toks: Vec<u32> = (0..20).collect();
    for ty in KvType::ALL {
        let mut st = r.new_state_with(16, ty);
        match r.forward(&mut st, &toks, false) {
            Err(RunError::ContextFull { have: 0, adding: 20, max_seq: 16 }) => {}
            other => panic!("{ty}: expected ContextFull, got {other:?}"),
        }
        r.forward(&mut st, &toks[..16], false).unwrap();
        assert!(matches!(r.forward(&mut st, &[1], false), Err(RunError::ContextFull { .. })));
        assert_eq!(st.pos, 16);
    }
}

#[test]
fn ring_overflow_is_a_sliding_window() {
    let r = runner("tiny-f16.gguf", 2);
    let toks: Vec<u32> = (0..48).map(|i| (i * 37 % 1000) as u32).collect();
    for ty in [KvType::F32, KvType::Q4_0] {
        let cfg = StateConfig { max_seq: 16, kv: ty, overflow: Overflow::Ring };
        let (mut ring, _) = r.alloc_state_within(&cfg, None).unwrap();
        let all = logits_with(&r, &mut ring, &toks);
        assert_eq!(ring.pos, 48);
        assert!(all.iter().flatten().all(|x| x.is_finite()));
        // before the wrap: exactly the plain cache
        let plain = logits_with(&r, &mut r.new_state_with(64, ty), &toks);
        assert_eq!(all[..16], plain[..16], "{ty}");
        assert_ne!(all[40], plain[40], "{ty}: past the window the context is cut");
        // token by token gives the same sliding window
        let (mut one, _) = r.alloc_state_within(&cfg, None).unwrap();
        for (i, t) in toks.iter().enumerate() {
            let l = r.forward(&mut one, &[*t], false).unwrap();
            let d = l.last().iter().zip(&all[i]).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
            assert!(d <= 1e-3, "{ty} position {i}: {d}");
        }
    }
}

#[test]
fn snapshot_restore_gives_identical_logits() {
    let o = oracle("ktiny-q4_k_m.logits.json");
    let r = runner("ktiny-q4_k_m.gguf", 2);
    let (pre, rest) = o.tokens.split_at(20);
    for ty in KvType::ALL {
        let mut st = r.new_state_with(1024, ty);
        r.forward(&mut st, pre, false).unwrap();
        let snap = st.snapshot().unwrap();
        assert_eq!(snap.pos, 20);
        assert!(snap.bytes() < st.bytes(), "{ty}: snapshot {} vs state {}", snap.bytes(), st.bytes());
        let a = logits_with(&r, &mut st, rest);
        st.restore(&snap).unwrap();
        assert_eq!(st.pos, 20);
        assert_eq!(a, logits_with(&r, &mut st, rest), "{ty}: after restore");
        // into a fresh state of the same shape
        let mut fresh = r.new_state_with(1024, ty);
        fresh.restore(&snap).unwrap();
        assert_eq!(a, logits_with(&r, &mut fresh, rest), "{ty}: fresh state");
        // a state of another format or size refuses it, untouched
        let mut other = r.new_state_with(512, ty);
        assert!(other.restore(&snap).is_err());
        let wrong = if ty == KvType::F32 { KvType::F16 } else { KvType::F32 };
        let mut other = r.new_state_with(1024, wrong);
        let before = other.clone();
        assert!(other.restore(&snap).is_err());
        assert_eq!(other, before);
        st.reset();
        assert_eq!(st.pos, 0);
    }
}

#[test]
fn memory_ladder_falls_back_to_q4_0_then_errors() {
    let r = runner("tiny-f16.gguf", 2);
    let m = r.model();
    let f32b = state_bytes(m, 65536, KvType::F32);
    let q4b = state_bytes(m, 65536, KvType::Q4_0);
    assert_eq!(f32b.kv_layers, 1);
    assert!(q4b.total() * 4 < f32b.total());
    assert_eq!(state_bytes(m, 8192, KvType::F32).kv * 8, f32b.kv, "linear in max_seq");
    assert_eq!(choose_kv(m, 65536, KvType::F32, None).unwrap(), (KvType::F32, None));
    assert_eq!(choose_kv(m, 65536, KvType::F32, Some(f32b.total())).unwrap().0, KvType::F32);
    let (ty, note) = choose_kv(m, 65536, KvType::F32, Some(f32b.total() - 1)).unwrap();
    assert_eq!(ty, KvType::Q4_0);
    assert!(note.unwrap().contains("using q4_0"));
    match choose_kv(m, 65536, KvType::F32, Some(q4b.total() - 1)) {
        Err(e @ StateError::TooLarge { .. }) => assert!(e.to_string().contains(&q4b.total().to_string())),
        other => panic!("expected TooLarge, got {other:?}"),
    }
    let cfg = StateConfig { max_seq: 65536, kv: KvType::F16, overflow: Overflow::Error };
    let (st, notes) = r.alloc_state_within(&cfg, Some(q4b.total())).unwrap();
    assert_eq!((st.kv_type(), notes.len()), (Some(KvType::Q4_0), 1));
    assert_eq!(st.bytes() as u64, q4b.total());
}

//! llama, qwen3 and qwen2 against llama.cpp (fixtures from `pn synth --arch`, see
//! tests/fixtures/make_arch_fixtures.sh), at qwen35moe's tolerances: f32 max |Δ| ≤ 1e-3
//! with every argmax equal and the 16 greedy tokens equal; quantized argmax ≥ 0.9 and
//! mean Pearson r ≥ 0.995. Also: our tokenizer gives llama.cpp's prompt tokens
//! (llama3 BPE and SentencePiece), the chat templates render with one BOS, and the
//! graph dump shows the architecture's RoPE.

use pn_engine::chat::{render_for, ChatMessage};
use pn_engine::graph::GraphBuilder;
use pn_engine::tokenizer::Tokenizer;
use pn_engine::{Geometry, Gguf};
use pn_tests::*;

const PROMPT: &str = "The quick brown fox jumps over the lazy dog. In 1969, Apollo 11 landed on the Moon; its crew returned safely.";
const F32: [&str; 3] = ["llama-tiny-f32", "qwen3-tiny-f32", "qwen2-tiny-f32"];
const QUANT: [&str; 4] = ["llama-ktiny-q4_k_m", "qwen3-ktiny-q4_k_m", "qwen2-ktiny-q4_k_m", "llama-spm-tiny-f16"];

fn check(name: &str) -> Agreement {
    let o = oracle(&format!("{name}.logits.json"));
    let a = agreement(&all_logits(&runner(&format!("{name}.gguf"), 2), &o.tokens), &o.logits);
    eprintln!("{name}: argmax {:.3}, mean r {:.6}, max |Δ| {:.2e}", a.argmax, a.mean_pearson, a.max_abs);
    a
}

#[test]
fn f32_logits_match_llama_cpp() {
    for name in F32 {
        let a = check(name);
        assert!(a.max_abs <= 1e-3 && a.argmax == 1.0, "{name}: {a:?}");
    }
}

#[test]
fn quantized_logits_track_llama_cpp() {
    for name in QUANT {
        let a = check(name);
        assert!(a.argmax >= 0.9 && a.mean_pearson >= 0.995, "{name}: {a:?}");
    }
}

#[test]
fn greedy_continuations_match_llama_cpp() {
    for name in F32.iter().chain(&["llama-spm-tiny-f16"]) {
        let (prompt, expected) = greedy_oracle(&format!("{name}.greedy.json"));
        let got = greedy(&runner(&format!("{name}.gguf"), 2), &prompt, expected.len());
        assert_eq!(got, expected, "{name}");
    }
}

fn tokenizer(name: &str) -> Tokenizer {
    Tokenizer::from_gguf(&Gguf::open(&fixture(&format!("{name}.gguf"))).unwrap()).unwrap()
}

#[test]
fn prompt_tokens_are_llama_cpps() {
    for name in F32.iter().chain(&QUANT) {
        let t = tokenizer(name);
        // the oracle tokenizes with add_bos=False, special=True
        let ids = t.encode(PROMPT, true);
        assert_eq!(ids, oracle(&format!("{name}.logits.json")).tokens, "{name}");
        assert_eq!(t.decode(&ids), PROMPT, "{name}: decode");
    }
}

#[test]
fn chat_templates_render_with_one_bos() {
    let msgs = [ChatMessage::user("Hi there")];
    let llama = tokenizer("llama-tiny-f32");
    let s = render_for(&llama, &msgs, true).unwrap();
    assert_eq!(s, "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
    let ids = llama.encode(&s, true);
    assert!(ids.iter().filter(|&&i| llama.is_eog(i)).count() == 1 && llama.token_text(ids[0]) == Some("<|start_header_id|>"), "{ids:?}");
    let mistral = tokenizer("llama-spm-tiny-f16");
    assert_eq!(render_for(&mistral, &msgs, true).unwrap(), "[INST] Hi there [/INST]");
    let qwen = tokenizer("qwen3-tiny-f32");
    assert!(render_for(&qwen, &msgs, true).unwrap().ends_with("<|im_start|>assistant\n"));
}

#[test]
fn graph_dumps_show_each_architectures_rope() {
    for (name, mode, freqs) in [("llama-tiny-f32", "Normal", true), ("qwen3-tiny-f32", "Neox", false), ("llama-spm-tiny-f16", "Normal", false)] {
        let g = Gguf::open(&fixture(&format!("{name}.gguf"))).unwrap();
        let m = pn_models::load(&g).unwrap();
        let mut b = GraphBuilder::new();
        m.build(Geometry::one(3, true), &mut b).unwrap();
        let text = pn_engine::dump::text(&b.finish(), Some(0..1), None);
        let ropes: Vec<&str> = text.lines().filter(|l| l.contains("Rope{")).collect();
        assert_eq!(ropes.len(), 2, "{name}: {text}");
        for l in ropes {
            assert!(l.contains(&format!("mode={mode}")), "{name}: {l}");
            // x, pos and, with llama3 scaling, the freq factors
            let inputs = l.rsplit("<-").next().unwrap().split_whitespace().count();
            assert_eq!(inputs, 2 + freqs as usize, "{name}: {l}");
        }
        assert_eq!(text.contains("Qcur_normed"), name.starts_with("qwen3"), "{name}");
    }
}

#[test]
fn unknown_architecture_names_the_supported_ones() {
    let mut bytes = std::fs::read(fixture("qwen3-tiny-f32.gguf")).unwrap();
    // rename the architecture in place: "qwen3" → "qwen9" in general.architecture
    let key = b"general.architecture";
    let p = bytes.windows(key.len()).position(|w| w == key).unwrap() + key.len() + 4 + 8;
    assert_eq!(&bytes[p..p + 5], b"qwen3");
    bytes[p + 4] = b'9';
    let e = pn_models::load(&Gguf::from_bytes(bytes).unwrap()).err().expect("unknown arch");
    let msg = e.to_string();
    for a in pn_models::SUPPORTED {
        assert!(msg.contains(a), "{msg}");
    }
    assert!(msg.contains("qwen9") && msg.contains("llama") && msg.contains("qwen2"), "{msg}");
}

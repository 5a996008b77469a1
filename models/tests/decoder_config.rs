//! The decoder architectures (llama, qwen3, qwen2) reject files that are not what they
//! say with errors naming the key or tensor, expected and found; and load what they are.

use pn_engine::gguf_writer::GgufWriter;
use pn_engine::{Gguf, MetaValue};
use std::path::PathBuf;

fn fixture(name: &str) -> Gguf {
    Gguf::open(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name)).unwrap()
}

/// A copy of `g` with metadata `set` (None: removed) and without tensors matching `drop`.
fn edited(g: &Gguf, set: &[(&str, Option<MetaValue>)], drop: &dyn Fn(&str) -> bool) -> Gguf {
    let mut w = GgufWriter::new();
    for (k, v) in &g.metadata {
        if !set.iter().any(|(s, _)| s == k) {
            w = w.kv(k.clone(), v.clone());
        }
    }
    for (k, v) in set {
        if let Some(v) = v {
            w = w.kv(*k, v.clone());
        }
    }
    for t in g.tensors.iter().filter(|t| !drop(&t.name)) {
        w = w.tensor(t.name.clone(), &t.ne[..t.n_dims as usize], t.ty, g.tensor_bytes(t).to_vec());
    }
    Gguf::from_bytes(w.to_bytes()).unwrap()
}

fn err(g: &Gguf) -> String {
    pn_models::load(g).err().expect("load must fail").to_string()
}

#[test]
fn fixtures_load_as_their_architecture() {
    for (f, arch) in [("llama-tiny-f32.gguf", "llama"), ("qwen3-tiny-f32.gguf", "qwen3"), ("qwen2-tiny-f32.gguf", "qwen2"), ("qwen3moe-tiny-f16.gguf", "qwen3moe")] {
        let m = pn_models::load(&fixture(f)).unwrap();
        assert_eq!(m.arch(), arch);
        let d = m.describe();
        let attn = &d.iter().find(|(k, _)| k == "attention").unwrap().1;
        assert!(attn.contains(if arch == "llama" { "Normal" } else { "Neox" }), "{attn}");
    }
}

#[test]
fn required_tensors_are_named() {
    let q2 = fixture("qwen2-tiny-f32.gguf");
    let e = err(&edited(&q2, &[], &|n| n == "blk.1.attn_k.bias"));
    assert!(e.contains("blk.1.attn_k.bias") && e.contains("qwen2"), "{e}");
    let q3 = fixture("qwen3-tiny-f32.gguf");
    let e = err(&edited(&q3, &[], &|n| n == "blk.0.attn_q_norm.weight"));
    assert!(e.contains("blk.0.attn_q_norm.weight") && e.contains("qwen3"), "{e}");
    // llama's factors must be n_rot/2 f32 values
    let l = fixture("llama-tiny-f32.gguf");
    let m = pn_models::load(&edited(&l, &[("llama.rope.dimension_count", Some(MetaValue::U32(32)))], &|_| false)).unwrap();
    let mut b = pn_engine::graph::GraphBuilder::new();
    let e = m.build(pn_engine::Geometry::one(1, false), &mut b).unwrap_err().to_string();
    assert!(e.contains("rope_freqs.weight") && e.contains("[16"), "{e}");
}

#[test]
fn unsupported_variants_are_refused_by_name() {
    let l = fixture("llama-tiny-f32.gguf");
    let yarn = Some(MetaValue::String("yarn".into()));
    let e = err(&edited(&l, &[("llama.rope.scaling.type", yarn)], &|_| false));
    assert!(e.contains("llama.rope.scaling.type") && e.contains("yarn"), "{e}");
    let e = err(&edited(&l, &[("llama.expert_count", Some(MetaValue::U32(8)))], &|_| false));
    assert!(e.contains("llama.expert_count") && e.contains("Mixtral"), "{e}");
    let e = err(&edited(&l, &[("llama.attention.head_count_kv", Some(MetaValue::U32(3)))], &|_| false));
    assert!(e.contains("heads 4/3"), "{e}");
    let e = err(&edited(&l, &[("llama.attention.layer_norm_rms_epsilon", None)], &|_| false));
    assert!(e.contains("llama.attention.layer_norm_rms_epsilon"), "{e}");
}

#[test]
fn linear_rope_scaling_sets_freq_scale() {
    let l = fixture("qwen3-tiny-f32.gguf");
    let g = edited(&l, &[("qwen3.rope.scaling.type", Some(MetaValue::String("linear".into()))), ("qwen3.rope.scaling.factor", Some(MetaValue::F32(4.0)))], &|_| false);
    let m = pn_models::load(&g).unwrap();
    let attn = m.describe().into_iter().find(|(k, _)| k == "attention").unwrap().1;
    assert!(attn.ends_with("scale 0.25"), "{attn}");
}

//! `pn synth --arch llama|qwen3|qwen2|qwen3moe|qwen35`: the tensor plans and metadata of
//! the other architectures, with the same presets, weight types and writer as the
//! qwen35moe synthesizer (cmd_synth.rs). Dense archs use `n_ff = 2·n_embd` and rotate
//! the whole head. `llama` writes a Llama-3 style file (byte-level BPE, `llama-bpe`,
//! llama3 rope scaling as `rope_freqs.weight`) or, with `--spm`, a Mistral-7B style one
//! (a SentencePiece vocabulary with `<0xXX>` byte tokens, no rope factors).

use crate::cmd_synth::{fit, metadata, more_bits, plan, vocabulary, Dims, WeightType, CHAT_TEMPLATE};
use crate::synth_write::{write_gguf, Init, TensorPlan};
use anyhow::{bail, Result};
use pn_engine::MetaValue;
use pn_ops::GgmlType;
use std::path::Path;

pub const ARCHS: &[&str] = &["qwen35moe", "qwen35", "qwen3moe", "qwen3", "qwen2", "llama"];

/// llama3 rope scaling written into synthetic llama files: factor 8, low/high frequency
/// factors 1 and 4, and a small original context (64) so that short test prompts reach
/// all three regimes (factor 1, smoothed, factor 8).
pub const LLAMA3_ORIG_CTX: f32 = 64.0;
const LLAMA3_BASE: f32 = 5e5;

/// What `run` writes besides the dims and weight type.
pub struct ArchOpts<'a> {
    pub arch: &'a str,
    pub spm: bool,
    pub seed: u64,
    pub ctx: usize,
    pub tied: bool,
    pub threads: usize,
}

const LLAMA3_SPECIAL: [&str; 5] = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"];
const LLAMA3_TEMPLATE: &str = "{% for message in messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";
const MISTRAL_TEMPLATE: &str = "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}{% endif %}{% endfor %}";

/// A SentencePiece vocabulary: `<unk> <s> </s>`, the 256 `<0xXX>` byte tokens, `▁` and
/// printable ASCII, then two-character pieces with decreasing scores (merge priority),
/// `n` tokens in all. Returns (tokens, types, scores).
pub fn spm_vocabulary(n: usize) -> (Vec<String>, Vec<i32>, Vec<f32>) {
    let mut tokens: Vec<String> = ["<unk>", "<s>", "</s>"].map(String::from).to_vec();
    let mut types = vec![2, 3, 3];
    tokens.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
    types.extend([6; 256]);
    let chars: Vec<String> = std::iter::once("\u{2581}".to_string()).chain((b'!'..=b'~').map(|c| (c as char).to_string())).collect();
    let mut scores = vec![0.0f32; tokens.len()];
    for (i, c) in chars.iter().enumerate() {
        tokens.push(c.clone());
        types.push(1);
        scores.push(-1000.0 - i as f32);
    }
    let common: Vec<&String> = chars.iter().take(40).collect();
    'outer: for a in &common {
        for b in &common {
            if tokens.len() >= n {
                break 'outer;
            }
            tokens.push(format!("{a}{b}"));
            types.push(1);
            scores.push(-(tokens.len() as f32));
        }
    }
    (tokens, types, scores)
}

/// Largest [`spm_vocabulary`]: specials, bytes, 95 characters, 40 × 40 pairs.
const SPM_MAX: usize = 3 + 256 + 95 + 40 * 40;

/// The llama3 frequency factors, as the converter computes them (convert_hf_to_gguf.py).
pub fn llama3_factors(base: f32, dim: usize) -> Vec<f32> {
    let (factor, low, high) = (8.0f64, 1.0f64, 4.0f64);
    let orig = LLAMA3_ORIG_CTX as f64;
    let (low_wl, high_wl) = (orig / low, orig / high);
    (0..dim / 2)
        .map(|i| {
            let freq = 1.0 / (base as f64).powf((2 * i) as f64 / dim as f64);
            let wl = 2.0 * std::f64::consts::PI / freq;
            let f = if wl < high_wl {
                1.0
            } else if wl > low_wl {
                factor
            } else {
                let smooth = (orig / wl - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor + smooth)
            };
            f as f32
        })
        .collect()
}

fn dense_ff(d: &Dims) -> usize {
    2 * d.n_embd
}

/// Tensors of the GQA archs: attention (q/k norms for qwen3*, q/k/v biases for qwen2),
/// then a SwiGLU MLP or (qwen3moe) softmax-routed experts.
fn plan_gqa(arch: &str, d: &Dims, wt: &WeightType, tied: bool, rope_freqs: bool) -> Vec<TensorPlan> {
    let (e, h, hkv, hd) = (d.n_embd, d.n_head, d.n_head_kv, d.head_dim);
    // ChatML's 3 special tokens, or llama's 5 (BPE) / 3 + 2 extra pieces (SentencePiece)
    let n_vocab = d.vocab + if arch == "llama" { 5 } else { 3 };
    let q6 = if wt.mix { GgmlType::Q6K } else { wt.base };
    let b = Some(wt.base);
    let mut out = Vec::new();
    let mut t = |name: String, ne: &[usize], ty: Option<GgmlType>, init: Init| {
        let ty = ty.map_or(GgmlType::F32, |t| fit(t, ne[0]));
        out.push(TensorPlan { name, ne: ne.to_vec(), ty, init });
    };
    t("token_embd.weight".into(), &[e, n_vocab], b, Init::Normal(1.0));
    t("output_norm.weight".into(), &[e], None, Init::Norm);
    if !tied {
        t("output.weight".into(), &[e, n_vocab], Some(q6), Init::Mat(1.0));
    }
    if rope_freqs {
        t("rope_freqs.weight".into(), &[hd / 2], None, Init::Llama3Freqs { base: LLAMA3_BASE });
    }
    for il in 0..d.n_layer {
        let p = |n: &str| format!("blk.{il}.{n}");
        let more = if more_bits(il, d.n_layer) { Some(q6) } else { b };
        t(p("attn_norm.weight"), &[e], None, Init::Norm);
        t(p("attn_q.weight"), &[e, hd * h], b, Init::Mat(1.0));
        t(p("attn_k.weight"), &[e, hd * hkv], b, Init::Mat(1.0));
        t(p("attn_v.weight"), &[e, hd * hkv], more, Init::Mat(1.0));
        t(p("attn_output.weight"), &[hd * h, e], b, Init::Mat(1.0));
        if arch == "qwen2" {
            t(p("attn_q.bias"), &[hd * h], None, Init::Normal(0.5));
            t(p("attn_k.bias"), &[hd * hkv], None, Init::Normal(0.5));
            t(p("attn_v.bias"), &[hd * hkv], None, Init::Normal(0.5));
        }
        if arch.starts_with("qwen3") {
            t(p("attn_q_norm.weight"), &[hd], None, Init::Norm);
            t(p("attn_k_norm.weight"), &[hd], None, Init::Norm);
        }
        t(p("ffn_norm.weight"), &[e], None, Init::Norm);
        if arch == "qwen3moe" {
            let (nx, ff) = (d.n_expert, d.expert_ff);
            t(p("ffn_gate_inp.weight"), &[e, nx], None, Init::Mat(2.0));
            t(p("ffn_gate_exps.weight"), &[e, ff, nx], b, Init::Mat(1.0));
            t(p("ffn_up_exps.weight"), &[e, ff, nx], b, Init::Mat(1.0));
            t(p("ffn_down_exps.weight"), &[ff, e, nx], more, Init::Mat(1.0));
        } else {
            let ff = dense_ff(d);
            t(p("ffn_gate.weight"), &[e, ff], b, Init::Mat(1.0));
            t(p("ffn_up.weight"), &[e, ff], b, Init::Mat(1.0));
            t(p("ffn_down.weight"), &[ff, e], more, Init::Mat(1.0));
        }
    }
    out
}

/// qwen35 (dense Qwen3.5): the qwen35moe plan with a SwiGLU MLP instead of experts.
fn plan_qwen35(d: &Dims, wt: &WeightType, tied: bool) -> Vec<TensorPlan> {
    let mut out: Vec<TensorPlan> = plan(d, wt, tied, 0).into_iter().filter(|t| !t.name.contains("_exps") && !t.name.contains("shexp") && !t.name.contains("ffn_gate_inp")).collect();
    let ff = dense_ff(d);
    let q6 = if wt.mix { GgmlType::Q6K } else { wt.base };
    for il in 0..d.n_layer {
        let down = if more_bits(il, d.n_layer) { q6 } else { wt.base };
        for (n, ne, ty) in [("ffn_gate", [d.n_embd, ff], wt.base), ("ffn_up", [d.n_embd, ff], wt.base), ("ffn_down", [ff, d.n_embd], down)] {
            out.push(TensorPlan { name: format!("blk.{il}.{n}.weight"), ne: ne.to_vec(), ty: fit(ty, ne[0]), init: Init::Mat(1.0) });
        }
    }
    out
}

fn strs(v: Vec<String>) -> MetaValue {
    MetaValue::Array(v.into_iter().map(MetaValue::String).collect())
}

/// Metadata of the GQA archs (the keys llama.cpp's converter writes).
fn metadata_gqa(arch: &str, d: &Dims, name: &str, file_type: u32, o: &ArchOpts<'_>) -> Vec<(String, MetaValue)> {
    use MetaValue::*;
    let k = |s: &str| format!("{arch}.{s}");
    let u = |x: usize| U32(x as u32);
    let rope_base = if arch == "llama" { LLAMA3_BASE } else { 1e6 };
    let mut m = vec![
        ("general.architecture".into(), String(arch.into())),
        ("general.name".into(), String(name.into())),
        (k("block_count"), u(d.n_layer)),
        (k("context_length"), u(o.ctx)),
        (k("embedding_length"), u(d.n_embd)),
        (k("feed_forward_length"), u(if arch == "qwen3moe" { d.expert_ff * d.n_expert_used } else { dense_ff(d) })),
        (k("attention.head_count"), u(d.n_head)),
        (k("attention.head_count_kv"), u(d.n_head_kv)),
        (k("attention.key_length"), u(d.head_dim)),
        (k("attention.value_length"), u(d.head_dim)),
        (k("attention.layer_norm_rms_epsilon"), F32(1e-5)),
        (k("rope.freq_base"), F32(rope_base)),
        (k("rope.dimension_count"), u(d.head_dim)),
    ];
    if arch == "qwen3moe" {
        m.extend([(k("expert_count"), u(d.n_expert)), (k("expert_used_count"), u(d.n_expert_used)), (k("expert_feed_forward_length"), u(d.expert_ff))]);
    }
    let (bos, eos, template) = if arch != "llama" {
        let (tokens, types, merges) = vocabulary(d.vocab);
        m.extend([
            ("tokenizer.ggml.model".into(), String("gpt2".into())),
            ("tokenizer.ggml.pre".into(), String("qwen2".into())),
            ("tokenizer.ggml.tokens".into(), strs(tokens)),
            ("tokenizer.ggml.token_type".into(), Array(types.into_iter().map(I32).collect())),
            ("tokenizer.ggml.merges".into(), strs(merges)),
            ("tokenizer.ggml.add_bos_token".into(), Bool(false)),
        ]);
        (d.vocab, d.vocab + 2, CHAT_TEMPLATE)
    } else if o.spm {
        let (tokens, types, scores) = spm_vocabulary(d.vocab + 5);
        m.extend([
            ("tokenizer.ggml.model".into(), String("llama".into())),
            ("tokenizer.ggml.pre".into(), String("default".into())),
            ("tokenizer.ggml.tokens".into(), strs(tokens)),
            ("tokenizer.ggml.scores".into(), Array(scores.into_iter().map(F32).collect())),
            ("tokenizer.ggml.token_type".into(), Array(types.into_iter().map(I32).collect())),
            ("tokenizer.ggml.unknown_token_id".into(), U32(0)),
            ("tokenizer.ggml.add_bos_token".into(), Bool(true)),
            ("tokenizer.ggml.add_eos_token".into(), Bool(false)),
        ]);
        (1, 2, MISTRAL_TEMPLATE)
    } else {
        let (mut tokens, mut types, merges) = vocabulary(d.vocab);
        tokens.truncate(d.vocab);
        types.truncate(d.vocab);
        tokens.extend(LLAMA3_SPECIAL.map(std::string::String::from));
        types.extend([3; 5]);
        m.extend([
            ("tokenizer.ggml.model".into(), String("gpt2".into())),
            ("tokenizer.ggml.pre".into(), String("llama-bpe".into())),
            ("tokenizer.ggml.tokens".into(), strs(tokens)),
            ("tokenizer.ggml.token_type".into(), Array(types.into_iter().map(I32).collect())),
            ("tokenizer.ggml.merges".into(), strs(merges)),
            ("tokenizer.ggml.add_bos_token".into(), Bool(true)),
        ]);
        (d.vocab, d.vocab + 4, LLAMA3_TEMPLATE)
    };
    m.extend([
        ("tokenizer.ggml.bos_token_id".into(), u(bos)),
        ("tokenizer.ggml.eos_token_id".into(), u(eos)),
        ("tokenizer.ggml.padding_token_id".into(), u(bos)),
        ("tokenizer.chat_template".into(), String(template.into())),
        ("general.quantization_version".into(), U32(2)),
        ("general.file_type".into(), U32(file_type)),
    ]);
    m
}

/// qwen35: the qwen35moe keys under `qwen35.`, the expert keys replaced by the MLP width.
fn metadata_qwen35(d: &Dims, name: &str, file_type: u32, ctx: usize) -> Vec<(String, MetaValue)> {
    let mut m: Vec<(String, MetaValue)> = metadata(d, name, file_type, ctx, 0)
        .into_iter()
        .filter(|(k, _)| !k.contains("expert") && !k.ends_with("feed_forward_length"))
        .map(|(k, v)| match k.strip_prefix("qwen35moe.") {
            Some(rest) => (format!("qwen35.{rest}"), v),
            None if k == "general.architecture" => (k, MetaValue::String("qwen35".into())),
            None => (k, v),
        })
        .collect();
    m.push(("qwen35.feed_forward_length".into(), MetaValue::U32(dense_ff(d) as u32)));
    m
}

/// Writes the file of `o.arch` (not qwen35moe: cmd_synth writes that one).
pub fn run(o: &ArchOpts<'_>, d: &Dims, wt: &WeightType, preset: &str, ty: &str, out: &Path) -> Result<()> {
    if o.spm && o.arch != "llama" {
        bail!("--spm: a SentencePiece vocabulary is written for --arch llama only, found --arch {}", o.arch);
    }
    let name = format!("synthetic-{}-{preset}-{ty}{}", o.arch, if o.spm { "-spm" } else { "" });
    if o.spm && d.vocab + 5 > SPM_MAX {
        bail!("--vocab: a SentencePiece vocabulary holds at most {} normal tokens, found {}", SPM_MAX - 5, d.vocab);
    }
    // llama.cpp's qwen2 shapes W_q as [n_embd, n_embd]: heads × head dim = n_embd
    let mut d = d.clone();
    if o.arch == "qwen2" {
        d.head_dim = d.n_embd / d.n_head;
        d.rope_dim = d.head_dim;
    }
    let d = &d;
    let (meta, tensors) = match o.arch {
        "qwen35" => (metadata_qwen35(d, &name, wt.file_type, o.ctx), plan_qwen35(d, wt, o.tied)),
        "qwen3" | "qwen2" | "qwen3moe" | "llama" => {
            let freqs = o.arch == "llama" && !o.spm;
            (metadata_gqa(o.arch, d, &name, wt.file_type, o), plan_gqa(o.arch, d, wt, o.tied, freqs))
        }
        other => bail!("--arch: expected one of {}, found {other:?}", ARCHS.join(", ")),
    };
    let threads = match o.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let bytes = write_gguf(out, &meta, &tensors, o.seed, threads)?;
    eprintln!("wrote {}: {} {preset} {ty} seed {}, {} layers, {} tensors, {:.1} MB", out.display(), o.arch, o.seed, d.n_layer, tensors.len(), bytes as f64 / 1e6);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama3_factors_cover_the_three_regimes() {
        let f = llama3_factors(5e5, 64);
        assert_eq!(f[0], 1.0);
        assert_eq!(*f.last().unwrap(), 8.0);
        assert!(f.iter().any(|&x| x > 1.0 && x < 8.0), "{f:?}");
        assert!(f.windows(2).all(|w| w[0] <= w[1]));
    }

    /// Every arch's file loads as its model (with its tokenizer) and builds a graph; the
    /// llama.cpp side of the check is tests/fixtures/make_arch_fixtures.sh.
    #[test]
    fn every_arch_round_trips_through_the_loader() {
        let d = crate::cmd_synth::PRESETS[0].1.clone();
        let wt = WeightType { base: GgmlType::F16, mix: false, file_type: 1 };
        for (arch, spm) in [("qwen35", false), ("qwen3moe", false), ("qwen3", false), ("qwen2", false), ("llama", false), ("llama", true)] {
            let out = std::env::temp_dir().join(format!("pn-synth-{arch}-{spm}-{}.gguf", std::process::id()));
            let o = ArchOpts { arch, spm, seed: 1, ctx: 256, tied: spm, threads: 1 };
            run(&o, &Dims { n_layer: 1, ..d.clone() }, &wt, "tiny", "f16", &out).unwrap();
            let g = pn_engine::Gguf::open(&out).unwrap();
            let m = pn_models::load(&g).unwrap_or_else(|e| panic!("{arch}: {e}"));
            assert_eq!((m.arch(), m.n_layer()), (arch, 1));
            let t = pn_engine::tokenizer::Tokenizer::from_gguf(&g).unwrap();
            assert_eq!(t.n_vocab(), m.n_vocab(), "{arch}");
            let mut b = pn_engine::graph::GraphBuilder::new();
            m.build(pn_engine::Geometry::one(2, true), &mut b).unwrap();
            std::fs::remove_file(&out).unwrap();
        }
    }

    #[test]
    fn spm_vocabulary_is_consistent() {
        let (t, ty, s) = spm_vocabulary(1029);
        assert_eq!((t.len(), ty.len(), s.len()), (1029, 1029, 1029));
        assert_eq!((t[3].as_str(), t[258].as_str(), t[259].as_str()), ("<0x00>", "<0xFF>", "\u{2581}"));
        let set: std::collections::HashSet<&String> = t.iter().collect();
        assert_eq!(set.len(), t.len(), "tokens are unique");
    }
}

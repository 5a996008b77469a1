//! `pn synth`: write a synthetic qwen35moe GGUF with seeded random weights: the metadata
//! keys and tensor names of a converted checkpoint (spec §2–§3), a small byte-level BPE
//! vocabulary, any weight type pn-ops can quantize, `q4_k_m` / `q5_k_m` as llama.cpp
//! mixes them. Streams to the file with every core (synth_write.rs): the `full-dims`
//! preset (the real Qwen3.5-35B-A3B layer dims, 8 layers, 64 experts) is ~1.16 GB q4_k_m.

use crate::synth_write::{write_gguf, Init, TensorPlan};
use anyhow::{bail, Result};
use clap::Args;
use pn_engine::MetaValue;
use pn_ops::quant::quantize_weights::QUANTIZABLE;
use pn_ops::GgmlType;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args)]
pub struct SynthArgs {
    /// Architecture: qwen35moe, qwen35, qwen3moe, qwen3, qwen2 or llama
    #[arg(long, default_value = "qwen35moe")]
    arch: String,
    /// A SentencePiece vocabulary (Mistral-7B style; --arch llama)
    #[arg(long)]
    spm: bool,
    /// Dimensions: tiny, ktiny, small or full-dims (Qwen3.5-35B-A3B layer dims)
    #[arg(long, default_value = "tiny")]
    preset: String,
    /// Weight type: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k,
    /// q6_k, iq4_nl, iq4_xs, mxfp4, or the mixes q4_k_m, q5_k_m
    #[arg(long = "type", default_value = "q4_k_m")]
    ty: String,
    /// Seed of the weights (same seed, same flags: the same bytes)
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Output GGUF file
    #[arg(long)]
    out: PathBuf,
    /// Override the preset's layer count (every 4th layer is full attention)
    #[arg(long)]
    layers: Option<usize>,
    /// Override the preset's expert count
    #[arg(long)]
    experts: Option<usize>,
    /// Override the preset's experts per token
    #[arg(long)]
    experts_used: Option<usize>,
    /// Override the preset's vocabulary (normal tokens, 256..=4225; 3 special tokens follow)
    #[arg(long)]
    vocab: Option<usize>,
    /// context_length written to the file
    #[arg(long, default_value_t = 4096)]
    ctx: usize,
    /// No output.weight (LM head tied to token_embd)
    #[arg(long)]
    tied: bool,
    /// Threads (0 = all cores)
    #[arg(long, short = 't', default_value_t = 0)]
    threads: usize,
    /// MTP (nextn) blocks after the layers (0 or 1; qwen35moe): block_count grows by one
    /// and `blk.N.*` holds an attention + MoE layer with `nextn.{eh_proj,enorm,hnorm,
    /// shared_head_norm}` (random weights: for speed measurements, not acceptance)
    #[arg(long, default_value_t = 0)]
    nextn: usize,
}

/// Model dimensions (synth presets; spec §2 names).
#[derive(Clone, Debug)]
pub struct Dims {
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub rope_dim: usize,
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub expert_ff: usize,
    pub shared_ff: usize,
    pub ssm_state: usize,
    pub ssm_groups: usize,
    pub ssm_dt_rank: usize,
    pub vocab: usize,
}

const fn dims(l: usize, e: usize, h: (usize, usize, usize, usize), x: (usize, usize, usize, usize), s: (usize, usize, usize), vocab: usize) -> Dims {
    Dims {
        n_layer: l,
        n_embd: e,
        n_head: h.0,
        n_head_kv: h.1,
        head_dim: h.2,
        rope_dim: h.3,
        n_expert: x.0,
        n_expert_used: x.1,
        expert_ff: x.2,
        shared_ff: x.3,
        ssm_state: s.0,
        ssm_groups: s.1,
        ssm_dt_rank: s.2,
        vocab,
    }
}

/// (name, dims): layers, n_embd, (heads, kv heads, head dim, rope dims), (experts, used,
/// expert FFN, shared FFN), (ssm state, groups, dt rank = V heads), normal tokens.
pub const PRESETS: [(&str, Dims); 4] = [
    ("tiny", dims(4, 128, (4, 2, 64, 16), (8, 2, 64, 64), (32, 2, 4), 1024)),
    // rows of 256 so every matrix can take a K-quant
    ("ktiny", dims(4, 256, (4, 2, 64, 16), (4, 2, 256, 256), (64, 2, 4), 1024)),
    ("small", dims(8, 256, (8, 2, 64, 16), (16, 4, 128, 128), (64, 4, 8), 2048)),
    // the real Qwen3.5-35B-A3B per-layer dims, 8 layers and 64 of the 256 experts
    ("full-dims", dims(8, 2048, (16, 2, 256, 64), (64, 8, 512, 512), (128, 16, 32), 4096)),
];

/// A `--type`: the base weight type, whether it is a llama.cpp `_M` mix, general.file_type.
pub(crate) struct WeightType {
    pub(crate) base: GgmlType,
    pub(crate) mix: bool,
    pub(crate) file_type: u32,
}

const TYPES: [(&str, GgmlType, bool, u32); 18] = {
    use GgmlType::*;
    [
        ("f32", F32, false, 0),
        ("f16", F16, false, 1),
        ("bf16", BF16, false, 32),
        ("q8_0", Q8_0, false, 7),
        ("q4_0", Q4_0, false, 2),
        ("q4_1", Q4_1, false, 3),
        ("q5_0", Q5_0, false, 8),
        ("q5_1", Q5_1, false, 9),
        ("q2_k", Q2K, false, 10),
        ("q3_k", Q3K, false, 11),
        ("q4_k", Q4K, false, 14),
        ("q5_k", Q5K, false, 16),
        ("q6_k", Q6K, false, 18),
        ("iq4_nl", IQ4NL, false, 25),
        ("iq4_xs", IQ4XS, false, 30),
        ("mxfp4", MXFP4, false, 38),
        ("q4_k_m", Q4K, true, 15),
        ("q5_k_m", Q5K, true, 17),
    ]
};

fn parse_type(s: &str) -> Result<WeightType> {
    let s = s.to_ascii_lowercase();
    match TYPES.iter().find(|t| t.0 == s) {
        Some(&(_, base, mix, file_type)) => Ok(WeightType { base, mix, file_type }),
        None => {
            let names: Vec<&str> = TYPES.iter().map(|t| t.0).collect();
            bail!("--type: expected one of {}, found {s:?}", names.join(", "))
        }
    }
}

/// The preset with the overrides applied and checked.
fn resolve_dims(a: &SynthArgs) -> Result<Dims> {
    let Some((_, d)) = PRESETS.iter().find(|p| p.0 == a.preset) else {
        let names: Vec<&str> = PRESETS.iter().map(|p| p.0).collect();
        bail!("--preset: expected one of {}, found {:?}", names.join(", "), a.preset);
    };
    let mut d = d.clone();
    let check = |flag: &str, v: usize, lo: usize, hi: usize| -> Result<usize> {
        if !(lo..=hi).contains(&v) {
            bail!("--{flag}: expected a value in {lo}..={hi}, found {v}");
        }
        Ok(v)
    };
    if let Some(l) = a.layers {
        d.n_layer = check("layers", l, 1, 1024)?;
    }
    if let Some(x) = a.experts {
        d.n_expert = check("experts", x, 1, 4096)?;
        d.n_expert_used = d.n_expert_used.min(x);
    }
    if let Some(u) = a.experts_used {
        d.n_expert_used = check("experts-used", u, 1, d.n_expert)?;
    }
    if let Some(v) = a.vocab {
        d.vocab = check("vocab", v, 256, MAX_VOCAB)?;
    }
    check("ctx", a.ctx, 1, 1 << 24)?;
    Ok(d)
}

/// ChatML, as Qwen models use.
pub(crate) const CHAT_TEMPLATE: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
const SPECIAL: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
/// Characters whose pairs make the merged tokens (most frequent English first).
const PAIR_CHARS: &[u8] = b" etaoinshrdlucmfwypvbgkqjxzETAOINSHRDLUCMFWYPVBGKQJXZ0123456789";
const MAX_VOCAB: usize = 256 + PAIR_CHARS.len() * PAIR_CHARS.len();

/// GPT-2's byte → printable character map (byte-level BPE).
fn byte_char(b: u8) -> char {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xa1..=0xac).contains(&b) || b >= 0xae;
    if printable(b) {
        return b as char;
    }
    let n = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + n).expect("valid char")
}

/// A byte-level BPE vocabulary: the 256 bytes, then `n − 256` merges of two characters,
/// then the special tokens. Returns (tokens, token types, merges).
pub fn vocabulary(n: usize) -> (Vec<String>, Vec<i32>, Vec<String>) {
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_char(b).to_string()).collect();
    let mut merges = Vec::new();
    'outer: for &a in PAIR_CHARS {
        for &b in PAIR_CHARS {
            if tokens.len() >= n {
                break 'outer;
            }
            let (a, b) = (byte_char(a), byte_char(b));
            merges.push(format!("{a} {b}"));
            tokens.push(format!("{a}{b}"));
        }
    }
    let mut types = vec![1; tokens.len()];
    tokens.extend(SPECIAL.iter().map(|s| s.to_string()));
    types.extend([3; SPECIAL.len()]);
    (tokens, types, merges)
}

/// llama.cpp's `use_more_bits`: the layers a `_M` mix gives more bits.
pub(crate) fn more_bits(i: usize, n: usize) -> bool {
    let (lo, hi) = (n / 8, 7 * n / 8);
    i < lo || i >= hi || (i - lo) % 3 == 2
}

/// A type that fits rows of `ne0` (llama.cpp's fallbacks when a row is not a multiple
/// of 256), F16 when nothing does.
pub(crate) fn fit(ty: GgmlType, ne0: usize) -> GgmlType {
    use GgmlType::*;
    let t = if ne0.is_multiple_of(ty.block_size()) {
        ty
    } else {
        match ty {
            Q4K => Q5_0,
            Q5K => Q5_1,
            Q6K => Q8_0,
            _ => IQ4NL,
        }
    };
    if ne0.is_multiple_of(t.block_size()) {
        t
    } else {
        F16
    }
}

/// Every tensor of the file, in order, with its type and initialization.
/// The tensors of the file: `d.n_layer` layers, then `nextn` MTP blocks.
pub(crate) fn plan(d: &Dims, wt: &WeightType, tied: bool, nextn: usize) -> Vec<TensorPlan> {
    let (e, h, hkv, hd) = (d.n_embd, d.n_head, d.n_head_kv, d.head_dim);
    let (s, g, v) = (d.ssm_state, d.ssm_groups, d.ssm_dt_rank);
    let d_inner = s * v;
    let conv_dim = 2 * s * g + d_inner;
    let (nx, ff, sff) = (d.n_expert, d.expert_ff, d.shared_ff);
    let n_vocab = d.vocab + SPECIAL.len();
    let is_attn = |il: usize| (il + 1).is_multiple_of(4);
    // the attn_v / attn_qkv counter of the mix (in layer order), and its total
    let n_wv = d.n_layer;
    let q6 = if wt.mix { GgmlType::Q6K } else { wt.base };
    let mut out = Vec::new();
    let mut t = |name: String, ne: &[usize], ty: Option<GgmlType>, init: Init| {
        let ty = match ty {
            None => GgmlType::F32,
            Some(t) => fit(t, ne[0]),
        };
        out.push(TensorPlan { name, ne: ne.to_vec(), ty, init });
    };
    let b = Some(wt.base);
    t("token_embd.weight".into(), &[e, n_vocab], b, Init::Normal(1.0));
    t("output_norm.weight".into(), &[e], None, Init::Norm);
    if !tied {
        t("output.weight".into(), &[e, n_vocab], Some(q6), Init::Mat(1.0));
    }
    for il in 0..d.n_layer + nextn {
        let p = |n: &str| format!("blk.{il}.{n}");
        let mtp = il >= d.n_layer;
        let wv = if more_bits(il, n_wv) { Some(q6) } else { b };
        let down = if more_bits(il, d.n_layer) { Some(q6) } else { b };
        t(p("attn_norm.weight"), &[e], None, Init::Norm);
        t(p("post_attention_norm.weight"), &[e], None, Init::Norm);
        if is_attn(il) || mtp {
            t(p("attn_q.weight"), &[e, 2 * hd * h], b, Init::Mat(1.0));
            t(p("attn_k.weight"), &[e, hd * hkv], b, Init::Mat(1.0));
            t(p("attn_v.weight"), &[e, hd * hkv], wv, Init::Mat(1.0));
            t(p("attn_output.weight"), &[hd * h, e], b, Init::Mat(1.0));
            t(p("attn_q_norm.weight"), &[hd], None, Init::Norm);
            t(p("attn_k_norm.weight"), &[hd], None, Init::Norm);
        } else {
            t(p("attn_qkv.weight"), &[e, conv_dim], wv, Init::Mat(1.0));
            t(p("attn_gate.weight"), &[e, d_inner], b, Init::Mat(1.0));
            t(p("ssm_conv1d.weight"), &[4, conv_dim], None, Init::Normal(0.5));
            t(p("ssm_dt.bias"), &[v], None, Init::DtBias);
            t(p("ssm_a"), &[v], None, Init::SsmA);
            t(p("ssm_beta.weight"), &[e, v], b, Init::Mat(1.0));
            t(p("ssm_alpha.weight"), &[e, v], b, Init::Mat(1.0));
            t(p("ssm_norm.weight"), &[s], None, Init::Norm);
            t(p("ssm_out.weight"), &[d_inner, e], b, Init::Mat(1.0));
        }
        // router and shared-expert gate stay F32 (llama-quantize never quantizes them)
        t(p("ffn_gate_inp.weight"), &[e, nx], None, Init::Mat(2.0));
        t(p("ffn_gate_exps.weight"), &[e, ff, nx], b, Init::Mat(1.0));
        t(p("ffn_up_exps.weight"), &[e, ff, nx], b, Init::Mat(1.0));
        t(p("ffn_down_exps.weight"), &[ff, e, nx], down, Init::Mat(1.0));
        t(p("ffn_gate_inp_shexp.weight"), &[e], None, Init::Mat(1.0));
        t(p("ffn_gate_shexp.weight"), &[e, sff], b, Init::Mat(1.0));
        t(p("ffn_up_shexp.weight"), &[e, sff], b, Init::Mat(1.0));
        t(p("ffn_down_shexp.weight"), &[sff, e], down, Init::Mat(1.0));
        if mtp {
            t(p("nextn.eh_proj.weight"), &[2 * e, e], b, Init::Mat(1.0));
            t(p("nextn.enorm.weight"), &[e], None, Init::Norm);
            t(p("nextn.hnorm.weight"), &[e], None, Init::Norm);
            t(p("nextn.shared_head_norm.weight"), &[e], None, Init::Norm);
        }
    }
    out
}

/// The metadata of the file (the key set of the oracle's synthetic fixtures).
pub(crate) fn metadata(d: &Dims, name: &str, file_type: u32, ctx: usize, nextn: usize) -> Vec<(String, MetaValue)> {
    use MetaValue::*;
    let k = |s: &str| format!("qwen35moe.{s}");
    let u = |x: usize| U32(x as u32);
    let pairs = d.rope_dim / 2;
    let s0 = pairs.div_ceil(3);
    let s1 = (pairs - s0).div_ceil(2);
    let sections = [s0, s1, pairs - s0 - s1, 0].iter().map(|&x| I32(x as i32)).collect();
    let (tokens, types, merges) = vocabulary(d.vocab);
    let bos = d.vocab as u32;
    let strs = |v: Vec<std::string::String>| Array(v.into_iter().map(String).collect());
    let mut m = vec![
        ("general.architecture".into(), String("qwen35moe".into())),
        ("general.name".into(), String(name.into())),
        (k("block_count"), u(d.n_layer + nextn)),
        (k("context_length"), u(ctx)),
        (k("embedding_length"), u(d.n_embd)),
        (k("feed_forward_length"), u(d.expert_ff * d.n_expert_used)),
        (k("attention.head_count"), u(d.n_head)),
        (k("attention.head_count_kv"), u(d.n_head_kv)),
        (k("attention.key_length"), u(d.head_dim)),
        (k("attention.value_length"), u(d.head_dim)),
        (k("attention.layer_norm_rms_epsilon"), F32(1e-6)),
        (k("rope.freq_base"), F32(1e7)),
        (k("rope.dimension_count"), u(d.rope_dim)),
        (k("rope.dimension_sections"), Array(sections)),
        (k("expert_count"), u(d.n_expert)),
        (k("expert_used_count"), u(d.n_expert_used)),
        (k("expert_feed_forward_length"), u(d.expert_ff)),
        (k("expert_shared_feed_forward_length"), u(d.shared_ff)),
        (k("ssm.conv_kernel"), u(4)),
        (k("ssm.inner_size"), u(d.ssm_state * d.ssm_dt_rank)),
        (k("ssm.state_size"), u(d.ssm_state)),
        (k("ssm.time_step_rank"), u(d.ssm_dt_rank)),
        (k("ssm.group_count"), u(d.ssm_groups)),
        (k("full_attention_interval"), u(4)),
        ("tokenizer.ggml.model".into(), String("gpt2".into())),
        ("tokenizer.ggml.pre".into(), String("qwen35".into())),
        ("tokenizer.ggml.tokens".into(), strs(tokens)),
        ("tokenizer.ggml.token_type".into(), Array(types.into_iter().map(I32).collect())),
        ("tokenizer.ggml.merges".into(), strs(merges)),
        ("tokenizer.ggml.eos_token_id".into(), U32(bos + 2)),
        ("tokenizer.ggml.bos_token_id".into(), U32(bos)),
        ("tokenizer.ggml.padding_token_id".into(), U32(bos)),
        ("tokenizer.ggml.add_bos_token".into(), Bool(false)),
        ("tokenizer.chat_template".into(), String(CHAT_TEMPLATE.into())),
        ("general.quantization_version".into(), U32(2)),
        ("general.file_type".into(), U32(file_type)),
    ];
    if nextn > 0 {
        m.insert(3, (k("nextn_predict_layers"), u(nextn)));
    }
    m
}

pub fn run(a: SynthArgs) -> Result<()> {
    let wt = parse_type(&a.ty)?;
    let d = resolve_dims(&a)?;
    if a.threads > crate::load::MAX_THREADS {
        bail!("--threads: expected 0 (all cores) to {}, found {}", crate::load::MAX_THREADS, a.threads);
    }
    if a.out.is_dir() {
        bail!("--out {}: expected a file path, found a directory", a.out.display());
    }
    debug_assert!(QUANTIZABLE.contains(&wt.base));
    if a.nextn > 1 || (a.nextn > 0 && a.arch != "qwen35moe") {
        bail!("--nextn: expected 0, or 1 with --arch qwen35moe, found {} ({})", a.nextn, a.arch);
    }
    if a.arch != "qwen35moe" || a.spm {
        let o = crate::synth_arch::ArchOpts { arch: &a.arch, spm: a.spm, seed: a.seed, ctx: a.ctx, tied: a.tied, threads: a.threads };
        return crate::synth_arch::run(&o, &d, &wt, &a.preset, &a.ty.to_ascii_lowercase(), &a.out);
    }
    let name = format!("synthetic-qwen35moe-{}-{}", a.preset, a.ty.to_ascii_lowercase());
    let meta = metadata(&d, &name, wt.file_type, a.ctx, a.nextn);
    let tensors = plan(&d, &wt, a.tied, a.nextn);
    let threads = match a.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let t0 = Instant::now();
    let bytes = write_gguf(&a.out, &meta, &tensors, a.seed, threads)?;
    let secs = t0.elapsed().as_secs_f64();
    eprintln!(
        "wrote {}: {} {} seed {}, {} layers, {} experts (top-{}), vocab {}, {} tensors, {:.1} MB in {:.1} s ({} threads)",
        a.out.display(),
        a.preset,
        a.ty.to_ascii_lowercase(),
        a.seed,
        d.n_layer,
        d.n_expert,
        d.n_expert_used,
        d.vocab + SPECIAL.len(),
        tensors.len(),
        bytes as f64 / 1e6,
        secs,
        threads
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mix_matches_llama_quantize_on_the_fixture_layout() {
        // ktiny-q4_k_m.gguf (llama-quantize): Q6_K for output, blk.2.attn_qkv, blk.3.attn_v,
        // ffn_down* of layers 2 and 3; Q4_K elsewhere; norms, router, conv F32
        let d = PRESETS[1].1.clone();
        let p = plan(&d, &parse_type("q4_k_m").unwrap(), false, 0);
        let q6: Vec<&str> = p.iter().filter(|t| t.ty == GgmlType::Q6K).map(|t| t.name.as_str()).collect();
        assert_eq!(
            q6,
            [
                "output.weight",
                "blk.2.attn_qkv.weight",
                "blk.2.ffn_down_exps.weight",
                "blk.2.ffn_down_shexp.weight",
                "blk.3.attn_v.weight",
                "blk.3.ffn_down_exps.weight",
                "blk.3.ffn_down_shexp.weight"
            ]
        );
        for t in &p {
            let f32_name = t.ne.len() == 1 || t.name.contains("ffn_gate_inp") || t.name.contains("conv1d");
            assert_eq!(t.ty == GgmlType::F32, f32_name, "{}", t.name);
        }
    }

    #[test]
    fn full_dims_is_the_size_of_the_real_layers() {
        let d = PRESETS[3].1.clone();
        assert_eq!((d.n_embd, d.n_layer, d.n_expert, d.n_expert_used, d.expert_ff, d.shared_ff), (2048, 8, 64, 8, 512, 512));
        let p = plan(&d, &parse_type("q4_k_m").unwrap(), false, 0);
        let bytes: usize = p.iter().map(|t| t.bytes()).sum();
        assert!((1_150_000_000..1_170_000_000).contains(&bytes), "{bytes}");
        let q = |n: &str| p.iter().find(|t| t.name == n).unwrap();
        assert_eq!(q("blk.0.attn_qkv.weight").ne, [2048, 8192]);
        assert_eq!(q("blk.3.attn_q.weight").ne, [2048, 8192]);
        assert_eq!(q("blk.3.attn_output.weight").ne, [4096, 2048]);
        assert_eq!(q("blk.7.ffn_down_exps.weight").ne, [512, 2048, 64]);
        assert_eq!(q("output.weight").ne, [2048, 4099]);
        assert_eq!(p.len(), 3 + 6 * 19 + 2 * 16);
    }

    #[test]
    fn vocabulary_is_consistent() {
        let (tokens, types, merges) = vocabulary(4096);
        assert_eq!((tokens.len(), types.len(), merges.len()), (4099, 4099, 3840));
        let set: std::collections::HashSet<&String> = tokens.iter().collect();
        assert_eq!(set.len(), tokens.len(), "tokens are unique");
        for m in &merges {
            assert!(set.contains(&m.replace(' ', "")), "{m}");
        }
        assert_eq!(byte_char(b' '), 'Ġ');
        assert_eq!(vocabulary(MAX_VOCAB).0.len(), MAX_VOCAB + 3);
    }
}

//! Hostile MODEL files: GGUFs that parse but are wrong as qwen35moe models. Each must give
//! a typed error when the model loads (`pn_models::load` or `Runner::new`), or a clear error
//! at forward time, and never a panic. The GGUF-level corpus (bad magic, truncation, …)
//! is `tests/fixtures/hostile/` + `engine/tests/gguf_hostile*.rs`; this is the layer above.
//!
//! The files are built by [`cases`] from a micro qwen35moe (2 layers: DeltaNet + attention,
//! n_embd 32, 4 experts, a 259-token byte-level tokenizer; ~30 KB) whose metadata starts
//! as a copy of `tests/fixtures/tiny-f16.gguf`'s. They are committed under
//! `tests/fixtures/hostile_models/` (the CLI tests in `tools/tests/cli_robustness.rs` use
//! them) and checked byte for byte against the generator here. Regenerate with
//!
//! ```sh
//! cargo test -p pn-tests --test hostile_models -- --ignored regenerate
//! ```
//!
//! which also writes the valid micro model as the seed of the `gguf_model` fuzz target
//! (`fuzz/seeds/gguf_model/micro-valid.gguf`).
//!
//! NaN/Inf weights are a documented decision (docs/robustness.md): the model loads (the
//! loader does not scan gigabytes of weights), `Runner::forward` returns the non-finite
//! logits as they are, and the CLI turns them into a clear error.

use pn_cpu::CpuBackend;
use pn_engine::gguf_writer::GgufWriter;
use pn_engine::{Gguf, MetaValue, Runner};
use pn_ops::GgmlType;
use std::path::PathBuf;
use std::sync::Arc;

const ARCH: &str = "qwen35moe";

/// One tensor of the micro model: name, ggml dims, type, raw bytes.
#[derive(Clone)]
struct T {
    name: String,
    ne: Vec<u64>,
    ty: GgmlType,
    data: Vec<u8>,
}

/// A GGUF under construction: metadata in order, tensors in order.
#[derive(Clone)]
struct Spec {
    meta: Vec<(String, MetaValue)>,
    tensors: Vec<T>,
}

impl Spec {
    fn set(&mut self, key: &str, v: MetaValue) {
        match self.meta.iter_mut().find(|(k, _)| k == key) {
            Some(e) => e.1 = v,
            None => self.meta.push((key.to_string(), v)),
        }
    }
    fn set_arch(&mut self, suffix: &str, v: MetaValue) {
        self.set(&format!("{ARCH}.{suffix}"), v)
    }
    fn remove(&mut self, key: &str) {
        let n = self.meta.len();
        self.meta.retain(|(k, _)| k != key);
        assert_ne!(n, self.meta.len(), "no key {key}");
    }
    fn remove_tensor(&mut self, name: &str) {
        let n = self.tensors.len();
        self.tensors.retain(|t| t.name != name);
        assert_ne!(n, self.tensors.len(), "no tensor {name}");
    }
    fn tensor_mut(&mut self, name: &str) -> &mut T {
        self.tensors.iter_mut().find(|t| t.name == name).unwrap_or_else(|| panic!("no tensor {name}"))
    }
    fn to_bytes(&self) -> Vec<u8> {
        let mut w = GgufWriter::new();
        for (k, v) in &self.meta {
            w = w.kv(k.clone(), v.clone());
        }
        for t in &self.tensors {
            w = w.tensor(t.name.clone(), &t.ne, t.ty, t.data.clone());
        }
        w.to_bytes()
    }
}

/// Deterministic values in [-scale, scale] (an LCG; the files must be reproducible).
fn values(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// f32 → IEEE half bits (round to nearest even), enough for finite test weights.
fn f16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32 - 127 + 15;
    let man = b & 0x7f_ffff;
    if (b & 0x7fff_ffff) == 0x7f80_0000 {
        return sign | 0x7c00;
    }
    if (b & 0x7fff_ffff) > 0x7f80_0000 {
        return sign | 0x7e00;
    }
    if exp >= 31 {
        return sign | 0x7c00;
    }
    if exp <= 0 {
        // subnormal or zero
        if exp < -10 {
            return sign;
        }
        let m = (man | 0x80_0000) >> (1 - exp);
        let r = (m >> 13) + (((m >> 12) & 1) & (((m & 0xfff) != 0x800 || (m >> 13) & 1 == 1) as u32));
        return sign | r as u16;
    }
    let mut h = ((exp as u32) << 10) | (man >> 13);
    let rem = man & 0x1fff;
    if rem > 0x1000 || (rem == 0x1000 && (h & 1) == 1) {
        h += 1;
    }
    sign | h as u16
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
fn f16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|&x| f16_bits(x).to_le_bytes()).collect()
}
/// Q8_0: blocks of 32 as (f16 scale, 32 × i8).
fn q8_0_bytes(v: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for b in v.chunks(32) {
        let amax = b.iter().fold(0f32, |m, x| m.max(x.abs()));
        let d = amax / 127.0;
        out.extend(f16_bits(d).to_le_bytes());
        for &x in b {
            out.push((if d == 0.0 { 0.0 } else { (x / d).round() }) as i8 as u8);
        }
    }
    out
}

fn fixture(name: &str) -> PathBuf {
    pn_tests::fixture(name)
}

/// Micro-model dimensions (kept small so every committed file is ~30 KB).
struct Dims {
    e: u64,
    vocab: u64,
    f_exp: u64,
    f_sh: u64,
}
const D: Dims = Dims { e: 32, vocab: 259, f_exp: 8, f_sh: 16 };

/// The valid micro model: tiny-f16's metadata with the dimensions shrunk, a byte-level
/// tokenizer, and seeded weights.
fn base() -> Spec {
    base_with(D.f_sh, GgmlType::Q8_0)
}

fn base_with(f_sh: u64, shexp_ty: GgmlType) -> Spec {
    let tiny = Gguf::open(&fixture("tiny-f16.gguf")).expect("tiny-f16.gguf opens");
    // metadata: copy the model keys (not the 1027-token tokenizer), then shrink
    let mut s = Spec { meta: Vec::new(), tensors: Vec::new() };
    for (k, v) in &tiny.metadata {
        if !k.starts_with("tokenizer.") {
            s.meta.push((k.clone(), v.clone()));
        }
    }
    s.set("general.name", MetaValue::String("pantheon-hostile-micro".into()));
    let u = MetaValue::U32;
    s.set_arch("block_count", u(2));
    s.set_arch("context_length", u(256));
    s.set_arch("embedding_length", u(D.e as u32));
    s.set_arch("feed_forward_length", u(16));
    s.set_arch("attention.head_count", u(2));
    s.set_arch("attention.head_count_kv", u(1));
    s.set_arch("attention.key_length", u(8));
    s.set_arch("attention.value_length", u(8));
    s.set_arch("rope.dimension_count", u(8));
    s.set_arch("rope.dimension_sections", MetaValue::Array(vec![MetaValue::I32(2), MetaValue::I32(1), MetaValue::I32(1), MetaValue::I32(0)]));
    s.set_arch("expert_count", u(4));
    s.set_arch("expert_used_count", u(2));
    s.set_arch("expert_feed_forward_length", u(D.f_exp as u32));
    s.set_arch("expert_shared_feed_forward_length", u(f_sh as u32));
    s.set_arch("ssm.conv_kernel", u(4));
    s.set_arch("ssm.inner_size", u(16));
    s.set_arch("ssm.state_size", u(8));
    s.set_arch("ssm.time_step_rank", u(2));
    s.set_arch("ssm.group_count", u(1));
    s.set_arch("full_attention_interval", u(2));
    // tokenizer: the 256 byte-level symbols + 3 control tokens
    let mut tokens: Vec<MetaValue> = (0..=255u8).map(|b| MetaValue::String(pn_engine::tokenizer::bpe::byte_to_char(b).to_string())).collect();
    let mut types: Vec<MetaValue> = vec![MetaValue::I32(1); 256];
    for sp in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] {
        tokens.push(MetaValue::String(sp.into()));
        types.push(MetaValue::I32(3));
    }
    assert_eq!(tokens.len() as u64, D.vocab);
    s.set("tokenizer.ggml.model", MetaValue::String("gpt2".into()));
    s.set("tokenizer.ggml.pre", MetaValue::String("qwen35".into()));
    s.set("tokenizer.ggml.tokens", MetaValue::Array(tokens));
    s.set("tokenizer.ggml.token_type", MetaValue::Array(types));
    s.set("tokenizer.ggml.merges", MetaValue::Array(vec![MetaValue::String("Ġ Ġ".into())]));
    s.set("tokenizer.ggml.eos_token_id", u(258));
    s.set("tokenizer.ggml.bos_token_id", u(256));
    s.set("tokenizer.ggml.add_bos_token", MetaValue::Bool(false));

    // tensors
    let (e, v, fe) = (D.e, D.vocab, D.f_exp);
    let mut seed = 1u64;
    let mut add = |s: &mut Spec, name: String, ne: &[u64], ty: GgmlType, fill: Option<f32>| {
        seed += 1;
        let n = ne.iter().product::<u64>() as usize;
        let vals = match fill {
            Some(c) => vec![c; n],
            None => values(seed, n, 0.25),
        };
        let data = match ty {
            GgmlType::F32 => f32_bytes(&vals),
            GgmlType::F16 => f16_bytes(&vals),
            GgmlType::Q8_0 => q8_0_bytes(&vals),
            other => panic!("generator: no encoder for {other}"),
        };
        s.tensors.push(T { name, ne: ne.to_vec(), ty, data });
    };
    // Q8_0 where rows are a multiple of 32 (1 byte per weight keeps the files small)
    let (f32t, f16t, q8t) = (GgmlType::F32, GgmlType::F16, GgmlType::Q8_0);
    add(&mut s, "token_embd.weight".into(), &[e, v], GgmlType::Q8_0, None);
    add(&mut s, "output_norm.weight".into(), &[e], f32t, Some(1.0));
    // tied output head (no output.weight) keeps the files small
    let (hk, dk, hv, dv, d, h, hkv, nexp) = (1u64, 8u64, 2u64, 8u64, 8u64, 2u64, 1u64, 4u64);
    for il in 0..2 {
        let b = |n: &str| format!("blk.{il}.{n}");
        add(&mut s, b("attn_norm.weight"), &[e], f32t, Some(1.0));
        add(&mut s, b("post_attention_norm.weight"), &[e], f32t, Some(1.0));
        if il == 0 {
            // Gated DeltaNet (full_attention_interval 2: layer 1 is attention)
            let conv_dim = 2 * hk * dk + hv * dv;
            add(&mut s, b("attn_qkv.weight"), &[e, conv_dim], q8t, None);
            add(&mut s, b("attn_gate.weight"), &[e, hv * dv], q8t, None);
            add(&mut s, b("ssm_conv1d.weight"), &[4, conv_dim], f32t, None);
            add(&mut s, b("ssm_dt.bias"), &[hv], f32t, Some(0.5));
            add(&mut s, b("ssm_a"), &[hv], f32t, Some(-1.0));
            add(&mut s, b("ssm_beta.weight"), &[e, hv], q8t, None);
            add(&mut s, b("ssm_alpha.weight"), &[e, hv], q8t, None);
            add(&mut s, b("ssm_norm.weight"), &[dv], f32t, Some(1.0));
            add(&mut s, b("ssm_out.weight"), &[hv * dv, e], f16t, None);
        } else {
            add(&mut s, b("attn_q.weight"), &[e, 2 * d * h], q8t, None);
            add(&mut s, b("attn_k.weight"), &[e, d * hkv], q8t, None);
            add(&mut s, b("attn_v.weight"), &[e, d * hkv], q8t, None);
            add(&mut s, b("attn_q_norm.weight"), &[d], f32t, Some(1.0));
            add(&mut s, b("attn_k_norm.weight"), &[d], f32t, Some(1.0));
            add(&mut s, b("attn_output.weight"), &[d * h, e], f16t, None);
        }
        add(&mut s, b("ffn_gate_inp.weight"), &[e, nexp], f32t, None);
        add(&mut s, b("ffn_gate_exps.weight"), &[e, fe, nexp], q8t, None);
        add(&mut s, b("ffn_up_exps.weight"), &[e, fe, nexp], q8t, None);
        add(&mut s, b("ffn_down_exps.weight"), &[fe, e, nexp], f16t, None);
        add(&mut s, b("ffn_gate_inp_shexp.weight"), &[e], f32t, None);
        add(&mut s, b("ffn_gate_shexp.weight"), &[e, f_sh], shexp_ty, None);
        add(&mut s, b("ffn_up_shexp.weight"), &[e, f_sh], shexp_ty, None);
        add(&mut s, b("ffn_down_shexp.weight"), &[f_sh, e], f16t, None);
    }
    s
}

/// Where a hostile model must fail.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fails {
    /// `pn_models::load` (config) returns an error containing every string.
    Config(&'static [&'static str]),
    /// `Runner::new` (graph build + weight binding) returns an error containing every string.
    Runner(&'static [&'static str]),
    /// Loads; `forward(&[0, TOKEN])` returns an error containing every string.
    Forward(&'static [&'static str]),
    /// Loads and runs; the logits are not all finite (NaN/Inf weights).
    NonFinite,
}

/// Token ids the forward check feeds (the second one is ≥ the vocabulary of
/// `vocab-smaller-than-tokens.gguf`).
const FORWARD_TOKENS: [u32; 2] = [0, 100];

/// (file name, what is wrong, expected failure, the bytes).
fn cases() -> Vec<(&'static str, &'static str, Fails, Vec<u8>)> {
    let mut out = Vec::new();
    let mut case = |name: &'static str, what: &'static str, fails: Fails, f: &dyn Fn(&mut Spec)| {
        let mut s = base();
        f(&mut s);
        out.push((name, what, fails, s.to_bytes()));
    };
    use Fails::*;
    case("nonfinite-weights.gguf", "NaN in output_norm.weight, +Inf in an expert", NonFinite, &|s| {
        let t = s.tensor_mut("output_norm.weight");
        t.data[0..4].copy_from_slice(&f32::NAN.to_le_bytes());
        let t = s.tensor_mut("blk.0.ffn_up_exps.weight");
        t.data[0..2].copy_from_slice(&0x7c00u16.to_le_bytes());
    });
    case("qkv-wrong-rows.gguf", "blk.0.attn_qkv rows 31 ≠ 2·ssm_state·group_count + inner_size = 32", Runner(&["blk.0.attn_qkv.weight", "expected shape"]), &|s| {
        let t = s.tensor_mut("blk.0.attn_qkv.weight");
        t.ne = vec![D.e, 31];
        t.data.truncate(31 * 34);
    });
    case("missing-tensor.gguf", "blk.1.attn_output.weight absent", Runner(&["blk.1.attn_output.weight", "missing"]), &|s| s.remove_tensor("blk.1.attn_output.weight"));
    case("missing-token-embd.gguf", "token_embd.weight absent", Config(&["token_embd.weight", "missing"]), &|s| s.remove_tensor("token_embd.weight"));
    case("missing-block-count.gguf", "no qwen35moe.block_count", Config(&["missing", "qwen35moe.block_count"]), &|s| s.remove("qwen35moe.block_count"));
    case("missing-embedding-length.gguf", "no qwen35moe.embedding_length", Config(&["missing", "qwen35moe.embedding_length"]), &|s| s.remove("qwen35moe.embedding_length"));
    case("missing-rope-sections.gguf", "no qwen35moe.rope.dimension_sections", Config(&["missing", "qwen35moe.rope.dimension_sections"]), &|s| s.remove("qwen35moe.rope.dimension_sections"));
    case("missing-ssm-state-size.gguf", "no qwen35moe.ssm.state_size", Config(&["missing", "qwen35moe.ssm.state_size"]), &|s| s.remove("qwen35moe.ssm.state_size"));
    case("missing-ssm-group-count.gguf", "no qwen35moe.ssm.group_count", Config(&["missing", "qwen35moe.ssm.group_count"]), &|s| s.remove("qwen35moe.ssm.group_count"));
    case("block-count-string.gguf", "qwen35moe.block_count is the STRING \"2\"", Config(&["qwen35moe.block_count", "expected", "string \"2\""]), &|s| {
        s.set_arch("block_count", MetaValue::String("2".into()))
    });
    case("head-count-not-multiple.gguf", "head_count 3, head_count_kv 2", Config(&["head_count 3", "multiple of head_count_kv 2"]), &|s| {
        s.set_arch("attention.head_count", MetaValue::U32(3));
        s.set_arch("attention.head_count_kv", MetaValue::U32(2));
    });
    case("expert-used-gt-count.gguf", "expert_used_count 5 > expert_count 4", Config(&["expert_count 4", "expert_used_count 5"]), &|s| {
        s.set_arch("expert_used_count", MetaValue::U32(5))
    });
    case("nextn-ge-block-count.gguf", "nextn_predict_layers 2 = block_count 2", Config(&["nextn_predict_layers", "block_count 2"]), &|s| {
        s.set_arch("nextn_predict_layers", MetaValue::U32(2))
    });
    case("unknown-arch.gguf", "general.architecture \"not-an-arch\"", Config(&["unknown architecture \"not-an-arch\"", "supported architectures are", "qwen35moe"]), &|s| {
        s.set("general.architecture", MetaValue::String("not-an-arch".into()))
    });
    case("arch-not-string.gguf", "general.architecture is a UINT32", Config(&["general.architecture", "expected a string"]), &|s| {
        s.set("general.architecture", MetaValue::U32(7))
    });
    case("rope-sections-short.gguf", "rope.dimension_sections has 3 values", Config(&["rope.dimension_sections", "expected 4"]), &|s| {
        s.set_arch("rope.dimension_sections", MetaValue::Array(vec![MetaValue::I32(2), MetaValue::I32(1), MetaValue::I32(1)]))
    });
    case("rope-sections-zero.gguf", "rope.dimension_sections all 0", Config(&["rope.dimension_sections"]), &|s| {
        s.set_arch("rope.dimension_sections", MetaValue::Array(vec![MetaValue::I32(0); 4]))
    });
    case("expert-count-mismatch.gguf", "blk.0.ffn_gate_exps has 3 experts, expert_count is 4", Runner(&["blk.0.ffn_gate_exps.weight", "expected shape"]), &|s| {
        let t = s.tensor_mut("blk.0.ffn_gate_exps.weight");
        t.ne[2] = 3;
        t.data.truncate((D.f_exp * 3 * 34) as usize);
    });
    case("conv-not-f32.gguf", "blk.0.ssm_conv1d.weight stored as F16", Config(&["blk.0.ssm_conv1d.weight", "F32"]), &|s| {
        let t = s.tensor_mut("blk.0.ssm_conv1d.weight");
        let vals: Vec<f32> = t.data.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
        t.ty = GgmlType::F16;
        t.data = f16_bytes(&vals);
    });
    case("huge-key-length.gguf", "attention.key_length 2^62 (dimension products overflow usize)", Config(&["attention.key_length"]), &|s| {
        s.set_arch("attention.key_length", MetaValue::U64(1 << 62));
        s.set_arch("attention.value_length", MetaValue::U64(1 << 62));
        s.set_arch("rope.dimension_count", MetaValue::U64(8));
    });
    case("huge-embedding-length.gguf", "embedding_length 2^40", Config(&["embedding_length", "expected a value in 1..="]), &|s| {
        s.set_arch("embedding_length", MetaValue::U64(1 << 40));
    });
    case("wide-embedding-length.gguf", "embedding_length 2^20 (in range; no tensor matches, nothing allocated)", Runner(&["expected shape"]), &|s| {
        s.set_arch("embedding_length", MetaValue::U32(1 << 20));
    });
    case("huge-block-count.gguf", "block_count 2^40 (a per-layer Vec of 2^40 entries)", Config(&["block_count", "blocks but"]), &|s| {
        s.set_arch("block_count", MetaValue::U64(1 << 40));
    });
    case("key-length-zero.gguf", "attention.key_length 0", Config(&["attention.key_length"]), &|s| {
        s.set_arch("attention.key_length", MetaValue::U32(0));
        s.set_arch("attention.value_length", MetaValue::U32(0));
        s.set_arch("rope.dimension_count", MetaValue::U32(0));
    });
    case("vocab-smaller-than-tokens.gguf", "token_embd has 64 rows; the tokenizer and the ids used go up to 258", Forward(&["token id 100", "vocabulary has 64"]), &|s| {
        let t = s.tensor_mut("token_embd.weight");
        t.ne[1] = 64;
        t.data.truncate(64 * 34);
    });
    // TQ1_0 needs rows of 256: a variant with a 256-wide shared expert
    // (one layer and no tokenizer, to stay under 64 KB)
    let mut s = base_with(256, GgmlType::Q8_0);
    s.set_arch("block_count", MetaValue::U32(1));
    s.tensors.retain(|t| !t.name.starts_with("blk.1."));
    s.meta.retain(|(k, _)| !k.starts_with("tokenizer."));
    let t = s.tensor_mut("blk.0.ffn_down_shexp.weight");
    t.ty = GgmlType::TQ1_0;
    t.data = vec![0u8; (D.e * 54) as usize];
    out.push(("tq1_0-weight.gguf", "blk.0.ffn_down_shexp.weight is TQ1_0 (no kernel)", Fails::Runner(&["blk.0.ffn_down_shexp.weight", "TQ1_0", "not supported"]), s.to_bytes()));
    out
}

/// The cases committed under `tests/fixtures/hostile_models/` (one per kind of defect; the
/// CLI tests run `pn` on them). The others are only built in memory here.
const COMMITTED: &[&str] = &[
    "nonfinite-weights.gguf",
    "qkv-wrong-rows.gguf",
    "missing-tensor.gguf",
    "missing-block-count.gguf",
    "block-count-string.gguf",
    "head-count-not-multiple.gguf",
    "unknown-arch.gguf",
    "expert-count-mismatch.gguf",
    "huge-block-count.gguf",
    "tq1_0-weight.gguf",
    "vocab-smaller-than-tokens.gguf",
];

fn dir() -> PathBuf {
    fixture("hostile_models")
}

/// Load a model as the CLI does. `Ok(runner)` or the error's display.
fn load(bytes: Vec<u8>) -> Result<Runner, (&'static str, String)> {
    let g = Arc::new(Gguf::from_bytes(bytes).map_err(|e| ("gguf", e.to_string()))?);
    let m = pn_models::load(&g).map_err(|e| ("config", e.to_string()))?;
    Runner::new(m, g, Arc::new(CpuBackend::new(1))).map_err(|e| ("runner", e.to_string()))
}

fn check(name: &str, fails: Fails, bytes: Vec<u8>) {
    let has_all = |msg: &str, subs: &[&str]| {
        for s in subs {
            assert!(msg.contains(s), "{name}: error {msg:?} should mention {s:?}");
        }
        assert!(!msg.contains('\n'), "{name}: error should be one line: {msg:?}");
    };
    match (fails, load(bytes)) {
        (Fails::Config(subs), Err(("config", msg))) | (Fails::Runner(subs), Err(("runner", msg))) => has_all(&msg, subs),
        (Fails::Forward(subs), Ok(r)) => {
            let mut st = r.new_state(16);
            let e = r.forward(&mut st, &FORWARD_TOKENS, false).expect_err(name).to_string();
            has_all(&e, subs);
        }
        (Fails::NonFinite, Ok(r)) => {
            let mut st = r.new_state(16);
            let l = r.forward(&mut st, &FORWARD_TOKENS, true).unwrap_or_else(|e| panic!("{name}: forward: {e}"));
            assert!(l.data.iter().any(|x| !x.is_finite()), "{name}: expected non-finite logits");
        }
        (want, Err((stage, msg))) => panic!("{name}: expected {want:?}, failed at {stage}: {msg}"),
        (want, Ok(_)) => panic!("{name}: expected {want:?}, but the model loaded"),
    }
}

#[test]
fn micro_model_is_valid_and_runs() {
    let bytes = base().to_bytes();
    assert!(bytes.len() < 64 * 1024, "micro model is {} bytes", bytes.len());
    let r = load(bytes.clone()).unwrap_or_else(|e| panic!("micro model: {e:?}"));
    let mut st = r.new_state(16);
    let l = r.forward(&mut st, &[1, 2, 3], true).expect("forward");
    assert_eq!(l.rows(), 3);
    assert!(l.data.iter().all(|x| x.is_finite()));
    let g = Gguf::from_bytes(bytes).unwrap();
    let tok = pn_engine::tokenizer::Tokenizer::from_gguf(&g).expect("micro tokenizer");
    assert_eq!(tok.decode(&tok.encode("def f(x): return x", false)), "def f(x): return x");
}

#[test]
fn hostile_models_fail_cleanly() {
    let mut failed = Vec::new();
    for (name, _, fails, bytes) in cases() {
        if std::panic::catch_unwind(|| check(name, fails, bytes)).is_err() {
            failed.push(name);
        }
    }
    assert!(failed.is_empty(), "hostile models that did not fail cleanly: {failed:?}");
}

#[test]
fn committed_hostile_models_are_current_and_fail_cleanly() {
    let cases: Vec<_> = cases().into_iter().filter(|c| COMMITTED.contains(&c.0)).collect();
    assert_eq!(cases.len(), COMMITTED.len());
    let mut names: Vec<String> = std::fs::read_dir(dir())
        .expect("tests/fixtures/hostile_models exists (regenerate: see the module docs)")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".gguf"))
        .collect();
    names.sort();
    let mut want: Vec<String> = cases.iter().map(|c| c.0.to_string()).collect();
    want.sort();
    assert_eq!(names, want, "the committed files differ from the generator's list (regenerate)");
    for (name, _, fails, bytes) in cases {
        let path = dir().join(name);
        let on_disk = std::fs::read(&path).unwrap();
        assert!(on_disk.len() < 64 * 1024, "{name}: {} bytes", on_disk.len());
        assert!(on_disk == bytes, "{name} is stale (regenerate: see the module docs)");
        // through the mmap path, as the CLI opens it
        let g = Gguf::open(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(g.tensors.len(), Gguf::from_bytes(bytes.clone()).unwrap().tensors.len());
        check(name, fails, on_disk);
    }
}

#[test]
#[ignore = "writes tests/fixtures/hostile_models/ and the fuzz seed"]
fn regenerate() {
    let d = dir();
    std::fs::create_dir_all(&d).unwrap();
    let mut table = String::from("| file | what is wrong | expected |\n|------|------|------|\n");
    for (name, what, fails, bytes) in cases() {
        if !COMMITTED.contains(&name) {
            continue;
        }
        std::fs::write(d.join(name), &bytes).unwrap();
        let expect = match fails {
            Fails::Config(_) => "config error at load",
            Fails::Runner(_) => "weight error at load (Runner::new)",
            Fails::Forward(_) => "error at forward",
            Fails::NonFinite => "loads; non-finite logits (the CLI errors)",
        };
        table += &format!("| {name} | {what} | {expect} |\n");
    }
    std::fs::write(d.join("README.md"), format!(
        "# Hostile model files\n\nGGUFs that parse but are wrong as qwen35moe models, each a ~30 KB micro model with one\ndefect (a selection: more cases are built in memory by the test). Generated and checked by `tests/tests/hostile_models.rs` (regenerate:\n`cargo test -p pn-tests --test hostile_models -- --ignored regenerate`); the CLI tests\n(`tools/tests/cli_robustness.rs`) run `pn` on them. See docs/robustness.md.\n\n{table}"
    )).unwrap();
    let seeds = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/gguf_model");
    std::fs::create_dir_all(&seeds).unwrap();
    std::fs::write(seeds.join("micro-valid.gguf"), base().to_bytes()).unwrap();
}

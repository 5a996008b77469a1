//! The MTP ("nextn") block of a Qwen3.5 file as graphs, spec §3.6 (llama.cpp
//! `graph_mtp`): for pairs (h_p, x_{p+1}), `e = embed(x_{p+1})`,
//! `x = eh_proj · [RMSN(e, enorm) ; RMSN(h, hnorm)]`, one gated-attention layer + MoE
//! with the shared expert (`blk.N.*`, N = n_layer; its own KV cache), then
//! `RMSN(x, shared_head_norm)` (the next draft's h) → LM head. Loaded only when asked
//! ([`load`]); the engine runs it (pn_engine::spec::mtp).

use super::{Ffn, Qwen35};
use crate::blocks;
use crate::meta::ConfigError;
use pn_engine::graph::{GraphBuilder, GraphError};
use pn_engine::spec::MtpBlock;
use pn_engine::Gguf;
use pn_ops::{BinaryOp, KvCache, KvType, LayerState, Op, Shape};
use std::sync::Arc;

/// The block of a file, checked: `nextn_predict_layers` ≥ 1 and its tensors present.
pub struct Mtp {
    m: Qwen35,
    /// The block's layer index (n_layer: the first MTP layer).
    il: usize,
}

/// The MTP block of `g`, or why it has none (expected vs found).
pub fn load(g: &Gguf) -> Result<Arc<dyn MtpBlock>, ConfigError> {
    let arch = crate::meta::architecture(g)?;
    let ffn = match arch {
        "qwen35moe" => Ffn::Moe,
        "qwen35" => Ffn::Dense,
        other => return Err(ConfigError::Invalid(format!("--draft mtp: architecture {other} has no MTP block (qwen35moe / qwen35 files may): use --draft lookup"))),
    };
    let m = Qwen35::load(g, arch, ffn)?;
    let c = &m.cfg;
    if c.n_nextn == 0 {
        return Err(ConfigError::Invalid(format!(
            "--draft mtp: this file has no MTP (nextn) block: {arch}.nextn_predict_layers is 0 (block_count {}); convert the checkpoint with its MTP weights, or use --draft lookup",
            c.n_layer_all
        )));
    }
    let il = c.n_layer;
    for n in ["nextn.eh_proj.weight", "nextn.enorm.weight", "nextn.hnorm.weight", "attn_norm.weight", "post_attention_norm.weight"] {
        let name = format!("blk.{il}.{n}");
        if !m.w.has(&name) {
            return Err(ConfigError::Tensor { name, msg: format!("--draft mtp: {arch}.nextn_predict_layers is {} but the MTP tensor is missing from the GGUF", c.n_nextn) });
        }
    }
    if c.recurrent.get(il).copied().unwrap_or(false) {
        return Err(ConfigError::Invalid(format!("--draft mtp: block {il} is marked recurrent; an MTP block is a full-attention layer")));
    }
    Ok(Arc::new(Mtp { m, il }))
}

impl Mtp {
    fn name(&self, s: &str) -> String {
        format!("blk.{}.{s}", self.il)
    }
    fn first_of(&self, names: &[String]) -> String {
        names.iter().find(|n| self.m.w.has(n)).cloned().unwrap_or_else(|| names[names.len() - 1].clone())
    }
}

impl MtpBlock for Mtp {
    fn n_embd(&self) -> usize {
        self.m.cfg.n_embd
    }

    fn build_norms(&self, t: usize, b: &mut GraphBuilder) -> Result<(), GraphError> {
        let c = &self.m.cfg;
        let e = c.n_embd;
        let tokens = b.input(Op::Tokens, t, "inp_tokens")?;
        let h = b.external("inp_h", Shape::d2(e, t))?;
        let table = self.first_of(&[self.name("nextn.embed_tokens.weight"), "token_embd.weight".into()]);
        let embd = self.m.w.node(b, &table, &[e, c.n_vocab])?;
        let x = b.op(Op::GetRows, &[embd, tokens], "mtp_embd")?;
        let en = blocks::rms_norm(b, &self.m.w, x, &self.name("nextn.enorm.weight"), e, c.eps, "mtp_enorm")?;
        let hn = blocks::rms_norm(b, &self.m.w, h, &self.name("nextn.hnorm.weight"), e, c.eps, "mtp_hnorm")?;
        b.output(en);
        b.output(hn);
        Ok(())
    }

    fn build_block(&self, t: usize, seqs: usize, b: &mut GraphBuilder) -> Result<(), GraphError> {
        let c = &self.m.cfg;
        let (e, il) = (c.n_embd, self.il);
        let pos = b.input(Op::Positions, t, "inp_pos")?;
        let eh = b.external("inp_eh", Shape::d2(2 * e, t))?;
        let mut h = blocks::linear(b, &self.m.w, eh, &self.name("nextn.eh_proj.weight"), 2 * e, e, "mtp_eh_proj")?;
        b.set_layer(Some(il));
        let x = blocks::rms_norm(b, &self.m.w, h, &self.name("attn_norm.weight"), e, c.eps, "attn_norm")?;
        let a = self.m.attention(b, il, x, pos, t)?;
        h = b.op(Op::Binary(BinaryOp::Add), &[a, h], "attn_residual")?;
        let y = blocks::rms_norm(b, &self.m.w, h, &self.name("post_attention_norm.weight"), e, c.eps, "attn_post_norm")?;
        let f = match self.m.ffn {
            Ffn::Moe => self.m.moe(b, il, y)?,
            Ffn::Dense => blocks::swiglu(b, &self.m.w, il, y, "", e, c.n_ff, "ffn_out")?,
        };
        h = b.op(Op::Binary(BinaryOp::Add), &[f, h], "l_out")?;
        b.set_layer(None);
        // each sequence's last pair (its next draft)
        if seqs > 1 {
            h = b.op(Op::LastRows { seqs }, &[h], "mtp_last")?;
        } else if t > 1 {
            h = b.op(Op::SliceRows { start: t - 1, len: 1 }, &[h], "mtp_last")?;
        }
        let norm = self.first_of(&[self.name("nextn.shared_head_norm.weight"), "output_norm.weight".into()]);
        let n = blocks::rms_norm(b, &self.m.w, h, &norm, e, c.eps, "mtp_norm")?;
        let head = self.first_of(&[self.name("nextn.shared_head_head.weight"), "output.weight".into(), "token_embd.weight".into()]);
        let logits = blocks::linear(b, &self.m.w, n, &head, e, c.n_vocab, "mtp_output")?;
        b.output(n);
        b.output(logits);
        Ok(())
    }

    fn new_state(&self, max_seq: usize, kv: KvType) -> LayerState {
        let c = &self.m.cfg;
        LayerState::Kv(KvCache::with_type(c.n_head_kv, c.head_dim, max_seq, kv))
    }
}

//! The MTP block's draft tokens against llama.cpp's on the default model: the rounds of
//! `llama-speculative-simple --spec-type draft-mtp --spec-draft-n-max 1 --temp 0` for the
//! six prompts of bench/mtp-prompts.txt (tests/fixtures/mtp-llama-drafts.json, made by
//! `bench/mtp_oracle_drafts.py --n 1 --fixture tests/fixtures/mtp-llama-drafts.json`),
//! 128 tokens each. pn drafts with f16 KV (llama.cpp's default) so the greedy texts
//! agree as long as possible; where both drafted for the same token in the same context,
//! the draft must be the same token (measured: 379 of 389).

use pn_engine::sampler::{Sampler, SamplerConfig};
use pn_engine::spec::{Drafter, MtpDrafter, Speculator};
use pn_engine::{Gguf, Runner, SeqState};
use pn_ops::KvType;
use pn_tests::*;
use std::collections::HashMap;
use std::sync::Arc;

type Round = (Vec<u32>, usize, u32);

/// Generated token index → token, and → draft; round 0's draft predicts token `g`.
fn stream(rounds: &[Round], mut g: usize) -> (HashMap<usize, u32>, HashMap<usize, u32>) {
    let (mut toks, mut drafts) = (HashMap::new(), HashMap::new());
    for (ds, acc, next) in rounds {
        for (j, &d) in ds.iter().enumerate() {
            drafts.insert(g + j, d);
        }
        for (j, &d) in ds.iter().take(*acc).enumerate() {
            toks.insert(g + j, d);
        }
        toks.insert(g + acc, *next);
        g += acc + 1;
    }
    (toks, drafts)
}

fn pn_rounds(r: &Runner, g: &Arc<Gguf>, prompt: &[u32], gen: usize) -> Vec<Round> {
    let mut st = SeqState::new(r.model().new_state_with(512, KvType::F16), 512);
    let block = pn_models::qwen35moe::mtp::load(g).unwrap();
    let d = Drafter::Mtp(Box::new(MtpDrafter::new(block, g.clone(), r.dies()[0].backend.clone(), 512, KvType::F32)));
    let mut sp = Speculator::new(r, d, 1).unwrap();
    let mut s = Sampler::new(SamplerConfig::greedy());
    let l = sp.prefill(r, &mut st, prompt).unwrap();
    let mut next = s.sample(l.last());
    let (mut rounds, mut n) = (Vec::new(), 1);
    while n < gen {
        let (acc, nx) = sp.round(r, &mut st, next, &mut s).unwrap();
        rounds.push((sp.last_drafts.clone(), acc.len(), nx));
        n += acc.len() + 1;
        next = nx;
    }
    rounds
}

#[test]
fn mtp_drafts_match_llama_cpp_on_the_default_model() {
    let g = Arc::new(Gguf::open(&fixture("../../models/default/pn-default-code-q4_k_m.gguf")).unwrap());
    let r = Runner::new(pn_models::load(&g).unwrap(), g.clone(), Arc::new(pn_cpu::CpuBackend::new(2))).unwrap();
    let tok = pn_engine::tokenizer::Tokenizer::from_gguf(&g).unwrap();
    let fx: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(fixture("mtp-llama-drafts.json")).unwrap()).unwrap();
    let gen = fx["gen"].as_u64().unwrap() as usize;
    let (mut compared, mut agree) = (0, 0);
    for p in fx["prompts"].as_array().unwrap() {
        let text = p["prompt"].as_str().unwrap();
        let lr: Vec<Round> = serde_json::from_value(p["rounds"].clone()).unwrap();
        let pr = pn_rounds(&r, &g, &tok.encode(text, true), gen);
        // llama-speculative-simple's first pending token is the prompt's last
        let ((pt, pd), (lt, ld)) = (stream(&pr, 1), stream(&lr, 0));
        let mut same = 1;
        while pt.get(&same).is_some_and(|t| lt.get(&same) == Some(t)) {
            same += 1;
        }
        let both: Vec<usize> = pd.keys().copied().filter(|i| *i < same && ld.contains_key(i)).collect();
        let a = both.iter().filter(|i| pd[i] == ld[i]).count();
        eprintln!("{text:?}: texts agree for {same} tokens, {a} of {} drafts agree", both.len());
        compared += both.len();
        agree += a;
    }
    assert!(compared >= 300, "only {compared} drafts compared: the greedy texts diverge from llama.cpp's early");
    assert!(agree as f64 >= 0.95 * compared as f64, "{agree} of {compared} MTP drafts agree with llama.cpp's");
}

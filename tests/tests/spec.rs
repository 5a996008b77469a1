//! Speculative decoding (engine/src/spec): greedy output with drafts is token for token
//! the output without; a rollback restores exactly the state of the kept tokens; MTP
//! needs a file with an MTP block.

use pn_engine::sampler::{argmax, Sampler, SamplerConfig};
use pn_engine::spec::slots::{draft_all, verify_all, SlotDraft};
use pn_engine::spec::{accept, Drafter, Lookup, MtpDrafter, MtpModel, SpecStats, Speculator};
use pn_engine::{Gguf, Runner};
use pn_ops::KvType;
use pn_tests::*;
use std::sync::Arc;

fn default_path() -> std::path::PathBuf {
    fixture("../../models/default/pn-default-code-q4_k_m.gguf")
}

fn load(name: &str) -> (Runner, Arc<Gguf>) {
    let p = if name == "default" { default_path() } else { fixture(name) };
    let g = Arc::new(Gguf::open(&p).unwrap());
    let m = pn_models::load(&g).unwrap();
    let mut r = Runner::new(m, g.clone(), Arc::new(pn_cpu::CpuBackend::new(2))).unwrap();
    // two lanes, as the CLI and the server run these small files: verify passes of
    // several slots (and their hidden rows) go through them
    pn_cpu::add_lanes(&mut r, 2).unwrap();
    (r, g)
}

/// A prompt that repeats itself (prompt lookup finds matches from the start).
fn prompt(vocab: usize) -> Vec<u32> {
    let base: Vec<u32> = (0..12u32).map(|i| (i * 37 + 11) % vocab as u32).collect();
    [base.clone(), base[..7].to_vec()].concat()
}

fn plain(r: &Runner, p: &[u32], n: usize) -> Vec<u32> {
    plain_with(r, p, n, SamplerConfig::greedy())
}

/// Plain decoding with a sampler (greedy: the argmax).
fn plain_with(r: &Runner, p: &[u32], n: usize, cfg: SamplerConfig) -> Vec<u32> {
    let mut st = r.new_state(256);
    let mut s = Sampler::new(cfg);
    let mut row = r.forward(&mut st, p, false).unwrap().last().to_vec();
    let mut out = Vec::new();
    while out.len() < n {
        let t = s.sample(&row);
        assert!(!s.is_greedy() || t == argmax(&row) as u32);
        out.push(t);
        row = r.forward(&mut st, &[t], false).unwrap().last().to_vec();
    }
    out
}

fn drafted(r: &Runner, p: &[u32], n: usize, drafter: Drafter, k: usize) -> (Vec<u32>, SpecStats) {
    drafted_with(r, p, n, drafter, k, SamplerConfig::greedy())
}

fn drafted_with(r: &Runner, p: &[u32], n: usize, drafter: Drafter, k: usize, cfg: SamplerConfig) -> (Vec<u32>, SpecStats) {
    let mut st = r.new_state(256);
    let mut sp = Speculator::new(r, drafter, k).unwrap();
    let mut s = Sampler::new(cfg);
    let l = sp.prefill(r, &mut st, p).unwrap();
    let mut next = s.sample(l.last());
    let mut out = Vec::new();
    while out.len() < n {
        out.push(next);
        let (acc, nx) = sp.round(r, &mut st, next, &mut s).unwrap();
        out.extend(acc);
        next = nx;
    }
    out.truncate(n);
    (out, sp.stats.clone())
}

fn mtp(r: &Runner, g: &Arc<Gguf>) -> Drafter {
    let block = pn_models::qwen35moe::mtp::load(g).unwrap();
    Drafter::Mtp(Box::new(MtpDrafter::new(block, g.clone(), r.dies()[0].backend.clone(), 256, KvType::F32)))
}

const MODELS: [&str; 5] = ["tiny-f16.gguf", "ktiny-q4_k_m.gguf", "qwen35-tiny-f16.gguf", "tiny-mtp-f16.gguf", "default"];

#[test]
fn lookup_greedy_is_plain_greedy() {
    let mut all = SpecStats::default();
    for m in MODELS {
        let (r, _) = load(m);
        let p = prompt(r.model().n_vocab());
        let want = plain(&r, &p, 40);
        for k in [1, 3, 6] {
            let (got, stats) = drafted(&r, &p, 40, Drafter::Lookup(Lookup::default()), k);
            assert_eq!(got, want, "{m}: --draft lookup --draft-n {k}");
            eprintln!("{m} ×{k}: {}", stats.line());
            all.add(&stats);
        }
    }
    // the rounds took both paths: drafts accepted and drafts rolled back
    assert!(all.accepted > 0 && all.accepted < all.drafted, "{}", all.line());
}

/// Sampling with drafts is plain sampling with the same seed, token for token (the
/// coupled acceptance rule, engine/src/spec/accept.rs: the sampler's own draw decides,
/// so drafts never change which random numbers a position takes).
#[test]
fn sampled_drafts_are_plain_sampling_with_the_same_seed() {
    let mut all = SpecStats::default();
    for m in ["tiny-mtp-f16.gguf", "default"] {
        let (r, g) = load(m);
        let p = prompt(r.model().n_vocab());
        for (i, (temperature, top_k, top_p, repeat_penalty)) in [(0.7, 40, 0.95, 1.0), (1.0, 0, 1.0, 1.1), (0.3, 8, 0.9, 1.0)].into_iter().enumerate() {
            let cfg = SamplerConfig { temperature, top_k, top_p, min_p: 0.0, repeat_penalty, repeat_last_n: 64, seed: 1000 + i as u64 };
            let want = plain_with(&r, &p, 40, cfg.clone());
            for (name, k) in [("lookup", 3), ("mtp", 2)] {
                let d = if name == "lookup" { Drafter::Lookup(Lookup::default()) } else { mtp(&r, &g) };
                let (got, stats) = drafted_with(&r, &p, 40, d, k, cfg.clone());
                assert_eq!(got, want, "{m}: --draft {name} ×{k}, {cfg:?}");
                all.add(&stats);
            }
        }
    }
    // drafts kept and drafts replaced by the sampler's own draw
    assert!(all.accepted > 0 && all.accepted < all.drafted, "{}", all.line());
}

#[test]
fn mtp_greedy_is_plain_greedy() {
    for m in ["tiny-mtp-f16.gguf", "default"] {
        let (r, g) = load(m);
        let p = prompt(r.model().n_vocab());
        let want = plain(&r, &p, 40);
        for k in [1, 2, 4] {
            let (got, stats) = drafted(&r, &p, 40, mtp(&r, &g), k);
            assert_eq!(got, want, "{m}: --draft mtp --draft-n {k}");
            assert!(stats.drafted > 0, "{m}: MTP drafted nothing");
        }
    }
}

/// The default model's trained MTP block predicts its own greedy continuation well: a
/// broken block (wrong concat order, positions or feedback) scores near 0.
#[test]
fn mtp_drafts_are_accepted_on_the_default_model() {
    let (r, g) = load("default");
    let tok = pn_engine::tokenizer::Tokenizer::from_gguf(&g).unwrap();
    let mut all = SpecStats::default();
    for text in ["def parse_args(argv):", "import os", "class Parser:"] {
        let p = tok.encode(text, true);
        let (_, s) = drafted(&r, &p, 48, mtp(&r, &g), 1);
        all.add(&s);
    }
    assert!(all.acceptance() > 0.5, "MTP acceptance with one draft: {}", all.line());
}

/// verify + rollback to any kept prefix, then one more token: bitwise the logits of a
/// fresh sequence fed the kept tokens and that token.
#[test]
fn rollback_restores_the_kept_prefix_exactly() {
    for m in MODELS {
        let (r, _) = load(m);
        let v = r.model().n_vocab() as u32;
        let head: Vec<u32> = (0..5).map(|i| (i * 13 + 3) % v).collect();
        let pass: Vec<u32> = (0..5).map(|i| (i * 29 + 7) % v).collect();
        for keep in 1..=pass.len() {
            let mut st = r.new_state(64);
            r.forward(&mut st, &head, false).unwrap();
            let (_, vp) = pn_engine::spec::verify::verify(&r, &mut st, &pass, None).unwrap();
            // keep one more first, then shrink (a stop inside a round un-feeds drafts)
            vp.rollback(&mut st, (keep + 1).min(pass.len())).unwrap();
            vp.rollback(&mut st, keep).unwrap();
            assert!(vp.rollback(&mut st, keep + 1).is_err() || keep == pass.len(), "{m}: grew back");
            assert_eq!(st.pos, head.len() + keep);
            let got = r.forward(&mut st, &[1], false).unwrap();
            let mut fresh = r.new_state(64);
            r.forward(&mut fresh, &head, false).unwrap();
            r.forward(&mut fresh, &pass[..keep], false).unwrap();
            let want = r.forward(&mut fresh, &[1], false).unwrap();
            assert_eq!(got.data, want.data, "{m}: keep {keep} of {}", pass.len());
        }
    }
}

#[test]
fn mtp_without_an_mtp_block_is_a_clear_error() {
    let (_, g) = load("ktiny-q4_k_m.gguf");
    let e = pn_models::qwen35moe::mtp::load(&g).err().expect("no MTP block").to_string();
    assert!(e.contains("no MTP") && e.contains("nextn_predict_layers"), "{e}");
    let (_, g) = load("qwen3-tiny-f32.gguf");
    let e = pn_models::qwen35moe::mtp::load(&g).err().expect("not qwen3.5").to_string();
    assert!(e.contains("has no MTP block"), "{e}");
}

/// Decode slots: every sequence's pending token and its own drafts (lookup, or its own
/// MTP drafter) in one pass (different draft counts per sequence), each rolled back on
/// its own: greedy output per sequence is still plain decoding's.
fn under_slots_is_plain_greedy(models: &[&str], make: &dyn Fn(&Runner, &Arc<Gguf>) -> Drafter) -> SpecStats {
    use pn_engine::spec::slots::{round, SlotRound};
    let mut all = SpecStats::default();
    for &m in models {
        let (r, g) = load(m);
        let v = r.model().n_vocab();
        let prompts: Vec<Vec<u32>> = (0..3)
            .map(|i| {
                let mut p = prompt(v);
                p.rotate_left(i * 2);
                p
            })
            .collect();
        let n = 30;
        let want: Vec<Vec<u32>> = prompts.iter().map(|p| plain(&r, p, n)).collect();
        let mut slots = pn_engine::Slots::new(4);
        struct Seq {
            h: pn_engine::SlotHandle,
            hist: Vec<u32>,
            next: u32,
            s: Sampler,
            stats: SpecStats,
            out: Vec<u32>,
            d: Drafter,
        }
        let mut seqs: Vec<Seq> = prompts
            .iter()
            .map(|p| {
                let mut st = r.new_state(256);
                let mut d = make(&r, &g);
                let l = d.prefill(&r, &mut st, p).unwrap();
                let mut s = Sampler::new(SamplerConfig::greedy());
                let next = s.sample(l.last());
                Seq { h: slots.bind(st).unwrap(), hist: p.clone(), next, s, stats: SpecStats::default(), out: Vec::new(), d }
            })
            .collect();
        let mut m_stats = SpecStats::default();
        while seqs.iter().any(|q| q.out.len() < n) {
            let mut items: Vec<SlotRound<'_>> = Vec::new();
            let mut pend = Vec::new();
            for (i, q) in seqs.iter_mut().enumerate().filter(|(_, q)| q.out.len() < n) {
                q.out.push(q.next);
                pend.push(i);
                items.push(SlotRound { handle: q.h, history: &q.hist, pending: q.next, sampler: &mut q.s, stats: &mut q.stats, drafter: &mut q.d });
            }
            let res = round(&mut slots, &r, 4, &mut items).unwrap();
            drop(items);
            for (i, (acc, next)) in pend.into_iter().zip(res) {
                let q = &mut seqs[i];
                let p = q.next;
                q.hist.push(p);
                q.hist.extend(&acc);
                q.out.extend(acc);
                q.next = next;
            }
        }
        for (i, q) in seqs.iter_mut().enumerate() {
            q.out.truncate(n);
            assert_eq!(q.out, want[i], "{m}: slot {i}");
            m_stats.add(&q.stats);
        }
        eprintln!("{m}: {}", m_stats.line());
        all.add(&m_stats);
    }
    all
}

#[test]
fn lookup_under_slots_is_plain_greedy() {
    let all = under_slots_is_plain_greedy(&["ktiny-q4_k_m.gguf", "default"], &|_, _| Drafter::Lookup(Lookup::default()));
    assert!(all.accepted > 0 && all.accepted < all.drafted, "{}", all.line());
}

#[test]
fn mtp_under_slots_is_plain_greedy() {
    let all = under_slots_is_plain_greedy(&["tiny-mtp-f16.gguf", "default"], &|r, g| mtp(r, g));
    // drafts accepted and drafts rejected (rolled back) both happened
    assert!(all.accepted > 0 && all.accepted < all.drafted, "{}", all.line());
}

/// The hidden rows handed out as a second output of the pass (`Taps::hidden`, what the
/// MTP drafter reads) are bitwise the `result_norm` values an observer sees, for every
/// token, with the pass split in ubatch chunks and last-row logits, and under slots;
/// the logits are the same as without them.
#[test]
fn hidden_output_is_the_observed_result_norm() {
    use pn_engine::runner::{Taps, HIDDEN_NODE};
    for m in MODELS {
        let (mut r, _) = load(m);
        r.ubatch = 8;
        let v = r.model().n_vocab() as u32;
        let toks: Vec<u32> = (0..19).map(|i| (i * 31 + 5) % v).collect();
        let observed = |r: &Runner, parts: &mut [(&mut pn_engine::SeqState, &[u32])]| {
            let mut h = Vec::new();
            let mut obs = |n: &pn_engine::Node, t: &pn_ops::Tensor| {
                if n.name == HIDDEN_NODE {
                    h.extend_from_slice(t.as_f32());
                }
            };
            let l = if parts.len() == 1 {
                let (st, t) = &mut parts[0];
                r.forward_observed(st, t, false, Some(&mut obs)).unwrap()
            } else {
                r.forward_multi_observed(parts, Some(&mut obs)).unwrap()
            };
            (l, h)
        };
        let (mut a, mut b) = (r.new_state(64), r.new_state(64));
        let (la, ha) = observed(&r, &mut [(&mut a, &toks[..])]);
        let mut hb = Vec::new();
        let lb = r.forward_hidden(&mut b, &toks, false, &mut hb).unwrap();
        assert_eq!(ha.len(), toks.len() * (ha.len() / toks.len()), "{m}");
        assert!(!hb.is_empty(), "{m}: no hidden rows");
        assert_eq!(ha, hb, "{m}: hidden rows");
        assert_eq!(la.data, lb.data, "{m}: logits");
        assert_eq!(lb.data, r.forward(&mut r.new_state(64), &toks, false).unwrap().data, "{m}: logits without the hidden output");
        // two sequences in one pass (3 and 2 tokens each), all logits
        let (t1, t2) = ([7u32 % v, 9 % v, 4 % v], [2u32 % v, 8 % v]);
        let (sa, sb) = (a.snapshot().unwrap(), b.snapshot().unwrap());
        let (lm, hm) = observed(&r, &mut [(&mut a, &t1[..]), (&mut b, &t2[..])]);
        a.restore(&sa).unwrap();
        b.restore(&sb).unwrap();
        let mut hn = Vec::new();
        let ln = r.forward_multi_with(&mut [(&mut a, &t1[..]), (&mut b, &t2[..])], Taps::hidden(&mut hn)).unwrap();
        assert_eq!(hm.len(), hb.len() / toks.len() * 5, "{m}: rows of the multi pass");
        assert_eq!(hm, hn, "{m}: hidden rows under slots");
        assert_eq!(lm.data, ln.data, "{m}: logits under slots");
    }
}

/// After every round (partial acceptance included) the MTP drafter holds exactly the
/// main model's `result_norm` rows of the accepted text and its own KV of those pairs:
/// each round's drafts are what a fresh drafter proposes when fed the hidden rows of
/// the same text in one pass (a wrong row, a missed or doubled row, or a stale MTP KV
/// cell after a rejection changes the drafts).
#[test]
fn mtp_drafts_follow_the_accepted_texts_hidden_rows() {
    let (r, g) = load("default");
    let tok = pn_engine::tokenizer::Tokenizer::from_gguf(&g).unwrap();
    for k in [1, 2, 3] {
        let (mut partial, mut rounds) = (0, 0);
        for text in ["def parse_args(argv):", "class Parser:"] {
            let p = tok.encode(text, true);
            let mut st = r.new_state(256);
            let mut sp = Speculator::new(&r, mtp(&r, &g), k).unwrap();
            let mut s = Sampler::new(SamplerConfig::greedy());
            let mut next = s.sample(sp.prefill(&r, &mut st, &p).unwrap().last());
            let mut ctx = p.clone();
            while ctx.len() < p.len() + 40 {
                ctx.push(next);
                let (acc, nx) = sp.round(&r, &mut st, next, &mut s).unwrap();
                // the reference: a fresh sequence and drafter fed `ctx` at once
                let mut fresh = r.new_state(256);
                let mut h = Vec::new();
                r.forward_hidden(&mut fresh, &ctx[..ctx.len() - 1], false, &mut h).unwrap();
                let Drafter::Mtp(mut d) = mtp(&r, &g) else { unreachable!() };
                d.observe_hidden(&h);
                assert_eq!(d.draft(&ctx, k).unwrap(), sp.last_drafts, "×{k} {text:?}: the drafts after {} tokens", ctx.len());
                partial += (acc.len() + 1 < sp.last_drafts.len() + 1 && !acc.is_empty()) as usize;
                rounds += 1;
                ctx.extend(&acc);
                next = nx;
            }
        }
        assert!(rounds > 20 && (k == 1 || partial > 0), "×{k}: {rounds} rounds, {partial} partially accepted");
    }
}

// MTP drafters of several decode slots on one model draft together
// (`spec::mtp::draft_many`: one block pass pairs every slot's accepted rows, then one
// pass per further draft position): every round's drafts are the ones each sequence's
// drafter gives alone, so acceptance, rollback and output are unchanged.

/// Rounds of `n` tokens or more for each prompt; per prompt, every round's drafts.
fn mtp_alone(r: &Runner, model: &Arc<MtpModel>, prompts: &[Vec<u32>], k: usize, n: usize) -> Vec<Vec<Vec<u32>>> {
    prompts
        .iter()
        .map(|p| {
            let mut st = r.new_state(256);
            let d = Drafter::Mtp(Box::new(MtpDrafter::with_model(model.clone(), 256, KvType::F32)));
            let mut sp = Speculator::new(r, d, k).unwrap();
            let mut s = Sampler::new(SamplerConfig::greedy());
            let mut next = s.sample(sp.prefill(r, &mut st, p).unwrap().last());
            let (mut rounds, mut out) = (Vec::new(), 0);
            while out < n {
                let (acc, nx) = sp.round(r, &mut st, next, &mut s).unwrap();
                rounds.push(sp.last_drafts.clone());
                out += acc.len() + 1;
                next = nx;
            }
            rounds
        })
        .collect()
}

/// The same rounds with every prompt in a decode slot, all verified in one pass a round
/// and drafted together; a sequence stops after as many rounds as it took alone.
fn mtp_under_slots(r: &Runner, model: &Arc<MtpModel>, prompts: &[Vec<u32>], k: usize, want_rounds: &[usize]) -> Vec<Vec<Vec<u32>>> {
    struct Seq {
        h: pn_engine::SlotHandle,
        hist: Vec<u32>,
        next: u32,
        s: Sampler,
        d: Drafter,
        rounds: Vec<Vec<u32>>,
    }
    let mut slots = pn_engine::Slots::new(prompts.len());
    let mut seqs: Vec<Seq> = prompts
        .iter()
        .map(|p| {
            let mut st = r.new_state(256);
            let mut d = Drafter::Mtp(Box::new(MtpDrafter::with_model(model.clone(), 256, KvType::F32)));
            let mut s = Sampler::new(SamplerConfig::greedy());
            let next = s.sample(d.prefill(r, &mut st, p).unwrap().last());
            Seq { h: slots.bind(st).unwrap(), hist: p.clone(), next, s, d, rounds: Vec::new() }
        })
        .collect();
    loop {
        let live: Vec<usize> = (0..seqs.len()).filter(|&i| seqs[i].rounds.len() < want_rounds[i]).collect();
        if live.is_empty() {
            return seqs.into_iter().map(|q| q.rounds).collect();
        }
        let mut items: Vec<SlotDraft<'_>> = seqs
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| live.contains(i))
            .map(|(_, q)| SlotDraft { handle: q.h, history: &q.hist, pending: q.next, n: k, drafter: &mut q.d })
            .collect();
        let toks = draft_all(&slots, &mut items).unwrap();
        let rows = verify_all(&mut slots, r, &items, &toks).unwrap();
        drop(items);
        for (j, &i) in live.iter().enumerate() {
            let q = &mut seqs[i];
            let drafts = &toks[j][1..];
            let (acc, next) = accept::accept(&mut q.s, &rows.logits[j], drafts);
            rows.keep(&mut slots, j, acc + 1, &mut q.d).unwrap();
            q.hist.push(q.next);
            q.hist.extend_from_slice(&drafts[..acc]);
            q.rounds.push(drafts.to_vec());
            q.next = next;
        }
    }
}

#[test]
fn mtp_drafts_batched_across_slots_are_each_sequences_own() {
    for m in ["tiny-mtp-f16.gguf", "default"] {
        let (r, g) = load(m);
        let v = r.model().n_vocab() as u32;
        // four prompts of different lengths: the slots fall out at different rounds
        let prompts: Vec<Vec<u32>> = (0..4u32).map(|i| (0..20 + 3 * i).map(|j| (j * 37 + i * 101 + 11) % (v - 8)).collect()).collect();
        for (k, budget) in [(1, usize::MAX), (3, usize::MAX), (2, 1)] {
            let block = pn_models::qwen35moe::mtp::load(&g).unwrap();
            let model = Arc::new(MtpModel::new(block, g.clone(), r.dies()[0].backend.clone()).with_graph_budget(budget));
            let want = mtp_alone(&r, &model, &prompts, k, 24 + 4 * k);
            let graphs = model.graphs();
            let got = mtp_under_slots(&r, &model, &prompts, k, &want.iter().map(Vec::len).collect::<Vec<_>>());
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g, w, "{m}: ×{k}, slot {i}: drafts per round");
            }
            if budget == 1 {
                // a budget below any graph: only the newest is kept, the rest recompiled
                assert_eq!(model.graphs(), 1, "{m}: ×{k}");
                continue;
            }
            // the slots' block passes ran together (geometries of several sequences)
            assert!(model.graphs() > graphs, "{m}: ×{k}: no multi-sequence block pass was compiled");
            let drafts: usize = want.iter().flatten().map(Vec::len).sum();
            eprintln!("{m} ×{k}: {} rounds, {drafts} drafts, {} block graphs ({} bytes)", want.iter().map(Vec::len).sum::<usize>(), model.graphs(), model.graph_bytes());
        }
    }
}

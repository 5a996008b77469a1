//! Slot table semantics: stale handles are errors (unbind, move, resize), move/compact
//! keep every sequence's results bitwise, async begin/poll equals a synchronous step, and
//! the memory ladder caps the slot count instead of running out of memory; a refused
//! sequence comes back whole.

use pn_engine::async_step::Launch;
use pn_engine::slots::slot_ladder;
use pn_engine::state::kv::{state_bytes, StateConfig};
use pn_engine::{SlotError, SlotHandle, Slots};
use pn_tests::*;
use std::sync::Arc;

fn prefilled(r: &pn_engine::Runner, seed: u32, n: usize) -> pn_engine::SeqState {
    let mut st = r.new_state(64);
    let toks: Vec<u32> = (0..n as u32).map(|i| (seed * 31 + i * 17) % 1000 + 1).collect();
    r.forward(&mut st, &toks, false).unwrap();
    st
}

#[test]
fn stale_handles_are_errors() {
    let r = runner("tiny-f16.gguf", 2);
    let mut slots = Slots::new(2);
    let a = slots.bind(prefilled(&r, 1, 3)).unwrap();
    let b = slots.bind(prefilled(&r, 2, 4)).unwrap();
    assert!(matches!(slots.bind(prefilled(&r, 3, 2)), Err(SlotError::Full { n: 2 })));
    assert!(matches!(slots.step(&r, &[(a, 1), (a, 2)]), Err(SlotError::Duplicate { slot: 0 })));
    assert!(matches!(slots.step(&r, &[]), Err(SlotError::EmptyStep)));
    // unbind: the handle is stale, and a new binding in the same slot does not revive it
    slots.unbind(a).unwrap();
    assert!(matches!(slots.step(&r, &[(a, 1)]), Err(SlotError::Unbound { slot: 0 })));
    let c = slots.bind(prefilled(&r, 3, 2)).unwrap();
    assert_eq!(c.slot(), 0);
    assert!(matches!(slots.state(a), Err(SlotError::Unbound { slot: 0 })));
    assert!(slots.step(&r, &[(c, 5), (b, 6)]).is_ok());
    // resize: every handle of the old generation is an error; the states come back
    let back = slots.resize(4).unwrap();
    assert_eq!(back.len(), 2);
    assert_eq!(slots.n_slots(), 4);
    let e = slots.step(&r, &[(b, 1)]).unwrap_err();
    assert!(matches!(e, SlotError::StaleGeneration { .. }), "{e}");
    assert!(e.to_string().contains("slot count changed"));
    assert!(matches!(slots.unbind(c), Err(SlotError::StaleGeneration { .. })));
    let d = slots.bind(back.into_iter().next().unwrap()).unwrap();
    assert_ne!(d.generation(), b.generation());
    assert!(slots.step(&r, &[(d, 7)]).is_ok());
    assert!(matches!(slots.bind_at(9, prefilled(&r, 1, 1)), Err(SlotError::OutOfRange { slot: 9, n: 4 })));
    assert!(matches!(slots.bind_at(0, prefilled(&r, 1, 1)), Err(SlotError::Occupied { slot: 0 })));
}

/// A sequence a full table (or a taken / missing slot) refuses comes back with the error,
/// untouched: bound once a slot frees, it decodes exactly as if it had never been refused.
#[test]
fn a_refused_sequence_comes_back_whole() {
    let r = runner("ktiny-q4_k_m.gguf", 2);
    let want = {
        let mut alone = Slots::new(1);
        let h = alone.bind(prefilled(&r, 3, 5)).unwrap();
        (alone.step(&r, &[(h, 7)]).unwrap(), alone.step(&r, &[(h, 8)]).unwrap())
    };
    let mut slots = Slots::new(2);
    let a = slots.bind(prefilled(&r, 1, 3)).unwrap();
    let b = slots.bind(prefilled(&r, 2, 4)).unwrap();
    let (e, st) = slots.try_bind(prefilled(&r, 3, 5)).unwrap_err();
    assert!(matches!(e, SlotError::Full { n: 2 }), "{e}");
    assert_eq!(st.pos, 5, "the refused sequence keeps its position");
    let (e, st) = slots.try_bind_at(1, st).unwrap_err();
    assert!(matches!(e, SlotError::Occupied { slot: 1 }), "{e}");
    let (e, st) = slots.try_bind_at(7, st).unwrap_err();
    assert!(matches!(e, SlotError::OutOfRange { slot: 7, n: 2 }), "{e}");
    slots.unbind(a).unwrap();
    let c = slots.try_bind(st).map_err(|(e, _)| e).unwrap();
    assert_eq!(c.slot(), 0);
    let got = (slots.step(&r, &[(c, 7)]).unwrap(), slots.step(&r, &[(c, 8), (b, 9)]).unwrap());
    assert_eq!(got.0, want.0);
    assert_eq!(got.1.row(0), want.1.row(0), "the refused sequence decodes as if never refused");
}

#[test]
fn move_and_compact_keep_results() {
    let r = runner("ktiny-q4_k_m.gguf", 2);
    let states: Vec<_> = (0..4).map(|i| prefilled(&r, i, 2 + i as usize)).collect();
    // reference: the four stepped together, twice, without moves
    let mut ref_slots = Slots::new(4);
    let hs: Vec<SlotHandle> = states.iter().map(|s| ref_slots.bind(s.clone()).unwrap()).collect();
    let first = ref_slots.step(&r, &[(hs[0], 5), (hs[1], 6), (hs[2], 7), (hs[3], 8)]).unwrap();
    let second = ref_slots.step(&r, &[(hs[1], 9), (hs[3], 10)]).unwrap();

    let mut slots = Slots::new(6);
    let mut h: Vec<SlotHandle> = states.iter().map(|s| slots.bind(s.clone()).unwrap()).collect();
    let l1 = slots.step(&r, &[(h[0], 5), (h[1], 6), (h[2], 7), (h[3], 8)]).unwrap();
    assert_eq!(l1, first);
    // sequences 0 and 2 finish; 3 moves to slot 5, then compaction packs 1 and 3 to 0, 1
    slots.unbind(h[0]).unwrap();
    slots.unbind(h[2]).unwrap();
    let moved = slots.move_to(h[3], 5).unwrap();
    assert!(matches!(slots.state(h[3]), Err(SlotError::Unbound { slot: 3 })));
    h[3] = moved;
    let pairs = slots.compact().unwrap();
    for (old, new) in pairs {
        let i = h.iter().position(|x| *x == old).unwrap();
        h[i] = new;
    }
    assert_eq!((h[1].slot(), h[3].slot()), (0, 1));
    assert_eq!(slots.n_bound(), 2);
    let l2 = slots.step(&r, &[(h[1], 9), (h[3], 10)]).unwrap();
    assert_eq!(l2, second, "moved / compacted slots give the same logits");
    // a fork continues exactly like its original
    let f = slots.copy_to(h[1], 4).unwrap();
    let l3 = slots.step(&r, &[(h[1], 11), (f, 11)]).unwrap();
    assert_eq!(l3.row(0), l3.row(1));
}

#[test]
fn async_begin_poll_equals_sync() {
    let r = Arc::new(runner("ktiny-q4_k_m.gguf", 2));
    let states: Vec<_> = (0..3).map(|i| prefilled(&r, i + 5, 3 + i as usize)).collect();
    let mut sync = Slots::new(3);
    let hs: Vec<SlotHandle> = states.iter().map(|s| sync.bind(s.clone()).unwrap()).collect();
    let mut asy = Slots::new(4);
    let ha: Vec<SlotHandle> = states.iter().map(|s| asy.bind(s.clone()).unwrap()).collect();
    let mut toks = [11u32, 12, 13];
    for _ in 0..3 {
        let want = sync.step(&r, &[(hs[0], toks[0]), (hs[1], toks[1]), (hs[2], toks[2])]).unwrap();
        let launch = asy.step_begin_with(&r, &[(ha[0], toks[0]), (ha[1], toks[1]), (ha[2], toks[2])], true).unwrap();
        assert_eq!(launch, Launch::Async);
        assert!(asy.in_flight());
        // while in flight: its slots are busy, others usable, no second step
        assert!(matches!(asy.state(ha[0]), Err(SlotError::Busy { slot: 0 })));
        assert!(matches!(asy.step_begin_with(&r, &[(ha[1], 1)], true), Err(SlotError::InFlight)));
        assert!(matches!(asy.resize(2), Err(SlotError::InFlight)));
        let extra = asy.bind(prefilled(&r, 9, 2)).unwrap();
        asy.unbind(extra).unwrap();
        let got = loop {
            if let Some(res) = asy.step_poll() {
                break res.unwrap();
            }
            std::thread::yield_now();
        };
        assert_eq!(got, want, "async step equals sync step");
        for i in 0..3 {
            assert_eq!(asy.state(ha[i]).unwrap().pos, sync.state(hs[i]).unwrap().pos);
            toks[i] = pn_engine::sampler::argmax(got.row(i)) as u32;
        }
    }
    assert!(matches!(asy.step_poll(), Some(Err(SlotError::NothingInFlight))));
    // async disabled: runs inside step_begin, says so, poll hands the result over
    let want = sync.step(&r, &[(hs[2], 3)]).unwrap();
    assert_eq!(asy.step_begin_with(&r, &[(ha[2], 3)], false).unwrap(), Launch::Sync);
    assert_eq!(asy.step_poll().unwrap().unwrap(), want);
    let want = sync.step(&r, &[(hs[1], 4)]).unwrap();
    asy.step_begin_with(&r, &[(ha[1], 4)], true).unwrap();
    assert_eq!(asy.step_wait().unwrap(), want);
}

#[test]
fn memory_ladder_caps_slots() {
    let r = runner("tiny-f16.gguf", 2);
    let cfg = StateConfig { max_seq: 1024, ..Default::default() };
    let per = state_bytes(r.model(), cfg.max_seq, cfg.kv).total();
    assert_eq!(slot_ladder(r.model(), &cfg, 16, 0, None).unwrap(), (16, None));
    assert_eq!(slot_ladder(r.model(), &cfg, 16, 0, Some(per * 16)).unwrap().0, 16);
    let (n, note) = slot_ladder(r.model(), &cfg, 16, 0, Some(per * 16 - 1)).unwrap();
    assert_eq!(n, 8);
    assert!(note.unwrap().contains("using 8 slots"));
    assert_eq!(slot_ladder(r.model(), &cfg, 16, 100, Some(per * 3)).unwrap().0, 2);
    assert_eq!(slot_ladder(r.model(), &cfg, 16, 0, Some(per)).unwrap().0, 1);
    let e = slot_ladder(r.model(), &cfg, 16, 0, Some(per - 1)).unwrap_err();
    assert!(e.to_string().contains("not enough memory for one decode slot"), "{e}");
}

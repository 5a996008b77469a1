//! Sequence-state paths with a resident die (`ResidentMock`, see resident.rs): decode
//! slots (several sequences in one pass; bind / move / fork / compact / resize), state
//! snapshot / restore / reset / clone / overflow mode, the prefix cache, the async step
//! API and the observer give bitwise the CPU's results. The mock poisons (NaN) the host
//! copy of every layer state it owns, so a path that reads host state without bringing
//! it home first would give NaN or different logits here.

use pn_engine::async_step::Launch;
use pn_engine::prefix_cache::{PrefixCache, PrefixCacheConfig};
use pn_engine::{Node, Runner, SeqState, SlotHandle, Slots};
use pn_ops::{Overflow, Tensor};
use pn_tests::resident::*;
use std::sync::Arc;

fn prompt(r: &Runner, seed: u32, n: usize) -> Vec<u32> {
    let v = r.model().n_vocab() as u32 - 1;
    (0..n as u32).map(|i| (seed * 131 + i * 17) % v + 1).collect()
}

fn prefilled(r: &Runner, seed: u32, n: usize) -> SeqState {
    let mut st = r.new_state(64);
    r.forward(&mut st, &prompt(r, seed, n), false).unwrap();
    st
}

fn finite(rows: &[Vec<f32>]) -> bool {
    rows.iter().flatten().all(|x| x.is_finite())
}

/// Runs `f` on a CPU runner and on a resident one; the results must be equal (and
/// finite), and the mock must hold no state once `f`'s states are dropped.
fn same_as_cpu(what: &str, f: impl Fn(&Arc<Runner>) -> Vec<Vec<f32>>) -> Arc<pn_engine::testing::ResidentMock> {
    same_as_cpu_with(what, |r, _| f(r))
}

/// [`same_as_cpu`], `f` also given the mock on the resident run (None on the CPU).
fn same_as_cpu_with(what: &str, f: impl Fn(&Arc<Runner>, Option<&pn_engine::testing::ResidentMock>) -> Vec<Vec<f32>>) -> Arc<pn_engine::testing::ResidentMock> {
    let mut last = None;
    for name in MODELS {
        let (cpu, _) = single(name, false, 512);
        let (res, mock) = single(name, true, 512);
        let mock = mock.unwrap();
        let want = f(&Arc::new(cpu), None);
        let got = f(&Arc::new(res), Some(&mock));
        assert!(finite(&got), "{name}: {what}: NaN logits (host state read without a sync?)");
        assert!(got == want, "{name}: {what}: differs from the CPU");
        assert_eq!(mock.held_states(), 0, "{name}: {what}: states leaked on the mock");
        assert_eq!(mock.counts().moved_buffers, 0);
        last = Some(mock);
    }
    last.unwrap()
}

#[test]
fn decode_slots_match_the_cpu() {
    let mock = same_as_cpu("slots", |r| {
        let mut slots = Slots::new(5);
        let mut hs: Vec<SlotHandle> = (0..3).map(|i| slots.bind(prefilled(r, 10 + i, 3 + 2 * i as usize)).unwrap()).collect();
        let mut rows = vec![slots.step(r, &[(hs[0], 5), (hs[1], 6), (hs[2], 7)]).unwrap().data];
        // move, fork (copy), unbind, compact
        hs[0] = slots.move_to(hs[0], 4).unwrap();
        let mut fork = slots.copy_to(hs[1], 3).unwrap();
        let gone = slots.unbind(hs[2]).unwrap();
        for (old, new) in slots.compact().unwrap() {
            for h in hs.iter_mut().chain([&mut fork]) {
                if *h == old {
                    *h = new;
                }
            }
        }
        rows.push(slots.step(r, &[(hs[0], 8), (hs[1], 9), (fork, 9)]).unwrap().data);
        rows.push(slots.step(r, &[(fork, 2), (hs[0], 3)]).unwrap().data);
        // resize: the states come back and are bound again, with the unbound one
        let back = slots.resize(4).unwrap();
        let hs: Vec<SlotHandle> = back.into_iter().chain([gone]).map(|s| slots.bind(s).unwrap()).collect();
        let batch: Vec<(SlotHandle, u32)> = hs.iter().map(|&h| (h, 11)).collect();
        rows.push(slots.step(r, &batch).unwrap().data);
        rows
    });
    let k = mock.counts();
    assert!(k.multi_executes > 0 && k.state_copies > 0, "{k:?}");
}

#[test]
fn snapshot_restore_reset_fork_and_overflow_match_the_cpu() {
    let mock = same_as_cpu("snapshots", |r| {
        let step = |st: &mut SeqState, t: u32| r.forward(st, &[t], false).unwrap().data;
        let p = prompt(r, 4, 11);
        let mut st = r.new_state(64);
        let mut rows = vec![r.forward(&mut st, &p, false).unwrap().data];
        let snap = st.snapshot().unwrap();
        let mut fork = st.clone();
        let a: Vec<Vec<f32>> = (1..4).map(|t| step(&mut st, t)).collect();
        st.restore(&snap).unwrap();
        let b: Vec<Vec<f32>> = (1..4).map(|t| step(&mut st, t)).collect();
        let c: Vec<Vec<f32>> = (1..4).map(|t| step(&mut fork, t)).collect();
        assert!(a == b && b == c, "restore and fork continue like the original");
        let mut fresh = r.new_state(64);
        fresh.restore(&snap).unwrap();
        assert!(step(&mut fresh, 1) == a[0], "restore into another state");
        st.reset();
        let again = r.forward(&mut st, &p, false).unwrap().data;
        assert!(again == rows[0], "reset gives a fresh sequence");
        // the overflow mode of a resident state (its KV layers come home to change)
        st.set_overflow(Overflow::Ring).unwrap();
        rows.extend(a);
        rows.extend((5..8).map(|t| step(&mut st, t)));
        assert_eq!(st.snapshot().unwrap().pos, p.len() + 3);
        // ring mode past the capacity: the device copies must have the new mode
        let mut small = r.new_state(16);
        rows.push(r.forward(&mut small, &prompt(r, 8, 12), false).unwrap().data);
        small.set_overflow(Overflow::Ring).unwrap();
        rows.extend((0..8).map(|t| step(&mut small, t + 1)));
        rows
    });
    let k = mock.counts();
    assert!(k.state_downloads > 0 && k.state_copies > 0 && k.state_releases > 0, "{k:?}");
}

#[test]
fn the_prefix_cache_matches_the_cpu() {
    same_as_cpu("prefix cache", |r| {
        let cfg = PrefixCacheConfig { budget_bytes: 64 << 20, interval: 8, snapshot_end: true };
        let mut c = PrefixCache::new(cfg);
        // snapshots at 8, 16, 24 (a cut leaves ≥ 16 tokens) and at the end (40)
        let a = prompt(r, 5, 40);
        let mut b = a[..16].to_vec();
        b.extend(prompt(r, 6, 20));
        let mut st = r.new_state(64);
        let pa = c.prefill(r, &mut st, &a).unwrap();
        assert_eq!(pa.reused, 0);
        let mut rows = vec![pa.logits, r.forward(&mut st, &[3], false).unwrap().data];
        // a second prompt sharing 16 tokens: the snapshot at 16 restored into a used state
        let pb = c.prefill(r, &mut st, &b).unwrap();
        assert_eq!(pb.reused, 16);
        rows.push(pb.logits);
        rows.push(r.forward(&mut st, &[4], false).unwrap().data);
        // `a` again into a fresh state: restored at 24 (a hit leaves a proper suffix)
        let mut st2 = r.new_state(64);
        let pc = c.prefill(r, &mut st2, &a).unwrap();
        assert_eq!(pc.reused, 24);
        rows.push(pc.logits);
        rows.push(r.forward(&mut st2, &[7], false).unwrap().data);
        // an end-of-turn snapshot of a resident state, then a hit on it
        let turn = [a.clone(), vec![7]].concat();
        assert!(c.insert_state(&turn, &st2));
        let mut st3 = r.new_state(64);
        let next = [turn, vec![8, 9]].concat();
        let pd = c.prefill(r, &mut st3, &next).unwrap();
        assert_eq!(pd.reused, 41);
        rows.push(pd.logits);
        rows
    });
}

#[test]
fn async_steps_match_the_cpu() {
    same_as_cpu("async steps", |r| {
        let mut slots = Slots::new(3);
        let hs: Vec<SlotHandle> = (0..3).map(|i| slots.bind(prefilled(r, 20 + i, 2 + i as usize)).unwrap()).collect();
        let mut rows = Vec::new();
        for t in 0..3 {
            let batch: Vec<(SlotHandle, u32)> = hs.iter().map(|&h| (h, t + 2)).collect();
            assert_eq!(slots.step_begin_with(r, &batch, true).unwrap(), Launch::Async);
            rows.push(slots.step_wait().unwrap().data);
        }
        // one slot stepped asynchronously while another is stepped synchronously
        slots.step_begin_with(r, &[(hs[0], 9)], true).unwrap();
        rows.push(slots.step(r, &[(hs[1], 9)]).unwrap().data);
        rows.push(slots.step_wait().unwrap().data);
        rows
    });
}

#[test]
fn the_observer_gets_the_cpu_values() {
    let mock = same_as_cpu("observer", |r| {
        let mut seen: Vec<(String, Tensor)> = Vec::new();
        let mut obs = |n: &Node, t: &Tensor| seen.push((n.name.clone(), t.clone()));
        let mut st = r.new_state(32);
        let l = r.forward_observed(&mut st, &prompt(r, 7, 5), true, Some(&mut obs)).unwrap();
        let l2 = r.forward_observed(&mut st, &[3], false, Some(&mut obs)).unwrap();
        assert!(seen.len() > 20);
        // every observed value as a row, then the logits
        let mut rows: Vec<Vec<f32>> = seen
            .iter()
            .map(|(_, t)| match &t.data {
                pn_ops::TensorData::F32(v) => v.clone(),
                pn_ops::TensorData::I32(v) => v.iter().map(|&x| x as f32).collect(),
            })
            .collect();
        rows.push(l.data);
        rows.push(l2.data);
        rows
    });
    assert!(mock.counts().downloads > 40, "observer copies are downloads: {:?}", mock.counts());
}

/// What a snapshot at `pos` of these layers holds: the used KV cells of every head, the
/// sink / window shadows a later query can read, the whole recurrent states.
fn snapshot_bound(layers: &[pn_ops::LayerState], pos: usize) -> usize {
    layers
        .iter()
        .map(|l| match l {
            pn_ops::LayerState::Kv(k) => {
                let sh = (pos.min(k.shadow.sink) + pos.min(k.shadow.window)) * k.head_dim * 2;
                2 * k.n_head_kv * (pos.min(k.capacity) * k.ty.row_bytes(k.head_dim) + sh)
            }
            l => l.bytes(),
        })
        .sum()
}

#[test]
fn an_in_place_reset_matches_a_fresh_cpu_state_without_uploads() {
    for name in MODELS {
        let (cpu, _) = single(name, false, 512);
        let (res, mock) = single(name, true, 512);
        let mock = mock.unwrap();
        let (a, b) = (prompt(&cpu, 3, 9), prompt(&cpu, 4, 6));
        let want = cpu.forward(&mut cpu.new_state(64), &b, false).unwrap().data;
        let mut st = res.new_state(64);
        res.forward(&mut st, &a, false).unwrap();
        let held = mock.held_states();
        assert!(held > 0 && st.is_resident());
        mock.reset_counts();
        st.reset();
        let k = mock.counts();
        assert_eq!((k.state_resets, k.state_releases, k.state_downloads, k.state_uploads), (held as u64, 0, 0, 0), "{name}: {k:?}");
        assert!(st.is_resident() && mock.held_states() == held, "{name}: the reset state stays on the device");
        let got = res.forward(&mut st, &b, false).unwrap().data;
        assert!(finite(std::slice::from_ref(&got)) && got == want, "{name}: a reset state differs from a fresh one");
        let k = mock.counts();
        assert_eq!((k.state_uploads, k.state_upload_bytes, k.state_downloads), (0, 0, 0), "{name}: {k:?}");
        // and the state equals a fresh CPU state after the same tokens
        let mut c = cpu.new_state(64);
        cpu.forward(&mut c, &b, false).unwrap();
        assert!(st == c, "{name}: state after reset + prefill");
        drop(st);
        assert_eq!(mock.held_states(), 0);
    }
}

#[test]
fn ranged_snapshots_move_only_the_used_cells() {
    const CAP: usize = 2048;
    for name in MODELS {
        let (cpu, _) = single(name, false, 512);
        let (res, mock) = single(name, true, 512);
        let mock = mock.unwrap();
        let p = prompt(&cpu, 5, 11);
        let (mut c, mut st) = (cpu.new_state(CAP), res.new_state(CAP));
        cpu.forward(&mut c, &p, false).unwrap();
        res.forward(&mut st, &p, false).unwrap();
        mock.reset_counts();
        let snap = st.snapshot().unwrap();
        let k = mock.counts();
        let bound = snapshot_bound(c.layers().unwrap(), p.len());
        let full = st.bytes();
        assert_eq!(k.state_downloads, 0, "{name}: {k:?}");
        assert!(k.state_snapshots > 0 && k.state_snapshot_bytes as usize == snap.bytes(), "{name}: {k:?}");
        assert!(snap.bytes() <= bound, "{name}: {} > {bound}", snap.bytes());
        // the KV part: the used cells and shadows, far under the cache's capacity
        let kv_snap: usize = snap.layers.iter().filter(|l| matches!(l, pn_ops::LayerSnapshot::Kv(_))).map(|l| l.bytes()).sum();
        let kv_full = st.kv_bytes();
        assert!(kv_snap * 20 < kv_full, "{name}: KV snapshot {kv_snap} B of a {kv_full} B cache");
        assert!(snap.bytes() < full, "{name}: snapshot {} B of a {full} B state", snap.bytes());
        eprintln!(
            "{name}: snapshot of {} tokens, capacity {CAP}: {} B moved (KV {kv_snap} B; bound {bound} B), whole state {full} B (KV {kv_full} B)",
            p.len(),
            snap.bytes()
        );
        assert!(snap == c.snapshot().unwrap(), "{name}: ranged snapshot differs from the CPU's");
        // restore (into the state and into a fresh one) continues like the CPU
        let want: Vec<Vec<f32>> = (1..4).map(|t| cpu.forward(&mut c, &[t], false).unwrap().data).collect();
        for mut s in [st, res.new_state(CAP)] {
            s.restore(&snap).unwrap();
            let got: Vec<Vec<f32>> = (1..4).map(|t| res.forward(&mut s, &[t], false).unwrap().data).collect();
            assert!(got == want, "{name}: restored from a ranged snapshot");
        }
        assert_eq!(mock.held_states(), 0);
    }
}

#[test]
fn prefix_cache_snapshots_are_ranged() {
    const CAP: usize = 2048;
    for name in MODELS {
        let (cpu, _) = single(name, false, 512);
        let (res, mock) = single(name, true, 512);
        let mock = mock.unwrap();
        let cfg = PrefixCacheConfig { budget_bytes: 256 << 20, interval: 8, snapshot_end: true };
        let a = prompt(&cpu, 7, 40);
        let mut b = a[..16].to_vec();
        b.extend(prompt(&cpu, 8, 20));
        let run = |r: &Runner| {
            let mut pc = PrefixCache::new(cfg);
            let mut st = r.new_state(CAP);
            let mut rows = vec![pc.prefill(r, &mut st, &a).unwrap().logits];
            let pb = pc.prefill(r, &mut st, &b).unwrap();
            assert_eq!(pb.reused, 16, "{name}");
            rows.push(pb.logits);
            rows.push(r.forward(&mut st, &[3], false).unwrap().data);
            (rows, pc.bytes(), pc.prefixes(), st.bytes())
        };
        let (want, cpu_bytes, _, _) = run(&cpu);
        mock.reset_counts();
        let (got, held, prefixes, full) = run(&res);
        let k = mock.counts();
        assert!(finite(&got) && got == want, "{name}: prefix cache through ranged snapshots");
        assert_eq!(held, cpu_bytes, "{name}");
        assert_eq!(k.state_downloads, 0, "{name}: {k:?}");
        // every snapshot the cache holds came through the ranged path, nothing more
        let mut geo = cpu.new_state(CAP);
        let layers = geo.layers().unwrap();
        let bound: usize = prefixes.iter().map(|&n| snapshot_bound(layers, n)).sum();
        assert!(k.state_snapshots > 0 && k.state_snapshot_bytes as usize <= bound, "{name}: {k:?}, bound {bound}");
        assert!(k.state_snapshot_bytes as usize <= held, "{name}: {k:?}, held {held}");
        // a whole download per snapshot would have moved `full` bytes each
        assert!((k.state_snapshot_bytes as usize) * 4 < prefixes.len() * full, "{name}: {k:?}, full state {full} B");
        eprintln!(
            "{name}: prefix cache: snapshots at {prefixes:?}: {} B moved (bound {bound} B), whole downloads would move {} B",
            k.state_snapshot_bytes,
            prefixes.len() * full
        );
        assert_eq!(mock.held_states(), 0);
    }
}

/// Slot bookkeeping on resident sequences: move, fork, compact, resize and rebind.
/// With `mock`, asserts that none of them (nor the steps after them) moves a layer state
/// through the host: a move is the key travelling with the state, a fork a copy on the
/// device (`StateOp::Copy`).
fn slot_ops(r: &Runner, mock: Option<&pn_engine::testing::ResidentMock>) -> Vec<Vec<f32>> {
    let batch = |hs: &[SlotHandle], t: u32| -> Vec<(SlotHandle, u32)> { hs.iter().map(|&h| (h, t)).collect() };
    let mut slots = Slots::new(6);
    let mut hs: Vec<SlotHandle> = (0..3).map(|i| slots.bind(prefilled(r, 20 + i, 4 + 2 * i as usize)).unwrap()).collect();
    let mut rows = vec![slots.step(r, &batch(&hs, 3)).unwrap().data];
    if let Some(m) = mock {
        m.reset_counts();
    }
    hs[2] = slots.move_to(hs[2], 5).unwrap();
    hs.push(slots.copy_to(hs[0], 4).unwrap());
    for (old, new) in slots.compact().unwrap() {
        hs.iter_mut().filter(|h| **h == old).for_each(|h| *h = new);
    }
    assert_eq!(hs.iter().map(|h| h.slot()).collect::<Vec<_>>(), [0, 1, 3, 2]);
    rows.push(slots.step(r, &batch(&hs, 4)).unwrap().data);
    let hs: Vec<SlotHandle> = slots.resize(5).unwrap().into_iter().map(|s| slots.bind(s).unwrap()).collect();
    rows.push(slots.step(r, &batch(&hs, 5)).unwrap().data);
    if let Some(m) = mock {
        let k = m.counts();
        assert_eq!((k.state_uploads, k.state_downloads, k.state_snapshots), (0, 0, 0), "slot moves went through the host: {k:?}");
        assert!(k.state_copies > 0, "the fork is a copy on the device: {k:?}");
    }
    rows
}

#[test]
fn slot_moves_and_forks_stay_on_the_device() {
    same_as_cpu_with("slot moves and forks", |r, m| slot_ops(r, m));
}

/// Slots whose sequences come and go (`rebinding` below), on the CPU or on the mock.
fn rebinding(r: &Runner, mock: Option<&pn_engine::testing::ResidentMock>) -> Vec<Vec<f32>> {
    let mut slots = Slots::new(3);
    let a = slots.bind(prefilled(r, 30, 4)).unwrap();
    let b = slots.bind(prefilled(r, 31, 6)).unwrap();
    let mut rows = vec![slots.step(r, &[(a, 3), (b, 3)]).unwrap().data];
    let ids = mock.map(|m| m.last_ids());
    // each rebinding and the step after it: on the device, copies into the rows' own
    // states (in place), no new state, the same sequence table as the first step
    let check = |m: Option<&pn_engine::testing::ResidentMock>, uploads: bool| {
        let Some(m) = m else { return };
        let k = m.counts();
        assert_eq!(m.last_ids(), *ids.as_ref().unwrap(), "a rebound slot's step ran on other states");
        assert_eq!((k.state_allocs, k.state_downloads), (0, 0), "a rebinding allocated or went through the host: {k:?}");
        assert_eq!(k.state_uploads > 0, uploads, "uploads: {k:?}");
    };
    // a leaves; c, prefilled on the device, takes slot 0
    let a_st = slots.unbind(a).unwrap();
    let c_st = prefilled(r, 32, 5);
    mock.inspect(|m| m.reset_counts());
    let c = slots.bind(c_st).unwrap();
    assert_eq!(c.slot(), 0);
    rows.push(slots.step(r, &[(c, 4), (b, 4)]).unwrap().data);
    check(mock, false);
    // b leaves; a fresh sequence (host state, never run) takes slot 1: uploaded into the row
    let b_st = slots.unbind(b).unwrap();
    let fresh = r.new_state(64);
    mock.inspect(|m| m.reset_counts());
    let d = slots.bind(fresh).unwrap();
    assert_eq!(d.slot(), 1);
    rows.push(slots.step(r, &[(c, 5), (d, 5)]).unwrap().data);
    check(mock, true);
    // the sequences that left go on from where they were, in other slots
    let _ = slots.unbind(d).unwrap();
    let (a, b) = (slots.bind(a_st).unwrap(), slots.bind(b_st).unwrap());
    rows.push(slots.step(r, &[(a, 6), (b, 6), (c, 6)]).unwrap().data);
    let _ = slots.unbind(c).unwrap();
    let b = slots.move_to(b, 0).unwrap();
    rows.push(slots.step(r, &[(b, 7), (a, 7)]).unwrap().data);
    rows
}

/// A slot's row keeps its state id, so a device's copies (and addresses) stay with the
/// slot whatever sequence it holds: rebinding allocates nothing there and the step's
/// sequence table is the same (one captured step replays); every row is bitwise the CPU's.
#[test]
fn slot_rows_keep_their_device_states_across_rebinding() {
    same_as_cpu_with("rebound slots", |r, m| rebinding(r, m));
}

/// A bind whose device work fails (the upload of a fresh state into the row's own copy)
/// leaves the slot free and the device holding what it held; the next bind works, and
/// its step is bitwise a fresh sequence's on the CPU.
#[test]
fn a_failed_bind_leaves_the_slot_free() {
    let (cpu, _) = single(MODELS[1], false, 512);
    let (res, mock) = single(MODELS[1], true, 512);
    let mock = mock.unwrap();
    let mut slots = Slots::new(1);
    let a = slots.bind(prefilled(&res, 40, 4)).unwrap();
    slots.step(&res, &[(a, 3)]).unwrap();
    drop(slots.unbind(a).unwrap());
    let held = mock.held_states();
    assert!(held > 0, "the free row keeps its device states");
    mock.fail_next(pn_engine::testing::Fail::StateUpload);
    assert!(slots.bind(res.new_state(64)).is_err());
    assert_eq!((slots.n_bound(), mock.held_states()), (0, held));
    let b = slots.bind(res.new_state(64)).unwrap();
    let got = slots.step(&res, &[(b, 5)]).unwrap().data;
    let want = cpu.forward(&mut cpu.new_state(64), &[5], true).unwrap().data;
    assert!(finite(std::slice::from_ref(&got)) && got == want, "a rebound fresh sequence differs from a fresh one on the CPU");
}

/// A resize whose device copy fails keeps the table as it was: every sequence bound under
/// its handle, and its next step bitwise the CPU's.
#[test]
fn a_failed_resize_keeps_the_table() {
    let (cpu, _) = single(MODELS[1], false, 512);
    let (res, mock) = single(MODELS[1], true, 512);
    let mock = mock.unwrap();
    let run = |r: &Runner, fail: Option<&pn_engine::testing::ResidentMock>| -> Vec<f32> {
        let mut slots = Slots::new(3);
        // slot 0 a fresh sequence (its layers on the host: no device copy moves it out),
        // slots 1 and 2 prefilled ones (on the device)
        let mut hs = vec![slots.bind(r.new_state(64)).unwrap()];
        hs.extend((1..3).map(|i| slots.bind(prefilled(r, 50 + i, 3 + i as usize)).unwrap()));
        if let Some(m) = fail {
            // slot 0 comes out, then slot 1's copy out of its row fails: slot 0 goes back
            m.fail_next(pn_engine::testing::Fail::StateCopy);
        }
        let batch: Vec<(SlotHandle, u32)> = hs.iter().map(|&h| (h, 7)).collect();
        if fail.is_some() {
            assert!(slots.resize(2).is_err(), "the injected copy failure");
            assert_eq!(slots.bound(), hs, "the same bindings after the failed resize");
        }
        slots.step(r, &batch).unwrap().data
    };
    let want = run(&cpu, None);
    let got = run(&res, Some(&mock));
    assert!(finite(std::slice::from_ref(&got)) && got == want, "the table after a failed resize differs from the CPU");
}

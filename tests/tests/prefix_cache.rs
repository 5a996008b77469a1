//! Prefix cache: a hit restores a snapshot and prefills only the rest, with logits
//! bitwise equal to a full prefill (and decoding continues identically); end-of-turn
//! snapshots; LRU eviction under a byte budget.

use pn_engine::prefix_cache::{PrefixCache, PrefixCacheConfig};
use pn_engine::sampler::argmax;
use pn_engine::{Runner, SeqState};
use pn_tests::*;

fn tokens(seed: u64, n: usize, vocab: usize) -> Vec<u32> {
    let mut x = seed.wrapping_add(99);
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((x >> 33) % vocab as u64) as u32
        })
        .collect()
}

fn cache(interval: usize, mb: usize) -> PrefixCache {
    PrefixCache::new(PrefixCacheConfig { budget_bytes: mb << 20, interval, snapshot_end: true })
}

/// Greedy continuation of a prefilled sequence: `n` more logits rows.
fn decode(r: &Runner, st: &mut SeqState, first: &[f32], n: usize) -> Vec<Vec<f32>> {
    let mut row = first.to_vec();
    (0..n)
        .map(|_| {
            row = r.forward(st, &[argmax(&row) as u32], false).unwrap().last().to_vec();
            row.clone()
        })
        .collect()
}

/// `a` (a_len tokens) is prefilled first; then `b` (its first `shared` tokens, then
/// b_len - shared others) hits at `want_hit`.
fn check_hit(model: &str, interval: usize, (a_len, shared, b_len): (usize, usize, usize), want_hit: usize) {
    let r = runner(model, 2);
    let v = r.model().n_vocab();
    let a = tokens(1, a_len, v);
    let mut b = a[..shared].to_vec();
    b.extend(tokens(2, b_len - shared, v));
    let mut c = cache(interval, 64);
    let mut st = r.new_state(256);
    let pa = c.prefill(&r, &mut st, &a).unwrap();
    assert_eq!(pa.reused, 0);
    let hit = c.prefill(&r, &mut st, &b).unwrap();
    assert_eq!(hit.reused, want_hit, "{model}: restored the longest usable boundary");
    assert_eq!(st.pos, b_len);
    let hit_dec = decode(&r, &mut st, &hit.logits, 4);
    // cold: a fresh cache, same segmentation
    let mut st2 = r.new_state(256);
    let cold = cache(interval, 64).prefill(&r, &mut st2, &b).unwrap();
    assert_eq!(cold.reused, 0);
    assert!(hit.logits == cold.logits, "{model} interval {interval}: hit logits differ from a full prefill");
    assert_eq!(hit_dec, decode(&r, &mut st2, &cold.logits, 4), "decode after a hit");
    // against one plain forward pass of the whole prompt (ubatch 512)
    let plain = r.forward(&mut r.new_state(256), &b, false).unwrap().last().to_vec();
    let d = plain.iter().zip(&hit.logits).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    if interval.is_multiple_of(64) {
        // segments at multiples of the delta rule's 64-token chunk, each ≥ 16 tokens:
        // the same chunks as one pass, so bitwise
        assert_eq!(d, 0.0, "{model} interval {interval}: vs one pass");
    } else {
        assert!(d < 1e-3, "{model} interval {interval}: vs one pass, max |Δ| {d}");
    }
}

#[test]
fn hit_equals_full_prefill() {
    check_hit("tiny-f16.gguf", 32, (100, 70, 100), 64);
    check_hit("ktiny-q4_k_m.gguf", 16, (100, 70, 100), 64);
    check_hit("ktiny-q4_k_m.gguf", 64, (100, 70, 100), 64);
    // 133 tokens: a cut at 128 would leave a 5-token last pass, so the prefill does not
    // cut there and the hit is taken at 64, not at a's snapshot at 128
    check_hit("ktiny-q4_k_m.gguf", 64, (150, 130, 133), 64);
    check_hit("tiny-f16.gguf", 64, (200, 160, 160), 128);
}

#[test]
fn end_of_turn_snapshot_continues_a_conversation() {
    let r = runner("tiny-f16.gguf", 2);
    let v = r.model().n_vocab();
    let turn1 = tokens(5, 40, v);
    let mut c = cache(256, 64);
    let mut st = r.new_state(256);
    let p1 = c.prefill(&r, &mut st, &turn1).unwrap();
    // the answer, then the end of the turn is snapshotted
    let mut hist = turn1.clone();
    let mut row = p1.logits.clone();
    for _ in 0..5 {
        let t = argmax(&row) as u32;
        hist.push(t);
        row = r.forward(&mut st, &[t], false).unwrap().last().to_vec();
    }
    assert!(c.insert_state(&hist, &st));
    assert!(!c.insert_state(&hist, &st), "already held");
    let mut turn2 = hist.clone();
    turn2.extend(tokens(6, 12, v));
    // continuing the live sequence with the new turn (what a chat does) …
    let live = r.forward(&mut st, &turn2[hist.len()..], false).unwrap().last().to_vec();
    // … equals a new request for the whole history through the cache
    let mut st2 = r.new_state(256);
    let hit = c.prefill(&r, &mut st2, &turn2).unwrap();
    assert_eq!(hit.reused, hist.len());
    assert!(hit.logits == live);
    assert_eq!(c.stats.hits, 1);
}

#[test]
fn lru_eviction_under_budget() {
    let r = runner("tiny-f16.gguf", 2);
    let v = r.model().n_vocab();
    let mut st = r.new_state(256);
    let one = {
        let t = tokens(9, 20, v);
        r.forward(&mut st, &t, false).unwrap();
        st.snapshot().unwrap().bytes() + 20 * 4
    };
    // room for three snapshots of 20 tokens
    let mut c = PrefixCache::new(PrefixCacheConfig { budget_bytes: 3 * one + one / 2, interval: 0, snapshot_end: true });
    let prompts: Vec<Vec<u32>> = (0..5).map(|i| tokens(10 + i, 20, v)).collect();
    for p in &prompts[..3] {
        c.prefill(&r, &mut st, p).unwrap();
    }
    assert_eq!(c.len(), 3);
    // use the oldest: the second becomes the least recently used
    let mut longer = prompts[0].clone();
    longer.push(1);
    assert_eq!(c.lookup(&longer).map(|(n, _)| n), Some(20));
    c.prefill(&r, &mut st, &prompts[3]).unwrap();
    assert_eq!(c.len(), 3);
    assert!(c.bytes() <= c.config().budget_bytes);
    assert!(c.contains(&prompts[0]) && !c.contains(&prompts[1]) && c.contains(&prompts[2]) && c.contains(&prompts[3]));
    assert_eq!(c.stats.evicted, 1);
    c.prefill(&r, &mut st, &prompts[4]).unwrap();
    assert!(!c.contains(&prompts[2]), "LRU evicted next");
    // a snapshot larger than the whole budget is not kept
    let mut tiny = PrefixCache::new(PrefixCacheConfig { budget_bytes: one / 2, interval: 0, snapshot_end: true });
    tiny.prefill(&r, &mut st, &prompts[0]).unwrap();
    assert!(tiny.is_empty());
}

/// Entries with every token's hidden row (what an MTP drafter needs of a restored
/// prefix): a hidden lookup sees only those; an entry held without rows gets them when
/// inserted again with them; their bytes count against the budget.
#[test]
fn hidden_rows_ride_with_their_snapshots() {
    let r = runner("tiny-f16.gguf", 2);
    let v = r.model().n_vocab();
    let (short, long) = (tokens(3, 12, v), tokens(3, 24, v));
    assert_eq!(short[..], long[..12]);
    let mut query = long.clone();
    query.push(1);
    let mut c = cache(0, 64);
    let mut st = r.new_state(256);
    r.forward(&mut st, &short, false).unwrap();
    let rows: Vec<f32> = (0..12 * 8).map(|i| i as f32).collect();
    assert!(c.insert_state_with(&short, &st, Some(&rows)));
    r.forward(&mut st, &long[12..], false).unwrap();
    assert!(c.insert_state(&long, &st));
    let bytes = c.bytes();
    // the plain lookup takes the longest; the hidden one the longest with rows
    assert_eq!(c.lookup(&query).map(|(n, _)| n), Some(24));
    let (n, _, h) = c.lookup_hidden(&query, |_| true).unwrap();
    assert_eq!((n, &h[..]), (12, &rows[..]));
    // inserted again without rows: nothing changes; with rows: the entry gets them
    assert!(!c.insert_state(&long, &st));
    let long_rows: Vec<f32> = (0..24 * 8).map(|i| -(i as f32)).collect();
    assert!(c.insert_state_with(&long, &st, Some(&long_rows)));
    assert_eq!((c.len(), c.bytes()), (2, bytes + 24 * 8 * 4));
    let (n, _, h) = c.lookup_hidden(&query, |_| true).unwrap();
    assert_eq!((n, &h[..]), (24, &long_rows[..]));
    assert!(!c.insert_state_with(&long, &st, Some(&long_rows)), "already held with rows");
}

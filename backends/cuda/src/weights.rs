//! The device weight cache's keying and lookup (host logic, unit tested without a GPU;
//! device.rs holds one over its uploaded weights).
//!
//! A weight is found by the address and length of its host bytes, its type, its shape
//! and the form stored (blocks / f16 fallback, or f32). The host address alone is not an
//! identity: a model's mapping can be freed and another model mapped at the same
//! address (one backend across several fixtures), with another type (F16 vs BF16, Q4_0
//! vs IQ4_NL: same length) or other contents. So every entry also keeps a sample of its
//! bytes ([`sample`]), compared on every hit: an entry whose bytes changed is dropped
//! and the weight uploaded again (counted as `stale`), never handed back.

use pn_ops::{GgmlType, Shape, WeightView};
use std::collections::HashMap;

/// What names a cached weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WeightKey {
    pub ptr: usize,
    pub len: usize,
    pub ty: GgmlType,
    pub shape: Shape,
    /// Stored as f32 (small operands), else as blocks / the f16 fallback.
    pub as_f32: bool,
}

impl WeightKey {
    pub fn of(w: &WeightView<'_>, as_f32: bool) -> WeightKey {
        WeightKey {
            ptr: w.bytes.as_ptr() as usize,
            len: w.bytes.len(),
            ty: w.ty,
            shape: w.shape,
            as_f32,
        }
    }
}

/// Windows sampled by [`sample`] and their size in bytes.
const WINDOWS: usize = 16;
const WINDOW: usize = 64;

/// A hash of `WINDOWS` windows of `WINDOW` bytes spread evenly over `b` (the first and
/// the last included) and of its length: ~1 KiB read per lookup, so it is cheap on every
/// decode step, and two different tensors of random-looking blocks differ in it.
pub fn sample(b: &[u8]) -> u64 {
    let mut h: u64 = 0x9e37_79b9_7f4a_7c15 ^ b.len() as u64;
    let mut eat = |w: &[u8]| {
        for c in w.chunks(8) {
            let mut x = [0u8; 8];
            x[..c.len()].copy_from_slice(c);
            h = (h ^ u64::from_le_bytes(x)).wrapping_mul(0x0000_0100_0000_01b3);
            h ^= h >> 29;
        }
    };
    if b.len() <= WINDOWS * WINDOW {
        eat(b);
        return h;
    }
    let last = b.len() - WINDOW;
    for i in 0..WINDOWS {
        let off = last * i / (WINDOWS - 1);
        eat(&b[off..off + WINDOW]);
    }
    h
}

/// Hits, misses and stale entries replaced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    pub stale: u64,
}

struct Entry<V> {
    sample: u64,
    value: V,
}

/// Weights by [`WeightKey`], each with the sample of the bytes it was made from.
pub struct WeightCache<V> {
    map: HashMap<WeightKey, Entry<V>>,
    stats: CacheStats,
}

impl<V> Default for WeightCache<V> {
    fn default() -> Self {
        WeightCache {
            map: HashMap::new(),
            stats: CacheStats::default(),
        }
    }
}

impl<V: Clone> WeightCache<V> {
    /// The cached value for `key` if it was made from bytes with this `sample`; an entry
    /// of the same key with another sample is stale: dropped, and None.
    pub fn get(&mut self, key: &WeightKey, sample: u64) -> Option<V> {
        match self.map.get(key) {
            Some(e) if e.sample == sample => {
                self.stats.hits += 1;
                Some(e.value.clone())
            }
            Some(_) => {
                self.map.remove(key);
                self.stats.stale += 1;
                self.stats.misses += 1;
                None
            }
            None => {
                self.stats.misses += 1;
                None
            }
        }
    }

    pub fn insert(&mut self, key: WeightKey, sample: u64, value: V) {
        self.map.insert(key, Entry { sample, value });
    }

    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.map.values().map(|e| &e.value)
    }

    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    /// Drops every entry (a model is gone); the counters stay.
    pub fn clear(&mut self) {
        self.map.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view<'a>(ty: GgmlType, shape: Shape, bytes: &'a [u8]) -> WeightView<'a> {
        WeightView {
            name: "w",
            ty,
            shape,
            bytes,
            rows16: None,
        }
    }

    /// One host buffer reused for another weight, as a freed and remapped model would be.
    #[test]
    fn a_reused_address_never_hands_back_a_stale_weight() {
        let mut c = WeightCache::<&str>::default();
        let mut buf = vec![0u8; 4096];
        buf.iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = (i * 7) as u8);
        let s2 = Shape::d2(1024, 2);
        let k = WeightKey::of(&view(GgmlType::F16, s2, &buf), false);
        c.insert(k, sample(&buf), "f16 upload");
        assert_eq!(
            c.get(&k, sample(&buf)),
            Some("f16 upload"),
            "same bytes: a hit"
        );

        // same address and length, another type (F16 -> BF16) or shape: another key
        let kb = WeightKey::of(&view(GgmlType::BF16, s2, &buf), false);
        assert_eq!(c.get(&kb, sample(&buf)), None, "BF16 at the F16's address");
        let ks = WeightKey::of(&view(GgmlType::F16, Shape::d2(512, 4), &buf), false);
        assert_eq!(c.get(&ks, sample(&buf)), None, "another shape");
        let kf = WeightKey::of(&view(GgmlType::F16, s2, &buf), true);
        assert_eq!(
            c.get(&kf, sample(&buf)),
            None,
            "the f32 form is another entry"
        );

        // same key, other contents (another fixture mapped at the same address)
        let before = sample(&buf);
        buf[1900] ^= 0xff; // inside the window at 1881..1945
        let after = sample(&buf);
        assert_ne!(
            before, after,
            "a byte in a middle window changes the sample"
        );
        assert_eq!(c.get(&k, after), None, "changed contents: stale, not a hit");
        assert_eq!(c.stats().stale, 1);
        assert_eq!(c.get(&k, before), None, "the stale entry was dropped");
        c.insert(k, after, "second upload");
        assert_eq!(c.get(&k, after), Some("second upload"));
        assert_eq!(
            c.stats(),
            CacheStats {
                hits: 2,
                misses: 5,
                stale: 1
            }
        );
        c.clear();
        assert_eq!(c.get(&k, after), None);
    }

    #[test]
    fn the_sample_covers_both_ends_and_the_length() {
        let big: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let s = sample(&big);
        for at in [0, big.len() - 1] {
            let mut b = big.clone();
            b[at] ^= 1;
            assert_ne!(sample(&b), s, "byte {at}");
        }
        assert_ne!(sample(&big[..big.len() - 1]), s, "length");
        let small = [1u8, 2, 3];
        assert_ne!(
            sample(&small),
            sample(&[1u8, 2, 4]),
            "short buffers: every byte"
        );
        assert_ne!(
            sample(&[0u8; 8]),
            sample(&[0u8; 9]),
            "zero padding is not equal"
        );
    }
}

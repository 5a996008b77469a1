//! Fuzz-ish property test without extra tools: mutate a small valid file with a seeded
//! xorshift PRNG and check that parsing never panics and every successful parse hands
//! out only in-bounds, disjoint tensor data.

use pn_engine::gguf_writer::GgufWriter;
use pn_engine::{Gguf, MetaValue};
use pn_ops::GgmlType;
use std::panic::{catch_unwind, AssertUnwindSafe};

struct XorShift(u64);
impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn seed_file() -> Vec<u8> {
    GgufWriter::new()
        .kv(
            "general.architecture",
            MetaValue::String("qwen35moe".into()),
        )
        .kv("qwen35moe.block_count", MetaValue::U32(4))
        .kv("f", MetaValue::F32(1e-6))
        .kv(
            "arr",
            MetaValue::Array(vec![MetaValue::I32(3), MetaValue::I32(0)]),
        )
        .kv(
            "strs",
            MetaValue::Array(vec![
                MetaValue::String("ab".into()),
                MetaValue::String("c".into()),
            ]),
        )
        .kv(
            "nested",
            MetaValue::Array(vec![MetaValue::Array(vec![MetaValue::U8(1)])]),
        )
        .kv("b", MetaValue::Bool(true))
        .kv("u64", MetaValue::U64(7))
        .tensor("a", &[8, 2], GgmlType::F32, vec![1; 64])
        .tensor("b", &[32], GgmlType::Q8_0, vec![2; 34])
        .tensor("c", &[4], GgmlType::F16, vec![3; 8])
        .tensor("d", &[256], GgmlType::Q4K, vec![4; 144])
        .to_bytes()
}

/// Every invariant a successful parse must give callers.
fn check(g: &Gguf, len: usize) {
    let mut ranges = Vec::new();
    for t in &g.tensors {
        let start = g.data_start.checked_add(t.offset).expect("offset overflow");
        let end = start.checked_add(t.n_bytes).expect("size overflow");
        assert!(end <= len as u64, "tensor {} past EOF", t.name);
        assert_eq!(t.offset % g.alignment, 0);
        let b = g.tensor_bytes(t);
        assert_eq!(b.len() as u64, t.n_bytes);
        assert_eq!(
            b.as_ptr() as usize - g.file_bytes().as_ptr() as usize,
            start as usize
        );
        assert!(t.n_dims <= 4 && t.ne.iter().all(|&d| d >= 1));
        assert_eq!(t.ne[0] % t.ty.block_size() as u64, 0);
        ranges.push((start, end));
    }
    ranges.sort();
    assert!(
        ranges.windows(2).all(|w| w[0].1 <= w[1].0),
        "overlapping tensors"
    );
    for (k, v) in &g.metadata {
        assert!(!k.is_empty());
        assert!(std::ptr::eq(g.get(k).unwrap(), v), "index of {k:?}");
    }
    assert!(g.alignment.is_power_of_two());
}

fn mutate(rng: &mut XorShift, base: &[u8], hot: usize) -> Vec<u8> {
    let mut b = base.to_vec();
    let n_mut = 1 + rng.below(4);
    for _ in 0..n_mut {
        // Mostly hit the header/kv/tensor-info region where the parser lives.
        let at = if rng.below(8) == 0 {
            rng.below(b.len())
        } else {
            rng.below(hot.min(b.len()))
        };
        match rng.below(6) {
            0 => b[at] ^= 1 << rng.below(8),
            1 => b[at] = rng.next() as u8,
            2 => b[at] = [0x00, 0xff, 0x7f, 0x80, 0x01, 0x20][rng.below(6)],
            3 => {
                // Overwrite a little-endian 8-byte field with an interesting value.
                let v: u64 =
                    [0, 1, u64::MAX, 1 << 63, 1 << 40, 32, 63, i64::MAX as u64][rng.below(8)];
                let end = (at + 8).min(b.len());
                b[at..end].copy_from_slice(&v.to_le_bytes()[..end - at]);
            }
            4 => {
                let v: u32 = [0, 1, 2, 3, 4, 9, 13, 99, u32::MAX][rng.below(9)];
                let end = (at + 4).min(b.len());
                b[at..end].copy_from_slice(&v.to_le_bytes()[..end - at]);
            }
            _ => {
                let cut = rng.below(b.len() + 1);
                b.truncate(cut);
                if b.is_empty() {
                    break;
                }
            }
        }
    }
    b
}

#[test]
fn random_mutations_never_panic() {
    let base = seed_file();
    let g = Gguf::from_bytes(base.clone()).unwrap();
    check(&g, base.len());
    let hot = g.data_start as usize;
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
    let (mut ok, mut errs) = (0usize, 0usize);
    for i in 0..20_000 {
        let m = mutate(&mut rng, &base, hot);
        let len = m.len();
        let r = catch_unwind(AssertUnwindSafe(|| match Gguf::from_bytes(m.clone()) {
            Ok(g) => {
                check(&g, len);
                // Display of every error must not panic either.
                true
            }
            Err(e) => {
                let _ = e.to_string();
                false
            }
        }));
        match r {
            Ok(true) => ok += 1,
            Ok(false) => errs += 1,
            Err(_) => panic!("iteration {i}: parser panicked on input {m:02x?}"),
        }
    }
    // Both outcomes must be exercised for the test to mean anything.
    eprintln!("fuzz: {ok} parsed, {errs} rejected");
    assert!(ok > 100 && errs > 1000, "ok {ok}, errors {errs}");
}

#[test]
fn every_single_byte_value_at_every_header_offset() {
    let base = seed_file();
    let hot = Gguf::from_bytes(base.clone()).unwrap().data_start as usize;
    for at in 0..hot {
        for v in [0u8, 1, 0x7f, 0x80, 0xff] {
            let mut m = base.clone();
            m[at] = v;
            let len = m.len();
            let r = catch_unwind(AssertUnwindSafe(|| {
                if let Ok(g) = Gguf::from_bytes(m) {
                    check(&g, len);
                }
            }));
            assert!(r.is_ok(), "panic with byte {at} = {v:#x}");
        }
    }
}

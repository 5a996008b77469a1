//! Shared helpers of the quant_* integration tests.
#![allow(dead_code)]

use pn_ops::GgmlType;

/// One record of ops/tests/data/quant_vectors.bin (see tools/gen_quant_vectors.py).
pub struct Record {
    pub kind: u8,
    pub name: String,
    pub ty: GgmlType,
    pub n: usize,
    pub bytes: Vec<u8>,
    pub floats: Vec<f32>,
}

pub fn load_vectors() -> Vec<Record> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/quant_vectors.bin");
    let b = std::fs::read(path).expect("quant_vectors.bin (run tools/gen_quant_vectors.py)");
    assert_eq!(&b[0..4], b"PNQV");
    let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap()) as usize;
    assert_eq!(u32_at(4), 1, "version");
    let count = u32_at(8);
    let mut o = 12;
    let mut recs = Vec::with_capacity(count);
    for _ in 0..count {
        let kind = b[o];
        let nl = b[o + 1] as usize;
        let name = String::from_utf8(b[o + 2..o + 2 + nl].to_vec()).unwrap();
        o += 2 + nl;
        let ty = GgmlType::from_id(u32_at(o) as u32).expect("known type id");
        let n = u32_at(o + 4);
        let nb = u32_at(o + 8);
        o += 12;
        let bytes = b[o..o + nb].to_vec();
        o += nb;
        let floats = b[o..o + 4 * n]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        o += 4 * n;
        recs.push(Record {
            kind,
            name,
            ty,
            n,
            bytes,
            floats,
        });
    }
    assert_eq!(o, b.len(), "trailing bytes");
    recs
}

/// Deterministic xorshift generator for the random tests.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| (self.next_u64() >> 24) as u8).collect()
    }
    /// Uniform in [-1, 1).
    pub fn unit(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    pub fn normalish(&mut self) -> f32 {
        (0..4).map(|_| self.unit()).sum::<f32>() * 0.9
    }
}

/// Random weight blocks of `ty` with finite, moderate f16 / f32 / E8M0 scales.
pub fn random_weight_row(rng: &mut Rng, ty: GgmlType, n: usize) -> Vec<u8> {
    use GgmlType::*;
    let ts = ty.type_size();
    let nb = n / ty.block_size();
    let mut b = rng.bytes(nb * ts);
    let f16s: &[usize] = match ty {
        Q4_0 | Q5_0 | Q8_0 | IQ4NL | IQ4XS | IQ2XXS | IQ2XS | IQ2S | IQ3XXS | IQ3S | IQ1S => &[0],
        Q4_1 | Q5_1 | Q4K | Q5K => &[0, 2],
        Q2K => &[80, 82],
        Q3K => &[108],
        Q6K => &[208],
        _ => &[],
    };
    for blk in b.chunks_exact_mut(ts) {
        let mut scale = || {
            let v = half::f16::from_f32(0.01 + 0.05 * rng.unit().abs()).to_bits();
            v.to_le_bytes()
        };
        for &o in f16s {
            let s = scale();
            blk[o..o + 2].copy_from_slice(&s);
        }
        match ty {
            F32 => {
                let v = rng.normalish();
                blk.copy_from_slice(&v.to_le_bytes());
            }
            F16 => {
                blk.copy_from_slice(&half::f16::from_f32(rng.normalish()).to_bits().to_le_bytes())
            }
            BF16 => blk.copy_from_slice(
                &half::bf16::from_f32(rng.normalish())
                    .to_bits()
                    .to_le_bytes(),
            ),
            MXFP4 => blk[0] = 118 + (rng.next_u64() % 8) as u8,
            Q8K => blk[0..4].copy_from_slice(&(0.01f32 + 0.01 * rng.unit()).to_le_bytes()),
            IQ1M => {
                let d = half::f16::from_f32(0.01 + 0.05 * rng.unit().abs()).to_bits();
                for i in 0..4 {
                    let o = 48 + 2 * i;
                    let w = u16::from_le_bytes([blk[o], blk[o + 1]]);
                    let w = (w & 0x0fff) | (((d >> (4 * i)) & 15) << 12);
                    blk[o..o + 2].copy_from_slice(&w.to_le_bytes());
                }
            }
            _ => {}
        }
    }
    b
}

/// Every type `dequantize_row` / `vec_dot` support.
pub fn weight_types() -> Vec<GgmlType> {
    GgmlType::all()
        .filter(|t| t.is_supported_weight())
        .collect()
}

/// Reruns this test binary in a child process with `var=1` (a dispatch switch read once
/// per process), filtered by `filters` on one thread; asserts that it passed and that
/// every test of `expect` ran and passed in it.
pub fn rerun_in_child(var: &str, filters: &[&str], expect: &[&str]) {
    let exe = std::env::current_exe().expect("the test binary");
    let out = std::process::Command::new(exe)
        .env(var, "1")
        .args(filters)
        .args(["--test-threads", "1"])
        .output()
        .expect("run the test binary");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{var}: {text}{}", String::from_utf8_lossy(&out.stderr));
    for t in expect {
        assert!(text.contains(&format!("{t} ... ok")), "{var}: the child ran {t}: {text}");
    }
}

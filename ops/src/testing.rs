//! Test data shared by the workspace's tests and benches (not part of the engine's API).

/// `n` values uniform in [-1, 1) from a xorshift32 stream: `seed` picks the stream,
/// `salt` lets a test file keep its own data apart from another's.
pub fn uniform(n: usize, seed: u32, salt: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761).wrapping_add(salt);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s as f32 / u32::MAX as f32) * 2.0 - 1.0
        })
        .collect()
}

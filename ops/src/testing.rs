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

/// Kernel knob sets for an in-process A/B (`quant::set_knobs`, benchmarks only):
/// `"a=;b=0:9,1:99"` — `name=knob:value,…`, sets apart by `;` (no pairs: the defaults).
#[cfg(target_arch = "x86_64")]
pub fn knob_sets(spec: &str) -> Result<Vec<(String, [usize; crate::quant::N_KNOBS])>, String> {
    let mut sets = Vec::new();
    for c in spec.split(';').filter(|c| !c.is_empty()) {
        let (name, kv) = c.split_once('=').ok_or_else(|| format!("expected name=knob:value,…, found {c:?}"))?;
        let mut k = [usize::MAX; crate::quant::N_KNOBS];
        for p in kv.split(',').filter(|p| !p.is_empty()) {
            let (i, v) = p.split_once(':').ok_or_else(|| format!("expected knob:value, found {p:?}"))?;
            let i: usize = i.parse().map_err(|_| format!("knob index {i:?} is not a number"))?;
            let slot = k.get_mut(i).ok_or_else(|| format!("knob {i} out of range (0..{})", crate::quant::N_KNOBS))?;
            *slot = v.parse().map_err(|_| format!("knob {i} value {v:?} is not a number"))?;
        }
        sets.push((name.to_string(), k));
    }
    Ok(sets)
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::knob_sets;

    #[test]
    fn knob_sets_parse_and_reject() {
        let s = knob_sets("a=;b=0:9,10:0").unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].0, "a");
        assert!(s[0].1.iter().all(|&v| v == usize::MAX));
        assert_eq!((s[1].1[0], s[1].1[10], s[1].1[1]), (9, 0, usize::MAX));
        assert!(knob_sets("nameless").unwrap_err().contains("name=knob:value"));
        assert!(knob_sets("a=99:1").unwrap_err().contains("out of range"));
        assert!(knob_sets("a=1:x").unwrap_err().contains("not a number"));
    }
}

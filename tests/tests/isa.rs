//! The instruction-set paths give the same logits, bit for bit: every weight format's
//! fixture through the plain-AVX2 kernels and their 8-row interleaved copies (a child
//! process of this test binary with `PN_NO_AVX512=1`, read once per process) against
//! this CPU's own kernels (AVX-512 VNNI / AMX where it has them). The per-kernel tests
//! (`ops/tests/rows16.rs`) check each dot; this checks the model's passes end to end.

use pn_tests::*;

const FIXTURES: [&str; 8] = ["tiny-q8_0", "tiny-q4_0", "tiny-f16", "ktiny-q4_k_m", "ktiny-q5_k_m", "ktiny-q6_k", "ktiny-iq4_xs", "ktiny-mxfp4"];

/// `name: <hash of every logit's bits>` for each fixture, on this process's kernels.
fn digests() -> Vec<String> {
    FIXTURES
        .iter()
        .map(|name| {
            let o = oracle(&format!("{name}.logits.json"));
            let logits = all_logits(&runner(&format!("{name}.gguf"), 2), &o.tokens);
            // FNV-1a over the bits of every logit, row by row
            let mut h = 0xcbf2_9ce4_8422_2325u64;
            for v in logits.iter().flatten() {
                for b in v.to_bits().to_le_bytes() {
                    h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
                }
            }
            format!("{name}:{h:016x}:{}", logits.len())
        })
        .collect()
}

#[test]
fn avx2_path_logits_are_bitwise_the_default_paths() {
    let mine = digests();
    if std::env::var_os("PN_NO_AVX512").is_some() {
        // the child: report
        println!("DIGESTS {}", mine.join(" "));
        return;
    }
    #[cfg(target_arch = "x86_64")]
    {
        if !std::is_x86_feature_detected!("avx512f") || !std::is_x86_feature_detected!("avx2") {
            return; // one path only on this CPU
        }
        let exe = std::env::current_exe().expect("the test binary");
        let out = std::process::Command::new(exe)
            .env("PN_NO_AVX512", "1")
            .args(["avx2_path_logits_are_bitwise_the_default_paths", "--exact", "--nocapture", "--test-threads", "1"])
            .output()
            .expect("run the test binary");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
        let line = text.lines().find_map(|l| l.split_once("DIGESTS ").map(|(_, d)| d)).unwrap_or_else(|| panic!("the child printed no digests: {text}"));
        let theirs: Vec<&str> = line.split(' ').collect();
        assert_eq!(theirs.len(), mine.len(), "{line}");
        for (a, b) in mine.iter().zip(&theirs) {
            assert_eq!(a, b, "default path vs PN_NO_AVX512=1 (name:hash:rows)");
        }
    }
}

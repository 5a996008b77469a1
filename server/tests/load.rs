//! A short run of the load and faults harness (bench/serve/loadtest.py) against an
//! in-process server with an API key: 1, 4 and 16 streaming clients, 30 % of them hanging
//! up mid-stream, malformed requests in between (each answered with its 4xx JSON error), a
//! client reading one byte a second; 0 stream errors, busy slots back to 0, RSS at the end
//! within 5 % of after warm-up. The 5-minute, 64-client run is a benchmark
//! (docs/server.md).

mod common;
mod loopback;

use common::*;

#[test]
fn short_load_run_with_faults() {
    let py = loopback::python_with("json");
    if !loopback::require(py.clone().map(|_| ())) {
        return;
    }
    let mut cfg = config();
    cfg.api_key = Some("load-key".into());
    // a small prefix cache, so the warm-up fills it and the RSS baseline is steady
    let mut sp = spec(DEFAULT, 16, 1024);
    sp.cache.budget_bytes = 4 << 20;
    let url = loopback::listen(server(cfg, sp));
    let pid = std::process::id().to_string();
    let py = py.unwrap();
    let run = |extra: &[&str]| {
        let mut a = vec![url.as_str(), "--pid", &pid, "--clients", "1,4,16", "--seconds", "6", "--warmup", "8", "--requests", "400"];
        a.extend(["--max-tokens", "32", "--faults", "--api-key", "load-key"]);
        a.extend(extra);
        loopback::run_script(&py, "bench/serve/loadtest.py", &a)
    };
    // as pn serve does (pn_server::malloc): glibc's mmap threshold pinned, so large
    // transient buffers do not stay in the per-thread arenas
    assert!(pn_server::malloc::pin_mmap_threshold(), "mallopt(M_MMAP_THRESHOLD) failed");
    // in this test process (its runtime, the test harness) RSS still climbs during the
    // first runs of a fresh server (8 s of warm-up fills little: the slot states, the
    // prompt index, and the runner's compiled geometries — one per (tokens, sequences)
    // pass shape met, bounded but not all warmed up front): two runs (all checks but the
    // RSS one) bring it to its plateau, the third is checked at 5 %. With one such run
    // the checked run still grew 3.8–5.8 % (303 → 321 MiB; 311 → 323).
    for _ in 0..2 {
        let pre = run(&["--rss-tolerance", "100"]);
        assert!(pre.contains("loadtest: all checks passed"), "{pre}");
    }
    let out = run(&[]);
    assert!(out.contains("loadtest: all checks passed"), "{out}");
}

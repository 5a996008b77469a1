#!/usr/bin/env bash
# GPU checks of the CUDA backend, prepared for the device tool (whose machine has a GPU
# but no network, so no crates.io and maybe no NVRTC):
#
#   backends/cuda/gpu-check.sh bundle   # HERE (network, no GPU): build the test
#       binaries and pn, compile every kernel's CUBIN for sm_80/sm_90 with NVRTC, strip,
#       and put it all in target/gpu-bundle (a few MB) -> carry ["target/gpu-bundle"]
#   backends/cuda/gpu-check.sh run      # THERE (GPU): run the bundle: nvidia-smi, the
#       op-parity harness (every op vs the CPU backend, every native block format, 1 and
#       many tokens), the CUBIN load check, and pn end to end (CPU vs CUDA logits)
#
# `run` falls back to `cargo test` when there is no bundle but cargo works offline.
# Env: PN_BUNDLE_PN=0 skips building pn in `bundle`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
B="$ROOT/target/gpu-bundle"
cd "$ROOT"

bundle() {
    rm -rf "$B" && mkdir -p "$B/bin" "$B/cubin"
    # CUBINs for sm_80 / sm_90 into the bundle's cache (the backend loads them without NVRTC)
    PN_CUDA_CACHE="$B/cubin" bash tools/nvrtc-check.sh
    local exes
    exes="$(cargo test -p pn-cuda --no-run --message-format=json 2>/dev/null | python3 -c '
import sys, json
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["target"]["name"], m["executable"])')"
    while read -r name exe; do
        cp "$exe" "$B/bin/$name"
    done <<<"$exes"
    if [ "${PN_BUNDLE_PN:-1}" != 0 ]; then
        cargo build --release -p pn-cli
        cp "${CARGO_TARGET_DIR:-$ROOT/target}/release/pn" "$B/bin/pn"
    fi
    strip "$B"/bin/* 2>/dev/null || true
    du -sh "$B"
    echo "gpu-check: bundle ready; carry [\"target/gpu-bundle\"] and run: bash backends/cuda/gpu-check.sh run"
}

run() {
    local fail=0
    nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv || echo "gpu-check: nvidia-smi failed"
    export PN_CUDA_CACHE="${PN_CUDA_CACHE:-$B/cubin}"
    for d in /usr/local/cuda/lib64 "$HOME"/.cache/pn-nvrtc/site-*/nvidia/cuda_nvrtc/lib; do
        [ -e "$d/libnvrtc.so.12" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    done
    if [ -x "$B/bin/gpu_parity" ]; then
        echo "== op parity (CUDA vs CPU)"
        "$B/bin/gpu_parity" --nocapture --test-threads 1 || fail=1
        echo "== backend creation"
        "$B/bin/nvrtc_compile" --nocapture no_device_is_a_clear_error || fail=1
    else
        echo "gpu-check: no bundle at $B; trying cargo (offline)"
        cargo test --offline -p pn-cuda --test gpu_parity -- --nocapture --test-threads 1 || fail=1
    fi
    local pn="$B/bin/pn"
    if [ -x "$pn" ]; then
        echo "== pn end to end (built-in model): CPU vs CUDA logits"
        "$pn" logits --tokens 1,2,3,4,5,6,7,8 --out /tmp/pn-cpu.json || fail=1
        if "$pn" logits --help 2>&1 | grep -qi "cuda\|--dies"; then
            if "$pn" logits --dies cuda:0 --tokens 1,2,3,4,5,6,7,8 --out /tmp/pn-cuda.json; then
                python3 - <<'PY' || fail=1
import json, math
a = json.load(open("/tmp/pn-cpu.json")); b = json.load(open("/tmp/pn-cuda.json"))
num = den = 0.0
for ra, rb in zip(a["logits"], b["logits"]):
    for x, y in zip(ra, rb):
        num += (x - y) ** 2; den += x * x
nmse = num / max(den, 1e-30)
same = a["argmax"] == b["argmax"]
print(f"pn logits CPU vs CUDA: nmse {nmse:.3e}, argmax equal: {same}")
raise SystemExit(0 if nmse < 1e-4 and same else 1)
PY
            else
                echo "gpu-check: pn --dies cuda:0 failed (is the CUDA backend wired into the CLI yet?)"
                fail=1
            fi
        fi
        "$pn" run -n 16 --dies cuda:0 2>&1 | tail -n 3 || echo "gpu-check: pn run on cuda:0 not available"
    fi
    if [ "$fail" = 0 ]; then echo "gpu-check: PASSED"; else echo "gpu-check: FAILED"; fi
    return "$fail"
}

case "${1:-run}" in
    bundle) bundle ;;
    run) run ;;
    *) echo "usage: $0 bundle|run" >&2; exit 2 ;;
esac

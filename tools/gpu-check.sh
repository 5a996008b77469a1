#!/usr/bin/env bash
# The CUDA backend's GPU check, in ONE call of the device tool (H200, no Rust, no network,
# 64 MiB carried):
#
#   bash tools/gpu-check.sh bundle  # HERE (Rust, network): release pn, the pn-cuda test
#       binaries (gpu_parity, gpu_e2e, nvrtc_compile), the CUBINs for sm_80/sm_90 (NVRTC
#       from PyPI, see tools/nvrtc-check.sh) and a few fixtures, stripped, into
#       target/gpu-bundle (< 60 MiB)
#   bash tools/gpu-check.sh run     # THERE, with carry ["target/gpu-bundle"], timeout_s 540:
#       nvidia-smi; op parity CUDA vs CPU; e2e logits CUDA vs CPU on every fixture;
#       pn synth full-dims q4_k_m; pn bench on cuda:0 (prompt 128 / 512, gen 32); pn batch
#       with 16 slots; pn bench on cpu:0 for reference. Every phase under `timeout`, the
#       total under 8 minutes; a failed phase does not stop the next; summary at the end;
#       exit 1 if any phase failed. Log: $OUT/gpu-check.log
#
#   bash tools/gpu-check.sh slim    # HERE, just before the device call: the tracked tree is
#       ~95 MB (tests/fixtures 80, models/default 13) and the device takes 64 MiB with the
#       carried bundle, so this takes those two folders out of the index (files stay on
#       disk) and ignores them in .git/info/exclude; nothing else travels but ~2 MB of
#       sources. NEVER commit while slim.
#   bash tools/gpu-check.sh unslim  # HERE, right after: index and exclude as before.
#
# Env (run): GPU_CHECK_DRY=1 runs without a GPU (the test binaries fall back to the
#   reference backend, synth + bench + batch on cpu:0 with the `small` preset) to check
#   this script; GPU_CHECK_BUDGET (seconds, default 470); GPU_CHECK_PRESET / _TYPE;
#   GPU_CHECK_SAVE=1 also copies the log to docs/gpu/gpu-check-DATE.log.
# Env (bundle): PN_BUNDLE_CUBIN=0 skips the CUBINs; PN_BUNDLE_FIXTURES=0 the fixtures
#   (~25 MiB; the run uses the checkout's tests/fixtures when they travel); PN_NVRTC_DIR
#   as in nvrtc-check.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
B="$ROOT/target/gpu-bundle"
BUDGET_MIB=60
# fixtures carried in the bundle (one per weight format / architecture); the run prefers
# the checkout's tests/fixtures when it is there
FIXTURES="ktiny-q4_k_m ktiny-q6_k ktiny-iq4_xs ktiny-mxfp4 tiny-q8_0 tiny-q4_0 tiny-bf16 qwen35-ktiny-q4_k_m qwen3moe-ktiny-q4_k_m"
cd "$ROOT"

say() { echo "gpu-check: $*"; }

nvrtc_lib() {
    local d
    for d in "${PN_NVRTC_DIR:-}" "${PN_NVRTC_CACHE:-$HOME/.cache/pn-nvrtc}"/site-*/nvidia/cuda_nvrtc/lib; do
        if [ -n "$d" ] && [ -e "$d/libnvrtc.so.12" ]; then echo "$d"; return 0; fi
    done
    return 1
}

bundle() {
    local target="${CARGO_TARGET_DIR:-$ROOT/target}"
    rm -rf "$B" && mkdir -p "$B/bin" "$B/cubin" "$B/fixtures"
    say "building release pn"
    cargo build --release -p pn-cli
    cp "$target/release/pn" "$B/bin/pn"
    say "building the pn-cuda test binaries (release)"
    local exes
    exes="$(cargo test --release -p pn-cuda --no-run --message-format=json | python3 -c '
import sys, json
for l in sys.stdin:
    try: m = json.loads(l)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["target"]["name"], m["executable"])')"
    while read -r name exe; do
        [ -n "$name" ] && cp "$exe" "$B/bin/$name"
    done <<<"$exes"
    for t in gpu_parity gpu_e2e nvrtc_compile; do
        [ -x "$B/bin/$t" ] || { say "FAILED: test binary $t not built"; exit 1; }
    done
    strip "$B"/bin/* 2>/dev/null || say "strip failed: binaries unstripped"
    local cubin="none (the device compiles with its own NVRTC, if it has one)"
    if [ "${PN_BUNDLE_CUBIN:-1}" != 0 ]; then
        local lib
        if ! lib="$(nvrtc_lib)"; then
            say "installing NVRTC (tools/nvrtc-check.sh)"
            bash tools/nvrtc-check.sh >/dev/null 2>&1 || true
        fi
        if lib="$(nvrtc_lib)"; then
            if LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" PN_CUDA_CACHE="$B/cubin" \
                "$B/bin/nvrtc_compile" --ignored --nocapture --exact every_kernel_compiles >"$B/cubin/nvrtc.log" 2>&1; then
                cubin="$(find "$B/cubin" -name '*.cubin' | wc -l) CUBINs (sm_80, sm_90)"
            else
                say "NVRTC compile failed (see $B/cubin/nvrtc.log); bundling without CUBINs"
                find "$B/cubin" -name '*.cubin' -delete
            fi
        else
            say "NVRTC unavailable (no network?): bundling WITHOUT CUBINs; the device must compile them"
        fi
    fi
    local f size
    [ "${PN_BUNDLE_FIXTURES:-1}" = 0 ] && FIXTURES=""
    for f in $FIXTURES; do
        size=$(( $(du -sb "$B" | cut -f1) + $(stat -c %s "tests/fixtures/$f.gguf") ))
        if [ "$size" -gt $((BUDGET_MIB * 1024 * 1024)) ]; then
            say "fixture $f left out: the bundle would pass ${BUDGET_MIB} MiB"
            continue
        fi
        cp "tests/fixtures/$f.gguf" "$B/fixtures/"
    done
    {
        echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (dirty)')"
        echo "built $(date -u +%FT%TZ) on $(uname -m)"
        echo "cubins: $cubin"
        echo "fixtures: $(ls "$B/fixtures" | tr '\n' ' ')"
    } >"$B/MANIFEST"
    cat "$B/MANIFEST"
    du -sh "$B"/*
    say "bundle ready ($(du -sm "$B" | cut -f1) MiB); on the device: carry [\"target/gpu-bundle\"], command: bash tools/gpu-check.sh run"
}

# ---- run --------------------------------------------------------------------------
T0=$SECONDS
RESULTS=()
FAILED=0
WORK=/tmp/gpu-check

# phase ID NAME TIMEOUT CMD...: run under `timeout` (cut to the time left in the budget),
# output also in $WORK/ID.txt; records pass / FAIL / TIMEOUT / SKIPPED, never stops the run.
phase() {
    local id="$1" name="$2" limit="$3" rc=0
    shift 3
    local left=$((BUDGET - (SECONDS - T0) - 5))
    if [ "$limit" -gt "$left" ]; then limit=$left; fi
    if [ "$limit" -lt 10 ]; then
        RESULTS+=("SKIPPED  $name (time budget spent)")
        FAILED=1
        return 0
    fi
    echo
    echo "== $name (timeout ${limit}s) =="
    local t=$SECONDS
    timeout --kill-after=5 "$limit" "$@" 2>&1 | tee "$WORK/$id.txt" || rc=$?
    local dt=$((SECONDS - t))
    case "$rc" in
        0) RESULTS+=("pass     $name (${dt}s)") ;;
        124 | 137) RESULTS+=("TIMEOUT  $name (${dt}s)"); FAILED=1 ;;
        *) RESULTS+=("FAIL     $name (rc $rc, ${dt}s)"); FAILED=1 ;;
    esac
    return 0
}

# the tok/s fields of pn bench's JSON line in $WORK/ID.txt
tok_s() { sed -n 's/.*"pp_tok_s":\([0-9.]*\).*"tg_tok_s":\([0-9.]*\).*/prefill \1 tok\/s, decode \2 tok\/s/p' "$WORK/$1.txt" 2>/dev/null | tail -n 1; }

run_all() {
    local dry="${GPU_CHECK_DRY:-0}" die=cuda:0
    local pn="$B/bin/pn" preset="${GPU_CHECK_PRESET:-full-dims}" type="${GPU_CHECK_TYPE:-q4_k_m}"
    rm -rf "$WORK" && mkdir -p "$WORK"
    say "$(date -u +%FT%TZ), budget ${BUDGET}s, bundle: $(head -n 1 "$B/MANIFEST" 2>/dev/null || echo missing)"
    if [ ! -x "$pn" ] || [ ! -x "$B/bin/gpu_parity" ] || [ ! -x "$B/bin/gpu_e2e" ]; then
        say "FAILED: no bundle at $B (build it where Rust is: bash tools/gpu-check.sh bundle)"
        return 1
    fi
    if timeout 20 nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv 2>&1; then
        [ "$dry" = 1 ] && say "GPU_CHECK_DRY=1: pn runs on cpu:0 (the tests still use the GPU)"
    elif [ "$dry" = 1 ]; then
        say "no GPU (nvidia-smi failed); GPU_CHECK_DRY=1: CPU-only run to check this script (pn on cpu:0, the tests on the reference backend)"
        preset="${GPU_CHECK_PRESET:-small}"
    else
        say "FAILED: no GPU here (nvidia-smi missing or no device found): nothing to check; GPU_CHECK_DRY=1 runs the CPU-only phases"
        return 1
    fi
    [ "$dry" = 1 ] && die=cpu:0
    export PN_CUDA_CACHE="${PN_CUDA_CACHE:-$B/cubin}"
    say "CUBIN cache $PN_CUDA_CACHE: $(find "$PN_CUDA_CACHE" -name '*.cubin' 2>/dev/null | wc -l) files"
    local d
    for d in /usr/local/cuda/lib64 "$HOME"/.cache/pn-nvrtc/site-*/nvidia/cuda_nvrtc/lib; do
        if [ -e "$d/libnvrtc.so.12" ]; then export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
    done
    # e2e models: the checkout's fixtures and built-in model when present, else the bundle's
    if ls "$ROOT"/tests/fixtures/*.gguf >/dev/null 2>&1; then
        export PN_E2E_MODELS="$ROOT/tests/fixtures:$ROOT/models/default"
    else
        export PN_E2E_MODELS="$B/fixtures"
    fi
    say "e2e models: $PN_E2E_MODELS"

    phase parity "op parity CUDA vs CPU" 150 "$B/bin/gpu_parity" --nocapture --test-threads 1
    if [ "$dry" = 1 ]; then
        phase e2e "e2e logits vs CPU (whole test binary)" 120 "$B/bin/gpu_e2e" --nocapture --test-threads 1
    else
        phase e2e "e2e logits CUDA vs CPU" 120 "$B/bin/gpu_e2e" --nocapture --test-threads 1 --exact cuda_matches_cpu_on_every_fixture
    fi
    local model="$WORK/$preset-$type.gguf"
    phase synth "pn synth $preset $type" 60 "$pn" synth --preset "$preset" --type "$type" --seed 1 --out "$model"
    if [ -s "$model" ]; then
        export PN_KV_TYPE=f32 # attention over a quantized KV cache runs on the CPU (docs/cuda.md)
        phase bench128 "pn bench $die prompt 128 gen 32" 60 "$pn" bench --model "$model" --dies "$die" --prompt-len 128 --gen 32 --reps 2
        phase bench512 "pn bench $die prompt 512 gen 32" 75 "$pn" bench --model "$model" --dies "$die" --prompt-len 512 --gen 32 --reps 1
        local i
        for i in $(seq 1 16); do echo "prompt $i: the quick brown fox number $i jumps over"; done >"$WORK/prompts.txt"
        # stdout (16 JSON lines of text) dropped; the aggregate tok/s is on stderr
        phase batch "pn batch $die 16 slots gen 32" 75 bash -c '"$0" batch --model "$1" --dies "$2" --slots 16 -n 32 --ignore-eos --prompts-file "$3" >/dev/null' \
            "$pn" "$model" "$die" "$WORK/prompts.txt"
        phase benchcpu "pn bench cpu:0 prompt 128 gen 32 (for comparison)" 45 "$pn" bench --model "$model" --dies cpu:0 --prompt-len 128 --gen 32 --reps 1
    else
        RESULTS+=("SKIPPED  bench / batch (no model)")
        FAILED=1
    fi

    echo
    echo "== summary ($((SECONDS - T0))s of ${BUDGET}s) =="
    printf '%s\n' "${RESULTS[@]}"
    echo "-- numbers"
    local worst
    worst="$(grep -ohE 'nmse [0-9.e+-]+' "$WORK/parity.txt" 2>/dev/null | sort -k2 -g | tail -n 1)"
    echo "parity: $(grep -cE ' nmse ' "$WORK/parity.txt" 2>/dev/null) cases, worst ${worst:-n/a}"
    grep -hE '^e2e |  rows ' "$WORK/e2e.txt" 2>/dev/null | grep -v ': prompt ' || echo "e2e: no numbers"
    echo "bench $die p128/g32: $(tok_s bench128)"
    echo "bench $die p512/g32: $(tok_s bench512)"
    echo "batch $die 16 slots: $(grep -iE 'tok/s' "$WORK/batch.txt" 2>/dev/null | tail -n 1)"
    echo "bench cpu:0 p128/g32: $(tok_s benchcpu)"
    return "$FAILED"
}

run() {
    BUDGET="${GPU_CHECK_BUDGET:-470}"
    OUT="${OUT:-/tmp/gpu-check-out}"
    mkdir -p "$OUT"
    LOG="$OUT/gpu-check.log"
    : >"$LOG"
    local rc=0
    run_all 2>&1 | tee -a "$LOG" || rc=$?
    local keep
    keep="docs/gpu/gpu-check-$(date +%F).log"
    if [ "${GPU_CHECK_SAVE:-0}" = 1 ]; then
        mkdir -p "$ROOT/docs/gpu" && cp "$LOG" "$ROOT/$keep"
    fi
    {
        if [ "$rc" = 0 ]; then say "PASSED"; else say "FAILED (rc $rc)"; fi
        say "log: $LOG; keep it in the repository as $keep"
    } | tee -a "$LOG"
    return "$rc"
}

# The folders `slim` takes out of what the device tool sends (see the header).
SLIM_DIRS="tests/fixtures models/default"
SLIM_MARK="# gpu-check-slim begin"

slim() {
    local ex
    ex="$(git -C "$ROOT" rev-parse --path-format=absolute --git-path info/exclude)"
    mkdir -p "$(dirname "$ex")" && touch "$ex"
    if grep -qF "$SLIM_MARK" "$ex"; then say "already slim"; return; fi
    # shellcheck disable=SC2086
    git -C "$ROOT" rm -r -q --cached $SLIM_DIRS
    { echo "$SLIM_MARK"; for d in $SLIM_DIRS; do echo "/$d/"; done; echo "# gpu-check-slim end"; } >>"$ex"
    say "slim: $SLIM_DIRS out of the index (still on disk). DO NOT COMMIT; run 'bash tools/gpu-check.sh unslim' after the device call"
}

unslim() {
    local ex
    ex="$(git -C "$ROOT" rev-parse --path-format=absolute --git-path info/exclude)"
    # shellcheck disable=SC2086
    git -C "$ROOT" reset -q -- $SLIM_DIRS
    if [[ -f "$ex" ]] && grep -qF "$SLIM_MARK" "$ex"; then
        sed -i "/^# gpu-check-slim begin\$/,/^# gpu-check-slim end\$/d" "$ex"
    fi
    say "unslim: index and exclude restored"
}

case "${1:-}" in
    bundle) bundle ;;
    run) run ;;
    slim) slim ;;
    unslim) unslim ;;
    *) echo "usage: $0 bundle|run|slim|unslim   (see the header of this script)" >&2; exit 2 ;;
esac

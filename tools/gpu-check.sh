#!/usr/bin/env bash
# The CUDA backend's GPU check, in ONE call of the device tool (H200: no Rust, no
# network; the working tree + carried files at most 64 MiB). docs/cuda.md has the plan.
#
#   bash tools/gpu-check.sh bundle  # HERE (Rust; network for NVRTC the first time):
#       release pn and the pn-cuda test binaries (gpu_parity, gpu_e2e, device_start),
#       symbols kept (strip --strip-debug), the CUBIN of every kernel for sm_90 (and
#       sm_80) compiled here by NVRTC and CHECKED complete (the bundle fails otherwise:
#       the device then needs no NVRTC), the fixtures, a MANIFEST: target/gpu-bundle
#   bash tools/gpu-check.sh slim    # HERE, just before the device call: tests/fixtures and
#       models/default out of the index (files stay on disk), ignored in .git/info/exclude,
#       so ~2 MB of sources travel beside the bundle. NEVER commit while slim.
#   bash tools/gpu-check.sh run     # THERE: carry ["target/gpu-bundle"], timeout_s 330.
#       Phases in order of value, each with its own cap, all within GPU_CHECK_BUDGET
#       (300 s): start-up probe → op parity (one process per test) → e2e logits on the
#       fixtures → full-dims bench → 16-slot batch → split on one GPU. Log: $OUT/gpu-check.log
#   bash tools/gpu-check.sh unslim  # HERE, right after: index and exclude as before.
#   bash tools/gpu-check.sh plan    # the phases, their caps and the budget.
#
# Run env: GPU_CHECK_BUDGET (s, 300); GPU_CHECK_PHASES (ids to run, e.g. parity,e2e; the
#   probe always runs); GPU_CHECK_DRY=1: no GPU needed (tests skip, pn on cpu:0, `small`
#   preset) to check this script; GPU_CHECK_BUNDLE (default target/gpu-bundle).
# Bundle env: PN_BUNDLE_FIXTURES=0 leaves the fixtures out; PN_NVRTC_DIR as in
#   tools/nvrtc-check.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
B="${GPU_CHECK_BUNDLE:-$ROOT/target/gpu-bundle}"
LIMIT_MIB=64   # the device tool's limit: tree that travels + carried files
TEST_BINS="gpu_parity gpu_e2e device_start"
# the CUBINs the device needs (H200: sm_90); sm_80 comes along (same NVRTC run)
NEED_ARCHS="sm_90"
FIXTURES="ktiny-q4_k_m ktiny-q6_k ktiny-iq4_xs ktiny-mxfp4 tiny-q8_0 tiny-q4_0 tiny-bf16 qwen35-ktiny-q4_k_m qwen3moe-ktiny-q4_k_m"
SLIM_DIRS="tests/fixtures models/default"
SLIM_MARK="# gpu-check-slim begin"
cd "$ROOT"

say() { echo "gpu-check: $*"; }
die() { say "FAILED: $*"; exit 1; }

# ---- bundle (here) -----------------------------------------------------------------

nvrtc_lib() {
    local d
    for d in "${PN_NVRTC_DIR:-}" "${PN_NVRTC_CACHE:-$HOME/.cache/pn-nvrtc}"/site-*/nvidia/cuda_nvrtc/lib; do
        if [ -n "$d" ] && [ -e "$d/libnvrtc.so.12" ]; then echo "$d"; return 0; fi
    done
    return 1
}

# The release test binaries of pn-cuda: "name path" lines.
test_exes() {
    cargo test --release -p pn-cuda --no-run --message-format=json | python3 -c '
import sys, json
for l in sys.stdin:
    try: m = json.loads(l)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["target"]["name"], m["executable"])'
}

# MiB (rounded up) of what the device tool sends besides the carried files once slim:
# tracked files outside SLIM_DIRS, and untracked files that are not ignored.
tree_mib() {
    local ex=() d
    for d in $SLIM_DIRS; do ex+=(":!$d"); done
    { git ls-files -z -- . "${ex[@]}"
      git ls-files -z -o --exclude-standard; } |
        xargs -0 -r stat -c %s 2>/dev/null | awk '{ s += $1 } END { printf "%d\n", (s + 1048575) / 1048576 }'
}

bundle() {
    local target="${CARGO_TARGET_DIR:-$ROOT/target}" lib exes name exe nvrtc_exe=""
    command -v python3 >/dev/null || die "python3 is needed (cargo's JSON, NVRTC install)"
    rm -rf "$B" && mkdir -p "$B/bin" "$B/cubin" "$B/fixtures"
    say "building release pn"
    cargo build --release -p pn-cli
    cp "$target/release/pn" "$B/bin/pn"
    say "building the pn-cuda test binaries (release)"
    exes="$(test_exes)"
    while read -r name exe; do
        case " $TEST_BINS " in *" $name "*) cp "$exe" "$B/bin/$name" ;; esac
        [ "$name" = nvrtc_compile ] && nvrtc_exe="$exe"
    done <<<"$exes"
    for name in $TEST_BINS; do
        [ -x "$B/bin/$name" ] || die "test binary $name not built"
    done
    [ -n "$nvrtc_exe" ] || die "test binary nvrtc_compile not built"
    # line tables out, symbols kept (backtraces name the functions)
    strip --strip-debug "$B"/bin/* || die "strip --strip-debug failed"

    # CUBINs: compiled here, then checked: the device must not need NVRTC
    if ! lib="$(nvrtc_lib)"; then
        say "installing NVRTC (tools/nvrtc-check.sh)"
        bash tools/nvrtc-check.sh >/dev/null 2>&1 || true
        lib="$(nvrtc_lib)" || die "no NVRTC (PyPI unreachable?): cannot make the CUBINs; PN_NVRTC_DIR=<dir of libnvrtc.so.12> to use another"
    fi
    LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" PN_CUDA_CACHE="$B/cubin" \
        "$nvrtc_exe" --ignored --nocapture --exact every_kernel_compiles >"$B/cubin/nvrtc.log" 2>&1 ||
        { cat "$B/cubin/nvrtc.log"; die "NVRTC compile failed (log above)"; }
    PN_CUDA_CACHE="$B/cubin" PN_CUBIN_ARCHS="$(echo "$NEED_ARCHS" | tr ' ' ,)" \
        "$nvrtc_exe" --ignored --nocapture --exact cubin_cache_complete >"$B/cubin/check.log" 2>&1 ||
        { cat "$B/cubin/check.log"; die "the bundle lacks a CUBIN for $NEED_ARCHS (log above)"; }
    say "CUBINs complete for $NEED_ARCHS: $(grep -c '^ok ' "$B/cubin/check.log") modules checked"

    local f size limit
    limit=$(( (LIMIT_MIB - $(tree_mib) - 1) * 1024 * 1024 ))
    [ "${PN_BUNDLE_FIXTURES:-1}" = 0 ] && FIXTURES=""
    for f in $FIXTURES; do
        size=$(( $(du -sb "$B" | cut -f1) + $(stat -c %s "tests/fixtures/$f.gguf") ))
        if [ "$size" -gt "$limit" ]; then
            say "fixture $f left out: tree + bundle would pass $LIMIT_MIB MiB"
            continue
        fi
        cp "tests/fixtures/$f.gguf" "$B/fixtures/"
    done
    {
        echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (dirty)')"
        echo "built $(date -u +%FT%TZ) on $(uname -srm), $(rustc --version 2>/dev/null)"
        echo "nvrtc $(sed -n 's/^NVRTC //p' "$B/cubin/nvrtc.log" | head -n 1) from $lib"
        echo "cubins:"
        (cd "$B/cubin" && find . -name '*.cubin' -printf '  %P %s\n' | sort)
        echo "binaries (strip --strip-debug):"
        (cd "$B/bin" && for f in *; do echo "  $f $(stat -c %s "$f") $(sha256sum "$f" | cut -c1-16)"; done)
        echo "fixtures: $(find "$B/fixtures" -name '*.gguf' -printf '%f\n' | sort | tr '\n' ' ')"
    } >"$B/MANIFEST"
    cat "$B/MANIFEST"
    local total=$(( $(du -sm "$B" | cut -f1) + $(tree_mib) ))
    say "bundle $(du -sm "$B" | cut -f1) MiB + tree after slim $(tree_mib) MiB = $total of $LIMIT_MIB MiB"
    [ "$total" -le "$LIMIT_MIB" ] || die "over the device tool's $LIMIT_MIB MiB: PN_BUNDLE_FIXTURES=0 or fewer fixtures"
    say "ready. Next: bash tools/gpu-check.sh slim; device run with carry [\"${B#"$ROOT"/}\"], timeout_s 330, command: bash tools/gpu-check.sh run; then bash tools/gpu-check.sh unslim"
}

# ---- run (there) -------------------------------------------------------------------
# Each phase: id, cap (s), optional (1: skipped when less than its cap is left; 0: cut
# to the time left), name. Debug reruns of failures come out of the same budget.
PHASES="probe 25 0 start-up probe (PN_REQUIRE_CUDA=1)
parity 70 0 op parity CUDA vs CPU (one process per test)
e2e 50 0 e2e logits CUDA vs CPU on every fixture
bench 65 1 full-dims q4_k_m: pn synth + pn bench cuda:0
batch 35 1 pn batch cuda:0, 16 slots
split 40 1 split on one GPU: e2e cuda:0+cuda:1, pn bench"
INFO_CAP=10 # the environment log before the phases

plan() {
    local id cap opt name sum=$INFO_CAP
    printf '%-8s %5s  %-8s %s\n' id cap kind phase
    printf '%-8s %5s  %-8s %s\n' info "$INFO_CAP" required "manifest, nvidia-smi, driver, nvcc, ldd, ldconfig, cuobjdump"
    while read -r id cap opt name; do
        printf '%-8s %5s  %-8s %s\n' "$id" "$cap" "$([ "$opt" = 1 ] && echo optional || echo required)" "$name"
        sum=$((sum + cap))
    done <<<"$PHASES"
    echo "sum of caps ${sum}s; budget ${GPU_CHECK_BUDGET:-300}s; debug reruns of a failure: 30 s graphs off + 60 s compute-sanitizer, from the budget"
}

T0=$SECONDS
RESULTS=()
FAILED=0
WORK=/tmp/gpu-check

left() { echo $((BUDGET - (SECONDS - T0) - 5)); }
note() { RESULTS+=("$*"); }

# `timeout` around one command, output to the terminal and appended to $WORK/ID.txt.
capped() {
    local id="$1" limit="$2" rc=0
    shift 2
    timeout --kill-after=5 "$limit" "$@" 2>&1 | tee -a "$WORK/$id.txt" || rc=$?
    return "$rc"
}

# One phase: run its function under its cap (see PHASES); records the result.
phase() {
    local id="$1" cap="$2" opt="$3" name="$4" rc=0 t dt limit
    if [ -n "${GPU_CHECK_PHASES:-}" ] && [ "$id" != probe ] && [[ ",$GPU_CHECK_PHASES," != *",$id,"* ]]; then
        return 0
    fi
    limit=$(left)
    if [ "$opt" = 1 ] && [ "$limit" -lt "$cap" ]; then
        note "SKIPPED  $name (${limit}s left, cap ${cap}s)"
        return 0
    fi
    [ "$limit" -gt "$cap" ] && limit=$cap
    if [ "$limit" -lt 5 ]; then
        note "SKIPPED  $name (budget spent)"
        FAILED=1
        return 0
    fi
    echo
    echo "== [$id] $name (cap ${limit}s, $(( SECONDS - T0 ))s into the run) =="
    t=$SECONDS
    PHASE_END=$((SECONDS + limit))
    "phase_$id" || rc=$?
    dt=$((SECONDS - t))
    case "$rc" in
        0) note "pass     $name (${dt}s)" ;;
        124 | 137) note "TIMEOUT  $name (${dt}s)"; FAILED=1 ;;
        *) note "FAIL     $name (rc $rc, ${dt}s)"; FAILED=1 ;;
    esac
}

phase_left() { echo $((PHASE_END - SECONDS)); }

# A failing test (exit status `rc`), once more with graphs off and synchronous launches,
# then, for the run's first failure that was not a timeout, under compute-sanitizer
# memcheck: what a one-shot debug needs.
MEMCHECKED=0
debug_test() {
    local id="$1" bin="$2" test="$3" rc="$4" lim
    lim=$(left); [ "$lim" -gt 30 ] && lim=30
    if [ "$lim" -ge 5 ]; then
        echo "-- rerun $test with PN_CUDA_GRAPHS=0 CUDA_LAUNCH_BLOCKING=1 (${lim}s)"
        if PN_CUDA_GRAPHS=0 CUDA_LAUNCH_BLOCKING=1 capped "$id-debug" "$lim" "$bin" --exact "$test" --nocapture --test-threads 1; then
            note "  debug  $test passes with graphs off + blocking launches"
        else
            note "  debug  $test fails with graphs off + blocking launches too"
        fi
    fi
    lim=$(left); [ "$lim" -gt 60 ] && lim=60
    if [ "$MEMCHECKED" = 1 ] || [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        return 0
    fi
    MEMCHECKED=1
    if ! command -v compute-sanitizer >/dev/null; then
        note "  debug  no compute-sanitizer"
    elif [ "$lim" -ge 10 ]; then
        echo "-- $test under compute-sanitizer --tool memcheck (${lim}s)"
        rc=0
        capped "$id-memcheck" "$lim" compute-sanitizer --tool memcheck --print-limit 20 --error-exitcode 86 \
            "$bin" --exact "$test" --nocapture --test-threads 1 || rc=$?
        case "$rc" in
            0) note "  debug  memcheck clean on $test (it passed under the sanitizer)" ;;
            86) note "  debug  memcheck found errors in $test (see $id-memcheck.txt)" ;;
            *) note "  debug  memcheck on $test: rc $rc (see $id-memcheck.txt)" ;;
        esac
    fi
}

# Every test of `bin` in its own process, so one device
# fault does not take the others with it; failures debugged (the first two).
each_test() {
    local id="$1" bin="$2" t lim rc failed=() codes=() notrun=0 n=0 i
    for t in $("$bin" --list --format terse 2>/dev/null | sed -n 's/: test$//p'); do
        lim=$(phase_left); [ "$lim" -gt 45 ] && lim=45
        if [ "$lim" -lt 3 ]; then note "  NOT RUN $t (phase cap)"; notrun=$((notrun + 1)); continue; fi
        n=$((n + 1)); rc=0
        echo "-- $t (${lim}s)"
        capped "$id" "$lim" "$bin" --exact "$t" --nocapture --test-threads 1 || rc=$?
        [ "$rc" = 0 ] || { note "  FAIL   $t (rc $rc)"; failed+=("$t"); codes+=("$rc"); }
    done
    echo "$id: $n tests run, ${#failed[@]} failed, $notrun not run"
    [ "$n" -gt 0 ] || return 1
    for i in "${!failed[@]}"; do
        [ "$i" -lt 2 ] && debug_test "$id" "$bin" "${failed[$i]}" "${codes[$i]}"
    done
    [ "${#failed[@]}" = 0 ] && [ "$notrun" = 0 ]
}

# (libtest prints "test device_starts ... " before the test's own output: no ^ anchor)
phase_probe() {
    local want='device present: [^()]+ \(sm_[0-9]+\)$'
    capped probe "$(phase_left)" "$B/bin/device_start" --exact device_starts --nocapture --test-threads 1 || return $?
    if [ "$DRY" = 1 ]; then
        grep -q 'no CUDA device: device_starts skipped' "$WORK/probe.txt" || grep -Eq "$want" "$WORK/probe.txt"
    else
        grep -Eq "$want" "$WORK/probe.txt" || { say "the probe did not print 'device present: <name> (sm_XX)'"; return 1; }
    fi
}

phase_parity() { each_test parity "$B/bin/gpu_parity"; }

phase_e2e() {
    local t=cuda_matches_cpu_on_every_fixture rc=0
    [ "$DRY" = 1 ] && t=harness_runs_without_a_device # the same comparison, reference for CUDA
    capped e2e "$(phase_left)" "$B/bin/gpu_e2e" --exact "$t" --nocapture --test-threads 1 || rc=$?
    [ "$rc" = 0 ] && return 0
    debug_test e2e "$B/bin/gpu_e2e" "$t" "$rc"
    return "$rc"
}

phase_bench() {
    local lim
    capped bench "$(phase_left)" "$PN" synth --preset "$PRESET" --type "$TYPE" --seed 1 --out "$MODEL" || return $?
    lim=$(phase_left); [ "$lim" -ge 5 ] || return 124
    capped bench "$lim" "$PN" bench --model "$MODEL" --dies "$DIE" --prompt-len 512 --gen 128 --reps 2
}

phase_batch() {
    [ -s "$MODEL" ] || { say "no $MODEL (the bench phase makes it)"; return 1; }
    local i
    for i in $(seq 1 16); do echo "prompt $i: the quick brown fox number $i jumps over"; done >"$WORK/prompts.txt"
    # the 16 JSON lines of text dropped; the aggregate tok/s is on stderr
    # shellcheck disable=SC2016 # expanded by the inner shell
    capped batch "$(phase_left)" bash -c '"$0" batch --model "$1" --dies "$2" --slots 16 -n 64 --ignore-eos --prompts-file "$3" >/dev/null' \
        "$PN" "$MODEL" "$DIE" "$WORK/prompts.txt"
}

phase_split() {
    local rc=0 lim
    lim=$(phase_left); [ "$lim" -gt 25 ] && lim=25
    capped split "$lim" "$B/bin/gpu_e2e" --exact cuda_split_on_one_device_matches_cpu --nocapture --test-threads 1 || rc=$?
    if [ -s "$MODEL" ]; then
        lim=$(phase_left); [ "$lim" -ge 5 ] || return 124
        PN_CUDA_DEVICE_MAP=0,0 capped split "$lim" "$PN" bench --model "$MODEL" --dies "$DIES2" --prompt-len 128 --gen 64 --reps 1 || rc=$?
    fi
    return "$rc"
}

# Where cudarc looks for NVRTC (libnvrtc.so, .so.12, .so.11, ...: never .so.13): with
# the CUBINs bundled it is not needed; as a fallback, the first libnvrtc.so.12 / .so.13
# found is linked as libnvrtc.so in a folder appended to LD_LIBRARY_PATH.
nvrtc_fallback() {
    local d f site v
    local dirs=(${PN_NVRTC_DIR:+"$PN_NVRTC_DIR"} /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-*/lib64)
    for site in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null) /opt/torch/.venv/lib/python3*/site-packages; do
        dirs+=("$site"/nvidia/*/lib)
    done
    for f in libnvrtc.so.12 libnvrtc.so.13; do
        for d in "${dirs[@]}"; do
            [ -e "$d/$f" ] || continue
            mkdir -p "$WORK/nvrtc"
            ln -sf "$(readlink -f "$d/$f")" "$WORK/nvrtc/libnvrtc.so"
            ln -sf "$d"/libnvrtc-builtins.so* "$WORK/nvrtc/" 2>/dev/null || true
            export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$WORK/nvrtc:$d"
            v="$(python3 -c 'import ctypes as c; l = c.CDLL("libnvrtc.so"); a, b = c.c_int(), c.c_int(); l.nvrtcVersion(c.byref(a), c.byref(b)); print(f"{a.value}.{b.value}")' 2>&1 | tail -n 1)"
            echo "NVRTC fallback: $d/$f linked as $WORK/nvrtc/libnvrtc.so (appended to LD_LIBRARY_PATH); dlopen(libnvrtc.so): NVRTC $v"
            return 0
        done
    done
    echo "NVRTC fallback: no libnvrtc.so.12 / .so.13 found (the bundled CUBINs must do)"
}

# What a one-shot debug needs, each command capped.
info() {
    local c f
    echo "== environment =="
    cat "$B/MANIFEST"
    echo "-- $(uname -a)"
    for c in "nvidia-smi" "nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total,clocks.max.sm --format=csv" \
        "cat /proc/driver/nvidia/version" "nvcc --version" "compute-sanitizer --version"; do
        echo "-- $c"
        # shellcheck disable=SC2086 # the command's words
        timeout 5 $c 2>&1 || echo "(failed: $c)"
    done
    echo "-- ldconfig -p | grep -E 'libcuda|libnvrtc'"
    ldconfig -p 2>/dev/null | grep -E 'libcuda|libnvrtc' || echo "(none)"
    for f in "$B"/bin/*; do echo "-- ldd $f"; ldd "$f" 2>&1; done
    echo "-- cuobjdump --dump-resource-usage (sm_90 CUBINs)"
    if command -v cuobjdump >/dev/null; then
        for f in "$B"/cubin/sm_90/*.cubin; do
            timeout 5 cuobjdump --dump-resource-usage "$f" 2>&1 | grep -E 'Function|REG|SHARED' || echo "(failed: $f)"
        done
    else
        echo "(no cuobjdump)"
    fi
    echo "-- env: PN_CUDA_CACHE=$PN_CUDA_CACHE LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-} PN_REQUIRE_CUDA=${PN_REQUIRE_CUDA:-} PN_E2E_MODELS=$PN_E2E_MODELS"
}

# pn bench's JSON line in $WORK/ID.txt, as "prefill X tok/s, decode Y tok/s".
tok_s() { sed -n 's/.*"pp_tok_s":\([0-9.]*\).*"tg_tok_s":\([0-9.]*\).*/prefill \1 tok\/s, decode \2 tok\/s/p' "$WORK/$1.txt" 2>/dev/null | tail -n 1; }

summary() {
    local worst
    echo
    echo "== summary ($((SECONDS - T0))s of ${BUDGET}s) =="
    printf '%s\n' "${RESULTS[@]}"
    echo "-- numbers"
    worst="$(grep -ohE 'nmse [0-9.e+-]+' "$WORK/parity.txt" 2>/dev/null | sort -k2 -g | tail -n 1)"
    echo "parity: $(grep -cE ' nmse ' "$WORK/parity.txt" 2>/dev/null) nmse cases, worst ${worst:-n/a}"
    grep -hE 'graph selftest:|graphs: ' "$WORK/parity.txt" 2>/dev/null || true
    grep -hE '^e2e |  rows ' "$WORK/e2e.txt" "$WORK/split.txt" 2>/dev/null | grep -v ': prompt ' || echo "e2e: no numbers"
    echo "bench $DIE $PRESET $TYPE p512/g128: $(tok_s bench)"
    echo "batch $DIE 16 slots: $(grep -ohE '[0-9.]+ tok/s aggregate' "$WORK/batch.txt" 2>/dev/null | tail -n 1)"
    echo "split $DIES2 p128/g64: $(tok_s split)"
}

run_all() {
    DRY="${GPU_CHECK_DRY:-0}" DIE=cuda:0 DIES2=cuda:0,cuda:1
    PN="$B/bin/pn" PRESET="${GPU_CHECK_PRESET:-full-dims}" TYPE="${GPU_CHECK_TYPE:-q4_k_m}"
    rm -rf "$WORK" && mkdir -p "$WORK"
    MODEL="$WORK/$PRESET-$TYPE.gguf"
    say "$(date -u +%FT%TZ), budget ${BUDGET}s, bundle $(head -n 1 "$B/MANIFEST" 2>/dev/null || echo missing)"
    [ -f "$B/MANIFEST" ] || { say "FAILED: no bundle at $B (build it where Rust is: bash tools/gpu-check.sh bundle)"; return 1; }
    chmod +x "$B"/bin/* # the carry may drop the mode bits
    export RUST_BACKTRACE=1 PN_CUDA_CACHE="$B/cubin"
    if [ "$DRY" = 1 ]; then
        say "GPU_CHECK_DRY=1: no device needed (the tests skip, pn on cpu:0 with the small preset)"
        DIE=cpu:0 DIES2=cpu:0,cpu:1 PRESET="${GPU_CHECK_PRESET:-small}"
        MODEL="$WORK/$PRESET-$TYPE.gguf"
    else
        export PN_REQUIRE_CUDA=1
    fi
    # e2e models: the checkout's fixtures when they travelled, else the bundle's
    if ls "$ROOT"/tests/fixtures/*.gguf >/dev/null 2>&1; then
        export PN_E2E_MODELS="$ROOT/tests/fixtures:$ROOT/models/default"
    else
        export PN_E2E_MODELS="$B/fixtures"
    fi
    nvrtc_fallback
    timeout "$INFO_CAP" bash -c "$(declare -f info); B='$B' PN_E2E_MODELS='$PN_E2E_MODELS' info" >"$WORK/info.txt" 2>&1 || echo "(environment log cut at ${INFO_CAP}s)" >>"$WORK/info.txt"
    cat "$WORK/info.txt"
    local id cap opt name
    while read -r id cap opt name; do
        phase "$id" "$cap" "$opt" "$name"
        if [ "$id" = probe ] && [ "${RESULTS[-1]:0:4}" != pass ]; then
            note "STOPPED  the device did not start: no other phase can pass"
            break
        fi
    done <<<"$PHASES"
    summary
    return "$FAILED"
}

run() {
    BUDGET="${GPU_CHECK_BUDGET:-300}"
    OUT="${OUT:-/tmp/gpu-check-out}"
    mkdir -p "$OUT"
    local rc=0 log="$OUT/gpu-check.log" keep
    keep="docs/gpu/gpu-check-$(date -u +%F).log"
    run_all 2>&1 | tee "$log" || rc=$?
    sed -n '/^== summary/,$p' "$log" >"$OUT/summary.txt"
    tar -C "$WORK" --exclude="*.gguf" --exclude=nvrtc -czf "$OUT/phases.tar.gz" . 2>/dev/null || true
    {
        if [ "$rc" = 0 ]; then say "PASSED"; else say "FAILED (rc $rc)"; fi
        say "log: $log (summary.txt, phases.tar.gz beside it); commit it as $keep"
    } | tee -a "$log" "$OUT/summary.txt"
    return "$rc"
}

# ---- slim / unslim (here, around the device call) ----------------------------------

slim() {
    local ex
    ex="$(git -C "$ROOT" rev-parse --path-format=absolute --git-path info/exclude)"
    mkdir -p "$(dirname "$ex")" && touch "$ex"
    if grep -qF "$SLIM_MARK" "$ex"; then say "already slim"; return; fi
    # shellcheck disable=SC2086
    git -C "$ROOT" rm -r -q --cached $SLIM_DIRS
    { echo "$SLIM_MARK"; for d in $SLIM_DIRS; do echo "/$d/"; done; echo "# gpu-check-slim end"; } >>"$ex"
    say "slim: $SLIM_DIRS out of the index (still on disk); $(tree_mib) MiB travel. DO NOT COMMIT; run 'bash tools/gpu-check.sh unslim' after the device call"
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
    plan) plan ;;
    slim) slim ;;
    unslim) unslim ;;
    *) echo "usage: $0 bundle|run|plan|slim|unslim   (see the header of this script)" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# Speculative decoding benchmarks (docs/speculative.md): greedy decode tok/s without and
# with drafts side by side (pn bench --draft), and the cost of verify passes of 2/4/8
# tokens against a 1-token step (--verify-cost). 2 threads. Wrap in /work/bench-quiet.sh.
# Usage: bench/spec_bench.sh default|FILE.gguf [gen]
set -euo pipefail
cd "$(dirname "$0")/.."
PN=${PN:-target/release/pn}
M=$1; GEN=${2:-128}
model=(); [ "$M" = default ] || model=(--model "$M")
b() { "$PN" bench "${model[@]}" -t 2 --gen "$GEN" --reps 2 "$@"; }
b --verify-cost --prompt-file bench/spec-prompt-code.txt
for d in "mtp 1" "mtp 2" "mtp 3" "lookup 3"; do
  set -- $d
  b --draft "$1" --draft-n "$2" --prompt-file bench/spec-prompt-code.txt || true
done
for n in 3 6; do
  b --draft lookup --draft-n "$n" --prompt-file bench/spec-prompt-repeat.txt
done

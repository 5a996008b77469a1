#!/usr/bin/env bash
# Session 26 on the AMD EPYC Zen 3 (AVX2) box, as session 21 on the Xeon (issue 20): the delta rule's chunked form (PN_DELTA_CHUNKED_FROM=1) against the
# recurrence (default) at 512 and 4096 tokens a pass, full-dims q4_k_m, DeltaRule's time
# from the per-op profile, alternated twice. Also the logits' agreement is covered by
# tests/state.rs (the chunked form stays off: docs/perf.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
for r in 1 2; do
  for t in 512 4096; do
    for c in rec chunked; do
      env=(); [ $c = chunked ] && env=(PN_DELTA_CHUNKED_FROM=1)
      line=$(env "${env[@]}" PN_DEBUG=2 PN_PROFILE=nodes target/release/pn bench --model /tmp/fd.gguf --prompt-len $t --gen 1 --reps 1 --ubatch $t -t 2 2>&1 | grep "DeltaRule attn_output")
      echo "round $r T=$t $c: $line"
    done
  done
done

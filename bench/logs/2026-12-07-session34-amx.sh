#!/usr/bin/env bash
# Session 34 on an Intel Xeon family 6 model 207 VM that, unlike sessions 29-33's, exposes
# AMX (amx_tile, amx_int8, amx_bf16; Linux grants the tile permission): pn's many-token
# K-quant and Q8_0 products take the AMX tiles (ops/src/quant/x86_amx*.rs), the peers are
# built as in sessions 29-33 (llama.cpp 0.3.36 with AMX off, ik_llama.cpp natively by
# ik_setup.sh). Session 29's script unchanged: all three engines on full-dims q4_k_m, the
# K table, the other full-dims files, real-dims q4_k_m, decode against the read probe.
set -euo pipefail
exec bash "$(dirname "$0")/2026-12-07-session29-xeon.sh" "$@"

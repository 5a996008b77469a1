#!/usr/bin/env bash
# pn serve vs llama.cpp's llama-server under bench/serve/loadtest.py, one after the other in
# one run, on the same GGUF, 16 slots each, loopback only: 1, 16 and 64 streaming clients.
# usage: bench/serve/compare.sh PN_BINARY LLAMA_SERVER_BINARY [SECONDS_PER_PHASE] [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
PN=$1 LLAMA=$2 SECS=${3:-20} OUT=${4:-/tmp/pn-compare}
MODEL=models/default/pn-default-code-q4_k_m.gguf
mkdir -p "$OUT"
wait_health() {
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$1/health" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "no /health on port $1" >&2; return 1
}
run() {  # NAME PORT PID
  wait_health "$2"
  python3 bench/serve/loadtest.py "http://127.0.0.1:$2" --pid "$3" --server "$1" --clients 1,16,64 \
    --seconds "$SECS" --warmup 5 --requests 100000 --max-tokens 64 --json "$OUT/$1.json" > "$OUT/$1.log" 2>&1 || true
  kill "$3"; wait "$3" 2>/dev/null || true
  tail -4 "$OUT/$1.log"
}
PN_PREFIX_CACHE_MB=16 "$PN" serve --port 18561 --model "$MODEL" --slots 16 --ctx 1024 > "$OUT/pn.server.log" 2>&1 &
run pn 18561 $!
"$LLAMA" -m "$MODEL" --host 127.0.0.1 --port 18562 -np 16 -t 2 -c 16384 --metrics > "$OUT/llama.server.log" 2>&1 &
run llama 18562 $!

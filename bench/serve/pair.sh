#!/usr/bin/env bash
# Two servers on the same GGUF, one after the other, under bench/serve_bench.py (N streaming
# clients x R greedy completions of T tokens, ignore_eos): one JSON line each.
# usage: bench/serve/pair.sh MODEL CLIENTS REQUESTS TOKENS LABEL1 'CMD1' LABEL2 'CMD2'
#   each CMD is a server command line with {model} and {port} in it, e.g.
#   'target/release/pn serve --model {model} --port {port} --slots 16 --ctx 1024'
#   '~/.cache/pn-oracle/llama/bin/llama-server -m {model} --port {port} -np 16 -t 2 -c 16384'
# Wrap it in /work/bench-quiet.sh on a shared machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=$1 CLIENTS=$2 REQS=$3 TOKENS=$4
shift 4
port=18571
while [ $# -ge 2 ]; do
  label=$1 cmd=${2//\{model\}/$MODEL}
  cmd=${cmd//\{port\}/$port}
  shift 2
  # exec: $! is the server itself (killed below), and fd 9 (bench-quiet's lock) is not
  # inherited, so a server left behind cannot hold the lock
  ( exec 9>&-; eval "exec $cmd" ) > "/tmp/pn-pair-$label.log" 2>&1 &
  pid=$!
  for _ in $(seq 1200); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
    sleep 0.1
  done
  python3 bench/serve_bench.py "http://127.0.0.1:$port" --clients "$CLIENTS" --requests "$REQS" --max-tokens "$TOKENS" --label "$label" || echo "{\"label\": \"$label\", \"error\": \"bench failed\"}"
  kill "$pid"; wait "$pid" 2>/dev/null || true
  port=$((port + 1))
done

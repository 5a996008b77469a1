#!/usr/bin/env bash
# KV-format quality benchmark (docs/kv-cache.md): our f16 / q8_0 / q4_0 KV against our f32
# KV, and llama.cpp's q8_0 / q4_0 KV against llama.cpp's f32 KV, on N random token ids.
#
#   bench/kv_quality.sh [MODEL.gguf] [N]      (default: the ktiny-q4_k_m fixture, 2048)
#
# Needs the llama.cpp oracle venv (~/.cache/pn-oracle/venv, shared/oracle/setup.sh) for
# the llama.cpp rows; without it only our rows are printed. SWEEP=1 adds the q4_0
# sink/window sweep. Output: /tmp/kvq/<name>.md.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-tests/fixtures/ktiny-q4_k_m.gguf}
N=${2:-2048}
NAME=$(basename "$MODEL" .gguf)
OUT=/tmp/kvq/$NAME
mkdir -p "$OUT"
PY=${PN_ORACLE_PY:-$HOME/.cache/pn-oracle/venv/bin/python}
ORACLE=${PN_ORACLE:-../shared/oracle/llama_oracle.py}
[ -f "$ORACLE" ] || ORACLE=/work/shared/oracle/llama_oracle.py

run_ours() {
  PN_KVQ_MODEL="$MODEL" PN_KVQ_N="$N" PN_KVQ_TOKENS_OUT="$OUT/tokens" PN_KVQ_SWEEP="${SWEEP:-}" \
  PN_KVQ_LLAMA="${1:-}" PN_KVQ_OUT="$OUT.md" \
    cargo test --release -q -p pn-tests --test kv_quality kv_quality -- --exact --ignored --nocapture
}

if [ -x "$PY" ]; then
  # the token ids first (our run writes them), then llama.cpp's logits for each KV type
  PN_KVQ_N=1 true
  run_ours >/dev/null 2>&1 || true
  for t in f32 q8_0 q4_0; do
    [ -f "$OUT/$t.json" ] || "$PY" "$ORACLE" logits "$MODEL" --tokens "$(cat "$OUT/tokens")" \
      --ctx $((N + 16)) --kv-type $t --out "$OUT/$t.json"
  done
  run_ours "$OUT"
else
  echo "no llama.cpp oracle at $PY: our formats only" >&2
  run_ours
fi
echo "table: $OUT.md"

#!/usr/bin/env bash
# serve figures for issue 21: pn at 1/4/16 clients on both models, llama-server pair at 16.
PN=$1 LOG=$2
cd /work/main
exec > >(tee -a "$LOG") 2>&1
DEF=/work/shared/models/pn-default-code-q4_k_m.gguf
echo "=== serve final $(date -u +%FT%TZ) pn=$PN load $(cut -d' ' -f1-3 /proc/loadavg)"
for m in "$DEF 2 128" "/tmp/fd.gguf 2 64"; do
  set -- $m
  for c in 1 4; do
    echo "--- $1 clients=$c requests=$2 tokens=$3"
    bash bench/serve/pair.sh $1 $c $2 $3 pn "$PN serve --model {model} --port {port} --slots 16 --ctx 1024"
  done
done
echo "--- default model, 16 clients x 2 x 128: llama-server vs pn"
bash bench/serve/pair.sh $DEF 16 2 128 \
  llama "$HOME/.cache/pn-oracle/llama/bin/llama-server -m {model} --host 127.0.0.1 --port {port} -np 16 -t 2 -c 16384" \
  pn "$PN serve --model {model} --port {port} --slots 16 --ctx 1024"
for shape in "16 1 64" "16 2 128"; do
  echo "--- fd.gguf round 2, $shape: llama-server vs pn"
  bash bench/serve/pair.sh /tmp/fd.gguf $shape \
    llama "$HOME/.cache/pn-oracle/llama/bin/llama-server -m {model} --host 127.0.0.1 --port {port} -np 16 -t 2 -c 16384" \
    pn "$PN serve --model {model} --port {port} --slots 16 --ctx 1024"
done
echo "=== done $(date -u +%FT%TZ)"

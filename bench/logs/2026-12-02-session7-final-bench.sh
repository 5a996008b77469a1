#!/usr/bin/env bash
# Final side-by-side run: /work/final-bench.sh NEW_PN BASE_PN LOG [parts]
# parts (default all): three fd256 quants kslots serve spec
set -uo pipefail
NEW=$1 BASE=$2 LOG=$3; shift 3
PARTS=${*:-three fd256 quants kslots serve spec}
cd /work/main
V=$HOME/.cache/pn-oracle/venv/bin/python
O=/work/shared/oracle
DEF=/work/shared/models/pn-default-code-q4_k_m.gguf
exec > >(tee -a "$LOG") 2>&1
echo "=== final bench $(date -u +%FT%TZ) new=$NEW base=$BASE; $(grep -m1 'model name' /proc/cpuinfo); load $(cut -d' ' -f1-3 /proc/loadavg)"
has() { [[ " $PARTS " == *" $1 "* ]]; }
if has three; then
  for r in 1 2; do
    echo "--- round $r: three engines, fd.gguf (new)"; PN=$NEW REPS=3 bash bench/compare.sh /tmp/fd.gguf 2
    echo "--- round $r: base pn on fd.gguf"
    for pl in 128 512; do $BASE bench --model /tmp/fd.gguf --prompt-len $pl --gen 32 --threads 2 --reps 3 | tail -1; done
  done
fi
if has fd256; then
  echo "--- fd256 (8 layers, 256 experts): three engines (new) + base"
  PN=$NEW REPS=2 bash bench/compare.sh /tmp/fd256.gguf 2
  for pl in 128 512; do $BASE bench --model /tmp/fd256.gguf --prompt-len $pl --gen 32 --threads 2 --reps 2 | tail -1; done
fi
if has quants; then
  for q in q8_0 q5_k_m iq4_xs; do echo "--- fd-$q: three engines (new)"; PN=$NEW REPS=2 bash bench/compare.sh /tmp/fd-$q.gguf 2; done
fi
if has kslots; then
  for m in /tmp/fd.gguf $DEF; do
    echo "--- K table on $m"
    $V $O/llama_bench_batch.py $m --seqs 1,2,4,8,16 --prompt-len 32 --gen 32 --threads 2
    for K in 1 2 4 8 16; do
      echo "new K=$K $($NEW bench --model $m --slots $K --prompt-len 32 --gen 32 --threads 2 | tail -1)"
      echo "base K=$K $($BASE bench --model $m --slots $K --prompt-len 32 --gen 32 --threads 2 | tail -1)"
    done
    echo "new single $($NEW bench --model $m --prompt-len 32 --gen 32 --threads 2 --reps 3 | tail -1)"
  done
fi
if has serve; then
  for shape in "16 1 64" "16 2 128"; do
    echo "--- serve pair fd.gguf, clients/requests/tokens = $shape"
    bash bench/serve/pair.sh /tmp/fd.gguf $shape \
      llama "$HOME/.cache/pn-oracle/llama/bin/llama-server -m {model} --host 127.0.0.1 --port {port} -np 16 -t 2 -c 16384" \
      pn "$NEW serve --model {model} --port {port} --slots 16 --ctx 1024"
  done
fi
if has spec; then
  echo "--- spec bench, default model"
  PN=$NEW bash bench/spec_bench.sh default 128 2>&1 | tail -20
fi
echo "=== done $(date -u +%FT%TZ)"

# Session 18 (round 1 at build d0da06d^, rounds 2-3 at the final build): K table, full-dims q4_k_m and the built-in model, K = 1/2/4/8/16, one round:
# llama.cpp's llama_bench_batch.py then pn bench --slots K (agg_tg_tok_s), then single-sequence pn bench.
cd /work/main
git log --oneline | head -1
D=models/default/pn-default-code-q4_k_m.gguf
for round in 1 2; do for m in /tmp/fd.gguf; do
  echo "-- $m"
  ( . ~/.cache/pn-oracle/venv/bin/activate; python ../shared/oracle/llama_bench_batch.py $m --seqs 1,4,16 --prompt-len 32 --gen 32 --threads 2 2>&1 | grep "agg_tg" )
  for k in 1 4 16; do echo -n "pn K=$k "; target/release/pn bench -q -m $m --slots $k --prompt-len 32 --gen 32 --threads 2 2>&1 | tail -1; done
  echo -n "pn single "; target/release/pn bench -q -m $m --prompt-len 32 --gen 32 --threads 2 2>&1 | tail -1
done; done
echo DONE

# Session 16 (delta-rule state prefetch): full-dims q4_k_m, K = 4 and 16, llama.cpp's llama_bench_batch.py
# then pn bench --slots K, three rounds in turn; agg_tg_tok_s.
cd /work/main
git log --oneline | head -1
for round in 1 2; do
  echo "-- round $round"
  ( . ~/.cache/pn-oracle/venv/bin/activate; python ../shared/oracle/llama_bench_batch.py /tmp/fd.gguf --seqs 4,16 --prompt-len 32 --gen 32 --threads 2 2>&1 | grep "agg_tg" )
  for k in 4 16; do echo -n "pn K=$k "; target/release/pn bench -q -m /tmp/fd.gguf --slots $k --prompt-len 32 --gen 32 --threads 2 2>&1 | tail -1; done
done
echo DONE

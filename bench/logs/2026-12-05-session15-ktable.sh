# Session 15: K = 1/2/4/8/16 with lanes (the default model: two one-thread lanes for a
# pass of several sequences; full-dims: one pass, file > 64 MB), llama.cpp's
# llama_bench_batch.py then pn bench --slots K (default model also PN_LANES=0), two
# rounds in turn; agg_tg_tok_s.
cd /work/main
git log --oneline | head -1
D=models/default/pn-default-code-q4_k_m.gguf
for round in 1 2; do
  echo "-- round $round: default model"
  ( . ~/.cache/pn-oracle/venv/bin/activate; python ../shared/oracle/llama_bench_batch.py $D --seqs 1,2,4,8,16 --prompt-len 32 --gen 128 --threads 2 2>&1 | grep "agg_tg" )
  for k in 1 2 4 8 16; do
    echo -n "pn K=$k "; target/release/pn bench -q --slots $k --prompt-len 32 --gen 128 --threads 2 2>&1 | tail -1
    echo -n "pn PN_LANES=0 K=$k "; PN_LANES=0 target/release/pn bench -q --slots $k --prompt-len 32 --gen 128 --threads 2 2>&1 | tail -1
  done
  echo -n "pn bench one sequence "; target/release/pn bench -q --prompt-len 32 --gen 128 --threads 2 --reps 3 2>&1 | tail -1
  echo "-- round $round: full-dims q4_k_m"
  ( . ~/.cache/pn-oracle/venv/bin/activate; python ../shared/oracle/llama_bench_batch.py /tmp/fd.gguf --seqs 1,4,16 --prompt-len 32 --gen 32 --threads 2 2>&1 | grep "agg_tg" )
  for k in 1 4 16; do echo -n "pn K=$k "; target/release/pn bench -q -m /tmp/fd.gguf --slots $k --prompt-len 32 --gen 32 --threads 2 2>&1 | tail -1; done
  echo -n "pn bench one sequence "; target/release/pn bench -q -m /tmp/fd.gguf --prompt-len 32 --gen 32 --threads 2 --reps 3 2>&1 | tail -1
done
echo DONE

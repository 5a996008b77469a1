# Session 18, final build: the built-in model's K table (issue 15: >= llama.cpp at every K),
# llama_bench_batch.py then pn bench --slots K (agg_tg_tok_s), two rounds.
cd /work/main
git log --oneline | head -1
D=models/default/pn-default-code-q4_k_m.gguf
for round in 1 2; do
  ( . ~/.cache/pn-oracle/venv/bin/activate; python ../shared/oracle/llama_bench_batch.py $D --seqs 1,4,16 --prompt-len 32 --gen 32 --threads 2 2>&1 | grep "agg_tg" )
  for k in 1 4 16; do echo -n "pn K=$k "; target/release/pn bench -q -m $D --slots $k --prompt-len 32 --gen 32 --threads 2 2>&1 | tail -1; done
done

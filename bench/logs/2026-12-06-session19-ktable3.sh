# Session 19, final build: a third K-table round on full-dims q4_k_m and one on the built-in
# model (llama_bench_batch.py --seqs 1,4,16 then pn bench --slots K, then single-sequence pn bench).
cd /work/main
git log --oneline | head -1
D=models/default/pn-default-code-q4_k_m.gguf
for m in /tmp/fd.gguf $D; do
  echo "-- $m"
  ( . ~/.cache/pn-oracle/venv/bin/activate; python ../shared/oracle/llama_bench_batch.py $m --seqs 1,4,16 --prompt-len 32 --gen 32 --threads 2 2>&1 | grep "agg_tg" )
  for k in 1 4 16; do echo -n "pn K=$k "; target/release/pn bench -q -m $m --slots $k --prompt-len 32 --gen 32 --threads 2 2>&1 | tail -1; done
  echo -n "pn single "; target/release/pn bench -q -m $m --prompt-len 32 --gen 32 --threads 2 2>&1 | tail -1
done
echo DONE

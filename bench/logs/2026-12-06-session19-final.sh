# Session 19, final build: (1) the three engines on full-dims q4_k_m, two rounds;
# (2) the K table (llama_bench_batch.py --seqs 1,4,16 then pn bench --slots K), two rounds;
# (3) the three engines on full-dims q8_0, q5_k_m and iq4_xs (pn synth --preset full-dims
# --type T --seed 1), one round each. Intel Xeon 6/207 (AVX-512 VNNI, AMX), 2 vCPUs, --threads 2.
cd /work/main
git log --oneline | head -1
ROUNDS=2 REPS=2 bash bench/compare.sh /tmp/fd.gguf 2
for round in 1 2; do m=/tmp/fd.gguf
  echo "-- K table round $round"
  ( . ~/.cache/pn-oracle/venv/bin/activate; python ../shared/oracle/llama_bench_batch.py $m --seqs 1,4,16 --prompt-len 32 --gen 32 --threads 2 2>&1 | grep "agg_tg" )
  for k in 1 4 16; do echo -n "pn K=$k "; target/release/pn bench -q -m $m --slots $k --prompt-len 32 --gen 32 --threads 2 2>&1 | tail -1; done
  echo -n "pn single "; target/release/pn bench -q -m $m --prompt-len 32 --gen 32 --threads 2 2>&1 | tail -1
done
for t in q8_0 q5_k_m iq4_xs; do
  [ -f /tmp/fd-$t.gguf ] || target/release/pn synth --preset full-dims --type $t --seed 1 --out /tmp/fd-$t.gguf >/dev/null
  ROUNDS=1 REPS=2 bash bench/compare.sh /tmp/fd-$t.gguf 2
done
echo DONE

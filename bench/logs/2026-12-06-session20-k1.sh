# Session 20: issue 15's K = 1 target — `pn bench --slots 1` (the slots path) against
# single-sequence `pn bench`, full-dims q4_k_m, 6 alternated pairs (decode tok/s).
cd /work/main
git log --oneline | head -1
for i in 1 2 3 4 5 6; do
  s=$(target/release/pn bench -q -m /tmp/fd.gguf --slots 1 --prompt-len 32 --gen 64 --threads 2 | tail -1 | sed -E 's/.*"agg_tg_tok_s":([0-9.]+).*/\1/')
  b=$(target/release/pn bench -q -m /tmp/fd.gguf --prompt-len 32 --gen 64 --threads 2 | tail -1 | sed -E 's/.*"tg_tok_s":([0-9.]+).*/\1/')
  echo "pair $i: slots=1 $s, single $b, ratio $(awk "BEGIN{printf \"%.3f\", $s / $b}")"
done

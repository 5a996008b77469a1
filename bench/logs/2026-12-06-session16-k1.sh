# Session 16: K = 1 through the slots (pn bench --slots 1) vs single-sequence pn bench, alternated, full-dims q4_k_m.
cd /work/main
for i in 1 2 3 4; do
  echo -n "slots1 "; target/release/pn bench -q -m /tmp/fd.gguf --slots 1 --prompt-len 32 --gen 64 --threads 2 | python3 -c 'import json,sys; print(json.load(sys.stdin)["agg_tg_tok_s"])'
  echo -n "single "; target/release/pn bench -q -m /tmp/fd.gguf --prompt-len 32 --gen 64 --threads 2 | python3 -c 'import json,sys; print(json.load(sys.stdin)["tg_tok_s"])'
done

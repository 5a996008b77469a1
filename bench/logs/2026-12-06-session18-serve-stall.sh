# Session 18: a long prompt arriving while one stream drafts (pn serve --draft lookup,
# full-dims q4_k_m, 2 threads): the stream's inter-token gaps during the prefill, the
# build before (one whole 256-token chunk pass per round) and after (the step budget),
# alternated, two rounds each. /tmp/pn-old = 776d722, /tmp/pn-new = 1c9dcf5.
cd /work/main
for round in 1 2; do for b in old new; do
  /tmp/pn-$b serve -m /tmp/fd.gguf --port 8097 --draft lookup -t 2 > /tmp/serve-$b.log 2>&1 &
  P=$!; for i in $(seq 1 120); do curl -sf localhost:8097/health > /dev/null && break; sleep 1; done
  echo -n "$b: "; python3 bench/serve/stall.py --url http://127.0.0.1:8097 --prompt-lines 300 --gen 120
  kill $P; wait $P 2>/dev/null
done; done

# Session 15 (lanes): pn serve vs llama-server, 16 streaming clients (bench/serve/pair.sh),
# default model 16 x 2 x 128 tokens, nine pairs (pn with lanes, the default for this
# 13 MB file); then pn alone at 1 / 4 / 16 clients on the default model and full-dims
# q4_k_m; then one full-dims 16-stream pair.
cd /work/main
git log --oneline | head -1
M=models/default/pn-default-code-q4_k_m.gguf
for r in 1 2 3 4 5 6 7 8 9; do
  bench/serve/pair.sh $M 16 2 128 llama "$HOME/.cache/pn-oracle/llama/bin/llama-server -m {model} --port {port} -np 16 -t 2 -c 16384" pn "target/release/pn serve --model {model} --port {port} --slots 16 --ctx 1024" 2>&1 | grep tok_s
done
for spec in "models/default/pn-default-code-q4_k_m.gguf 2 128" "/tmp/fd.gguf 1 64"; do
  set -- $spec
  target/release/pn serve --model $1 --port 18620 --slots 16 --ctx 1024 > /tmp/pn-streams.log 2>&1 &
  pid=$!
  for _ in $(seq 600); do curl -sf http://127.0.0.1:18620/health >/dev/null 2>&1 && break; sleep 0.1; done
  for c in 1 4 16; do python3 bench/serve_bench.py http://127.0.0.1:18620 --clients $c --requests $2 --max-tokens $3 --label "pn $(basename $1) x$c"; done
  kill $pid; wait $pid 2>/dev/null
done
bench/serve/pair.sh /tmp/fd.gguf 16 1 64 llama "$HOME/.cache/pn-oracle/llama/bin/llama-server -m {model} --port {port} -np 16 -t 2 -c 16384" pn "target/release/pn serve --model {model} --port {port} --slots 16 --ctx 1024" 2>&1 | grep tok_s
echo DONE

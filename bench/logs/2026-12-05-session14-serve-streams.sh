# Session 14: pn serve at 1 / 4 / 16 streaming clients (bench/serve_bench.py), default model
# (2 requests x 128 tokens each) and full-dims q4_k_m (1 x 64), then four more default-model
# 16-stream pairs against llama-server (bench/serve/pair.sh).
cd /work/main
git log --oneline | head -1
for spec in "models/default/pn-default-code-q4_k_m.gguf 2 128" "/tmp/fd.gguf 1 64"; do
  set -- $spec
  target/release/pn serve --model $1 --port 18620 --slots 16 --ctx 1024 > /tmp/pn-streams.log 2>&1 &
  pid=$!
  for _ in $(seq 600); do curl -sf http://127.0.0.1:18620/health >/dev/null 2>&1 && break; sleep 0.1; done
  for c in 1 4 16; do python3 bench/serve_bench.py http://127.0.0.1:18620 --clients $c --requests $2 --max-tokens $3 --label "pn $(basename $1) x$c"; done
  kill $pid; wait $pid 2>/dev/null
done
M=models/default/pn-default-code-q4_k_m.gguf
for r in 1 2 3 4; do
  bench/serve/pair.sh $M 16 2 128 llama "$HOME/.cache/pn-oracle/llama/bin/llama-server -m {model} --port {port} -np 16 -t 2 -c 16384" pn "target/release/pn serve --model {model} --port {port} --slots 16 --ctx 1024" 2>&1 | grep tok_s
done
echo DONE

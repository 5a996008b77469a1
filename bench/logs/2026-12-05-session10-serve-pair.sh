# Session 10: pn serve vs llama-server, full-dims q4_k_m, 16 clients x 2 requests x 128 tokens (rows16 build).
cd /work/main
L=~/.cache/pn-oracle/llama/bin/llama-server
bash bench/serve/pair.sh /tmp/fd.gguf 16 2 128 llama "$L -m {model} --port {port} -np 16 -t 2 -c 16384" pn "target/release/pn serve --model {model} --port {port} --slots 16 --ctx 1024" 2>&1 | grep tok_s

# Session 14: pn serve vs llama-server, 16 streaming clients (bench/serve/pair.sh):
# default model 16 x 2 x 128 tokens, five rounds; full-dims q4_k_m 16 x 1 x 64, one.
cd /work/main
git log --oneline | head -1
M=models/default/pn-default-code-q4_k_m.gguf
for r in 1 2 3 4 5; do
  bench/serve/pair.sh $M 16 2 128 llama "$HOME/.cache/pn-oracle/llama/bin/llama-server -m {model} --port {port} -np 16 -t 2 -c 16384" pn "target/release/pn serve --model {model} --port {port} --slots 16 --ctx 1024" 2>&1 | grep tok_s
done
bench/serve/pair.sh /tmp/fd.gguf 16 1 64 llama "$HOME/.cache/pn-oracle/llama/bin/llama-server -m {model} --port {port} -np 16 -t 2 -c 16384" pn "target/release/pn serve --model {model} --port {port} --slots 16 --ctx 1024" 2>&1 | grep tok_s
echo DONE

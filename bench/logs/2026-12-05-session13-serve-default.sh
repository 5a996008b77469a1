# Session 13, final build: pn serve vs llama-server on the default model, 16 streaming
# clients x 2 requests x 128 tokens (bench/serve/pair.sh), four rounds one after the other.
cd /work/main
git log --oneline | head -1
M=models/default/pn-default-code-q4_k_m.gguf
for r in 1 2 3 4; do
  bench/serve/pair.sh $M 16 2 128 llama "$HOME/.cache/pn-oracle/llama/bin/llama-server -m {model} --port {port} -np 16 -t 2 -c 16384" pn "target/release/pn serve --model {model} --port {port} --slots 16 --ctx 1024" 2>&1 | grep tok_s
done

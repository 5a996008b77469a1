# Session 15: pn serve (lanes) vs llama-server on other request shapes, default model,
# 16 streaming clients: 4 requests x 64 tokens (more prefill a token), and 1 x 256.
cd /work/main
git log --oneline | head -1
M=models/default/pn-default-code-q4_k_m.gguf
for shape in "4 64" "4 64" "1 256" "1 256"; do
  set -- $shape
  bench/serve/pair.sh $M 16 $1 $2 llama "$HOME/.cache/pn-oracle/llama/bin/llama-server -m {model} --port {port} -np 16 -t 2 -c 16384" pn "target/release/pn serve --model {model} --port {port} --slots 16 --ctx 1024" 2>&1 | grep tok_s
done
echo DONE

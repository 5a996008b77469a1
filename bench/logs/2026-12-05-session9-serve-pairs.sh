cd /work/main
L=~/.cache/pn-oracle/llama/bin/llama-server
for cfg in "16 1 64" "16 2 128"; do
  bash bench/serve/pair.sh /tmp/fd.gguf $cfg llama "$L -m {model} --port {port} -np 16 -t 2 -c 16384" pn "/tmp/pn-wave serve --model {model} --port {port} --slots 16 --ctx 1024" 2>&1 | grep tok_s
done

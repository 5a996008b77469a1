# Session 10: default model, pn serve vs llama-server (16x2x128, two pairs) and the K table.
cd /work/main
L=~/.cache/pn-oracle/llama/bin/llama-server
D=models/default/pn-default-code-q4_k_m.gguf
for i in 1 2; do
  bash bench/serve/pair.sh $D 16 2 128 llama "$L -m {model} --port {port} -np 16 -t 2 -c 16384" pn "target/release/pn serve --model {model} --port {port} --slots 16 --ctx 1024" 2>&1 | grep tok_s
done
. ~/.cache/pn-oracle/venv/bin/activate
python ../shared/oracle/llama_bench_batch.py $D --seqs 1,4,16 --prompt-len 32 --gen 32 --threads 2 2>&1 | grep "agg_tg"
for k in 1 4 16; do echo -n "pn K=$k "; target/release/pn bench -m $D --slots $k --prompt-len 32 --gen 32 --threads 2 -q 2>&1 | tail -1 | cut -c1-60; done

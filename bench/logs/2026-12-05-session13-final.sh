# Session 13, final build: three engines on full-dims q4_k_m / q5_k_m / iq4_xs (REPS=2), the
# K table (llama.cpp's llama_bench_batch.py, then the session-start binary /tmp/pn-base =
# b429df5 and this build alternated per K), and serve pairs (llama-server -np 16 -t 2,
# pn-base, pn) on the default model (3 rounds) and full-dims q4_k_m (1 round).
# Intel Xeon 6/207 (AVX-512 + AMX), 2 vCPUs; nothing else running.
cd /work/main
git log --oneline | head -1
for f in /tmp/fd.gguf /tmp/fd-q5_k_m.gguf /tmp/fd-iq4_xs.gguf; do
  REPS=2 PN=target/release/pn bench/compare.sh $f 2>&1 | grep -E "^ik_llama|^pn:|^llama.cpp:|^pp|^=="
done
echo "== K table, fd q4_k_m, --prompt-len 32 --gen 32"
( . ~/.cache/pn-oracle/venv/bin/activate; python ../shared/oracle/llama_bench_batch.py /tmp/fd.gguf --seqs 1,4,16 --prompt-len 32 --gen 32 --threads 2 2>&1 | grep "agg_tg" )
for k in 1 4 16; do for b in /tmp/pn-base target/release/pn; do echo -n "$b K=$k "; $b bench -m /tmp/fd.gguf --slots $k --prompt-len 32 --gen 32 --threads 2 2>&1 | tail -1; done; done
for b in /tmp/pn-base target/release/pn; do echo -n "$b single "; $b bench -m /tmp/fd.gguf --prompt-len 32 --gen 32 --threads 2 --reps 3 2>&1 | tail -1; done
echo "== serve, default model, 16 clients x 2 x 128"
M=models/default/pn-default-code-q4_k_m.gguf
for r in 1 2 3; do
  bench/serve/pair.sh $M 16 2 128 llama "$HOME/.cache/pn-oracle/llama/bin/llama-server -m {model} --port {port} -np 16 -t 2 -c 16384" pn-base "/tmp/pn-base serve --model {model} --port {port} --slots 16 --ctx 1024" pn "target/release/pn serve --model {model} --port {port} --slots 16 --ctx 1024" 2>&1 | grep tok_s
done
echo "== serve, fd q4_k_m, 16 clients x 1 x 64"
bench/serve/pair.sh /tmp/fd.gguf 16 1 64 llama "$HOME/.cache/pn-oracle/llama/bin/llama-server -m {model} --port {port} -np 16 -t 2 -c 16384" pn "target/release/pn serve --model {model} --port {port} --slots 16 --ctx 1024" 2>&1 | grep tok_s
echo DONE

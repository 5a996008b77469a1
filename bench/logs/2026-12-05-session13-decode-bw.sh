# Session 13: decode against the read bandwidth measured in the same minutes: two
# processes of /tmp/bw (bw.c: a 1 GiB zmm streaming read, best of 8, gcc -O2 -mavx512f),
# then three engines' decode on full-dims q4_k_m (a step reads ~301 MB), then bw again.
cd /work/main
git log --oneline | head -1
bw2() { /tmp/bw & /tmp/bw; wait; }
echo "bw before:"; bw2
for i in 1 2; do
  target/release/pn bench --model /tmp/fd.gguf --prompt-len 32 --gen 128 --threads 2 --reps 3 2>/dev/null | tail -1
done
( . ~/.cache/pn-oracle/venv/bin/activate; python ../shared/oracle/llama_bench.py /tmp/fd.gguf --prompt-len 32 --gen 128 --threads 2 --reps 3 | tail -1 )
~/.cache/pn-oracle/ik/bin/llama-bench -m /tmp/fd.gguf -p 0 -n 128 -t 2 -r 3 -rtr 1 -o json 2>/dev/null | python3 -c 'import json,sys; r=json.load(sys.stdin); print("ik tg128", [x["avg_ts"] for x in r])'
echo "bw after:"; bw2

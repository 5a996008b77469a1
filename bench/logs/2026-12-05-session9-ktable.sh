cd /work/main
. ~/.cache/pn-oracle/venv/bin/activate
python ../shared/oracle/llama_bench_batch.py /tmp/fd.gguf --seqs 1,4,16 --prompt-len 32 --gen 32 --threads 2 2>&1 | grep "agg_tg"
for k in 1 4 16; do for b in base delta; do echo -n "$b K=$k "; /tmp/pn-$b bench -m /tmp/fd.gguf --slots $k --prompt-len 32 --gen 32 --threads 2 -q 2>&1 | tail -1; done; done

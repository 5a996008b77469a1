cd /work/main
echo "== K table $(date) build $(git rev-parse --short HEAD) pn=/tmp/pn-wave (= HEAD), base=/tmp/pn-base (178cb26)"
. ~/.cache/pn-oracle/venv/bin/activate
python ../shared/oracle/llama_bench_batch.py /tmp/fd.gguf --seqs 1,4,16 --prompt-len 32 --gen 32 --threads 2 2>&1 | grep "agg_tg"
for k in 1 4 16; do for b in wave base; do echo -n "$b K=$k "; /tmp/pn-$b bench -m /tmp/fd.gguf --slots $k --prompt-len 32 --gen 32 --threads 2 -q 2>&1 | tail -1; done; done
echo -n "single pn bench: "; /tmp/pn-wave bench -m /tmp/fd.gguf --prompt-len 32 --gen 32 --threads 2 -q 2>&1 | tail -1
for r in 1 2; do
echo "== compare round $r $(date)"
PN=/tmp/pn-wave bash bench/compare.sh /tmp/fd.gguf 2 2>&1 | tail -12
done
echo "== done $(date)"

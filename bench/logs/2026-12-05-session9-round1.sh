cd /work/main
echo "== K table $(date)"
bash /tmp/ktable.sh 2>&1 | grep -E "agg_tg|K="
echo "== serve pairs $(date)"
bash /tmp/serve-pairs.sh
echo "== done $(date)"

# Session 16: pn serve on the built-in model, 16 clients x 2 x 128 tokens (bench/serve_bench.py, greedy):
# no drafts, then MTP x1 drafting in every step, then MTP x1 with the adaptive policy; then 1 client.
cd /work/main
git log --oneline | head -1
P='target/release/pn serve --port {port} --slots 16 --ctx 1024'
for c in 16 1; do
  bash bench/serve/pair.sh models/default/pn-default-code-q4_k_m.gguf $c 2 128 none "$P" mtp-always "$P --draft mtp --draft-policy always" mtp-adaptive "$P --draft mtp" lookup-adaptive "$P --draft lookup"
done
echo DONE

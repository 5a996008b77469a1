# Session 17: pn serve on the built-in model, 16 clients x 2 x 128 tokens (bench/serve_bench.py,
# greedy), MTP x1 drafts with the slots' block passes one pass per draft position (NEW =
# /tmp/pn-new, dd5a5e6) against each slot's block alone (OLD = /tmp/pn-old, ddeb679), beside
# no drafts; two rounds, then 6 clients.
cd /work/main
for c in 16 16 6; do
  args=()
  for b in OLD NEW; do
    bin=/tmp/pn-${b,,}
    P="$bin serve --port {port} --slots 16 --ctx 1024"
    args+=(none-$b "$P" mtp-always-$b "$P --draft mtp --draft-policy always" mtp-adaptive-$b "$P --draft mtp")
  done
  bash bench/serve/pair.sh models/default/pn-default-code-q4_k_m.gguf $c 2 128 "${args[@]}"
done
echo DONE

# Session 20, final build: (1) the three engines on full-dims q4_k_m, three rounds; (2) on
# full-dims q8_0, q5_k_m and iq4_xs (pn synth --preset full-dims --type T --seed 1), one
# round each; (3) on the 20.5 GB real-dims file (pn synth --preset full-dims --type q4_k_m
# --layers 40 --experts 256 --seed 1), two rounds; (4) the K table (bench/ktable.sh: K =
# 1/2/4/8/16), two rounds on full-dims q4_k_m and one on the built-in model. Intel Xeon
# 6/207 (AVX-512 VNNI, AMX), 2 vCPUs (one core's two hyperthreads), --threads 2.
cd /work/main
git log --oneline | head -1
export PN=target/release/pn
ROUNDS=3 REPS=2 bash bench/compare.sh /tmp/fd.gguf 2
for t in q8_0 q5_k_m iq4_xs; do
  [ -f /tmp/fd-$t.gguf ] || $PN synth --preset full-dims --type $t --seed 1 --out /tmp/fd-$t.gguf >/dev/null
  ROUNDS=1 REPS=2 bash bench/compare.sh /tmp/fd-$t.gguf 2
done
ROUNDS=2 REPS=2 bash bench/compare.sh /tmp/rd.gguf 2
ROUNDS=2 bash bench/ktable.sh /tmp/fd.gguf 2
ROUNDS=1 bash bench/ktable.sh models/default/pn-default-code-q4_k_m.gguf 2
echo DONE

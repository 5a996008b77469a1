#!/usr/bin/env bash
# ik_llama.cpp's llama-bench built for plain AVX2 only (no AVX-512, no AVX-VNNI), from the
# oracle's source snapshot: the AVX2 peer for issue 20 on a machine that has AVX-512
# (docs/perf.md "Session 23"), run beside `PN_NO_AVX512=1 pn bench` by
#   PN_NO_AVX512=1 IK_BENCH=~/.cache/pn-oracle/ik-avx2/bin/llama-bench bench/compare.sh M.gguf
# ~35 minutes on 2 cores. Result: ~/.cache/pn-oracle/ik-avx2/bin/llama-bench (the binary
# is checked for zmm registers: none may appear). Needs cmake and a C++ compiler.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
oracle=${ORACLE:-$root/../shared/oracle}
out="$HOME/.cache/pn-oracle/ik-avx2"
if [ -x "$out/bin/llama-bench" ]; then
  echo "ik llama-bench (AVX2) ready: $out/bin/llama-bench"; exit 0
fi
command -v cmake >/dev/null || pip install -q cmake
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
tar xzf "$oracle"/peers/ik_llama.cpp-*.tar.gz -C "$src"
cd "$src"
cmake -B build -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
      -DGGML_AVX512=OFF -DGGML_AVXVNNI=OFF -DGGML_CUDA=OFF -DLLAMA_CURL=OFF \
      -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target llama-bench >/dev/null
if objdump -d --no-show-raw-insn build/bin/llama-bench | grep -q zmm; then
  echo "the AVX2 build uses zmm registers: not an AVX2-only binary" >&2; exit 1
fi
mkdir -p "$out/bin"
cp build/bin/llama-bench "$out/bin/"
echo "ik llama-bench (AVX2) ready: $out/bin/llama-bench"

#!/usr/bin/env bash
# Session 28 (AMD EPYC Zen 3, AVX2, 2 cores): the K table right after x86_bcast8 landed
# (build 156f7b9, before `pn bench --slots 1` printed its in-process comparison).
set -euo pipefail
cd "$(dirname "$0")/../.."
KS=1,4,16 ROUNDS=2 bench/ktable.sh /tmp/fd.gguf 2

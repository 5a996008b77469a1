#!/usr/bin/env bash
# Session 21: the K table after the slot rows (host path: a buffer move at bind / unbind),
# full-dims q4_k_m and the built-in model, two rounds each.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=2 bench/ktable.sh /tmp/fd.gguf 2
ROUNDS=2 bench/ktable.sh models/default/pn-default-code-q4_k_m.gguf 2

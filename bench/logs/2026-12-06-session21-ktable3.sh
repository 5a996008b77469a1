#!/usr/bin/env bash
# Session 21, the final build: two more full-dims rounds of the K table.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=2 bench/ktable.sh /tmp/fd.gguf 2

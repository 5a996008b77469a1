#!/usr/bin/env bash
# Session 21, later in the hour: two more full-dims rounds of the K table.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=2 bench/ktable.sh /tmp/fd.gguf 2

#!/usr/bin/env bash
# Session 32: the K table again after the three-engine run (whose second K-table round
# fell in one of this VM's slow minutes: every pn figure of that round 15-25% low).
set -euo pipefail
cd "$(dirname "$0")/../.."
PN=${PN:-target/release/pn}
PN=$PN KS=1,4,16 ROUNDS=3 bench/ktable.sh /tmp/fd.gguf 2

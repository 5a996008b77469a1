#!/usr/bin/env bash
# Moved to tools/gpu-check.sh (bundle | run); this forwards to it.
exec bash "$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/tools/gpu-check.sh" "$@"

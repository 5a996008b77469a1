#!/usr/bin/env bash
# Compile every CUDA kernel (backends/cuda/kernels/*.cu) with NVRTC for sm_80 and sm_90,
# failing on any error or warning. No GPU needed: NVRTC comes from the PyPI package
# nvidia-cuda-nvrtc-cu12 (libnvrtc.so.12 + its builtins), cached under
# ~/.cache/pn-nvrtc so reruns do not download it again.
#
#   tools/nvrtc-check.sh            # install NVRTC if needed, run the check
#   PN_NVRTC_DIR=/path/to/lib ...   # use an existing libnvrtc directory instead
#
# Exit status: 0 when every kernel compiles cleanly (or, with a message, when PyPI is
# unreachable and no NVRTC is cached); non-zero on any compile error or warning.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${PN_NVRTC_CACHE:-$HOME/.cache/pn-nvrtc}"
PKG="nvidia-cuda-nvrtc-cu12"
VERSION="${PN_NVRTC_VERSION:-12.9.86}"
SITE="$CACHE/site-$VERSION"

find_lib() {
    local d
    for d in "${PN_NVRTC_DIR:-}" "$SITE/nvidia/cuda_nvrtc/lib"; do
        if [ -n "$d" ] && [ -e "$d/libnvrtc.so.12" ]; then
            echo "$d"
            return 0
        fi
    done
    return 1
}

if ! LIB="$(find_lib)"; then
    PY="$(command -v python3 || command -v python || true)"
    if [ -z "$PY" ]; then
        echo "nvrtc-check: FAILED: python3 is needed to install $PKG from PyPI" >&2
        exit 1
    fi
    echo "nvrtc-check: installing $PKG==$VERSION into $SITE"
    mkdir -p "$CACHE"
    TMP="$(mktemp -d "$CACHE/tmp.XXXXXX")"
    LOG="$TMP/pip.log"
    if "$PY" -m pip install --quiet --disable-pip-version-check --no-deps --target "$TMP/site" "$PKG==$VERSION" >"$LOG" 2>&1; then
        rm -rf "$SITE"
        mv "$TMP/site" "$SITE"
        rm -rf "$TMP"
    else
        if grep -qiE "connection|network|resolve|timed out|unreachable|No matching distribution" "$LOG"; then
            echo "nvrtc-check: SKIPPED: PyPI unreachable, cannot install $PKG:" >&2
            tail -n 3 "$LOG" >&2
            rm -rf "$TMP"
            exit 0
        fi
        echo "nvrtc-check: FAILED: pip install $PKG==$VERSION:" >&2
        cat "$LOG" >&2
        rm -rf "$TMP"
        exit 1
    fi
    LIB="$(find_lib)" || {
        echo "nvrtc-check: FAILED: $PKG installed but libnvrtc.so.12 not found under $SITE" >&2
        exit 1
    }
fi

echo "nvrtc-check: libnvrtc from $LIB"
cd "$ROOT"
export LD_LIBRARY_PATH="$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if ! cargo test --workspace --test nvrtc_compile -- --ignored --nocapture every_kernel_compiles; then
    echo "nvrtc-check: FAILED: a kernel did not compile cleanly with NVRTC (see above)" >&2
    exit 1
fi
echo "nvrtc-check: every kernel compiles for sm_80 and sm_90 without warnings"

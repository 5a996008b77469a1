#!/usr/bin/env python3
"""Logits of pn against llama.cpp on models the fixtures do not have: other seeds,
presets, architectures, quant types and token streams, every case made afresh.

    ~/.cache/pn-oracle/venv/bin/python bench/oracle_sweep.py [--pn target/release/pn]
        [--oracle ../shared/oracle] [--work /tmp/pn-sweep] [--only SUBSTRING]

Per case: `synth.py` (+ llama.cpp's `quantize.py` for the K-quant / IQ mixes), then every
position's logits from `llama_oracle.py logits` (f32 KV) and from `pn logits --kv-type f32`
(passes of 512), and `pn logits --ubatch 1` (one token a pass: the decode path; `--ubatch
37` for the long streams) which must equal them bit for bit. Prints a line per case and fails (exit 1) when a case is
under the oracle tests' bars (argmax agreement ≥ 0.8, mean Pearson ≥ 0.99; exact formats:
max |Δ| ≤ 1e-3) or the two pn paths differ. Not a test (it needs the oracle's venv).
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np

# (arch, preset, seed, weights: synth --wtype or a quantize.py ftype, exact); a random
# stream of 40–90 tokens, or of LONG[name] tokens (past the chunked delta rule's 64-token
# chunks, several 512-token passes)
LONG = {"qwen35moe-small-s7-f32": 700, "qwen35moe-ktiny-s31-q4_k_m": 300, "qwen35-ktiny-s79-q4_k_m": 520}
CASES = [
    ("qwen35moe", "tiny", 5, "f32", True),
    ("qwen35moe", "tiny", 23, "f16", False),
    ("qwen35moe", "tiny", 41, "bf16", False),
    ("qwen35moe", "small", 7, "f32", True),
    ("qwen35moe", "small", 9, "q8_0", False),
    ("qwen35moe", "small", 13, "q4_0", False),
    ("qwen35moe", "small", 17, "q5_0", False),
    ("qwen35moe", "small", 19, "q4_1", False),
    ("qwen35moe", "small", 29, "q5_1", False),
    ("qwen35moe", "ktiny", 31, "q4_k_m", False),
    ("qwen35moe", "ktiny", 37, "q4_k_s", False),
    ("qwen35moe", "ktiny", 43, "q5_k_m", False),
    ("qwen35moe", "ktiny", 47, "q6_k", False),
    ("qwen35moe", "ktiny", 53, "q3_k_m", False),
    ("qwen35moe", "ktiny", 59, "q2_k", False),
    ("qwen35moe", "ktiny", 61, "iq4_xs", False),
    ("qwen35moe", "ktiny", 67, "iq4_nl", False),
    ("qwen35moe", "ktiny", 71, "mxfp4_moe", False),
    ("qwen35moe", "ktiny", 73, "q8_0", False),
    ("qwen35", "ktiny", 79, "q4_k_m", False),
    ("qwen35", "tiny", 83, "f32", True),
    ("qwen3moe", "ktiny", 89, "q5_k_m", False),
    ("qwen3moe", "tiny", 97, "f32", True),
]
SYNTH_TYPES = {"f32", "f16", "bf16", "q8_0", "q4_0", "q5_0", "q4_1", "q5_1"}


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))}: exit {r.returncode}\n{r.stderr[-2000:]}")
    return r


def logits(path):
    with open(path) as f:
        j = json.load(f)
    return j["tokens"], np.array(j["logits"], dtype=np.float64)


def agreement(ours, ref):
    am = float(np.mean(ours.argmax(1) == ref.argmax(1)))
    pr = float(np.mean([np.corrcoef(a, b)[0, 1] for a, b in zip(ours, ref)]))
    return am, pr, float(np.abs(ours - ref).max())


def main():
    ap = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--pn", default=os.path.join(here, "../target/release/pn"))
    ap.add_argument("--oracle", default=os.path.join(here, "../../shared/oracle"))
    ap.add_argument("--work", default="/tmp/pn-sweep")
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    py = sys.executable
    rng = np.random.default_rng(2026)
    bad = 0
    for arch, preset, seed, wt, exact in CASES:
        name = f"{arch}-{preset}-s{seed}-{wt}"
        if a.only not in name:
            continue
        base = os.path.join(a.work, name)
        model = base + ".gguf"
        try:
            if not os.path.exists(model):
                src = model if wt in SYNTH_TYPES else base + ".src.gguf"
                run([py, f"{a.oracle}/synth.py", "--arch", arch, "--preset", preset, "--seed", str(seed),
                     "--wtype", wt if wt in SYNTH_TYPES else "f16", "--out", src])
                if wt not in SYNTH_TYPES:
                    run([py, f"{a.oracle}/quantize.py", src, model, wt])
                    os.remove(src)
            # random token ids (vocab 1024 in every preset)
            n = LONG.get(name) or int(rng.integers(40, 90))
            toks = ",".join(str(t) for t in rng.integers(0, 1024, n))
            run([py, f"{a.oracle}/llama_oracle.py", "logits", model, "--tokens", toks, "--kv-type", "f32",
                 "--out", base + ".llama.json"])
            run([a.pn, "logits", "-q", "-m", model, "--tokens", toks, "--kv-type", "f32", "--out", base + ".pn.json"])
            # the decode path (one token a pass), or odd chunks for the long streams
            ub = "37" if name in LONG else "1"
            run([a.pn, "logits", "-q", "-m", model, "--tokens", toks, "--kv-type", "f32", "--ubatch", ub,
                 "--out", base + ".pn1.json"])
            _, ref = logits(base + ".llama.json")
            _, ours = logits(base + ".pn.json")
            _, ours1 = logits(base + ".pn1.json")
            am, pr, mx = agreement(ours, ref)
            same = np.array_equal(ours, ours1)
            ok = am >= 0.8 and pr >= 0.99 and (mx <= 1e-3 or not exact) and same
            bad += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {name:36} {ref.shape[0]:3} tokens  argmax {am:.3f}  "
                  f"pearson {pr:.5f}  max|Δ| {mx:.2e}  ubatch {ub}: {'bitwise' if same else 'DIFFERS'}", flush=True)
        except RuntimeError as e:
            bad += 1
            print(f"FAIL {name}: {e}", flush=True)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""How much a long prompt arriving mid-stream stalls a running stream (`pn serve`).

    python3 bench/serve/stall.py --url http://127.0.0.1:8090 [--prompt-lines 300] [--gen 160]

Starts one streaming completion (greedy, `--gen` tokens), and once it has streamed 10
tokens sends a completion with a long prompt (`--prompt-lines` lines of `xN = N`,
max_tokens 1). Prints one JSON line: the stream's inter-token gaps (p50, p99, max, ms)
while the long prompt prefilled, that prompt's time to its answer, and the stream's
tokens during it. Standard library only.
"""
import argparse
import json
import threading
import time
import urllib.request


def post(url, body, stream=False):
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    return urllib.request.urlopen(req, timeout=600)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8090")
    ap.add_argument("--prompt-lines", type=int, default=300)
    ap.add_argument("--gen", type=int, default=160)
    a = ap.parse_args()
    stamps, started, window = [], threading.Event(), {}

    def stream():
        r = post(a.url, {"prompt": "def parse_args(argv):", "max_tokens": a.gen, "temperature": 0, "ignore_eos": True, "stream": True}, True)
        for line in r:
            if line.startswith(b"data: {"):
                stamps.append(time.perf_counter())
                if len(stamps) == 10:
                    started.set()

    t = threading.Thread(target=stream)
    t.start()
    started.wait()
    long = "".join(f"x{j} = {j}\n" for j in range(a.prompt_lines))
    t0 = time.perf_counter()
    r = json.load(post(a.url, {"prompt": long, "max_tokens": 1, "ignore_eos": True}))
    t1 = time.perf_counter()
    t.join()
    gaps = sorted((b - x) * 1e3 for x, b in zip(stamps, stamps[1:]) if t0 <= b <= t1)
    q = lambda f: round(gaps[min(len(gaps) - 1, int(f * len(gaps)))], 1) if gaps else None
    print(json.dumps({"prompt_tokens": r["usage"]["prompt_tokens"], "long_prompt_s": round(t1 - t0, 2), "stream_tokens_during": len(gaps),
                      "gap_p50_ms": q(0.5), "gap_p99_ms": q(0.99), "gap_max_ms": round(gaps[-1], 1) if gaps else None}))


if __name__ == "__main__":
    main()

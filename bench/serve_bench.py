#!/usr/bin/env python3
"""Concurrent streaming clients against an OpenAI-compatible server (pn serve or llama-server).

Each of N clients streams R completions (`/v1/completions`, `stream: true`, a fixed
`max_tokens` with `ignore_eos`, greedy), one after another, with prompts of its own.
Reports aggregate generated tokens/s (all tokens / wall time), time to first token and
inter-token latency (p50 / p99 over every gap of every stream), as one JSON line.

usage: serve_bench.py URL [--clients 1,4,16] [--requests 2] [--max-tokens 64] [--label pn]
Standard library only (http.client + threads), so the client costs little CPU.
"""
import argparse
import http.client
import json
import threading
import time
import urllib.parse

TOPICS = ["a stack", "a queue", "a binary search", "a linked list", "a trie", "an LRU cache", "a heap", "a graph walk",
          "a tokenizer", "a JSON parser", "a rate limiter", "a matrix product", "a bloom filter", "a ring buffer",
          "a date parser", "a CSV reader"]


def prompt(client, req):
    t = TOPICS[(client + req) % len(TOPICS)]
    return f"# Python: {t}, written carefully with docstrings and tests (client {client}, request {req}).\nimport os\nimport sys\n\n\ndef main():\n"


def pct(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def one_stream(url, model, text, max_tokens, out):
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    body = {"prompt": text, "max_tokens": max_tokens, "stream": True, "ignore_eos": True, "temperature": 0, "seed": 1}
    if model:
        body["model"] = model
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
    stamps = []
    for raw in r:
        line = raw.strip()
        if not line.startswith(b"data: "):
            continue
        data = line[6:]
        if data == b"[DONE]":
            break
        v = json.loads(data)
        ch = v.get("choices") or []
        if ch and ch[0].get("text"):
            stamps.append(time.perf_counter())
        # llama-server sends the whole usage in its last chunk; both count tokens the same
    conn.close()
    out.append((t0, stamps))


def run(url, model, clients, requests, max_tokens):
    results = []
    lock = threading.Lock()

    def client(c):
        for q in range(requests):
            local = []
            one_stream(url, model, prompt(c, q), max_tokens, local)
            with lock:
                results.extend(local)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ttft = [s[0] - t for t, s in results if s]
    gaps = [b - a for _, s in results for a, b in zip(s, s[1:])]
    tokens = clients * requests * max_tokens
    ms = lambda x: None if x is None else round(x * 1000, 1)
    return {
        "clients": clients, "requests": clients * requests, "max_tokens": max_tokens,
        "tok_s": round(tokens / wall, 1), "wall_s": round(wall, 2),
        "ttft_p50_ms": ms(pct(ttft, 50)), "ttft_p99_ms": ms(pct(ttft, 99)),
        "itl_p50_ms": ms(pct(gaps, 50)), "itl_p99_ms": ms(pct(gaps, 99)),
        "chunks": sum(len(s) for _, s in results),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--clients", default="1,4,16")
    ap.add_argument("--requests", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--label", default="")
    ap.add_argument("--model", default="", help="model id to send (default: none)")
    a = ap.parse_args()
    # warm up (graph compilation, page faults)
    run(a.url, a.model, 1, 1, 4)
    for n in [int(x) for x in a.clients.split(",")]:
        r = run(a.url, a.model, n, a.requests, a.max_tokens)
        r["label"] = a.label
        print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()

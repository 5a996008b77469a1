"""Load and faults against an OpenAI-compatible server on loopback (pn serve or
llama.cpp's llama-server): N concurrent streaming clients per phase, bounded by time and
request count; every stream checked (SSE parsed, `[DONE]` last); peak RSS of the server
per phase; no slot or memory leak at the end. With --faults, in every phase: 30 % of the
clients hang up mid-stream at a random token, malformed requests go in between (each must
get its 4xx JSON error), and one client reads a single byte a second.

usage: loadtest.py URL [--pid PID] [--clients 1,16,64] [--seconds 20 | 30,30,300] [--requests 2000]
                   [--warmup 10] [--max-tokens 64] [--faults] [--api-key KEY] [--server pn|llama]
                   [--json OUT.json]
Exits 1 when a check fails (errors, malformed answers, leaks), 0 otherwise.
"""
import argparse
import json
import random
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import faults
import sse

PROMPTS = ["def fibonacci(n):", "class Stack:", "import os\n\ndef walk(path):", "def parse_args(argv):",
           "# sort a list of pairs by the second item\n", "def read_config(path):"]


def pct(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


class Rss:
    """Samples VmRSS of PID every 100 ms; `peak()` since the last reset."""

    def __init__(self, pid):
        self.pid, self.max, self.stop = pid, 0, False
        if pid:
            threading.Thread(target=self._run, daemon=True).start()

    def now(self):
        if not self.pid:
            return None
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return None

    def _run(self):
        while not self.stop:
            self.max = max(self.max, self.now() or 0)
            time.sleep(0.1)

    def reset(self):
        self.max = self.now() or 0

    def peak(self):
        return self.max if self.pid else None


def client_loop(args, auth, cid, stop_at, budget, rng):
    """One client: streams until the phase ends or the shared budget is spent."""
    out = []
    hang_up = args.faults and cid % 10 in (1, 4, 7)  # 30 % of the clients (not the first)
    while time.monotonic() < stop_at and budget.take():
        body = {"messages": [{"role": "user", "content": rng.choice(PROMPTS)}], "max_tokens": args.max_tokens,
                "temperature": 0.8, "seed": rng.randrange(1 << 30), "ignore_eos": True}
        cut = rng.randint(1, max(1, args.max_tokens - 1)) if hang_up else None
        out.append(sse.stream_chat(args.url, body, auth, disconnect_after=cut))
    return out


class Budget:
    def __init__(self, n):
        self.n, self.lock = n, threading.Lock()

    def take(self):
        with self.lock:
            self.n -= 1
            return self.n >= 0


def busy_slots(args, auth):
    if args.server == "pn":
        return sse.metric(args.url, "pn_slots_busy", auth)
    return sse.metric(args.url, "llamacpp:requests_processing", auth)


def phase(args, auth, n, rss, seconds):
    rss.reset()
    t0 = time.monotonic()
    stop_at = t0 + seconds
    budget = Budget(args.requests)
    fault_failures, fault_rounds, slow = [], 0, None
    with ThreadPoolExecutor(n + 2) as ex:
        futs = [ex.submit(client_loop, args, auth, i, stop_at, budget, random.Random(1000 * n + i)) for i in range(n)]
        if args.faults:
            slow = ex.submit(faults.slow_reader, args.url, auth, stop_at, 4 * args.max_tokens)
            while time.monotonic() < stop_at and not all(f.done() for f in futs):
                fault_failures += faults.malformed_round(args.url, args.api_key, auth)
                fault_rounds += 1
                time.sleep(0.5)
        results = [r for f in futs for r in f.result()]
        slow = slow.result() if slow else None
    wall = time.monotonic() - t0
    full = [r for r in results if not r.disconnected and not r.error]
    errors = [r.error for r in results if r.error]
    tokens = sum(len(r.t_tokens) for r in results)
    row = {
        "clients": n, "requests": len(results), "completed": len(full), "disconnected": sum(r.disconnected for r in results),
        "errors": len(errors), "error_samples": errors[:5], "seconds": round(wall, 2),
        "requests_per_s": round(len(full) / wall, 2), "tokens_per_s": round(tokens / wall, 1),
        "ttft_p50_ms": ms(pct([r.ttft for r in full if r.ttft], 50)), "ttft_p99_ms": ms(pct([r.ttft for r in full if r.ttft], 99)),
        "itl_p50_ms": ms(pct([g for r in full for g in r.gaps()], 50)), "itl_p99_ms": ms(pct([g for r in full for g in r.gaps()], 99)),
        "peak_rss_mib": mib(rss.peak()),
    }
    if args.faults:
        row.update(malformed_rounds=fault_rounds, malformed_failures=fault_failures[:5], n_malformed_failures=len(fault_failures),
                   slow_client_bytes=slow[0], slow_client_error=slow[1])
    return row


def ms(x):
    return None if x is None else round(1000 * x, 1)


def mib(x):
    return None if x is None else round(x / (1 << 20), 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--pid", type=int, default=0)
    ap.add_argument("--clients", default="1,16,64")
    ap.add_argument("--seconds", default="20", help="per phase: one figure, or one per client count")
    ap.add_argument("--requests", type=int, default=2000, help="per phase at most")
    ap.add_argument("--warmup", type=float, default=10, help="seconds at the largest count, faults included")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--faults", action="store_true")
    ap.add_argument("--api-key", default="")
    ap.add_argument("--server", choices=["pn", "llama"], default="pn")
    ap.add_argument("--json", default="")
    ap.add_argument("--rss-tolerance", type=float, default=5, help="percent: RSS at the end vs after warm-up")
    args = ap.parse_args()
    args.url = args.url.rstrip("/")
    if not args.url.startswith(("http://127.0.0.1", "http://localhost")):
        sys.exit("loadtest.py drives loopback servers only (http://127.0.0.1:PORT)")
    auth = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    counts = [int(c) for c in args.clients.split(",")]
    secs = [float(x) for x in args.seconds.split(",")]
    secs = secs * len(counts) if len(secs) == 1 else secs
    if len(secs) != len(counts):
        sys.exit(f"--seconds: expected 1 or {len(counts)} figures, found {len(secs)}")
    rss = Rss(args.pid)

    # warm-up at the largest count with the faults, so the slots, the prefix cache and the
    # error paths have allocated what they keep before the baseline
    warm = phase(argparse.Namespace(**{**vars(args), "requests": 4 * max(counts)}), auth, max(counts), rss, args.warmup)
    time.sleep(1)
    rss_warm = rss.now()
    rows = [phase(args, auth, n, rss, t) for n, t in zip(counts, secs)]

    # no leak: busy slots back to 0, RSS within 5 % of after warm-up
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and busy_slots(args, auth) > 0:
        time.sleep(0.1)
    busy = busy_slots(args, auth)
    time.sleep(1)
    rss_end = rss.now()
    after = faults.good_request_ok(args.url, auth)
    report = {"server": args.server, "url": args.url, "max_tokens": args.max_tokens, "faults": args.faults,
              "warmup": {k: warm[k] for k in ("requests", "errors")}, "phases": rows, "busy_slots_at_end": busy,
              "rss_after_warmup_mib": mib(rss_warm), "rss_end_mib": mib(rss_end), "request_after_run_error": after}
    fails = []
    for r in rows:
        if r["errors"]:
            fails.append(f"{r['clients']} clients: {r['errors']} stream errors {r['error_samples']}")
        if r.get("n_malformed_failures"):
            fails.append(f"{r['clients']} clients: malformed requests answered wrongly {r['malformed_failures']}")
        if r.get("slow_client_error"):
            fails.append(r["slow_client_error"])
        if r["completed"] == 0:
            fails.append(f"{r['clients']} clients: no request completed")
    if warm["errors"]:
        fails.append(f"warm-up: {warm['errors']} errors {warm['error_samples']}")
    if busy != 0:
        fails.append(f"busy slots at the end: {busy}")
    if rss_warm and rss_end and abs(rss_end - rss_warm) > args.rss_tolerance / 100 * rss_warm:
        fails.append(f"RSS at the end {mib(rss_end)} MiB vs {mib(rss_warm)} MiB after warm-up (> {args.rss_tolerance:g} %)")
    if after:
        fails.append(f"a request after the run: {after}")
    report["failures"] = fails
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    for r in rows:
        print(f"{r['clients']:>3} clients: {r['requests_per_s']} req/s, {r['tokens_per_s']} tok/s, TTFT p50/p99 {r['ttft_p50_ms']}/{r['ttft_p99_ms']} ms, "
              f"inter-token p50/p99 {r['itl_p50_ms']}/{r['itl_p99_ms']} ms, peak RSS {r['peak_rss_mib']} MiB, {r['errors']} errors", file=sys.stderr)
    print("loadtest: " + ("FAILED: " + "; ".join(fails) if fails else "all checks passed"))
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()

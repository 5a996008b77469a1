"""Streams through nginx to two pn serve replicas (tools/tests/serve_nginx.rs: two `pn serve`
processes behind Debian's nginx running deploy/nginx.conf).

usage: nginx_check.py NGINX_URL REPLICA1_URL REPLICA2_URL
32 concurrent streams: 0 errors, both replicas used; 6 conversations of two turns with an
`x-session-id` each: turn 2 is a prefix-cache hit (cached_tokens > 0) on the replica that
served turn 1, covering at least turn 1's whole prompt. Exits 1 on the first failed check.
"""
import os
import sys
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench", "serve"))
import sse  # noqa: E402

LB, REPLICAS = sys.argv[1], sys.argv[2:4]


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what, flush=True)
    if not cond:
        sys.exit(1)


def requests_on(url):
    return sse.metric(url, "pn_requests_total", default=0.0)


def hits_on(url):
    return sse.metric(url, "pn_prompt_cache_hit_tokens_total", default=0.0)


def main():
    status, body = sse.get(LB, "/health")
    check(status == 200 and b"ok" in body, f"/health through nginx: {status} {body!r}")

    before = [requests_on(u) for u in REPLICAS]
    body = {"messages": [{"role": "user", "content": "def add(a, b):"}], "max_tokens": 24, "temperature": 0.8, "ignore_eos": True}
    with ThreadPoolExecutor(32) as ex:
        results = list(ex.map(lambda i: sse.stream_chat(LB, dict(body, seed=i)), range(32)))
    errors = [r.error for r in results if r.error]
    check(not errors, f"32 streams through nginx, {len(errors)} errors {errors[:3]}")
    check(all(r.t_tokens and r.usage for r in results), "every stream has tokens and usage")
    used = [requests_on(u) - b for u, b in zip(REPLICAS, before)]
    check(all(n > 0 for n in used), f"both replicas used: {used[0]:.0f} + {used[1]:.0f} requests")

    # conversation affinity: turn 2 lands where turn 1's cache is
    for k in range(6):
        sid = {"x-session-id": f"conversation-{k}"}
        msgs = [{"role": "user", "content": f"def f{k}(x):"}]
        t1 = sse.stream_chat(LB, {"messages": msgs, "max_tokens": 16, "temperature": 0, "ignore_eos": True}, sid)
        check(t1.error is None, f"session {k} turn 1: {t1.error}")
        hits0 = [hits_on(u) for u in REPLICAS]
        msgs += [{"role": "assistant", "content": t1.text}, {"role": "user", "content": "Shorter, please."}]
        t2 = sse.stream_chat(LB, {"messages": msgs, "max_tokens": 16, "temperature": 0, "ignore_eos": True}, sid)
        check(t2.error is None, f"session {k} turn 2: {t2.error}")
        cached = t2.usage["prompt_tokens_details"]["cached_tokens"]
        gained = [hits_on(u) - h for u, h in zip(REPLICAS, hits0)]
        turn1 = t1.usage["prompt_tokens"]
        check(cached >= turn1 and sorted(gained)[0] == 0, f"session {k} turn 2 through nginx: cached_tokens {cached} of {t2.usage['prompt_tokens']} (turn 1's prompt: {turn1}), cache hits per replica {gained}")
    print("nginx: all checks passed")


if __name__ == "__main__":
    main()

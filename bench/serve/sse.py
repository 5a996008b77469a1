"""A small streaming client for pn serve / llama-server (stdlib only), shared by
loadtest.py and the nginx test: one chat completion over SSE, checked as it arrives.

stream_chat() returns a Result: the text, the token timestamps, the usage, and `error`
(None when the stream was well-formed: HTTP 200, every `data:` line JSON, `[DONE]` last,
nothing after it).
"""
import http.client
import json
import time
import urllib.parse


class Result:
    def __init__(self):
        self.status = None
        self.text = ""
        self.t_start = time.monotonic()
        self.t_tokens = []      # monotonic time of each content delta
        self.usage = None
        self.finish = None
        self.error = None
        self.disconnected = False  # the client hung up on purpose
        self.headers = {}

    @property
    def ttft(self):
        return self.t_tokens[0] - self.t_start if self.t_tokens else None

    def gaps(self):
        return [b - a for a, b in zip(self.t_tokens, self.t_tokens[1:])]


def connect(url, timeout=120):
    u = urllib.parse.urlsplit(url)
    return http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout)


def stream_chat(url, body, headers=None, disconnect_after=None, timeout=120):
    """POST /v1/chat/completions with stream=true; `disconnect_after`: close the socket
    after that many content deltas (a client that goes away)."""
    r = Result()
    body = dict(body, stream=True)
    body.setdefault("stream_options", {"include_usage": True})
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    conn = connect(url, timeout)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body), h)
        resp = conn.getresponse()
        r.status = resp.status
        r.headers = dict(resp.getheaders())
        if resp.status != 200:
            r.error = f"HTTP {resp.status}: {resp.read()[:300]!r}"
            return r
        if not resp.getheader("Content-Type", "").startswith("text/event-stream"):
            r.error = f"Content-Type {resp.getheader('Content-Type')!r}, expected text/event-stream"
            return r
        done = False
        for raw in resp:
            line = raw.decode("utf-8").rstrip("\r\n")
            if not line or line.startswith(":"):
                continue
            if not line.startswith("data:"):
                r.error = f"not an SSE data line: {line[:120]!r}"
                return r
            data = line[5:].strip()
            if done:
                r.error = f"data after [DONE]: {data[:120]!r}"
                return r
            if data == "[DONE]":
                done = True
                continue
            v = json.loads(data)
            if "error" in v:
                r.error = f"error event: {v['error']}"
                return r
            if v.get("usage"):
                r.usage = v["usage"]
            for ch in v.get("choices", []):
                c = (ch.get("delta") or {}).get("content")
                if c:
                    r.t_tokens.append(time.monotonic())
                    r.text += c
                    if disconnect_after is not None and len(r.t_tokens) >= disconnect_after:
                        r.disconnected = True
                        return r
                if ch.get("finish_reason"):
                    r.finish = ch["finish_reason"]
        if not done:
            r.error = "the stream ended without data: [DONE]"
        elif r.finish is None:
            r.error = "no finish_reason in the stream"
    except Exception as e:  # a reset, a timeout, bad JSON: all count as errors
        r.error = f"{type(e).__name__}: {e}"
    finally:
        conn.close()
    return r


def get(url, path, headers=None, timeout=30):
    conn = connect(url, timeout)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def metric(url, name, headers=None, default=None):
    """Sum of a Prometheus metric's samples (all label sets) from GET /metrics; `default`
    when it has none yet (a labelled counter before its first sample)."""
    status, body = get(url, "/metrics", headers)
    if status != 200:
        raise RuntimeError(f"/metrics: HTTP {status}")
    total, seen = 0.0, False
    for line in body.decode().splitlines():
        if line.startswith(name) and (len(line) == len(name) or line[len(name)] in " {"):
            total += float(line.rsplit(" ", 1)[1])
            seen = True
    if not seen and default is not None:
        return default
    if not seen:
        raise RuntimeError(f"/metrics has no {name}")
    return total

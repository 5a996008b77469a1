"""The fault clients of loadtest.py: malformed requests that must each get their 4xx JSON
error, and a client that reads one byte a second."""
import json
import select
import socket
import time
import urllib.parse

import sse

GOOD = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def _cases(api_key):
    """(name, body bytes, extra headers, expected status)."""
    j = lambda v: json.dumps(v).encode()  # noqa: E731
    cases = [
        ("bad JSON", b'{"messages": [{"role": "user", "content": "hi"', {}, 400),
        ("wrong types", j({"messages": "hi", "max_tokens": "ten"}), {}, 400),
        ("huge max_tokens", j(dict(GOOD, max_tokens=10**12)), {}, 400),
        ("invalid UTF-8", b'{"messages": [{"role": "user", "content": "\xff\xfe\xc3"}]}', {}, 400),
        ("unknown field", j(dict(GOOD, frobnicate=True)), {}, 400),
        ("5 MiB body", j({"messages": [{"role": "user", "content": "x" * (5 << 20)}]}), {}, 413),
    ]
    if api_key:
        cases.append(("wrong API key", j(GOOD), {"Authorization": "Bearer not-the-key"}, 401))
    return cases


def _raw_request(url, body, headers, timeout=30):
    """POST body; stops sending as soon as the server answers (a 413 comes before the
    body is read). Returns (status, body bytes)."""
    u = urllib.parse.urlsplit(url)
    s = socket.create_connection((u.hostname, u.port), timeout=timeout)
    try:
        head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: {u.hostname}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        s.sendall(head.encode())
        sent = 0
        while sent < len(body):
            if select.select([s], [], [], 0)[0]:
                break  # answered early
            try:
                sent += s.send(body[sent:sent + 65536])
            except (BrokenPipeError, ConnectionResetError):
                break
        data = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            data += chunk
            if b"\r\n\r\n" in data:
                hdr, rest = data.split(b"\r\n\r\n", 1)
                n = [int(line.split(b":")[1]) for line in hdr.split(b"\r\n") if line.lower().startswith(b"content-length:")]
                if n and len(rest) >= n[0]:
                    break
        if not data.startswith(b"HTTP/1."):
            return None, data
        hdr, _, rest = data.partition(b"\r\n\r\n")
        return int(hdr.split(b" ")[1]), rest
    finally:
        s.close()


def malformed_round(url, api_key, auth):
    """Sends each malformed request once; returns a list of failures (empty: all answered
    with their 4xx and an OpenAI error object)."""
    failures = []
    for name, body, extra, want in _cases(api_key):
        headers = dict(auth)
        headers.update(extra)
        try:
            status, resp = _raw_request(url, body, headers)
        except OSError as e:
            failures.append(f"{name}: {type(e).__name__}: {e}")
            continue
        try:
            err = json.loads(resp)["error"]
            ok = status == want and isinstance(err.get("message"), str) and "type" in err
        except (ValueError, KeyError, TypeError):
            ok = False
        if not ok:
            failures.append(f"{name}: expected {want} with a JSON error, got {status} {resp[:160]!r}")
    return failures


def slow_reader(url, auth, stop_at, max_tokens):
    """A stream read one byte a second until `stop_at` (monotonic); returns (bytes read,
    error or None). A tiny receive buffer makes the server's writes back up."""
    u = urllib.parse.urlsplit(url)
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    s.settimeout(30)
    n, got = 0, b""
    try:
        s.connect((u.hostname, u.port))
        body = json.dumps({"messages": [{"role": "user", "content": "def slow(x):"}], "max_tokens": max_tokens, "stream": True}).encode()
        head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: {u.hostname}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in auth.items()) + "\r\n"
        s.sendall(head.encode() + body)
        while len(got) < 12:  # the status line at full speed, then a byte a second
            b = s.recv(12 - len(got))
            if not b:
                break
            got += b
        n = len(got)
        while time.monotonic() < stop_at:
            b = s.recv(1)
            if not b:
                break
            n += 1
            time.sleep(1.0)
    except OSError as e:
        return n, f"slow client: {type(e).__name__}: {e}"
    finally:
        s.close()
    if not got.startswith(b"HTTP/1.1 200"):
        return n, f"slow client: expected HTTP/1.1 200, got {got!r}"
    return n, None


def good_request_ok(url, auth):
    """A plain request after the faults still works."""
    r = sse.stream_chat(url, GOOD, auth)
    return r.error

"""End-to-end check of `pn serve` with the real `openai` Python package.

usage: openai_e2e.py BASE_URL API_KEY            run the checks, print "N passed, M failed"
       openai_e2e.py BASE_URL API_KEY drain      stream a long completion; print STREAMING
                                                 after the first chunk, DRAINED <finish> at the end
Driven by tools/tests/serve.rs (which starts the server).
"""
import sys

import openai

base, key = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=120)
model = client.models.list().data[0].id

if len(sys.argv) > 3 and sys.argv[3] == "drain":
    stream = client.completions.create(model=model, prompt="def main():", max_tokens=400, stream=True, extra_body={"ignore_eos": True})
    finish, n = None, 0
    for chunk in stream:
        n += 1
        if n == 1:
            print("STREAMING", flush=True)
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    print("DRAINED", finish, n, flush=True)
    sys.exit(0)

passed, failed = 0, 0


def check(name, fn):
    global passed, failed
    try:
        fn()
        passed += 1
        print("ok  ", name, flush=True)
    except Exception as e:  # report every failing check, not only the first
        failed += 1
        print("FAIL", name, type(e).__name__, e, flush=True)


MSGS = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "def add(a, b):"}]


def chat_whole():
    r = client.chat.completions.create(model=model, messages=MSGS, max_tokens=16, seed=3)
    c = r.choices[0]
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-"), r
    assert c.message.role == "assistant" and isinstance(c.message.content, str), c
    assert c.finish_reason in ("stop", "length"), c.finish_reason
    assert r.usage.prompt_tokens > 0 and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert isinstance(r.usage.prompt_tokens_details.cached_tokens, int)


def chat_stream():
    whole = client.chat.completions.create(model=model, messages=MSGS, max_tokens=16, seed=4, temperature=0.8)
    text, finish, usage = "", None, None
    for chunk in client.chat.completions.create(model=model, messages=MSGS, max_tokens=16, seed=4, temperature=0.8, stream=True, stream_options={"include_usage": True}):
        if chunk.usage:
            usage = chunk.usage
        for ch in chunk.choices:
            text += ch.delta.content or ""
            finish = ch.finish_reason or finish
    assert text == whole.choices[0].message.content, (text, whole.choices[0].message.content)
    assert finish == whole.choices[0].finish_reason
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens


def completions():
    r = client.completions.create(model=model, prompt="import os\n", max_tokens=8, temperature=0)
    assert r.object == "text_completion" and isinstance(r.choices[0].text, str)
    streamed = "".join(c.choices[0].text for c in client.completions.create(model=model, prompt="import os\n", max_tokens=8, temperature=0, stream=True) if c.choices)
    assert streamed == r.choices[0].text, (streamed, r.choices[0].text)


def stop_strings():
    full = client.completions.create(model=model, prompt="class Stack:\n", max_tokens=40, temperature=0).choices[0].text
    assert len(full) > 10, full
    stop = full[len(full) // 2:len(full) // 2 + 3]
    r = client.completions.create(model=model, prompt="class Stack:\n", max_tokens=40, temperature=0, stop=[stop])
    assert r.choices[0].text == full[:full.index(stop)], (r.choices[0].text, stop)
    assert r.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].text for c in client.completions.create(model=model, prompt="class Stack:\n", max_tokens=40, temperature=0, stop=stop, stream=True) if c.choices)
    assert streamed == r.choices[0].text, (streamed, stop)


def logprobs():
    r = client.chat.completions.create(model=model, messages=MSGS, max_tokens=6, temperature=0, logprobs=True, top_logprobs=2)
    lp = r.choices[0].logprobs.content
    assert len(lp) == r.usage.completion_tokens, (len(lp), r.usage)
    for t in lp:
        assert t.logprob <= 0 and len(t.top_logprobs) == 2 and t.top_logprobs[0].logprob == t.logprob


def errors():
    try:
        client.chat.completions.create(model=model, messages=MSGS, temperature=5)
        raise AssertionError("temperature 5 accepted")
    except openai.BadRequestError as e:
        assert e.status_code == 400 and "temperature" in str(e), e
    try:
        client.chat.completions.create(model="no-such-model", messages=MSGS)
        raise AssertionError("unknown model accepted")
    except openai.NotFoundError as e:
        assert e.status_code == 404
    bad = openai.OpenAI(base_url=base + "/v1", api_key="wrong-key", max_retries=0)
    try:
        bad.models.list()
        raise AssertionError("wrong key accepted")
    except openai.AuthenticationError as e:
        assert e.status_code == 401


def predicted_outputs():
    # the client's `prediction` argument: the same answer, usage counts the prediction's
    # tokens (this server runs without --draft: none drafted)
    more = {"ignore_eos": True}
    whole = client.chat.completions.create(model=model, messages=MSGS, max_tokens=16, temperature=0, extra_body=more)
    text = whole.choices[0].message.content
    assert text, whole
    r = client.chat.completions.create(model=model, messages=MSGS, max_tokens=16, temperature=0, prediction={"type": "content", "content": text}, extra_body=more)
    assert r.choices[0].message.content == text, (r.choices[0].message.content, text)
    d = r.usage.completion_tokens_details
    assert d is not None and isinstance(d.accepted_prediction_tokens, int) and isinstance(d.rejected_prediction_tokens, int), r.usage
    try:
        client.chat.completions.create(model=model, messages=MSGS, max_tokens=4, prediction={"type": "diff", "content": text})
        raise AssertionError("a prediction of type diff accepted")
    except openai.BadRequestError as e:
        assert e.status_code == 400 and "prediction.type" in str(e), e


for name, fn in [("chat", chat_whole), ("predicted outputs", predicted_outputs), ("chat stream", chat_stream), ("completions", completions), ("stop strings", stop_strings), ("logprobs", logprobs), ("errors", errors)]:
    check(name, fn)
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)

"""Load and memory of `geist serve` at CI size (pass/fail; the full-size runs and their
numbers are scripts/serve_load.py's, docs/SERVE.md).

- Load: 8 streaming clients at once against --parallel 8, each a few requests: no errors,
  every stream complete ([DONE], a finish reason, usage), and each reply equal to the same
  request's answer when it runs alone (greedy; batched decode is batch invariant).
- Memory: with --cache-ram 64, 60 requests over 20 distinct ~200-token prefixes (whose
  snapshots, ~20 MiB each, are far more than 64 MiB together) grow the RSS by at most the cap plus a
  constant once the slot's working memory exists; 40 identical requests after that add at
  most a few MiB.
"""
import json
import threading
import urllib.request

import pytest

from conftest import http

CLIENTS = 8
PER_CLIENT = 2
MAX_TOKENS = 12


def system_text(k, words=150):
    return f"Document {k}. " + " ".join(f"Section {k}.{i} says item {i} of set {k} is fine." for i in range(words // 8))


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def body_of(c, i):
    return {"messages": [{"role": "system", "content": system_text(0, 60)},
                         {"role": "user", "content": f"Client {c} asks question {i}: what is item {c + i}?"}],
            "max_tokens": MAX_TOKENS, "temperature": 0}


def stream(url, body):
    """(content, finish_reason, usage, saw_done) of one streaming chat request."""
    b = dict(body, stream=True, stream_options={"include_usage": True})
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(b).encode(),
                                 headers={"Content-Type": "application/json"})
    text, finish, usage, done = [], None, None, False
    with urllib.request.urlopen(req, timeout=300) as r:
        assert r.status == 200
        for line in r:
            line = line.decode().strip()
            if not line:
                continue
            assert line.startswith("data: "), line
            if line == "data: [DONE]":
                done = True
                continue
            assert not done, "data after [DONE]"
            ev = json.loads(line[6:])
            assert "error" not in ev, ev
            for ch in ev.get("choices", []):
                text.append(ch.get("delta", {}).get("content") or "")
                finish = ch.get("finish_reason") or finish
            if ev.get("usage"):
                usage = ev["usage"]
    return "".join(text), finish, usage, done


@pytest.fixture(scope="module")
def par8(start_server):
    return start_server(["-c", "1024", "--parallel", "8", "-q"])


def test_eight_streaming_clients_complete_and_match_alone(par8):
    results, errors = {}, []

    def client(c):
        try:
            for i in range(PER_CLIENT):
                results[(c, i)] = stream(par8.url, body_of(c, i))
        except Exception as e:  # reported below, with the client
            errors.append(f"client {c}: {e!r}")

    threads = [threading.Thread(target=client, args=(c,)) for c in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert not errors, errors
    assert len(results) == CLIENTS * PER_CLIENT
    for (c, i), (text, finish, usage, done) in results.items():
        assert done and finish in ("stop", "length"), (c, i, finish)
        assert usage and usage["completion_tokens"] >= 1 and usage["prompt_tokens"] > 60
        if finish == "length":
            assert usage["completion_tokens"] == MAX_TOKENS
    # The same requests one at a time: the same replies (greedy, batch invariant decode).
    for c, i in [(0, 0), (3, 1), (7, 1)]:
        status, _, raw = http("POST", par8.url + "/v1/chat/completions", body_of(c, i),
                              {"Content-Type": "application/json"}, timeout=300)
        assert status == 200
        alone = json.loads(raw)["choices"][0]["message"]["content"]
        assert alone == results[(c, i)][0], (c, i)
    m = par8.metrics()
    assert m.get("geist_requests_failed_total", 0) == 0


def test_rss_bounded_by_cache_ram(start_server):
    cap = 64
    s = start_server(["-c", "1024", "--parallel", "1", "--cache-ram", str(cap), "-q"])

    def one(k, q):
        body = {"messages": [{"role": "system", "content": system_text(k)}, {"role": "user", "content": q}],
                "max_tokens": 1, "temperature": 0}
        status, _, raw = http("POST", s.url + "/v1/chat/completions", body, {"Content-Type": "application/json"},
                              timeout=300)
        assert status == 200, raw
        return json.loads(raw)["usage"]

    one(10 ** 6, "Warm-up?")  # the slot's working memory (scratch, KV pages, logits) is touched once
    one(10 ** 6 + 1, "Warm-up again?")
    r0 = rss_mib(s.proc.pid)
    for i in range(60):
        one(i % 20, f"Question {i}?")
    r1 = rss_mib(s.proc.pid)
    for _ in range(40):
        one(0, "The same question?")
    r2 = rss_mib(s.proc.pid)
    m = s.metrics()
    evictions = m.get("geist_prefix_cache_evictions_total")
    msg = f"RSS {r0:.0f} -> {r1:.0f} -> {r2:.0f} MiB, cap {cap} MiB, evictions {evictions}"
    # Without the cap, 20 snapshots of ~200-token prefixes would add well over 32 MiB.
    assert evictions is not None and evictions > 0, msg
    assert m["geist_prefix_cache_bytes"] <= cap * 2 ** 20, msg
    assert r1 - r0 <= cap + 16, msg
    assert r2 - r1 <= 4, msg

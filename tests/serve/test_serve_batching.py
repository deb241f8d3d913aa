"""Continuous batching in `geist serve`, seen in /metrics: what the engine's steps held.

- Several streaming requests at once against --parallel 4 advance together: the steps
  held more than one request on average (a server that stepped one slot at a time has
  exactly one per step).
- A prompt that arrives while another request decodes is prefilled in chunks of at most
  the prefill budget (-b) inside the steps that also decode the other request: the steps
  that mixed prompt rows with decode rows are at least the prompt's length over the budget.
"""
import json
import socket
import threading
import time

from conftest import http

JSON = {"Content-Type": "application/json"}


def steps_delta(before, after):
    return {k: after[k] - before[k] for k in ("geist_steps_total", "geist_step_sequences_total",
                                              "geist_steps_mixed_total", "geist_generated_tokens_total")}


def test_concurrent_streams_advance_in_shared_steps(start_server):
    srv = start_server(["-c", "1024", "--parallel", "4", "-q"])
    before = srv.metrics()
    barrier = threading.Barrier(4)
    done, errors = [], []

    def client(i):
        try:
            barrier.wait(10)
            body = {"prompt": f"Story {i}: once upon a time", "max_tokens": 32, "temperature": 0, "stream": True,
                    "cache_prompt": False}
            status, _, raw = http("POST", srv.url + "/v1/completions", body, JSON, timeout=120)
            assert status == 200 and raw.rstrip().endswith(b"data: [DONE]"), raw[-200:]
            done.append(i)
        except Exception as e:  # reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and len(done) == 4, errors
    d = steps_delta(before, srv.metrics())
    assert d["geist_generated_tokens_total"] == 4 * 32, d
    # 4 x 32 decode rows and 4 prompts: one request per step would take >= 132 steps.
    per_step = d["geist_step_sequences_total"] / d["geist_steps_total"]
    assert per_step >= 2.0, d
    assert d["geist_steps_total"] < 4 * 32, d


def test_prompt_chunks_join_the_decoding_steps_within_the_budget(start_server):
    budget = 16
    srv = start_server(["-c", "2048", "--parallel", "2", "-b", str(budget), "-q"])
    # A long generation, streamed; the second prompt is sent once it decodes. 1500 tokens (~20 s
    # on 2 cores) so that it is still decoding when the second request ends: with 600 it once
    # had ended in one CI run.
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 1500, "temperature": 0, "stream": True}).encode()
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
    try:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
                  + str(len(body)).encode() + b"\r\n\r\n" + body)
        got = b""
        while got.count(b"data: ") < 3:
            chunk = s.recv(4096)
            assert chunk, "the stream ended early"
            got += chunk
        before = srv.metrics()
        prompt = "Notes. " + " ".join(f"Line {i} lists the value {i * 11}." for i in range(30))
        status, _, raw = http("POST", srv.url + "/v1/completions",
                              {"prompt": prompt, "max_tokens": 1, "temperature": 0, "cache_prompt": False}, JSON)
        assert status == 200, raw
        after = srv.metrics()
        n_prompt = json.loads(raw)["usage"]["prompt_tokens"]
    finally:
        s.close()
    d = steps_delta(before, after)
    assert n_prompt > 8 * budget
    # Each step held the decoding request's row and at most budget - 1 prompt rows: the
    # prompt needed at least n_prompt / budget steps, each of them mixed.
    assert d["geist_steps_mixed_total"] >= n_prompt / budget, (n_prompt, d)
    assert d["geist_steps_total"] >= n_prompt / budget, (n_prompt, d)
    # The second request's slot counts as busy until the engine has reset it, which can be
    # just after its answer (Engine::finish): wait for that, then the long generation must
    # be the one slot still busy.
    busy = after["geist_slots_busy"]
    for _ in range(100):
        if busy <= 1:
            break
        time.sleep(0.05)
        busy = srv.metrics()["geist_slots_busy"]
    assert busy == 1, "the long generation had ended: no decode rows to join"

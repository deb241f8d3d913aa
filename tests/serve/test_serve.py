"""`geist serve` against the `openai` client and raw HTTP: the OpenAI shapes, streaming,
sampling parameters, errors, the API key, the exact prefix cache, disconnects, the
queue, and shutdown."""
import json
import signal
import socket
import subprocess
import threading
import time

import pytest

from conftest import API_KEY, BIN, MODEL, ROOT, TINY, free_port, http, import_or_skip, skip_or_fail

openai = import_or_skip("openai")

# About 240 tokens of system text, as the pinned-prefix workload has.
SYSTEM = " ".join(f"Rule {i}: when asked about figure {i}, answer in one short sentence." for i in range(18))


def chat(client, user, system=SYSTEM, **kw):
    msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    return client.chat.completions.create(model="any", messages=msgs, **kw)


def test_health_and_models(srv, client):
    status, _, body = http("GET", srv.url + "/health")  # no key needed
    assert status == 200 and json.loads(body)["status"] == "ok"
    models = client.models.list()
    assert len(models.data) == 1
    assert models.data[0].id == "gemma-3-270m-q4_k_m.gguf"
    assert models.data[0].object == "model"


def test_chat_greedy_shape_and_usage(client):
    r = chat(client, "What is in figure 2?", max_tokens=12, temperature=0)
    assert r.object == "chat.completion"
    assert r.id.startswith("chatcmpl-")
    c = r.choices[0]
    assert c.message.role == "assistant"
    assert isinstance(c.message.content, str) and c.message.content
    assert c.finish_reason in ("stop", "length")
    u = r.usage
    assert u.prompt_tokens > 200
    assert 1 <= u.completion_tokens <= 12
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert u.prompt_tokens_details.cached_tokens >= 0
    again = chat(client, "What is in figure 2?", max_tokens=12, temperature=0)
    assert again.choices[0].message.content == c.message.content  # greedy is deterministic


def test_stream_equals_non_stream(client):
    kw = dict(max_tokens=16, temperature=0.9, seed=7)
    full = chat(client, "Describe figure 4.", **kw)
    chunks = list(chat(client, "Describe figure 4.", stream=True, stream_options={"include_usage": True}, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == full.choices[0].message.content
    finals = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finals == [full.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens
    assert all(ch.usage is None for ch in chunks[:-1])


def test_stream_without_usage_and_done_marker(srv, auth):
    body = {"prompt": "Once upon a time", "max_tokens": 5, "stream": True, "temperature": 0}
    status, headers, raw = http("POST", srv.url + "/v1/completions", body, auth)
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    events = [l[len("data: "):] for l in raw.decode().split("\n") if l.startswith("data: ")]
    assert events[-1] == "[DONE]"
    parsed = [json.loads(e) for e in events[:-1]]
    assert all("usage" not in p for p in parsed)
    assert parsed[-1]["choices"][0]["finish_reason"] == "length"


def test_completions_max_tokens_and_stream(client):
    r = client.completions.create(model="m", prompt="Once upon a time", max_tokens=6, temperature=0)
    assert r.object == "text_completion"
    assert r.usage.completion_tokens == 6 and r.choices[0].finish_reason == "length"
    s = client.completions.create(model="m", prompt="Once upon a time", max_tokens=6, temperature=0, stream=True)
    assert "".join(ch.choices[0].text for ch in s) == r.choices[0].text
    one = client.completions.create(model="m", prompt="Once upon a time", max_tokens=1, temperature=0)
    assert one.usage.completion_tokens == 1 and r.choices[0].text.startswith(one.choices[0].text)


def test_token_prompt_equals_text_prompt(srv, client, auth):
    status, _, body = http("POST", srv.url + "/tokenize", {"content": "Once upon a time", "add_special": True}, auth)
    ids = json.loads(body)["tokens"]
    a = client.completions.create(model="m", prompt="Once upon a time", max_tokens=8, temperature=0)
    b = client.completions.create(model="m", prompt=ids, max_tokens=8, temperature=0)
    assert a.choices[0].text == b.choices[0].text


def test_stop_strings_span_tokens_and_are_not_emitted(client):
    base = client.completions.create(model="m", prompt="The list of numbers: 1, 2, 3,", max_tokens=40,
                                     temperature=0).choices[0].text
    assert len(base) > 12, base
    # A stop string that starts inside the text and crosses token boundaries.
    stop = base[5:12]
    assert stop.strip(), base
    cut = base[:base.index(stop)]
    r = client.completions.create(model="m", prompt="The list of numbers: 1, 2, 3,", max_tokens=40, temperature=0,
                                  stop=[stop, "never-appears"])
    assert r.choices[0].text == cut and r.choices[0].finish_reason == "stop"
    s = client.completions.create(model="m", prompt="The list of numbers: 1, 2, 3,", max_tokens=40, temperature=0,
                                  stop=stop, stream=True)
    parts = list(s)
    assert "".join(p.choices[0].text for p in parts) == cut
    assert parts[-1].choices[0].finish_reason == "stop"


def test_seeds(client):
    kw = dict(max_tokens=20, temperature=1.0, top_p=1.0, extra_body={"top_k": 0, "min_p": 0.0})
    a = chat(client, "Tell me about figure 7.", seed=1234, **kw)
    b = chat(client, "Tell me about figure 7.", seed=1234, **kw)
    assert a.choices[0].message.content == b.choices[0].message.content
    others = {chat(client, "Tell me about figure 7.", seed=s, **kw).choices[0].message.content for s in (1, 2, 3, 4)}
    assert len(others) > 1  # four seeds at temperature 1 over 20 tokens do not all agree


# Sampling with nothing truncated: at temperature 1.5 five seeds do not all give the greedy
# text. Each truncation below at its extreme leaves only the most likely token, so it must
# give the greedy text for every one of these seeds; a server that ignored the parameter
# would give the untruncated texts, of which test_untruncated_sampling_differs_from_greedy
# shows at least one differs.
UNTRUNCATED = {"temperature": 1.5, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
SAMPLING_SEEDS = (1, 2, 3, 4, 5)


def complete_text(client, prompt="Once upon a time", max_tokens=8, **kw):
    extra = {k: kw.pop(k) for k in ("top_k", "min_p", "repeat_penalty") if k in kw}
    return client.completions.create(model="m", prompt=prompt, max_tokens=max_tokens, extra_body=extra,
                                     **kw).choices[0].text


def test_untruncated_sampling_differs_from_greedy(client):
    greedy = complete_text(client, temperature=0)
    sampled = [complete_text(client, seed=s, **UNTRUNCATED) for s in SAMPLING_SEEDS]
    assert any(t != greedy for t in sampled), (greedy, sampled)


@pytest.mark.parametrize("param,value", [("top_k", 1), ("top_p", 0.001), ("min_p", 1.0)])
def test_extreme_truncation_is_greedy(client, param, value):
    greedy = complete_text(client, temperature=0)
    for s in SAMPLING_SEEDS:
        assert complete_text(client, seed=s, **dict(UNTRUNCATED, **{param: value})) == greedy, (param, s)


def test_repeat_penalty_changes_a_repeating_greedy_text(client):
    # Greedy continues the list (" 4, 5, 6, ..."), repeating the prompt's ", ": a penalty on
    # the tokens seen steers away from them; 1.0 is no penalty (the server's default).
    prompt = "The list of numbers: 1, 2, 3,"
    greedy = complete_text(client, prompt, max_tokens=24, temperature=0)
    assert greedy.count(",") >= 4, greedy
    assert complete_text(client, prompt, max_tokens=24, temperature=0, repeat_penalty=1.0) == greedy
    penalised = complete_text(client, prompt, max_tokens=24, temperature=0, repeat_penalty=1.3)
    assert penalised.count(",") < greedy.count(","), (greedy, penalised)


def test_chat_logprobs(client):
    r = chat(client, "What is in figure 1?", max_tokens=8, temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    n_text_tokens = r.usage.completion_tokens - (1 if r.choices[0].finish_reason == "stop" else 0)
    assert len(content) == n_text_tokens
    for t in content:
        assert t.logprob <= 0
        assert len(t.top_logprobs) == 3
        lps = [x.logprob for x in t.top_logprobs]
        assert lps == sorted(lps, reverse=True)
        assert t.token == t.top_logprobs[0].token  # greedy takes the most likely token
        assert abs(t.logprob - t.top_logprobs[0].logprob) < 1e-6
        assert bytes(t.bytes).decode(errors="replace") == t.token
    # The streamed logprobs are the same numbers.
    s = chat(client, "What is in figure 1?", max_tokens=8, temperature=0, logprobs=True, top_logprobs=3, stream=True)
    streamed = [t for ch in s if ch.choices and ch.choices[0].logprobs for t in ch.choices[0].logprobs.content]
    assert [(t.token, t.logprob) for t in streamed] == [(t.token, t.logprob) for t in content]


def test_completion_logprobs(client):
    r = client.completions.create(model="m", prompt="Once upon a time", max_tokens=5, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == 5 and len(lp.token_logprobs) == 5 and len(lp.top_logprobs) == 5
    assert "".join(lp.tokens) == r.choices[0].text
    assert all(len(t) == 2 for t in lp.top_logprobs)


# A conversation with a system text, an assistant turn and untrimmed contents.
CONVERSATION = [{"role": "system", "content": " You are terse. "}, {"role": "user", "content": " Name a colour. "},
                {"role": "assistant", "content": "Blue.\n"}, {"role": "user", "content": "And another one?"}]


def gemma3_template():
    # docs/model-spec.md 7.8, Gemma 3: the system text folded into the first user turn,
    # contents trimmed; without the leading <bos>, which /v1/completions adds.
    return ("<start_of_turn>user\nYou are terse.\n\nName a colour.<end_of_turn>\n<start_of_turn>model\n"
            "Blue.<end_of_turn>\n<start_of_turn>user\nAnd another one?<end_of_turn>\n<start_of_turn>model\n")


def gemma4_template():
    # docs/model-spec.md 7.8, Gemma 4: a system turn of its own; <bos> left to /v1/completions.
    return ("<|turn>system\nYou are terse.<turn|>\n<|turn>user\nName a colour.<turn|>\n<|turn>model\n"
            "Blue.<turn|>\n<|turn>user\nAnd another one?<turn|>\n<|turn>model\n")


def assert_chat_is_the_template(url, headers, template):
    """The chat request's prompt is `template` (tokenized with specials, one BOS): same
    token count, the same greedy reply and top-5 logprobs as a completion of the
    template, and the template's prompt finds the chat's prompt-end cache entry (keyed by
    its exact tokens) whole."""
    def post(path, body):
        status, _, raw = http("POST", url + path, body, headers)
        assert status == 200, raw
        return json.loads(raw)
    chat_r = post("/v1/chat/completions", {"messages": CONVERSATION, "max_tokens": 8, "temperature": 0,
                                           "logprobs": True, "top_logprobs": 5})
    toks = post("/tokenize", {"content": template, "add_special": True, "with_pieces": True})["tokens"]
    assert [t["piece"] for t in toks[:2]] != ["<bos>", "<bos>"] and toks[0]["piece"] == "<bos>"
    # A completion of the template written with its own <bos> gets no second one
    # (model-spec 7.7; /tokenize, as llama.cpp's tokenizer, gives two).
    with_bos = post("/v1/completions", {"prompt": "<bos>" + template, "max_tokens": 1, "temperature": 0})
    assert with_bos["usage"]["prompt_tokens"] == len(toks)
    assert chat_r["usage"]["prompt_tokens"] == len(toks)
    cold = post("/v1/completions", {"prompt": template, "max_tokens": 8, "temperature": 0, "logprobs": 5,
                                    "cache_prompt": False})
    assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert cold["choices"][0]["text"] == chat_r["choices"][0]["message"]["content"]
    assert cold["choices"][0]["finish_reason"] == chat_r["choices"][0]["finish_reason"]
    chat_lp = chat_r["choices"][0]["logprobs"]["content"]
    lp = cold["choices"][0]["logprobs"]
    assert [t["logprob"] for t in chat_lp] == lp["token_logprobs"]
    assert [t["token"] for t in chat_lp] == lp["tokens"]
    # Completions key the top tokens by piece in a map ordered by the piece's bytes; pieces
    # that are not valid UTF-8 all print as U+FFFD, and the last such key read wins. The
    # chat's lists folded the same way:
    def folded(top):
        return {x["token"]: x["logprob"] for x in sorted(top, key=lambda x: bytes(x["bytes"]))}
    assert [folded(t["top_logprobs"]) for t in chat_lp] == lp["top_logprobs"]
    warm = post("/v1/completions", {"prompt": template, "max_tokens": 1, "temperature": 0})
    assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] == warm["usage"]["prompt_tokens"]


def test_gemma3_chat_prompt_is_the_template(srv, auth):
    assert_chat_is_the_template(srv.url, auth, gemma3_template())


def test_gemma4_chat_prompt_is_the_template(start_server):
    s = start_server(["-c", "1024", "--parallel", "1", "-q"], model=ROOT / "tests/data/gemma4/tiny_gemma4_a_q8_0.gguf")
    assert_chat_is_the_template(s.url, {"Content-Type": "application/json"}, gemma4_template())


def test_errors_are_openai_shaped(srv, client, auth):
    def post(path, body, headers=auth):
        status, _, raw = http("POST", srv.url + path, body, headers)
        err = json.loads(raw)["error"]
        assert set(err) == {"message", "type", "param", "code"}
        return status, err
    status, err = post("/v1/chat/completions", b"{not json")
    assert status == 400 and err["code"] == "invalid_json"
    status, err = post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "temperature": "x"})
    assert status == 400 and err["param"] == "temperature" and err["type"] == "invalid_request_error"
    status, err = post("/v1/chat/completions", {"model": "m"})
    assert status == 400 and err["param"] == "messages"
    status, err = post("/v1/completions", {"prompt": "hi", "max_tokens": "ten"})
    assert status == 400 and err["param"] == "max_tokens"
    status, err = post("/v1/completions", {"prompt": [1, 2, 99999999]})
    assert status == 400 and err["param"] == "prompt"
    status, err = post("/nowhere", {})
    assert status == 404
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], n=2)
    assert e.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="m", prompt="word " * 3000, max_tokens=4)
    assert e.value.body["code"] == "context_length_exceeded"
    huge = b'{"prompt":"' + b"a" * (9 << 20) + b'"}'
    status, _, raw = http("POST", srv.url + "/v1/completions", huge, auth)
    assert status == 413 and json.loads(raw)["error"]["code"] == "request_too_large"
    status, _, raw = http("GET", srv.url + "/health")
    assert status == 200  # still serving


def test_truncated_and_garbage_requests_do_not_hurt(srv, client):
    for payload in (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\"",
                    b"\x00\xff garbage \r\n\r\n", b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)
            try:
                s.recv(4096)
            except OSError:
                pass
    assert chat(client, "Still there?", system=None, max_tokens=2, temperature=0).choices[0].message.content


def test_api_key(srv):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
        status, h, raw = http("POST", srv.url + "/v1/chat/completions", body, headers)
        assert status == 401
        assert json.loads(raw)["error"]["code"] == "invalid_api_key"
    assert http("GET", srv.url + "/v1/models")[0] == 401
    assert http("GET", srv.url + "/metrics")[0] == 401
    bad = openai.OpenAI(base_url=srv.url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_tokenize_round_trip(srv, auth):
    text = "Héllo wörld, <b>tags</b> and emoji 🎉 — done."
    status, _, raw = http("POST", srv.url + "/tokenize", {"content": text, "with_pieces": True}, auth)
    assert status == 200
    toks = json.loads(raw)["tokens"]
    assert all(set(t) == {"id", "piece"} for t in toks)
    status, _, raw = http("POST", srv.url + "/detokenize", {"tokens": [t["id"] for t in toks]}, auth)
    assert status == 200 and json.loads(raw)["content"] == text
    status, _, raw = http("POST", srv.url + "/detokenize", {"tokens": [10 ** 9]}, auth)
    assert status == 400


def _cache_pair(client, user, **kw):
    cold = chat(client, user, extra_body={"cache_prompt": False}, **kw)
    warm = chat(client, user, **kw)
    return cold, warm


def test_prefix_cache_is_exact(srv, client):
    # Warm the system prefix, then each new question reuses it; every answer equals the
    # one computed from scratch (cache_prompt false), greedy, seeded, and in logprobs.
    chat(client, "What is in figure 11?", max_tokens=2, temperature=0)
    for user, kw in (("What is in figure 12?", dict(temperature=0)),
                     ("And what about figure 13?", dict(temperature=1.0, seed=99, top_p=1.0)),
                     ("Figure 14, please.", dict(temperature=0, logprobs=True, top_logprobs=5))):
        cold, warm = _cache_pair(client, user, max_tokens=24, **kw)
        assert cold.usage.prompt_tokens_details.cached_tokens == 0
        assert warm.usage.prompt_tokens_details.cached_tokens >= 200, warm.usage
        assert warm.usage.prompt_tokens_details.cached_tokens < warm.usage.prompt_tokens
        assert warm.choices[0].message.content == cold.choices[0].message.content
        assert warm.choices[0].finish_reason == cold.choices[0].finish_reason
        if kw.get("logprobs"):
            a, b = cold.choices[0].logprobs.content, warm.choices[0].logprobs.content
            assert [(t.token, t.logprob, [(x.token, x.logprob) for x in t.top_logprobs]) for t in a] == \
                   [(t.token, t.logprob, [(x.token, x.logprob) for x in t.top_logprobs]) for t in b]
    # The whole prompt cached: nothing left to prefill, same answer.
    again = chat(client, "Figure 14, please.", max_tokens=24, temperature=0)
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens
    m = srv.metrics({"Authorization": f"Bearer {API_KEY}"})
    assert m["geist_prefix_cache_hits_total"] + m["geist_prefix_slot_hits_total"] >= 4
    assert m["geist_prefix_cache_bytes"] <= m["geist_prefix_cache_capacity_bytes"]


# About 800 tokens: past the default model's sliding window (512 positions on 5 of its 6
# layers), so a state restored at its end holds the window's rows, not the whole prefix.
LONG = " ".join(f"Entry {i}: the {('red', 'green', 'blue')[i % 3]} box on shelf {i} holds {i * 13 % 97} coins."
                for i in range(40))


def test_prefix_cache_is_exact_past_the_sliding_window(srv, auth):
    def ask(path, body):
        """(answer with logprobs, prompt tokens, cached tokens, cache source)"""
        status, _, raw = http("POST", srv.url + path, dict(body, max_tokens=8, temperature=0), auth)
        assert status == 200, raw
        r = json.loads(raw)
        c = r["choices"][0]
        if path == "/v1/completions":
            lp = c["logprobs"]
            answer = (c["text"], c["finish_reason"], lp["tokens"], lp["token_logprobs"], lp["top_logprobs"])
        else:
            answer = (c["message"]["content"], c["finish_reason"],
                      [(t["token"], t["logprob"], [(x["token"], x["logprob"]) for x in t["top_logprobs"]])
                       for t in c["logprobs"]["content"]])
        u = r["usage"]
        return answer, u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"], r["timings"]["cache_source"]

    def exact(path, body, min_cached, sources=("cache",)):
        warm, n, cached, source = ask(path, body)
        cold, _, cold_cached, _ = ask(path, dict(body, cache_prompt=False))
        assert cached >= min_cached and source in sources, (cached, source)
        assert cold_cached == 0
        assert warm == cold
        return warm, n

    status, _, raw = http("POST", srv.url + "/tokenize", {"content": LONG, "add_special": True}, auth)
    n_long = len(json.loads(raw)["tokens"])
    assert n_long > 700, n_long
    # 1. A prompt past the window, then one that extends it: the second restores the
    # first's prompt-end state and computes only its own tail.
    completion = {"logprobs": 5}
    ask("/v1/completions", dict(completion, prompt=LONG))
    exact("/v1/completions", dict(completion, prompt=LONG + " Question: which box holds the most coins?"), n_long)
    # 2. Two chats on one system text longer than the window: the second restores the
    # first's state at the system text's end.
    chat_kw = {"logprobs": True, "top_logprobs": 5}
    msgs = [{"role": "system", "content": LONG}, {"role": "user", "content": "Which shelf has the red box 9?"}]
    ask("/v1/chat/completions", dict(chat_kw, messages=msgs))
    msgs[1]["content"] = "How many coins are on shelf 20?"
    (reply, _, _), n_first = exact("/v1/chat/completions", dict(chat_kw, messages=msgs), n_long - 8)
    # 3. The conversation's next turn continues from that request's tokens (its prompt-end
    # state, or a live slot), past the window.
    msgs += [{"role": "assistant", "content": reply}, {"role": "user", "content": "And on shelf 21?"}]
    exact("/v1/chat/completions", dict(chat_kw, messages=msgs), n_first, ("slot", "cache"))


def test_multi_turn_reuses_the_conversation(client):
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is in figure 3?"}]
    r1 = client.chat.completions.create(model="m", messages=msgs, max_tokens=12, temperature=0)
    msgs += [{"role": "assistant", "content": r1.choices[0].message.content},
             {"role": "user", "content": "And figure 4?"}]
    r2 = client.chat.completions.create(model="m", messages=msgs, max_tokens=12, temperature=0)
    # At least the first request's whole prompt is reused.
    assert r2.usage.prompt_tokens_details.cached_tokens >= r1.usage.prompt_tokens
    cold = client.chat.completions.create(model="m", messages=msgs, max_tokens=12, temperature=0,
                                          extra_body={"cache_prompt": False})
    assert cold.choices[0].message.content == r2.choices[0].message.content


def test_concurrent_requests_match_sequential(client):
    users = [f"Briefly, figure {i}?" for i in range(4)]
    seq = [chat(client, u, max_tokens=10, temperature=0, extra_body={"cache_prompt": False}).choices[0].message.content
           for u in users]
    out = [None] * len(users)

    def run(i):
        out[i] = chat(client, users[i], max_tokens=10, temperature=0).choices[0].message.content
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(users))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == seq


@pytest.fixture(scope="module")
def tiny(start_server):
    """The tiny random model: one slot, no queue, a large context (long generations)."""
    return start_server(["-c", "32768", "--parallel", "1", "--queue", "0", "--timeout", "1", "--keep-alive", "1",
                         "-q"], model=TINY)


def _long_stream(url):
    """Opens a streaming completion that runs to the context's end; returns the socket
    after the first data line arrived."""
    body = json.dumps({"prompt": "Once upon a time", "stream": True, "temperature": 1.0, "seed": 5,
                       "top_k": 0, "min_p": 0.0}).encode()
    s = socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=30)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
              + str(len(body)).encode() + b"\r\n\r\n" + body)
    got = b""
    while b"data: " not in got:
        got += s.recv(4096)
    return s


def test_disconnect_mid_stream_frees_the_slot(tiny):
    before = tiny.metrics()
    s = _long_stream(tiny.url)
    s.close()
    deadline = time.time() + 20
    while time.time() < deadline:
        m = tiny.metrics()
        if m["geist_slots_busy"] == 0:
            break
        time.sleep(0.05)
    assert m["geist_slots_busy"] == 0
    assert m["geist_requests_cancelled_total"] == before["geist_requests_cancelled_total"] + 1
    generated = m["geist_generated_tokens_total"] - before["geist_generated_tokens_total"]
    assert generated < 32000  # stopped long before the context was full
    # The slot serves the next request.
    status, _, raw = http("POST", tiny.url + "/v1/completions", {"prompt": "hi", "max_tokens": 3})
    assert status == 200 and json.loads(raw)["usage"]["completion_tokens"] == 3


def _raw_completion(port, body):
    """A socket that has sent POST /v1/completions with the API key and `body` (a dict)."""
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Authorization: Bearer " + API_KEY.encode() + b"\r\nContent-Length: "
              + str(len(data)).encode() + b"\r\n\r\n" + data)
    return s


def _closed_and_cancelled(srv, auth, before, t_close, within, max_generated):
    """After a client closed at t_close: the slot is free within `within` seconds, one more
    request was cancelled, and fewer than max_generated tokens were generated."""
    deadline = t_close + 20
    while time.time() < deadline:
        m = srv.metrics(auth)
        if m["geist_slots_busy"] == 0:
            break
        time.sleep(0.02)
    assert m["geist_slots_busy"] == 0
    assert time.time() - t_close < within
    assert m["geist_requests_cancelled_total"] == before["geist_requests_cancelled_total"] + 1
    generated = m["geist_generated_tokens_total"] - before["geist_generated_tokens_total"]
    assert generated < max_generated, generated  # stopped long before max_tokens


def test_disconnect_mid_stream_of_a_long_generation_stops_it(srv, auth):
    # The default model, 1500 tokens asked (about 20 s on 2 cores): a client that leaves
    # after the first few streamed tokens stops the generation within a moment.
    before = srv.metrics(auth)
    s = _raw_completion(srv.port, {"prompt": "Once upon a time", "stream": True, "max_tokens": 1500,
                                   "temperature": 1.0, "seed": 5, "top_k": 0, "min_p": 0.0})
    got = b""
    while got.count(b"data: ") < 5:
        chunk = s.recv(4096)
        assert chunk, "the stream ended early"
        got += chunk
    s.close()
    _closed_and_cancelled(srv, auth, before, time.time(), 3, 500)


def test_disconnect_while_waiting_for_a_non_streaming_reply_frees_the_slot(srv, auth):
    # A non-streaming request writes nothing until it ends; the server watches the
    # connection instead, and a client that closes it cancels the generation. (The default
    # model: the tiny one finishes any request before a client could leave.)
    before = srv.metrics(auth)
    s = _raw_completion(srv.port, {"prompt": "Once upon a time", "max_tokens": 1500, "temperature": 1.0, "seed": 5,
                                   "top_k": 0, "min_p": 0.0})  # about 20 s on 2 cores
    deadline = time.time() + 20
    while srv.metrics(auth)["geist_generated_tokens_total"] < before["geist_generated_tokens_total"] + 10:
        assert time.time() < deadline
        time.sleep(0.02)
    s.close()
    # Noticed within a few of the server's 100 ms checks.
    _closed_and_cancelled(srv, auth, before, time.time(), 2, 500)
    # A client that stays gets its whole answer (the watch does not misread a live one).
    status, _, raw = http("POST", srv.url + "/v1/completions",
                          {"prompt": "Once upon a time", "max_tokens": 40, "temperature": 1.0, "seed": 5,
                           "top_k": 0, "min_p": 0.0}, auth)
    assert status == 200 and json.loads(raw)["usage"]["completion_tokens"] == 40


def test_a_client_that_stops_sending_is_dropped(tiny):
    # Half a request, then silence (slowloris): after --timeout (1 s here) the server
    # answers 400 (or just closes), and the connection is gone after --keep-alive more
    # (httplib 0.11 waits that long even after "Connection: close").
    for partial in (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Len",
                    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro"):
        with socket.create_connection(("127.0.0.1", tiny.port), timeout=10) as s:
            s.sendall(partial)
            t0 = time.time()
            got = b""
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                got += chunk
            assert got == b"" or got.startswith(b"HTTP/1.1 400"), got
            assert time.time() - t0 < 5


def test_full_queue_answers_503_with_retry_after(tiny):
    s = _long_stream(tiny.url)
    try:
        status, headers, raw = http("POST", tiny.url + "/v1/completions", {"prompt": "hi", "max_tokens": 3})
        assert status == 503
        assert headers.get("Retry-After") == "1"
        assert json.loads(raw)["error"]["code"] == "server_busy"
    finally:
        s.close()


def test_sigterm_finishes_running_requests_and_exits_zero(start_server):
    srv = start_server(["-c", "4096", "--parallel", "1", "-q"], model=TINY)
    result = {}

    def run():
        result["r"] = http("POST", srv.url + "/v1/completions",
                           {"prompt": "Once", "max_tokens": 3000, "temperature": 1.0, "seed": 1, "top_k": 0})
    t = threading.Thread(target=run)
    t.start()
    time.sleep(0.05)
    srv.proc.send_signal(signal.SIGTERM)
    t.join(30)
    assert srv.proc.wait(30) == 0
    status, _, raw = result["r"]
    assert status == 200, raw
    assert json.loads(raw)["usage"]["completion_tokens"] >= 1
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", srv.port), timeout=2).close()
    assert "stopped" in srv.output()


def test_sigint_with_no_requests_exits_zero(start_server):
    srv = start_server(["-c", "1024", "-q"], model=TINY)
    assert srv.stop(signal.SIGINT) == 0


def listening_addresses(port):
    """The local addresses (hex, as /proc/net/tcp and tcp6 write them) of the sockets that
    listen on `port`."""
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            addr, p = local.split(":")
            if state == "0A" and int(p, 16) == port:  # 0A: LISTEN
                out.add(addr)
    return out


def test_default_bind_is_loopback_only(srv):
    # The session's server was started without --host.
    assert listening_addresses(srv.port) == {"0100007F"}  # 127.0.0.1, and no IPv6 socket


def test_sigterm_cancels_a_request_longer_than_the_grace_time(start_server):
    srv = start_server(["-c", "2048", "--parallel", "1", "--shutdown-grace", "0.5", "-q"])
    result = {}

    def run():
        result["r"] = http("POST", srv.url + "/v1/completions",
                           {"prompt": "Once upon a time", "max_tokens": 1500, "temperature": 1.0, "seed": 5,
                            "top_k": 0, "min_p": 0.0}, timeout=60)  # about 20 s on 2 cores
    t = threading.Thread(target=run)
    t.start()
    deadline = time.time() + 20
    while srv.metrics()["geist_generated_tokens_total"] < 5:
        assert time.time() < deadline
        time.sleep(0.02)
    t0 = time.time()
    srv.proc.send_signal(signal.SIGTERM)
    assert srv.proc.wait(30) == 0
    elapsed = time.time() - t0
    t.join(30)
    assert elapsed < 3, f"exited {elapsed:.1f} s after SIGTERM with a 0.5 s grace"
    out = srv.output()
    assert "cancelling the requests still running" in out and "stopped" in out, out
    status, _, raw = result["r"]
    assert status == 503 and json.loads(raw)["error"]["code"] == "cancelled", raw


def test_sigterm_flushes_the_disk_cache(start_server, tmp_path):
    # A long system text, a short question and one token: the system text's entry (~40
    # MB) is queued for the writer a few tokens before the prompt's end, so the answer
    # comes while the writer still writes it and the prompt end's entry waits behind it;
    # SIGTERM right then must still put the prompt's end on disk, where a restarted server
    # restores it whole.
    cache = tmp_path / "cache"
    args = ["-c", "4096", "--parallel", "1", "-q", "--cache-dir", str(cache)]
    body = {"messages": [{"role": "system", "content": SYSTEM * 4}, {"role": "user", "content": "Figure 3?"}],
            "max_tokens": 1, "temperature": 0}
    first = start_server(args)
    status, _, raw = http("POST", first.url + "/v1/chat/completions", body)
    assert first.stop() == 0
    assert status == 200, raw
    before = json.loads(raw)
    assert before["usage"]["prompt_tokens"] > 1000
    assert not [n for n in cache.iterdir() if ".tmp." in n.name]
    second = start_server(args)
    status, _, raw = http("POST", second.url + "/v1/chat/completions", body)
    after = json.loads(raw)
    assert after["usage"]["prompt_tokens_details"]["cached_tokens"] == after["usage"]["prompt_tokens"], second.output()
    assert after["choices"][0]["message"]["content"] == before["choices"][0]["message"]["content"]


def test_health_is_503_while_the_model_loads(tmp_path, start_server):
    # The server listens before it loads the model (about 1 s for the default model here):
    # /health, generation and /metrics answer meanwhile, saying so. It starts its own server
    # to see the first moments; start_server is asked for its checks only (SKIP, or a failure
    # under GEIST_SERVE_REQUIRED=1, where there is no server or no model).
    if not MODEL.exists():
        skip_or_fail(f"SKIP: model {MODEL} is missing (python3 scripts/fetch_model.py)")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with open(tmp_path / "server.log", "wb") as log:
        proc = subprocess.Popen([str(BIN), "serve", "-m", str(MODEL), "--port", str(port), "-q"], stdout=log,
                                stderr=subprocess.STDOUT)
    try:
        loading, deadline = [], time.time() + 60
        while time.time() < deadline:
            try:
                status, _, raw = http("GET", url + "/health", timeout=2)
            except OSError:  # not listening yet
                time.sleep(0.005)
                continue
            if status == 200:
                break
            loading.append((status, json.loads(raw)))
            if len(loading) == 1:
                gen = http("POST", url + "/v1/completions", {"prompt": "hi", "max_tokens": 1})
                metrics = http("GET", url + "/metrics")[2].decode()
        assert status == 200, (tmp_path / "server.log").read_text()
        assert loading, "never saw the server loading: /health was 200 at once"
        assert all(x == (503, {"status": "loading"}) for x in loading), loading
        assert gen[0] == 503 and json.loads(gen[2])["error"]["code"] == "loading"
        assert "\ngeist_ready 0\n" in metrics
    finally:
        proc.terminate()
        proc.wait(30)


def test_cache_dir_survives_a_restart(start_server, tmp_path):
    cache = tmp_path / "cache"
    args = ["-c", "2048", "-q", "--cache-dir", str(cache)]
    body = {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is in figure 9?"}],
            "max_tokens": 8, "temperature": 0}
    first = start_server(args)
    status, _, raw = http("POST", first.url + "/v1/chat/completions", body)
    assert status == 200
    cold = json.loads(raw)
    assert first.stop() == 0
    files = sorted(cache.glob("*.geistsnap"))
    assert files, "no cache file was written"
    # A file geist did not write, under a name of its kind, is left alone and not served.
    foreign = cache / "0123456789abcdef.geistsnap"
    foreign.write_bytes(b"GEISTSNP" + b"\0" * 200)
    second = start_server(args)
    status, _, raw = http("POST", second.url + "/v1/chat/completions", body)
    warm = json.loads(raw)
    assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] == warm["usage"]["prompt_tokens"]
    assert warm["timings"]["cache_source"] == "cache"
    assert warm["choices"][0]["message"]["content"] == cold["choices"][0]["message"]["content"]
    assert "ignoring cache file" in second.output() and foreign.name in second.output()
    assert second.stop() == 0
    assert foreign.read_bytes() == b"GEISTSNP" + b"\0" * 200
    # Every entry corrupted in its checksummed part: none is served, the answer is computed.
    for f in cache.glob("*.geistsnap"):
        if f != foreign:
            data = bytearray(f.read_bytes())
            data[len(data) // 2] ^= 0xFF
            f.write_bytes(bytes(data))
    third = start_server(args)
    status, _, raw = http("POST", third.url + "/v1/chat/completions", body)
    again = json.loads(raw)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert again["choices"][0]["message"]["content"] == cold["choices"][0]["message"]["content"]
    assert third.output().count("checksum") >= len(files)


def test_chat_page(srv):
    status, headers, raw = http("GET", srv.url + "/")  # no key needed for the page itself
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    page = raw.decode()
    assert "/v1/chat/completions" in page and "stream: true" in page
    assert "http://" not in page and "https://" not in page  # nothing from a CDN
    assert "innerHTML" not in page  # model text goes in as text only
    assert "default-src 'self'" in headers["Content-Security-Policy"]


def test_a_second_server_on_the_same_port_is_refused(srv):
    import subprocess
    from conftest import BIN, TINY as tiny_model
    r = subprocess.run([str(BIN), "serve", "-m", str(tiny_model), "--port", str(srv.port)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1 and "cannot listen" in r.stderr


def test_concurrent_requests_on_a_new_prefix_share_it(client):
    # Two requests on a system text never seen, at once: the second reuses the first's
    # snapshot of it (at its start or while it waits for its prefill), and both answers
    # equal the ones computed from scratch.
    system = "Fresh context. " + " ".join(f"Fact {i}: item {i} weighs {i * 3} grams." for i in range(20))
    users = ["How heavy is item 4?", "How heavy is item 7?"]
    out = [None, None]

    def run(i):
        out[i] = chat(client, users[i], system=system, max_tokens=10, temperature=0)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cached = sorted(r.usage.prompt_tokens_details.cached_tokens for r in out)
    assert cached[1] >= 150, cached
    for i in range(2):
        cold = chat(client, users[i], system=system, max_tokens=10, temperature=0, extra_body={"cache_prompt": False})
        assert out[i].choices[0].message.content == cold.choices[0].message.content


def test_seed_option_is_the_default_seed(start_server):
    body = {"prompt": "hi", "max_tokens": 12, "temperature": 1.0, "top_k": 0}
    fixed = start_server(["-c", "1024", "-q", "-s", "5"], model=TINY)
    a = [json.loads(http("POST", fixed.url + "/v1/completions", body)[2])["choices"][0]["text"] for _ in range(2)]
    assert a[0] == a[1]
    seeded = json.loads(http("POST", fixed.url + "/v1/completions", dict(body, seed=5))[2])["choices"][0]["text"]
    assert seeded == a[0]
    free = start_server(["-c", "1024", "-q"], model=TINY)
    b = {json.loads(http("POST", free.url + "/v1/completions", body)[2])["choices"][0]["text"] for _ in range(4)}
    assert len(b) > 1  # no seed, no -s: a random seed per request


def test_snapshots_taken_into_evicted_buffers_are_exact(start_server):
    # --cache-ram 28 holds the system text's snapshot (~10 MiB) and one prompt-end snapshot
    # (~11 MiB) of this prompt. The system text is restored (so most recently used) by every
    # request, so each new question's prompt-end snapshot evicts the previous one and is
    # taken into its buffer, which still holds the other prompt's bytes. The same request
    # again restores that image in full; its answer and logprobs equal the ones computed
    # from scratch.
    s = start_server(["-c", "1024", "--parallel", "1", "--cache-ram", "28", "-q"])
    c = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0, timeout=120)
    kw = dict(max_tokens=8, temperature=0, logprobs=True, top_logprobs=3)

    def answer(r):
        lp = [(t.token, t.logprob, [(x.token, x.logprob) for x in t.top_logprobs]) for t in r.choices[0].logprobs.content]
        return r.choices[0].message.content, r.choices[0].finish_reason, lp

    restored_from_reused = 0
    for q in range(4):
        user = f"What is in figure {q * 5 + 1}? Answer briefly, then name figure {q * 7 + 2}."
        cold = chat(c, user, extra_body={"cache_prompt": False}, **kw)
        before = s.metrics().get("geist_snapshot_buffers_reused_total", 0)
        chat(c, user, **kw)  # takes the prompt-end snapshot
        reused = s.metrics()["geist_snapshot_buffers_reused_total"] > before
        whole = chat(c, user, **kw)  # restores it: nothing left to prefill
        assert whole.usage.prompt_tokens_details.cached_tokens == whole.usage.prompt_tokens, whole.usage
        assert answer(whole) == answer(cold), q
        restored_from_reused += reused
    m = s.metrics()
    assert restored_from_reused >= 2, m
    assert m["geist_prefix_cache_bytes"] <= 28 * 2 ** 20

"""`geist serve --cache-dir` across a restart (functional only; the timing is
scripts/serve_restart.py's, docs/SERVE.md):

- a new question on a system text the first server saw is answered from the disk cache by
  the restarted server (cached_tokens covers the system text) with the same reply as the
  request computed from scratch, and a request repeated word for word after the restart
  gives the reply it gave before;
- the files' order at startup is their last use, not their first write: a shared prefix
  written first and restored by every later request is loaded even when --cache-ram holds
  only a few of the files (newer per-question snapshots would push it out otherwise);
- a server killed (SIGKILL) while it writes entries leaves at most temporary files, which
  the next start removes (only those: geist's temporary names and bytes, of a writer that
  is gone), and no entry that is partial or served wrong.
"""
import json
import os
import re
import subprocess
import threading
import time

from conftest import http

# About 240 tokens, as the pinned-prefix workload's system texts.
SYSTEM = "Document 7. " + " ".join(f"Section 7.{i} says item {i} of set 7 is fine." for i in range(14))


def body(question, **kw):
    return dict({"messages": [{"role": "system", "content": SYSTEM},
                              {"role": "user", "content": question}], "max_tokens": 8, "temperature": 0}, **kw)


def question(i):
    # ~200 tokens each: every request's prompt-end snapshot is bigger than the shared one.
    return f"Question {i}: " + " ".join(f"panel {j} shows series {i}-{j} rising to {j * 7 + i} units;"
                                        for j in range(12)) + " Explain."


def post(srv, b):
    status, _, raw = http("POST", srv.url + "/v1/chat/completions", b)
    assert status == 200, raw
    out = json.loads(raw)
    return out["choices"][0]["message"]["content"], out["usage"]["prompt_tokens_details"]["cached_tokens"], out


def test_known_prefix_after_a_restart_is_cached_and_exact(start_server, tmp_path):
    cache = tmp_path / "cache"
    args = ["-c", "2048", "-q", "--cache-dir", str(cache)]
    first = start_server(args)
    before = {}
    for i in range(6):
        text, cached, _ = post(first, body(question(i)))
        before[i] = text
        if i > 0:
            assert cached > 200, "the shared system text was not reused within one server"
    assert first.stop() == 0
    # The shared prefix (the smallest file) was written first and restored by every request
    # since; each per-question file was written once, after it.
    files = sorted(cache.glob("*.geistsnap"), key=lambda f: f.stat().st_size)
    assert len(files) == 7, [f.name for f in files]
    shared, ends = files[0], files[1:]
    newest_ends = sorted(ends, key=lambda f: f.stat().st_mtime_ns)[-2:]
    assert shared.stat().st_mtime_ns > newest_ends[0].stat().st_mtime_ns, \
        "the shared prefix's file was not marked used"
    # A RAM cache that holds two per-question snapshots but not two and the shared one:
    # by write time the two newest per-question files would fill it; by last use the
    # shared prefix is the newest but one and gets in.
    big = max(f.stat().st_size for f in ends)
    cap_mib = (2 * big + 2 * 4096) // 2**20 + 1
    assert cap_mib * 2**20 < 2 * min(f.stat().st_size for f in ends) + shared.stat().st_size, \
        "snapshot sizes changed: pick another shape"
    args += ["--cache-ram", str(cap_mib)]
    second = start_server(args)
    loaded = second.output()
    assert "entries loaded" in loaded
    # A question never asked, on the known system text: its prefix comes from the disk.
    text, cached, out = post(second, body(question(100)))
    assert out["timings"]["cache_source"] == "cache"
    assert cached > 200, f"after the restart only {cached} tokens were reused: {loaded}"
    cold, cold_cached, _ = post(second, body(question(100), cache_prompt=False))
    assert cold_cached == 0
    assert text == cold
    assert second.stop() == 0

    # A request repeated word for word after a restart: the whole prompt or at least the
    # system text is reused, and the reply is the one given before the restart.
    third = start_server(args)
    text, cached, out = post(third, body(question(5)))
    assert cached > 200 and out["timings"]["cache_source"] == "cache"
    assert text == before[5]
    assert third.stop() == 0
    # Nothing but geist's own files (and no temporary ones) in the directory.
    assert all(n.endswith(".geistsnap") for n in os.listdir(cache)), os.listdir(cache)


def temporary_files(cache):
    return sorted(n for n in os.listdir(cache) if ".geistsnap.tmp." in n)


def test_sigkill_while_writing_the_cache(start_server, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    args = ["-c", "2048", "--parallel", "2", "-q", "--cache-dir", str(cache)]
    # A writer that is gone left this one; a file with a temporary name but other bytes, and
    # one whose writer runs (this process), are not geist's to remove.
    gone = subprocess.Popen(["true"])
    gone.wait()
    (cache / f"{'1' * 16}.geistsnap.tmp.{gone.pid}").write_bytes(b"GEISTSNP partial")
    foreign = {f"{'2' * 16}.geistsnap.tmp.{gone.pid}": b"not geist's",
               f"{'3' * 16}.geistsnap.tmp.{os.getpid()}": b"GEISTSNP being written"}
    for name, data in foreign.items():
        (cache / name).write_bytes(data)
    bodies, killed_mid_write = [], 0

    def start():
        # Every start removes the temporary files the kill before left, and only those.
        left = len(temporary_files(cache)) - len(foreign)
        srv = start_server(args)
        out = srv.output()
        assert temporary_files(cache) == sorted(foreign), out
        assert "left 2 files with a temporary name" in out, out
        assert left == 0 or f"removed {left} temporary file" in out, out
        for name, data in foreign.items():
            assert (cache / name).read_bytes() == data
        return srv, left
    # Each trial: a new system text and two questions on it at once (about three entries
    # written), killed when the n-th of its temporary files appears, plus a delay (n = 0:
    # the delay after sending).
    for trial, (nth, delay) in enumerate([(1, 0), (1, 0.01), (2, 0), (2, 0.03), (3, 0), (0, 0.3)]):
        srv, left = start()
        assert trial > 0 or left == 1  # the gone writer's
        system = f"Manual {trial}. " + " ".join(f"Step {i} of part {trial} sets dial {i} to {i * trial}." for i in range(16))
        sent = [{"messages": [{"role": "system", "content": system}, {"role": "user", "content": f"What does step {q}?"}],
                 "max_tokens": 4, "temperature": 0, "logprobs": True, "top_logprobs": 3} for q in (3, 7)]
        bodies.append(sent)

        def send(body, url=srv.url):  # cut by the kill: the answer does not matter
            try:
                http("POST", url + "/v1/chat/completions", body, timeout=30)
            except OSError:
                pass
        threads = [threading.Thread(target=send, args=(b,), daemon=True) for b in sent]
        for t in threads:
            t.start()
        seen = set()
        while len(seen) < nth and any(t.is_alive() for t in threads):
            seen.update(n for n in temporary_files(cache) if n not in foreign)
            time.sleep(0.0005)
        time.sleep(delay)
        srv.proc.kill()
        srv.proc.wait()
        killed_mid_write += len(temporary_files(cache)) > len(foreign)
    assert killed_mid_write >= 2, "the kills missed every write: the test proves little"
    srv, _ = start()
    out = srv.output()
    assert "ignoring cache file" not in out, out  # no entry file is partial
    loaded = int(re.search(r"(\d+) entr(y|ies) loaded", out).group(1))
    assert loaded >= 1, out

    def post(body):
        status, _, raw = http("POST", srv.url + "/v1/chat/completions", body)
        assert status == 200, raw
        r = json.loads(raw)
        c = r["choices"][0]
        lps = [(t["token"], t["logprob"], [(x["token"], x["logprob"]) for x in t["top_logprobs"]])
               for t in c["logprobs"]["content"]]
        return (c["message"]["content"], c["finish_reason"], lps), r["timings"]["cache_source"]
    from_disk = 0
    for sent in bodies:
        for i, b in enumerate(sent):
            warm, source = post(b)
            cold, _ = post(dict(b, cache_prompt=False))
            assert warm == cold, b["messages"]
            # The first question on a system text finds only what the disk held.
            from_disk += i == 0 and source == "cache"
    assert from_disk >= 1, f"no request restored an entry from the disk ({loaded} loaded)"

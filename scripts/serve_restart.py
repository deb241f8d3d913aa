#!/usr/bin/env python3
"""The first request after a restart with --cache-dir against warm ones (geist serve).

Starts `geist serve --cache-dir DIR` on a fresh temporary directory (127.0.0.1, a free
port), sends the pinned-prefix workload's requests (scripts/serve_load.py: --prefixes
system texts of ~240 tokens, each request with its own ~385-token question, 16 tokens
generated, greedy, streaming), stops the server with SIGTERM (it finishes its disk
writes), starts it again on the same directory and times its first request on a known
prefix. Then, on that restarted server, warm requests of the same shape (a known system
text, a new question; the slot holds another prefix, so the prefix comes from the
snapshot cache as it did for the first one) give the reference: median of --warm.
Repeated --trials times (each on a fresh directory, filled by a first server and then
restarted once per kind of first request), for two kinds of first request:

  new:    a known system text with a question never asked (cached: the system text);
  repeat: a prompt asked before the restart, word for word (cached: the whole prompt).

Prints per trial the first request's end-to-end time, time to first token, the server's
prompt_ms and cached_tokens, the warm medians and the ratio first / warm (end to end),
then the median ratio per kind. Also checks that each first request's reply equals the
same request computed without the cache (new) or before the restart (repeat).

  flock /tmp/geist-bench.lock python3 scripts/serve_restart.py [--trials 3] [--warm 6]
"""
import argparse
import json
import os
import pathlib
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from serve_load import system_text  # noqa: E402 -- the workload's system texts

ROOT = pathlib.Path(__file__).resolve().parents[1]


def question(k, r):
    return f"Figure {r} of document {k}: " + " ".join(
        f"panel {i} shows series {r}-{i} rising to {i * 7 + r} units;" for i in range(20)) + " Explain."


def body(k, r, max_tokens=16, **extra):
    return dict({"messages": [{"role": "system", "content": system_text(k, 112)},
                              {"role": "user", "content": question(k, r)}],
                 "max_tokens": max_tokens, "temperature": 0, "stream": True,
                 "stream_options": {"include_usage": True}}, **extra)


def stream(url, b):
    """(seconds end to end, seconds to the first content chunk, text, usage, timings)."""
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(b).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    ttft, text, usage, timings = None, "", None, None
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if "error" in ev:
                raise RuntimeError(ev["error"]["message"])
            usage = ev.get("usage") or usage
            timings = ev.get("timings") or timings
            for ch in ev.get("choices", []):
                piece = ch.get("delta", {}).get("content")
                if piece and ttft is None:
                    ttft = time.perf_counter() - t0
                text += piece or ""
    total = time.perf_counter() - t0
    return total, ttft if ttft is not None else total, text, usage, timings


class Server:
    def __init__(self, a, cache_dir, log):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [a.bin, "serve", "-m", a.model, "-t", str(a.threads), "-c", str(a.ctx), "--parallel", "1",
               "--port", str(self.port), "--cache-dir", cache_dir, "-q"] + a.extra
        self.log = open(log, "ab")
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"geist serve exited with {self.proc.returncode}; see {log}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.perf_counter() - t0 > 120:
                self.proc.kill()
                raise RuntimeError(f"geist serve was not ready in 120 s; see {log}")
            time.sleep(0.05)
        self.ready_s = time.perf_counter() - t0

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(60)
        self.log.close()
        if rc != 0:
            raise RuntimeError(f"geist serve exited with {rc} after SIGTERM")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.environ.get("GEIST_BIN", str(ROOT / "build/release/tools/geist")))
    ap.add_argument("--model", default=os.environ.get(
        "GEIST_MODEL", str(pathlib.Path.home() / ".cache/geist/models/gemma-3-270m-q4_k_m.gguf")))
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--ctx", type=int, default=4096)
    ap.add_argument("--prefixes", type=int, default=3, help="system texts (known prefixes)")
    ap.add_argument("--rounds", type=int, default=2, help="requests per system text before the first restart")
    ap.add_argument("--warm", type=int, default=6, help="warm requests after each first request")
    ap.add_argument("--trials", type=int, default=3, help="restarts per kind of first request")
    ap.add_argument("--keep", action="store_true", help="keep the cache directory and logs")
    ap.add_argument("extra", nargs="*", help="more geist serve options (after --)")
    a = ap.parse_args()
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="geist-restart-"))
    log = tmp / "server.log"
    try:
        results = {"new": [], "repeat": []}
        next_q = 20  # questions never asked before (two digits, as the workload's)
        for trial in range(a.trials):
            # A fresh cache directory per trial, filled by one server with the known prefixes.
            cache_dir = str(tmp / f"cache{trial}")
            srv = Server(a, cache_dir, log)
            before = {}
            for r in range(a.rounds):
                for k in range(a.prefixes):
                    _, _, text, usage, _ = stream(srv.url, body(k, r))
                    before[(k, r)] = text
            srv.stop()
            files = sorted(os.listdir(cache_dir))
            size = sum(os.path.getsize(os.path.join(cache_dir, f)) for f in files)
            print(f"trial {trial}: cache dir after {a.rounds * a.prefixes} requests: {len(files)} files, "
                  f"{size / 2**20:.1f} MiB")
            # The repeated prompts first: the new questions' snapshots would make their files
            # the least recently used ones.
            for kind in ("repeat", "new"):
                k = trial % a.prefixes
                srv = Server(a, cache_dir, log)
                if kind == "new":
                    b = body(k, next_q)
                    next_q += 1
                else:
                    b = body(k, trial % a.rounds)
                first = stream(srv.url, b)
                if kind == "new":
                    expect = stream(srv.url, dict(b, cache_prompt=False))[2]
                else:
                    expect = before[(k, trial % a.rounds)]
                # Warm requests of the same shape on this server: each on another system text
                # than the one before it, so the slot never holds it and the snapshot cache
                # gives the prefix, as it did for the first request.
                warm = []
                for w in range(a.warm):
                    kw = (k + 1 + w) % a.prefixes
                    if kind == "new":
                        wb = body(kw, next_q)
                        next_q += 1
                    else:
                        wb = body(kw, w % a.rounds)
                    warm.append(stream(srv.url, wb))
                srv.stop()
                wt = statistics.median(x[0] for x in warm)
                wf = statistics.median(x[1] for x in warm)
                wp = statistics.median(x[4]["prompt_ms"] for x in warm)
                wc = statistics.median(x[3]["prompt_tokens_details"]["cached_tokens"] for x in warm)
                row = {"kind": kind, "ready_s": srv.ready_s, "first_ms": first[0] * 1e3,
                       "first_ttft_ms": first[1] * 1e3, "first_prompt_ms": first[4]["prompt_ms"],
                       "prompt_tokens": first[3]["prompt_tokens"],
                       "cached": first[3]["prompt_tokens_details"]["cached_tokens"],
                       "source": first[4]["cache_source"], "warm_ms": wt * 1e3, "warm_ttft_ms": wf * 1e3,
                       "warm_prompt_ms": wp, "warm_cached": wc, "ratio": first[0] / wt, "same": first[2] == expect}
                results[kind].append(row)
                print(f"trial {trial} {kind:6}: ready in {row['ready_s']:.2f} s; first {row['first_ms']:.0f} ms "
                      f"(TTFT {row['first_ttft_ms']:.0f}, prompt_ms {row['first_prompt_ms']:.0f}, "
                      f"cached {row['cached']}/{row['prompt_tokens']} from {row['source']}); "
                      f"warm median {row['warm_ms']:.0f} ms (TTFT {row['warm_ttft_ms']:.0f}, "
                      f"prompt_ms {row['warm_prompt_ms']:.0f}, cached {row['warm_cached']:.0f}); "
                      f"ratio {row['ratio']:.3f}; reply identical: {row['same']}")
        ok = True
        for kind, rows in results.items():
            med = statistics.median(r["ratio"] for r in rows)
            same = all(r["same"] for r in rows)
            ok = ok and same and all(r["cached"] > 0 for r in rows)
            print(f"{kind:6}: first / warm median ratio {med:.3f} over {len(rows)} restarts "
                  f"(max {max(r['ratio'] for r in rows):.3f}); cached_tokens {[r['cached'] for r in rows]}; "
                  f"replies identical: {same}")
        return 0 if ok else 1
    finally:
        if a.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

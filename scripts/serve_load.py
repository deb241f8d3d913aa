#!/usr/bin/env python3
"""Load and memory runs against a running `geist serve` (127.0.0.1 only, bounded).

  load:   --clients C streaming chat clients, --requests R each (a shared system text,
          distinct questions): errors, complete streams, aggregate generated tokens/s,
          P50/P95 time to first token.
  workload: the pinned-prefix workload over HTTP: 3 system texts (~240 tokens) x 20
          requests, each with its own ~360-token question, 16 tokens generated, greedy;
          each request once with the cache and once with "cache_prompt": false, interleaved:
          end-to-end latency P50/P95 of both, their ratio, and whether outputs are equal
          (--cache on or off: only those requests; works against llama-server too).
  memory: --requests R requests cycling over --prefixes P distinct system texts (each
          request a new question), then R identical requests; the server's RSS
          (/proc/PID/status, --pid) before, after the first phase and after the second.

  python3 scripts/serve_load.py load --url http://127.0.0.1:8080 --clients 8 --requests 4
  python3 scripts/serve_load.py workload --url http://127.0.0.1:8080 [--cache on|off|both]
  python3 scripts/serve_load.py memory --url http://127.0.0.1:8080 --pid PID --requests 200 --prefixes 50
"""
import argparse
import json
import threading
import time
import urllib.request


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def stream(url, body):
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    ttft, done, usage = None, False, None
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.decode().strip()
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                ev = json.loads(line[6:])
                if "error" in ev:
                    raise RuntimeError(ev["error"]["message"])
                if ev.get("usage"):
                    usage = ev["usage"]
                if ttft is None and any(c.get("delta", {}).get("content") for c in ev.get("choices", [])):
                    ttft = time.perf_counter() - t0
    return ttft, done, usage


def pct(xs, p):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def system_text(k, words=150):
    return f"Document {k}. " + " ".join(f"Section {k}.{i} says item {i} of set {k} is fine." for i in range(words // 8))


def load(a):
    ttfts, tokens, errors, incomplete = [], [0], [], [0]
    lock = threading.Lock()

    def client(c):
        for r in range(a.requests):
            body = {"messages": [{"role": "system", "content": system_text(0)},
                                 {"role": "user", "content": f"Client {c}, question {r}: summarize."}],
                    "max_tokens": a.max_tokens, "temperature": 0.7, "seed": c * 1000 + r, "stream": True,
                    "stream_options": {"include_usage": True}}
            try:
                ttft, done, usage = stream(a.url, body)
                with lock:
                    if ttft is not None:
                        ttfts.append(ttft * 1e3)
                    if not done or usage is None:
                        incomplete[0] += 1
                    else:
                        tokens[0] += usage["completion_tokens"]
            except Exception as e:  # noqa: BLE001 -- every failure is counted and printed
                with lock:
                    errors.append(repr(e))
    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dt = time.perf_counter() - t0
    print(f"{a.clients} clients x {a.requests} requests: {len(errors)} errors, {incomplete[0]} incomplete streams")
    print(f"generated {tokens[0]} tokens in {dt:.1f} s: {tokens[0] / dt:.1f} tokens/s aggregate")
    print(f"TTFT P50 {pct(ttfts, 50):.0f} ms  P95 {pct(ttfts, 95):.0f} ms")
    for e in errors[:5]:
        print("error:", e)


def cached_tokens(out):
    """Prompt tokens the server reused: usage.prompt_tokens_details.cached_tokens, or
    llama-server's timings.cache_n where usage does not say."""
    details = (out.get("usage") or {}).get("prompt_tokens_details") or {}
    if "cached_tokens" in details:
        return details["cached_tokens"]
    return (out.get("timings") or {}).get("cache_n", -1)


def workload(a):
    def post(body):
        req = urllib.request.Request(a.url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        t0 = time.perf_counter()
        with urllib.request.urlopen(req, timeout=600) as r:
            out = json.load(r)
        return time.perf_counter() - t0, out
    on, off, same, cached, outputs = [], [], True, [], []
    for r in range(20):
        for k in range(3):
            question = f"Figure {r} of document {k}: " + " ".join(
                f"panel {i} shows series {r}-{i} rising to {i * 7 + r} units;" for i in range(20)) + " Explain."
            body = {"messages": [{"role": "system", "content": system_text(k, 112)},
                                 {"role": "user", "content": question}], "max_tokens": 16, "temperature": 0}
            if a.cache in ("both", "off"):
                t_off, o_off = post(dict(body, cache_prompt=False))
                off.append(t_off * 1e3)
                outputs.append(o_off["choices"][0]["message"]["content"])
            if a.cache in ("both", "on"):
                t_on, o_on = post(body)
                on.append(t_on * 1e3)
                cached.append(cached_tokens(o_on))
                outputs.append(o_on["choices"][0]["message"]["content"])
            if a.cache == "both":
                same = same and o_on["choices"][0]["message"]["content"] == o_off["choices"][0]["message"]["content"]
            n_prompt = (o_on if a.cache != "off" else o_off)["usage"]["prompt_tokens"]
    print(f"60 requests, prompt ~{n_prompt} tokens" + (f", cached median {sorted(cached)[30]} tokens" if cached else ""))
    if off:
        print(f"cache off: P50 {pct(off, 50):.0f} ms  P95 {pct(off, 95):.0f} ms")
    if on:
        print(f"cache on:  P50 {pct(on, 50):.0f} ms  P95 {pct(on, 95):.0f} ms")
    if a.cache == "both":
        print(f"ratio P50 {pct(on, 50) / pct(off, 50):.2f}; outputs identical: {same}")
    if a.outputs:
        with open(a.outputs, "w") as f:
            json.dump(outputs, f, indent=0)


def memory(a):
    def one(k, q):
        body = {"messages": [{"role": "system", "content": system_text(k)},
                             {"role": "user", "content": q}], "max_tokens": 2, "temperature": 0}
        req = urllib.request.Request(a.url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            json.load(r)
    rs = rss_mib(a.pid)
    one(10 ** 6, "Warm-up?")  # the slot's working memory (scratch, KV pages) is touched once
    r0 = rss_mib(a.pid)
    for i in range(a.requests):
        one(i % a.prefixes, f"Question {i}?")
    r1 = rss_mib(a.pid)
    for i in range(a.requests):
        one(0, "The same question?")
    r2 = rss_mib(a.pid)
    print(f"RSS {rs:.0f} MiB at start, {r0:.0f} MiB after one request, {r1:.0f} MiB after {a.requests} requests over {a.prefixes} prefixes "
          f"(+{r1 - r0:.0f}), {r2:.0f} MiB after {a.requests} identical ones (+{r2 - r1:.0f})")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["load", "memory", "workload"])
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--prefixes", type=int, default=50)
    ap.add_argument("--pid", type=int)
    ap.add_argument("--cache", choices=["both", "on", "off"], default="both",
                    help="workload: each request with the cache and without (interleaved), or only one "
                         "of them (against llama-server: 'on'; its cache_prompt=false request would "
                         "leave the whole prompt in the slot for the next one)")
    ap.add_argument("--outputs", help="workload: write the 60 (or 120) reply texts to this JSON file")
    a = ap.parse_args()
    if not a.url.startswith("http://127.0.0.1:"):
        ap.error("--url must be http://127.0.0.1:PORT")
    {"load": load, "memory": memory, "workload": workload}[a.mode](a)


if __name__ == "__main__":
    main()

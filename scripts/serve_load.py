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
  decode: decode throughput of --clients C streaming requests sent at once (each its own
          story prompt, --max-tokens, seeded sampling so replies run long) against one
          request alone: per-chunk arrival times give the tokens/s while every client is
          decoding (the window from the last first token to the first end), the server's
          /metrics give its decode-step rate (rows / seconds in decode steps); also the
          aggregate over the whole run and TTFT P50/P95. --repeat runs of 1 and of C clients,
          alternating; the ratio is the median of the runs' ratios.
  memory: --requests R requests cycling over --prefixes P distinct system texts (each
          request a new question), then R identical requests; the server's RSS
          (/proc/PID/status, --pid) before, after the first phase and after the second.

  python3 scripts/serve_load.py load --url http://127.0.0.1:8080 --clients 8 --requests 4
  python3 scripts/serve_load.py workload --url http://127.0.0.1:8080 [--cache on|off|both]
  python3 scripts/serve_load.py decode --url http://127.0.0.1:8080 --clients 8 --max-tokens 128 --repeat 3
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


def metrics(url):
    with urllib.request.urlopen(url + "/metrics", timeout=60) as r:
        out = {}
        for line in r.read().decode().splitlines():
            if line and not line.startswith("#") and "{" not in line:
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out


def decode_run(a, clients, wave):
    """One wave of `clients` streaming requests sent together: per-client chunk times."""
    res = [None] * clients
    barrier = threading.Barrier(clients)

    def client(c):
        body = {"messages": [{"role": "user", "content": f"Write a long story about a lighthouse keeper "
                              f"named Keeper{c} and the ship number {wave * 100 + c}. Use many chapters."}],
                "max_tokens": a.max_tokens, "temperature": a.temperature, "seed": wave * 100 + c, "stream": True,
                "stream_options": {"include_usage": True}}
        req = urllib.request.Request(a.url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        barrier.wait()
        t0 = time.perf_counter()
        times, usage = [], None
        with urllib.request.urlopen(req, timeout=600) as r:
            for line in r:
                line = line.decode().strip()
                if line.startswith("data: ") and line != "data: [DONE]":
                    ev = json.loads(line[6:])
                    usage = ev.get("usage") or usage
                    if any(ch.get("delta", {}).get("content") for ch in ev.get("choices", [])):
                        times.append(time.perf_counter())
        res[c] = (t0, times, usage["completion_tokens"])
    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return res


def decode(a):
    # 1 and C clients alternate, run by run, so that each ratio compares runs a few seconds
    # apart (on a shared machine the load moves between minutes).
    sizes = sorted({1, a.clients})
    rows = {n: [] for n in sizes}
    for rep in range(a.repeat):
        for n in sizes:
            m0 = metrics(a.url)
            res = decode_run(a, n, rep)
            m1 = metrics(a.url)
            t_start = min(r[0] for r in res)
            firsts = [r[1][0] for r in res]
            ends = [r[1][-1] for r in res]
            lo, hi = max(firsts), min(ends)
            in_window = sum(sum(1 for t in r[1] if lo < t <= hi) for r in res)
            steady = in_window / (hi - lo) if hi > lo else float("nan")
            tokens = sum(r[2] for r in res)
            chunks = sum(len(r[1]) for r in res)
            whole = tokens / (max(ends) - t_start)
            rows_d = m1["geist_decode_rows_total"] - m0["geist_decode_rows_total"]
            secs_d = m1["geist_decode_seconds_total"] - m0["geist_decode_seconds_total"]
            steps = m1["geist_decode_steps_total"] - m0["geist_decode_steps_total"]
            ttft = [(f - r[0]) * 1e3 for f, r in zip(firsts, res)]
            rows[n].append({"steady": steady, "server": rows_d / secs_d, "whole": whole, "ttft": ttft})
            print(f"run {rep}, {n} client(s): {tokens} tokens ({chunks} chunks), all decoding for "
                  f"{hi - lo:.2f} s at {steady:.1f} tokens/s; server decode steps {rows_d / secs_d:.1f} tokens/s "
                  f"({rows_d / steps:.2f} rows/step); whole run {whole:.1f} tokens/s; "
                  f"TTFT P50 {pct(ttft, 50):.0f} ms P95 {pct(ttft, 95):.0f} ms")
        if len(sizes) == 2:
            one, many = rows[1][-1], rows[a.clients][-1]
            print(f"run {rep}: {a.clients} vs 1: {many['steady'] / one['steady']:.2f}x while all decode, "
                  f"{many['server'] / one['server']:.2f}x in the server's decode steps, "
                  f"{many['whole'] / one['whole']:.2f}x over the whole run")
    for n in sizes:
        med = {k: pct([r[k] for r in rows[n]], 50) for k in ("steady", "server", "whole")}
        ttft = [t for r in rows[n] for t in r["ttft"]]
        print(f"{n} client(s), median of {a.repeat}: {med['steady']:.1f} tokens/s while all decode, "
              f"server decode steps {med['server']:.1f} tokens/s, whole run {med['whole']:.1f} tokens/s; "
              f"TTFT P50 {pct(ttft, 50):.0f} ms P95 {pct(ttft, 95):.0f} ms")
    if len(sizes) == 2:
        ratio = {k: pct([m[k] / o[k] for m, o in zip(rows[a.clients], rows[1])], 50)
                 for k in ("steady", "server", "whole")}
        print(f"{a.clients} vs 1, median of the {a.repeat} runs' ratios: {ratio['steady']:.2f}x while all decode, "
              f"{ratio['server']:.2f}x in the server's decode steps, {ratio['whole']:.2f}x over the whole run")


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
    parts = {"on": [], "off": []}  # the server's timings: (prompt_ms, predicted_ms)

    def part(mode, out):
        t = out.get("timings") or {}
        if "prompt_ms" in t and "predicted_ms" in t:
            parts[mode].append((t["prompt_ms"], t["predicted_ms"]))
    for r in range(20):
        for k in range(3):
            question = f"Figure {r} of document {k}: " + " ".join(
                f"panel {i} shows series {r}-{i} rising to {i * 7 + r} units;" for i in range(20)) + " Explain."
            body = {"messages": [{"role": "system", "content": system_text(k, 112)},
                                 {"role": "user", "content": question}], "max_tokens": 16, "temperature": 0}
            if a.cache in ("both", "off"):
                t_off, o_off = post(dict(body, cache_prompt=False))
                off.append(t_off * 1e3)
                part("off", o_off)
                outputs.append(o_off["choices"][0]["message"]["content"])
            if a.cache in ("both", "on"):
                t_on, o_on = post(body)
                on.append(t_on * 1e3)
                part("on", o_on)
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
    for mode in ("off", "on"):
        if parts[mode]:
            print(f"cache {mode}: the server's prompt_ms P50 {pct([x[0] for x in parts[mode]], 50):.0f} ms, "
                  f"predicted_ms (the 16 decoded tokens) P50 {pct([x[1] for x in parts[mode]], 50):.0f} ms")
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
    ap.add_argument("mode", choices=["load", "memory", "workload", "decode"])
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--prefixes", type=int, default=50)
    ap.add_argument("--pid", type=int)
    ap.add_argument("--repeat", type=int, default=3, help="decode: runs of each size")
    ap.add_argument("--temperature", type=float, default=0.8, help="decode: sampling temperature (0: greedy)")
    ap.add_argument("--cache", choices=["both", "on", "off"], default="both",
                    help="workload: each request with the cache and without (interleaved), or only one "
                         "of them (against llama-server: 'on'; its cache_prompt=false request would "
                         "leave the whole prompt in the slot for the next one)")
    ap.add_argument("--outputs", help="workload: write the 60 (or 120) reply texts to this JSON file")
    a = ap.parse_args()
    if not a.url.startswith("http://127.0.0.1:"):
        ap.error("--url must be http://127.0.0.1:PORT")
    {"load": load, "memory": memory, "workload": workload, "decode": decode}[a.mode](a)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Time to first token of `geist serve` with and without its prefix cache.

Starts nothing: point it at a running server (--url). Each round sends the same chat
request twice, interleaved: once with "cache_prompt": false (computed from scratch) and
once with the cache on, streaming, and times the first content chunk at the client. The
system text is about --system-tokens tokens (the pinned-prefix workload's 240 by default),
the user turn varies per round. Prints P50/P95 of both and their ratio, and checks the two
outputs are identical (greedy).

  build/release/tools/geist serve -c 4096 &
  python3 scripts/serve_ttft.py --url http://127.0.0.1:8080 --rounds 20
"""
import argparse
import json
import statistics
import time
import urllib.request


def stream(url, body):
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    ttft, text, usage = None, "", None
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                usage = ev["usage"]
            for ch in ev.get("choices", []):
                piece = ch.get("delta", {}).get("content")
                if piece and ttft is None:
                    ttft = time.perf_counter() - t0
                text += piece or ""
    return ttft if ttft is not None else time.perf_counter() - t0, text, usage


def pct(xs, p):
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--system-tokens", type=int, default=240)
    a = ap.parse_args()
    # About 13 tokens per rule sentence with Gemma's tokenizer.
    system = " ".join(f"Rule {i}: when asked about figure {i}, answer in one short sentence."
                      for i in range(max(1, a.system_tokens // 13)))
    cold, warm, cached, prompt = [], [], [], 0
    same = True
    for i in range(a.rounds + 1):
        body = {"messages": [{"role": "system", "content": system},
                             {"role": "user", "content": f"What does figure {i} show, in round {i}?"}],
                "max_tokens": a.max_tokens, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}
        tc, text_c, _ = stream(a.url, dict(body, cache_prompt=False))
        tw, text_w, usage = stream(a.url, body)
        if i == 0:
            continue  # the first round fills the cache
        cold.append(tc * 1e3)
        warm.append(tw * 1e3)
        cached.append(usage["prompt_tokens_details"]["cached_tokens"])
        prompt = usage["prompt_tokens"]
        same = same and text_c == text_w
    print(f"prompt {prompt} tokens, cached {statistics.median(cached):.0f} (median), {a.rounds} rounds")
    print(f"TTFT uncached: P50 {pct(cold, 50):.1f} ms  P95 {pct(cold, 95):.1f} ms")
    print(f"TTFT cached:   P50 {pct(warm, 50):.1f} ms  P95 {pct(warm, 95):.1f} ms")
    print(f"ratio P50 {pct(warm, 50) / pct(cold, 50):.3f}; outputs identical: {same}")


if __name__ == "__main__":
    main()

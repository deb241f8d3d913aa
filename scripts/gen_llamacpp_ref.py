#!/usr/bin/env python3
"""Reference data from llama.cpp (through the llama-cpp-python package) for geist's
end-to-end tests on the default model. Writes:

  tests/data/ref/gemma3_270m_logits.json   per prompt: llama.cpp's token ids, and at every
      position the top-20 (id, logit) and the log-sum-exp of all logits;
  tests/data/ref/gemma3_270m_ppl.json      llama.cpp's perplexity of
      tests/data/text/kjv_genesis.txt with the algorithm of its perplexity tool (BOS at the
      start of every window, second half of each window scored).

Usage: pip install llama-cpp-python gguf numpy; python3 scripts/gen_llamacpp_ref.py [MODEL]
"""
import hashlib
import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import llama_cpp

ROOT = Path(__file__).resolve().parent.parent
MODEL = sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser("~/.cache/geist/models/gemma-3-270m-q4_k_m.gguf")
TOPK = 20
N_THREADS = 2

# Prompts of at least 64 tokens, written for this test (prose, code, dialogue, lists).
PROMPTS = [
    "The lighthouse keeper had kept the lamp burning for thirty-one years, through storms that "
    "tore the shutters from their hinges and calms so deep that the sea looked like poured glass. "
    "Every evening he climbed the one hundred and twelve steps, trimmed the wick, polished the lens, "
    "and wrote a single line in the logbook. On the night the supply boat failed to arrive, he wrote",
    "def merge_sorted(a, b):\n    \"\"\"Merge two sorted lists into one sorted list.\"\"\"\n    i = j = 0\n"
    "    out = []\n    while i < len(a) and j < len(b):\n        if a[i] <= b[j]:\n            out.append(a[i])\n"
    "            i += 1\n        else:\n            out.append(b[j])\n            j += 1\n    out.extend(a[i:])\n"
    "    out.extend(b[j:])\n    return out\n\n\ndef test_merge_sorted():\n    assert merge_sorted([1, 4, 9], [2, 3, 10]) ==",
    "Q: What causes the seasons on Earth?\nA: The seasons are caused by the tilt of Earth's rotational axis, "
    "about 23.4 degrees relative to its orbital plane. As Earth orbits the Sun, the hemisphere tilted toward "
    "the Sun receives more direct sunlight and longer days.\nQ: Why is the sky blue?\nA:",
    "Shopping list for the weekend camping trip:\n1. Tent, stakes and a spare rope\n2. Two sleeping bags rated "
    "to minus five degrees\n3. Camp stove, a lighter and three gas canisters\n4. Oatmeal, dried apricots, coffee, "
    "rice and lentils\n5. First-aid kit with plasters, bandages and antiseptic\n6. Headlamps and extra batteries\n7.",
    "Die Stadt lag still unter dem ersten Schnee des Jahres. In den Fenstern brannten Kerzen, und aus den "
    "Schornsteinen stieg Rauch in den grauen Himmel. Auf dem Marktplatz standen noch die Buden vom Vortag, "
    "verlassen und mit Planen bedeckt. Nur ein alter Mann mit einem Hund ging langsam über das Pflaster und",
]


def logsumexp(x):
    m = float(np.max(x))
    return m + math.log(float(np.sum(np.exp(x.astype(np.float64) - m))))


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 22), b""):
            h.update(b)
    return h.hexdigest()


def make_llm(n_ctx):
    # The most precise configuration llama.cpp offers: f32 K/V cache and no flash attention.
    # With its defaults (f16 cache, CPU flash attention accumulating V in f16) its logits
    # differ from its own f32-cache run by a KL of about 8e-3 per position, far more than
    # the engine differences this reference is meant to catch.
    return llama_cpp.Llama(model_path=MODEL, n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_threads=N_THREADS,
                           logits_all=True, verbose=False, type_k=llama_cpp.GGML_TYPE_F32,
                           type_v=llama_cpp.GGML_TYPE_F32, flash_attn=False)


def eval_all(llm, ids):
    """Logits after every token of ids, from a fresh cache: [len(ids)][n_vocab]."""
    llm.reset()
    llm.eval(ids)
    return np.array(llm.scores[: len(ids)], dtype=np.float32)


def gen_logits(llm, meta):
    cases = []
    for text in PROMPTS:
        ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
        assert len(ids) >= 64, (len(ids), text[:40])
        logits = eval_all(llm, ids)
        rows = []
        for row in logits:
            top = np.argsort(-row, kind="stable")[:TOPK]
            rows.append({"top": [[int(t), float(row[t])] for t in top], "lse": logsumexp(row)})
        cases.append({"text": text, "ids": [int(t) for t in ids], "positions": rows})
        print(f"logits: {len(ids)} tokens", file=sys.stderr)
    out = dict(meta, top_k=TOPK, cases=cases)
    (ROOT / "tests/data/ref/gemma3_270m_logits.json").write_text(json.dumps(out, indent=None) + "\n")


def gen_ppl(meta, n_ctx=512):
    llm = make_llm(n_ctx)
    text_path = ROOT / "tests/data/text/kjv_genesis.txt"
    ids = llm.tokenize(text_path.read_bytes(), add_bos=True, special=False)
    n_chunk = len(ids) // n_ctx
    first = n_ctx // 2
    nll, count = 0.0, 0
    for c in range(n_chunk):
        win = list(ids[c * n_ctx:(c + 1) * n_ctx])
        win[0] = llm.token_bos()
        logits = eval_all(llm, win).astype(np.float64)
        for j in range(first, n_ctx - 1):
            row = logits[j]
            m = row.max()
            nll += math.log(np.exp(row - m).sum()) - (row[ids[c * n_ctx + j + 1]] - m)
            count += 1
        print(f"ppl chunk {c + 1}/{n_chunk}: {math.exp(nll / count):.4f}", file=sys.stderr)
    out = dict(meta, text="tests/data/text/kjv_genesis.txt", n_ctx=n_ctx, n_tokens=len(ids), n_chunk=n_chunk,
               n_scored=count, ppl=math.exp(nll / count), token_ids_sha256=hashlib.sha256(
                   np.array(ids, dtype=np.int32).tobytes()).hexdigest())
    (ROOT / "tests/data/ref/gemma3_270m_ppl.json").write_text(json.dumps(out, indent=1) + "\n")
    print(f"ppl = {out['ppl']:.4f}", file=sys.stderr)


def main():
    meta = {
        "generator": "scripts/gen_llamacpp_ref.py",
        "engine": f"llama-cpp-python {llama_cpp.__version__}",
        "model_file": os.path.basename(MODEL),
        "model_sha256": sha256(MODEL),
        "settings": {"n_threads": N_THREADS, "n_batch": 512, "kv_cache": "f32", "flash_attn": False},
    }
    gen_logits(make_llm(1024), meta)
    gen_ppl(meta)


if __name__ == "__main__":
    main()

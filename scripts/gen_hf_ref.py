#!/usr/bin/env python3
"""Exact-math reference logits for the default model from HF transformers (float32, eager
attention, use_cache=True) running on the weights of the same GGUF, dequantized by
transformers' GGUF loader (which uses the gguf package). Writes
tests/data/ref/gemma3_270m_hf_logits.json: the prompts of gemma3_270m_logits.json (token ids
as llama.cpp tokenized them) plus one prompt longer than the 512-token sliding window;
per position the top-20 (id, logit), the log-sum-exp and the full-vocab argmax.

Usage: pip install torch transformers accelerate gguf llama-cpp-python;
       python3 scripts/gen_hf_ref.py [MODEL]
"""
import json
import math
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import transformers

ROOT = Path(__file__).resolve().parent.parent
MODEL = sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser("~/.cache/geist/models/gemma-3-270m-q4_k_m.gguf")
TOPK = 20
LONG_TOKENS = 700  # > the sliding window of 512, so the window mask is exercised


def main():
    torch.set_num_threads(2)
    d = tempfile.mkdtemp()
    os.symlink(MODEL, os.path.join(d, "model.gguf"))
    model = transformers.AutoModelForCausalLM.from_pretrained(d, gguf_file="model.gguf", dtype=torch.float32,
                                                              attn_implementation="eager")
    model.eval()
    llama_ref = json.loads((ROOT / "tests/data/ref/gemma3_270m_logits.json").read_text())
    prompts = [c["ids"] for c in llama_ref["cases"]]
    import llama_cpp  # only its tokenizer, for the long prompt's ids
    vocab = llama_cpp.Llama(model_path=MODEL, vocab_only=True, verbose=False)
    text = (ROOT / "tests/data/text/kjv_genesis.txt").read_bytes()
    prompts.append(vocab.tokenize(text, add_bos=True, special=False)[:LONG_TOKENS])
    cases = []
    for ids in prompts:
        with torch.no_grad():
            logits = model(torch.tensor([ids]), use_cache=True).logits[0].double().numpy()
        rows = []
        for row in logits:
            top = np.argsort(-row, kind="stable")[:TOPK]
            m = row.max()
            rows.append({"top": [[int(t), float(row[t])] for t in top],
                         "lse": float(m + math.log(np.exp(row - m).sum()))})
        cases.append({"ids": [int(t) for t in ids], "positions": rows})
        print(f"hf: {len(ids)} tokens", file=sys.stderr)
    out = {
        "generator": "scripts/gen_hf_ref.py",
        "engine": f"transformers {transformers.__version__}, torch {torch.__version__}, float32, eager attention",
        "weights": "dequantized from the GGUF by transformers' GGUF loader",
        "model_file": os.path.basename(MODEL),
        "model_sha256": llama_ref["model_sha256"],
        "top_k": TOPK,
        "cases": cases,
    }
    (ROOT / "tests/data/ref/gemma3_270m_hf_logits.json").write_text(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Tiny random Gemma 4 text models made with HF transformers, and their reference logits.

For each model in MODELS this writes OUT/<name>/ with
  config.json, model.safetensors   the HF checkpoint (save_pretrained)
  ref_<name>.json                  prompts (token ids) and, per prompt, the file of its logits
  ref_<name>_<i>.f32                     float32 logits [n_tokens][vocab], little endian, for every
                                   position of prompt i (one forward of the whole prompt,
                                   float32, eager attention, use_cache=True)
tools/convert_gemma4.py turns the checkpoint into GGUF; tests/gemma4_logits_int.cpp checks
geist's logits on those GGUFs against ref_<i>.f32.

The two models cover what Gemma 4 E2B/E4B do differently from Gemma 3 (model-spec.md s4):
per-layer embeddings (PLE), KV-shared layers (the last N layers read the cache of the last
owner layer of their type), 16-wide sliding heads next to 32-wide full heads, proportional
partial RoPE on full layers (partial_rotary_factor 0.25), a per-layer output scale, final
softcap 30; model "b" also has one KV head and the double-wide FFN of its KV-shared layers
(use_double_wide_mlp, as E2B). Weights are random with larger spreads than HF's init (q/k norms
0.5 + 0.05 N(0,1), other norms 1 + 0.1 N(0,1), the final one 3 + 0.1 N(0,1), layer scalars in [0.5, 1.5]) so that every term matters.

Usage (needs torch and transformers with Gemma4; the committed data was made on the lent
GPU machine, on its CPU, with transformers 5.17.0 and torch 2.11.0):
  python3 scripts/make_gemma4_vocab.py      # the tokenizer the GGUFs carry
  python3 scripts/make_tiny_gemma4_hf.py OUT
  for m in a b; do for t in f32 q8_0; do
    python3 tools/convert_gemma4.py OUT/$m tests/data/gemma4/tiny_gemma4_${m}_$t.gguf --type $t \
        --tokenizer tests/data/tokenizer/gemma4_tiny_tokenizer.json; done
    cp OUT/$m/ref_$m.json OUT/$m/ref_${m}_*.f32 tests/data/gemma4/
    # the Q8_0 copy's reference: HF on the GGUF's own weights, dequantized by the gguf package
    python3 scripts/dequant_gemma4_gguf.py tests/data/gemma4/tiny_gemma4_${m}_q8_0.gguf OUT/$m OUT/${m}_q8_0
    python3 scripts/make_tiny_gemma4_hf.py --reference OUT/${m}_q8_0 ${m}_q8_0 tests/data/gemma4; done
"""
import json
import os
import sys

import numpy as np
import torch
import transformers
from transformers import Gemma4ForCausalLM, Gemma4TextConfig

VOCAB = 384
SEED = 20261202

LAYER_TYPES = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention",
               "sliding_attention", "full_attention", "sliding_attention", "full_attention"]

MODELS = {
    # E4B-like: 2 KV heads, 3 KV-shared layers (5: full -> 2, 6: sliding -> 4, 7: full -> 2)
    "a": dict(num_key_value_heads=2, num_kv_shared_layers=3, use_double_wide_mlp=False),
    # E2B-like: 1 KV head, 4 KV-shared layers with double-wide FFNs (4 -> 3, 5 -> 2, 6 -> 3, 7 -> 2)
    "b": dict(num_key_value_heads=1, num_kv_shared_layers=4, use_double_wide_mlp=True),
}

PROMPT_LENGTHS = [5, 23, 41]  # the longer ones exceed the sliding window of 8


def make_config(extra):
    return Gemma4TextConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=len(LAYER_TYPES),
        num_attention_heads=4,
        head_dim=16,
        global_head_dim=32,
        layer_types=LAYER_TYPES,
        sliding_window=8,
        final_logit_softcapping=30.0,
        vocab_size_per_layer_input=VOCAB,
        hidden_size_per_layer_input=32,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        attention_k_eq_v=False,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
        },
        pad_token_id=0, eos_token_id=1, bos_token_id=2,
        **extra,
    )


def randomize(model, gen):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name == "model.norm.weight":  # the final norm sets the logit scale (std ~2.5)
                p.copy_(3.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith(("q_norm.weight", "k_norm.weight")):
                # Attention scale is 1 and q, k are RMS-normalized: weights near 0.5 keep the
                # scores at std ~1 (16- and 32-wide heads), as trained models do; with 1 the
                # softmax is so sharp that 8-bit weights flip the argmax.
                p.copy_(0.5 + 0.05 * torch.randn(p.shape, generator=gen))
            elif name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif "embed_tokens_per_layer" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            elif "embed_tokens" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            elif p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen) / np.sqrt(p.shape[1]))
            else:
                raise SystemExit(f"unexpected parameter {name} {tuple(p.shape)}")
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(0.5 + torch.rand(b.shape, generator=gen))


def prompts_for_test():
    rng = np.random.default_rng(SEED)
    return [[2] + [int(t) for t in rng.integers(5, VOCAB, n - 1)] for n in PROMPT_LENGTHS]


def write_refs(model, name, d):
    """ref_<name>.json + ref_<name>_<i>.f32: logits at every position of every prompt."""
    ref = {"generator": "scripts/make_tiny_gemma4_hf.py",
           "engine": f"transformers {transformers.__version__}, torch {torch.__version__}, float32, eager, use_cache=True",
           "vocab": VOCAB, "prompts": []}
    for i, ids in enumerate(prompts_for_test()):
        with torch.no_grad():
            logits = model(torch.tensor([ids]), use_cache=True).logits[0].float().numpy()
        assert logits.shape == (len(ids), VOCAB)
        f = f"ref_{name}_{i}.f32"
        logits.astype("<f4").tofile(os.path.join(d, f))
        ref["prompts"].append({"ids": ids, "logits": f})
        print(name, i, len(ids), "argmax", logits.argmax(-1)[:8].tolist(), "std", float(logits.std()))
    with open(os.path.join(d, f"ref_{name}.json"), "w") as fh:
        json.dump(ref, fh, indent=1)


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "--reference":
        # --reference HF_DIR NAME OUT: logits of an existing checkpoint (e.g. the dequantized
        # weights of a quantized GGUF, scripts/dequant_gemma4_gguf.py)
        _, _, src, name, out = sys.argv
        model = Gemma4ForCausalLM.from_pretrained(src, dtype=torch.float32, attn_implementation="eager").eval()
        os.makedirs(out, exist_ok=True)
        write_refs(model, name, out)
        return
    out = sys.argv[1]
    torch.manual_seed(SEED)
    for name, extra in MODELS.items():
        gen = torch.Generator().manual_seed(SEED + ord(name))
        cfg = make_config(extra)
        model = Gemma4ForCausalLM(cfg).eval().to(torch.float32)
        model.config._attn_implementation = "eager"
        randomize(model, gen)
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        model.save_pretrained(d, safe_serialization=True)
        write_refs(model, name, d)
        print(name, "params", sum(p.numel() for p in model.parameters()))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""A random-weight GGUF with the real Gemma 4 E4B (or E2B) text geometry, for speed and
memory measurements (not for output quality).

Geometry (model-spec.md s4.1, s4.5-4.6): E4B d 2560, 42 layers (5 sliding + 1 full, x7),
8 heads / 2 KV heads, head dims 256 sliding / 512 full, FFN 10240, PLE 256 per layer,
the last 18 layers KV-shared, window 512, vocab 262144, tied head, softcap 30. E2B: d 1536,
35 layers (4 + 1, x7), 1 KV head, FFN 6144 / 12288 (double-wide in the 20 shared layers).

Tensor types, a Q4_K_M-like mix: attn_q, attn_k, attn_output, ffn_gate, ffn_up Q4_K;
attn_v, ffn_down Q6_K; token_embd (= the output head) Q6_K; the PLE table
per_layer_token_embd Q6_K (E4B: 262144 x 10752 = 2.8 G entries, 2.3 GB); the PLE
projections per_layer_model_proj, inp_gate, proj BF16; norms f32. The quantized blocks are
random bytes with every f16 scale set to a small finite value (valid blocks); BF16 values
N(0, 0.02). Norm weights 1, layer output scales 1.

The tokenizer is the tiny synthetic Gemma 4 vocabulary (tests/data/tokenizer/
gemma4_tiny_tokenizer.json) padded with <unusedN> tokens to 262144 entries.

Usage: python3 scripts/make_synth_gemma4.py OUT.gguf [--variant e4b|e2b]
Needs numpy and gguf. Writes ~5.5 GB (E4B) / ~3.6 GB (E2B) and needs about as much RAM.
"""
import argparse
import json
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT
from gguf.constants import GGML_QUANT_SIZES

ROOT = Path(__file__).resolve().parent.parent
VOCAB = 262144

VARIANTS = {
    "e4b": dict(d=2560, L=42, period=6, n_kv=2, shared=18, ff=lambda l, shared: 10240),
    "e2b": dict(d=1536, L=35, period=5, n_kv=1, shared=20, ff=lambda l, shared: 12288 if shared else 6144),
}
SCALE_OFFSETS = {QT.Q4_K: (0, 2), QT.Q6_K: (208,)}


def random_blocks(rng, rows, cols, qt):
    block, size = GGML_QUANT_SIZES[qt]
    nb = cols // block
    a = rng.integers(0, 256, size=(rows, nb, size), dtype=np.uint8)
    d = np.frombuffer(np.float16(0.002).tobytes(), dtype=np.uint8)
    for off in SCALE_OFFSETS[qt]:
        a[:, :, off:off + 2] = d
    return a.reshape(rows, nb * size)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--variant", default="e4b", choices=sorted(VARIANTS))
    args = ap.parse_args()
    v = VARIANTS[args.variant]
    d, L, n_kv, n_shared = v["d"], v["L"], v["n_kv"], v["shared"]
    sliding = [(l + 1) % v["period"] != 0 for l in range(L)]
    sliding[-1] = False
    first_shared = L - n_shared
    n_ff = [v["ff"](l, l >= first_shared) for l in range(L)]
    H, hd_s, hd_f, d_ple = 8, 256, 512, 256
    rng = np.random.default_rng(7)

    w = gguf.GGUFWriter(args.out, "gemma4")
    w.add_name(f"synthetic-gemma4-{args.variant}-random")
    w.add_description("random weights with the real geometry; made by scripts/make_synth_gemma4.py")
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    p = "gemma4."
    w.add_uint32(p + "block_count", L)
    w.add_uint32(p + "context_length", 131072)
    w.add_uint32(p + "embedding_length", d)
    w.add_array(p + "feed_forward_length", n_ff)
    w.add_uint32(p + "attention.head_count", H)
    w.add_uint32(p + "attention.head_count_kv", n_kv)
    w.add_uint32(p + "attention.key_length", hd_f)
    w.add_uint32(p + "attention.value_length", hd_f)
    w.add_uint32(p + "attention.key_length_swa", hd_s)
    w.add_uint32(p + "attention.value_length_swa", hd_s)
    w.add_float32(p + "attention.layer_norm_rms_epsilon", 1e-6)
    w.add_uint32(p + "attention.sliding_window", 512)
    w.add_array(p + "attention.sliding_window_pattern", sliding)
    w.add_uint32(p + "attention.shared_kv_layers", n_shared)
    w.add_uint32(p + "embedding_length_per_layer_input", d_ple)
    w.add_float32(p + "rope.freq_base", 1e6)
    w.add_float32(p + "rope.freq_base_swa", 1e4)
    w.add_uint32(p + "rope.dimension_count", hd_f)
    w.add_uint32(p + "rope.dimension_count_swa", hd_s)
    w.add_float32(p + "final_logit_softcapping", 30.0)

    tj = json.loads((ROOT / "tests/data/tokenizer/gemma4_tiny_tokenizer.json").read_text(encoding="utf-8"))
    tokens = [f"<unused{i}>" for i in range(VOCAB)]
    types = [int(gguf.TokenType.UNUSED)] * VOCAB
    for text, i in tj["model"]["vocab"].items():
        tokens[i] = text
        types[i] = int(gguf.TokenType.BYTE if text.startswith("<0x") and len(text) == 6 else gguf.TokenType.NORMAL)
    for a in tj["added_tokens"]:
        tokens[a["id"]] = a["content"]
        types[a["id"]] = int(gguf.TokenType.CONTROL)
    w.add_tokenizer_model("gemma4")
    w.add_tokenizer_pre("gemma4")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in tj["model"]["merges"]])
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_eot_token_id(tokens.index("<turn|>"))
    w.add_add_bos_token(True)
    w.add_add_space_prefix(False)

    def q(name, n_in, n_out, qt):
        a = random_blocks(rng, n_out, n_in, qt)
        w.add_tensor(name, a, raw_shape=a.shape, raw_dtype=qt)

    def bf16(name, n_in, n_out):
        x = (0.02 * rng.standard_normal((n_out, n_in), dtype=np.float32))
        a = gguf.quants.quantize(x, QT.BF16)
        w.add_tensor(name, a, raw_shape=a.shape, raw_dtype=QT.BF16)

    def ones(name, n):
        w.add_tensor(name, np.ones(n, dtype=np.float32))

    q("token_embd.weight", d, VOCAB, QT.Q6_K)
    q("per_layer_token_embd.weight", L * d_ple, VOCAB, QT.Q6_K)
    bf16("per_layer_model_proj.weight", d, L * d_ple)
    ones("per_layer_proj_norm.weight", d_ple)
    ones("output_norm.weight", d)
    w.add_tensor("rope_freqs.weight", np.array([1.0] * 64 + [1e30] * 192, dtype=np.float32))
    for l in range(L):
        b = f"blk.{l}."
        hd = hd_s if sliding[l] else hd_f
        ones(b + "attn_norm.weight", d)
        q(b + "attn_q.weight", d, H * hd, QT.Q4_K)
        ones(b + "attn_q_norm.weight", hd)
        if l < first_shared:
            q(b + "attn_k.weight", d, n_kv * hd, QT.Q4_K)
            q(b + "attn_v.weight", d, n_kv * hd, QT.Q6_K)
            ones(b + "attn_k_norm.weight", hd)
        q(b + "attn_output.weight", H * hd, d, QT.Q4_K)
        ones(b + "post_attention_norm.weight", d)
        ones(b + "ffn_norm.weight", d)
        q(b + "ffn_gate.weight", d, n_ff[l], QT.Q4_K)
        q(b + "ffn_up.weight", d, n_ff[l], QT.Q4_K)
        q(b + "ffn_down.weight", n_ff[l], d, QT.Q6_K)
        ones(b + "post_ffw_norm.weight", d)
        bf16(b + "inp_gate.weight", d, d_ple)
        bf16(b + "proj.weight", d_ple, d)
        ones(b + "post_norm.weight", d)
        ones(b + "layer_output_scale.weight", 1)
        print(f"layer {l}", file=sys.stderr, end="\r")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

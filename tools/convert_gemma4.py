#!/usr/bin/env python3
"""Convert an HF Gemma 4 text checkpoint (config.json + *.safetensors) to GGUF.

Writes the metadata keys and tensor names of model-spec.md s4.5-4.6 (the ones llama.cpp's
converter writes for `gemma4`), so a GGUF from either converter loads in geist:

  gemma4.{block_count, context_length, embedding_length, feed_forward_length (per layer),
          attention.head_count, attention.head_count_kv, attention.key_length (full layers),
          attention.value_length, attention.key_length_swa, attention.value_length_swa,
          attention.layer_norm_rms_epsilon, attention.sliding_window,
          attention.sliding_window_pattern (bool per layer, true = sliding),
          attention.shared_kv_layers, embedding_length_per_layer_input,
          rope.freq_base, rope.freq_base_swa, rope.dimension_count, rope.dimension_count_swa,
          final_logit_softcapping}
  token_embd, per_layer_token_embd, per_layer_model_proj, per_layer_proj_norm, output_norm,
  rope_freqs (f32 [hd_full / 2]: 1 for the rotated pairs, 1e30 for the rest), and per layer
  blk.N.{attn_norm, attn_q, attn_q_norm, attn_k, attn_k_norm, attn_v (owners only),
  attn_output, post_attention_norm, ffn_norm, ffn_gate, ffn_up, ffn_down, post_ffw_norm,
  inp_gate, proj, post_norm, layer_output_scale}.

Gemma 4 norms are plain (x * w, no +1 shift). Matrices are written as --type (f32, f16,
bf16 or q8_0; q8_0 falls back to f32 for a matrix whose input width is not a multiple of
32); norms, scalars and rope_freqs stay f32. MoE and K=V (attention_k_eq_v) checkpoints
are refused.

The tokenizer comes from an HF tokenizer.json (--tokenizer, default: the checkpoint's):
its BPE vocab, merges and added tokens become tokenizer.ggml.* with model "gemma4".

Usage: python3 tools/convert_gemma4.py HF_DIR OUT.gguf [--type f32|f16|bf16|q8_0] [--tokenizer tokenizer.json]
Needs: numpy, gguf, safetensors.
"""
import argparse
import json
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT
from safetensors.numpy import load_file

ARCH = "gemma4"


def load_tensors(d: Path):
    out = {}
    for f in sorted(d.glob("*.safetensors")):
        out.update(load_file(str(f)))
    # Multimodal checkpoints prefix the text model with "model.language_model."
    return {k.replace("model.language_model.", "model."): v for k, v in out.items()}


def tensor_map(T, L, first_shared, d_ple):
    """(HF name, GGUF name, "matrix" | "vector") for every tensor that is converted."""
    out = [("model.embed_tokens.weight", "token_embd.weight", "matrix")]
    if d_ple:
        out += [("model.embed_tokens_per_layer.weight", "per_layer_token_embd.weight", "matrix"),
                ("model.per_layer_model_projection.weight", "per_layer_model_proj.weight", "matrix"),
                ("model.per_layer_projection_norm.weight", "per_layer_proj_norm.weight", "vector")]
    out.append(("model.norm.weight", "output_norm.weight", "vector"))
    for i in range(L):
        s, b = f"model.layers.{i}.", f"blk.{i}."
        m = [("input_layernorm.weight", "attn_norm.weight", "vector"),
             ("self_attn.q_proj.weight", "attn_q.weight", "matrix"),
             ("self_attn.q_norm.weight", "attn_q_norm.weight", "vector")]
        if i < first_shared:
            m += [("self_attn.k_proj.weight", "attn_k.weight", "matrix"),
                  ("self_attn.v_proj.weight", "attn_v.weight", "matrix"),
                  ("self_attn.k_norm.weight", "attn_k_norm.weight", "vector")]
        m += [("self_attn.o_proj.weight", "attn_output.weight", "matrix"),
              ("post_attention_layernorm.weight", "post_attention_norm.weight", "vector"),
              ("pre_feedforward_layernorm.weight", "ffn_norm.weight", "vector"),
              ("mlp.gate_proj.weight", "ffn_gate.weight", "matrix"),
              ("mlp.up_proj.weight", "ffn_up.weight", "matrix"),
              ("mlp.down_proj.weight", "ffn_down.weight", "matrix"),
              ("post_feedforward_layernorm.weight", "post_ffw_norm.weight", "vector")]
        if d_ple:
            m += [("per_layer_input_gate.weight", "inp_gate.weight", "matrix"),
                  ("per_layer_projection.weight", "proj.weight", "matrix"),
                  ("post_per_layer_input_norm.weight", "post_norm.weight", "vector")]
        if s + "layer_scalar" in T:
            m.append(("layer_scalar", "layer_output_scale.weight", "vector"))
        out += [(s + a, b + g, k) for a, g, k in m]
    return out


def write_tokenizer(w: gguf.GGUFWriter, path: Path, n_vocab: int):
    tj = json.loads(path.read_text(encoding="utf-8"))
    m = tj["model"]
    if m.get("type") != "BPE":
        raise SystemExit(f"{path}: tokenizer model {m.get('type')} is not BPE")
    vocab = dict(m["vocab"])
    for a in tj.get("added_tokens", []):
        vocab[a["content"]] = a["id"]
    if len(vocab) > n_vocab or max(vocab.values()) >= n_vocab:
        raise SystemExit(f"{path}: {len(vocab)} tokens do not fit the model's {n_vocab}")
    tokens = [f"<unused{i}>" for i in range(n_vocab)]
    types = [int(gguf.TokenType.UNUSED)] * n_vocab
    for text, i in vocab.items():
        tokens[i] = text
        types[i] = int(gguf.TokenType.NORMAL)
    for i, t in enumerate(tokens):
        if len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
            types[i] = int(gguf.TokenType.BYTE)
    for a in tj.get("added_tokens", []):
        types[a["id"]] = int(gguf.TokenType.CONTROL if a.get("special") else gguf.TokenType.USER_DEFINED)
    merges = [" ".join(x) if isinstance(x, list) else x for x in m["merges"]]
    ids = {t: i for i, t in enumerate(tokens)}
    w.add_tokenizer_model("gemma4")
    w.add_tokenizer_pre("gemma4")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * n_vocab)
    w.add_token_types(types)
    w.add_token_merges(merges)
    for name, add in (("<bos>", w.add_bos_token_id), ("<eos>", w.add_eos_token_id), ("<unk>", w.add_unk_token_id),
                      ("<pad>", w.add_pad_token_id), ("<turn|>", w.add_eot_token_id)):
        if name in ids:
            add(ids[name])
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(False)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("hf_dir", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--type", default="f32", choices=["f32", "f16", "bf16", "q8_0"])
    ap.add_argument("--tokenizer", type=Path)
    args = ap.parse_args()

    cfg = json.loads((args.hf_dir / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    if cfg.get("enable_moe_block"):
        raise SystemExit("MoE Gemma 4 checkpoints are not supported")
    if cfg.get("attention_k_eq_v"):
        raise SystemExit("K=V Gemma 4 checkpoints (attention_k_eq_v) are not supported")
    T = load_tensors(args.hf_dir)
    L = cfg["num_hidden_layers"]
    types = cfg["layer_types"]
    sliding = [t == "sliding_attention" for t in types]
    hd_swa = cfg["head_dim"]
    per_layer = {int(k): v for k, v in cfg.get("per_layer_config", {}).items() if str(k).isdigit()}
    hd_full = next((per_layer[i]["head_dim"] for i in range(L) if not sliding[i] and i in per_layer),
                   cfg.get("global_head_dim", 512))
    n_shared = cfg.get("num_kv_shared_layers", 0)
    first_shared = L - n_shared
    rp = cfg["rope_parameters"]
    full_rope = rp["full_attention"]
    partial = full_rope.get("partial_rotary_factor", 1.0)
    live_pairs = int(partial * hd_full // 2)
    n_ff = [T[f"model.layers.{i}.mlp.gate_proj.weight"].shape[0] for i in range(L)]
    d = cfg["hidden_size"]
    d_ple = cfg.get("hidden_size_per_layer_input", 0)

    w = gguf.GGUFWriter(str(args.out), ARCH)
    w.add_name(args.hf_dir.name)
    w.add_description(f"converted by tools/convert_gemma4.py from {args.hf_dir.name}")
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    p = ARCH + "."
    w.add_uint32(p + "block_count", L)
    w.add_uint32(p + "context_length", cfg["max_position_embeddings"])
    w.add_uint32(p + "embedding_length", d)
    w.add_array(p + "feed_forward_length", n_ff)
    w.add_uint32(p + "attention.head_count", cfg["num_attention_heads"])
    w.add_uint32(p + "attention.head_count_kv", cfg["num_key_value_heads"])
    w.add_uint32(p + "attention.key_length", hd_full)
    w.add_uint32(p + "attention.value_length", hd_full)
    w.add_uint32(p + "attention.key_length_swa", hd_swa)
    w.add_uint32(p + "attention.value_length_swa", hd_swa)
    w.add_float32(p + "attention.layer_norm_rms_epsilon", cfg["rms_norm_eps"])
    w.add_uint32(p + "attention.sliding_window", cfg["sliding_window"])
    w.add_array(p + "attention.sliding_window_pattern", sliding)
    w.add_uint32(p + "attention.shared_kv_layers", n_shared)
    w.add_uint32(p + "embedding_length_per_layer_input", d_ple)
    w.add_float32(p + "rope.freq_base", full_rope["rope_theta"])
    w.add_float32(p + "rope.freq_base_swa", rp["sliding_attention"]["rope_theta"])
    w.add_uint32(p + "rope.dimension_count", hd_full)
    w.add_uint32(p + "rope.dimension_count_swa", hd_swa)
    if cfg.get("final_logit_softcapping"):
        w.add_float32(p + "final_logit_softcapping", cfg["final_logit_softcapping"])

    n_vocab = T["model.embed_tokens.weight"].shape[0]
    tok_path = args.tokenizer or (args.hf_dir / "tokenizer.json")
    if tok_path.exists():
        write_tokenizer(w, tok_path, n_vocab)
    else:
        print(f"warning: no tokenizer ({tok_path}); the GGUF will not load in geist", file=sys.stderr)

    def matrix(name, x):
        x = np.ascontiguousarray(x, dtype=np.float32)
        if args.type == "f32" or (args.type == "q8_0" and x.shape[-1] % 32 != 0):
            w.add_tensor(name, x)
        elif args.type == "f16":
            w.add_tensor(name, x.astype(np.float16))
        else:
            qt = QT.BF16 if args.type == "bf16" else QT.Q8_0
            q = gguf.quants.quantize(x, qt)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qt)

    def vec(name, x):
        w.add_tensor(name, np.ascontiguousarray(x, dtype=np.float32).reshape(-1))

    used = set()

    def get(k):
        used.add(k)
        return T[k]

    for hf, name, kind in tensor_map(T, L, first_shared, d_ple):
        (matrix if kind == "matrix" else vec)(name, get(hf))
    vec("rope_freqs.weight", np.array([1.0] * live_pairs + [1e30] * (hd_full // 2 - live_pairs)))
    left = sorted(k for k in T if k not in used and not k.endswith("lm_head.weight"))
    if left:
        raise SystemExit(f"tensors not converted: {left[:8]}")

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes, {args.type})")


if __name__ == "__main__":
    main()

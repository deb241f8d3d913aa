#!/usr/bin/env python3
"""A random-weight GGUF with the geometry and per-tensor types of the default model, Gemma 3
270M Q4_K_M (gemma-3-270m-q4_k_m.gguf), for speed and memory measurements on machines the
real file cannot be copied to. Not for output quality: the output is gibberish.

Hyperparameters, the gemma3.* keys exactly as the real file has them:
  block_count 18, embedding_length 640, feed_forward_length 2048, head_count 4,
  head_count_kv 1, key_length = value_length 256, context_length 32768, sliding_window 512,
  rope.freq_base 1e6, layer_norm_rms_epsilon 1e-6. The real file has no
  attention.sliding_window_pattern and no rope.freq_base_swa key (the loader's defaults,
  6 and 1e4, apply to both files), and no output.weight (tied head). general.file_type 15.

Tensors: the real file's names, shapes, types and order (so the data offsets match too):
  output_norm                    F32   [640]
  token_embd                     Q8_0  [640, 262144]
  per layer (alphabetical, as in the real file):
    attn_k                       Q5_0  [640, 256]
    attn_q                       Q5_0  [640, 1024]
    attn_v                       Q8_0 in layers 0 1 4 7 10 13 15 16 17, else Q5_0  [640, 256]
    attn_output                  Q4_K  [1024, 640]
    ffn_gate, ffn_up             Q5_0  [640, 2048]
    ffn_down                     Q6_K in layers 0 1 4 7 10 13 15 16 17, else Q4_K  [2048, 640]
    attn_norm, ffn_norm, post_attention_norm, post_ffw_norm   F32 [640]
    attn_q_norm, attn_k_norm     F32   [256]
Quantized blocks are random bytes with every f16 scale field (ggml block layouts, see
SCALE_OFFSETS) set to a small finite normal f16 value, chosen per type so the weights have
a modest magnitude (dequantized std ~0.02 for Q8_0/Q5_0, ~0.04 for Q4_K, ~0.14 for Q6_K; all
finite). Norm weights 1.

Tokenizer: the real vocabulary is not used. The tiny synthetic SentencePiece vocabulary of
scripts/make_tiny_gemma3.py (model "llama", pre "default"; <pad> 0, <eos> 1, <bos> 2,
<unk> 3, <start_of_turn>, <end_of_turn>, 256 byte tokens, a few hundred pieces) is padded
with <unusedN> tokens (control, score -1000, as the real file types its unused tokens) to
the real size 262144, so the output head has the real width. Greedy decoding nearly always
picks an <unusedN> token, which prints as empty text: expect no visible output.

Usage: python3 scripts/make_synth_gemma3.py OUT.gguf [--mix q2_k|q3_k|q4_1|q5_1]
--mix: other per-layer types, for measuring those kernels (the head stays Q8_0). q2_k,
q3_k: attn_output and ffn_down (the only layer matrices whose input width is a multiple
of 256) in Q2_K or Q3_K, the rest as above; q4_1, q5_1: every layer matrix in that type.
Needs numpy and gguf only (and scripts/make_tiny_gemma3.py next to this file). Writes
254,351,584 bytes in a few seconds (the real file: 253,113,024). The tensor data has the real
file's sizes and offsets exactly; the synthetic token list's metadata is ~1.2 MB longer.
"""
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT
from gguf.constants import GGML_QUANT_SIZES

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_tiny_gemma3 import build_vocab  # noqa: E402

VOCAB = 262144
N_LAYER = 18
N_EMBD = 640
N_FF = 2048
N_HEAD = 4
N_HEAD_KV = 1
HEAD_DIM = 256
N_CTX = 32768
WINDOW = 512
ROPE_BASE = 1e6
EPS = 1e-6
FILE_TYPE = 15  # LLAMA_FTYPE_MOSTLY_Q4_K_M
# Layers whose attn_v is Q8_0 (else Q5_0) and ffn_down is Q6_K (else Q4_K), as in the real file.
MORE_BITS = {0, 1, 4, 7, 10, 13, 15, 16, 17}

# Byte offsets of the f16 scale fields (d, and dmin where there is one) in each ggml block.
SCALE_OFFSETS = {
    QT.Q4_0: (0,),         # d, qs[16]                          18 B / 32
    QT.Q4_1: (0, 2),       # d, m, qs[16]                       20 B / 32
    QT.Q5_0: (0,),         # d, qh[4], qs[16]                   22 B / 32
    QT.Q5_1: (0, 2),       # d, m, qh[4], qs[16]                24 B / 32
    QT.Q8_0: (0,),         # d, qs[32]                          34 B / 32
    QT.Q2_K: (80, 82),     # scales[16], qs[64], d, dmin        84 B / 256
    QT.Q3_K: (108,),       # hmask[32], qs[64], scales[12], d  110 B / 256
    QT.Q4_K: (0, 2),       # d, dmin, scales[12], qs[128]      144 B / 256
    QT.Q5_K: (0, 2),       # d, dmin, scales[12], qh[32], qs[128]  176 B / 256
    QT.Q6_K: (208,),       # ql[128], qh[64], scales[16], d    210 B / 256
}
# The f16 value written to those fields (all normal f16 numbers, no subnormals), picked so
# random bytes dequantize to a modest magnitude.
SCALE_VALUE = {
    QT.Q4_0: 4e-3, QT.Q4_1: 4e-3, QT.Q5_0: 2e-3, QT.Q5_1: 2e-3, QT.Q8_0: 3e-4,
    QT.Q2_K: 1e-3, QT.Q3_K: 1e-3, QT.Q4_K: 2e-4, QT.Q5_K: 1e-4, QT.Q6_K: 1e-4,
}


def random_blocks(rng, rows, cols, qt):
    """uint8 [rows, cols / block * type_size]: random bytes, valid f16 scales."""
    block, size = GGML_QUANT_SIZES[qt]
    assert cols % block == 0, (qt, cols)
    nb = cols // block
    a = rng.integers(0, 256, size=(rows, nb, size), dtype=np.uint8)
    d = np.frombuffer(np.float16(SCALE_VALUE[qt]).tobytes(), dtype=np.uint8)
    for off in SCALE_OFFSETS[qt]:
        a[:, :, off:off + 2] = d
    return a.reshape(rows, nb * size)


def main():
    args = sys.argv[1:]
    mix = None
    if len(args) == 3 and args[1] == "--mix" and args[2] in ("q2_k", "q3_k", "q4_1", "q5_1"):
        mix = args[2]
        args = args[:1]
    if len(args) != 1 or args[0].startswith("-"):
        sys.exit("usage: python3 scripts/make_synth_gemma3.py OUT.gguf [--mix q2_k|q3_k|q4_1|q5_1]")
    out = args[0]
    k_mix = {"q2_k": QT.Q2_K, "q3_k": QT.Q3_K}.get(mix)
    all_mix = {"q4_1": QT.Q4_1, "q5_1": QT.Q5_1}.get(mix)
    rng = np.random.default_rng(270)

    w = gguf.GGUFWriter(out, "gemma3")
    w.add_type("model")
    w.add_name("synthetic-gemma3-270m-q4_k_m-random")
    w.add_description("random weights with the real Gemma 3 270M Q4_K_M geometry and tensor "
                      "types; made by scripts/make_synth_gemma3.py")
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_layer_norm_rms_eps(EPS)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_freq_base(ROPE_BASE)
    w.add_sliding_window(WINDOW)
    w.add_head_count_kv(N_HEAD_KV)

    tiny_tokens, tiny_scores, tiny_types, ids = build_vocab()
    n = len(tiny_tokens)
    assert n < VOCAB
    tokens = tiny_tokens + [f"<unused{i}>" for i in range(VOCAB - n)]
    scores = tiny_scores + [-1000.0] * (VOCAB - n)
    types = tiny_types + [int(gguf.TokenType.CONTROL)] * (VOCAB - n)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(ids["<bos>"])
    w.add_eos_token_id(ids["<eos>"])
    w.add_unk_token_id(ids["<unk>"])
    w.add_pad_token_id(ids["<pad>"])
    w.add_add_bos_token(True)
    w.add_bool("tokenizer.ggml.add_sep_token", False)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(False)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_file_type(FILE_TYPE)

    def q(name, n_in, n_out, qt):
        if name.startswith("blk."):
            if all_mix is not None:
                qt = all_mix
            elif k_mix is not None and n_in % 256 == 0:
                qt = k_mix
        a = random_blocks(rng, n_out, n_in, qt)
        w.add_tensor(name, a, raw_shape=a.shape, raw_dtype=qt)

    def ones(name, n):
        w.add_tensor(name, np.ones(n, dtype=np.float32))

    qd, kvd = N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM
    ones("output_norm.weight", N_EMBD)
    q("token_embd.weight", N_EMBD, VOCAB, QT.Q8_0)
    for il in range(N_LAYER):
        p = f"blk.{il}."
        more = il in MORE_BITS
        q(p + "attn_k.weight", N_EMBD, kvd, QT.Q5_0)
        ones(p + "attn_k_norm.weight", HEAD_DIM)
        ones(p + "attn_norm.weight", N_EMBD)
        q(p + "attn_output.weight", qd, N_EMBD, QT.Q4_K)
        q(p + "attn_q.weight", N_EMBD, qd, QT.Q5_0)
        ones(p + "attn_q_norm.weight", HEAD_DIM)
        q(p + "attn_v.weight", N_EMBD, kvd, QT.Q8_0 if more else QT.Q5_0)
        q(p + "ffn_down.weight", N_FF, N_EMBD, QT.Q6_K if more else QT.Q4_K)
        q(p + "ffn_gate.weight", N_EMBD, N_FF, QT.Q5_0)
        ones(p + "ffn_norm.weight", N_EMBD)
        q(p + "ffn_up.weight", N_EMBD, N_FF, QT.Q5_0)
        ones(p + "post_attention_norm.weight", N_EMBD)
        ones(p + "post_ffw_norm.weight", N_EMBD)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {out}: {os.path.getsize(out)} bytes")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Write tests/data/tiny_gemma3.gguf: a random-weight Gemma 3 model for fast tests.

The model is meant for tests that need a real forward pass but not real quality (TSan,
fuzzing, concurrency, session/KV-cache logic): it loads through the same code as a real
Gemma 3 GGUF, runs in well under a millisecond per token and is under 1 MB.

Geometry (model-spec.md section 2, keys prefixed "gemma3."):
  6 layers, n_embd 64, 4 heads / 2 kv heads, head_dim (key_length = value_length) 16,
  feed_forward_length 256, sliding_window 8, sliding_window_pattern 6 (layers 0-4 sliding,
  layer 5 global: layer il is sliding iff (il + 1) % 6 != 0), context_length 512,
  rms eps 1e-6, rope freq_base 1e6 (global) / freq_base_swa 1e4 (sliding), tied output
  head (no output.weight), no logit softcapping.

Tensor types (all have an integer-dot form in geist's q8 activation mode):
  token_embd                Q8_0   [64, n_vocab]
  attn_q, attn_k            Q5_0   [64, 64] / [64, 32]
  attn_v                    Q8_0   [64, 32]
  attn_output               Q4_0   [64, 64]  (input dim 64: a K-quant needs 256)
  ffn_gate, ffn_up          Q8_0   [64, 256]
  ffn_down                  Q6_K on even layers, Q4_K on odd layers  [256, 64]
  norms                     F32    (GGUF norms carry Gemma's +1: mean + 0.1 N(0,1), mean 1,
                                    1.5 for the post-norms, 3 for output_norm; see the scales)

32-element formats are quantized with gguf.quants.quantize. gguf 0.19.0 has no K-quant
quantizer, so Q4_K and Q6_K are quantized here (plain min/max and absmax per sub-block,
not ggml's search), packed as ggml lays them out and checked against
gguf.quants.dequantize.

Tokenizer: SentencePiece-style ("llama", pre "default"), as Gemma 3 GGUFs carry it:
  0 <pad> (control), 1 <eos> (control), 2 <bos> (control), 3 <unk> (unknown),
  4 <start_of_turn>, 5 <end_of_turn> (control), 6..261 <0x00>..<0xFF> (byte),
  then "\\n", "▁", lowercase letters, digits, punctuation and common English words with and without
  the "▁" prefix, each with the chain of prefixes that lets SPM merging reach it (normal).
  Scores of normal tokens decrease with id (like Gemma's); special and byte tokens 0.
  add_bos_token true, add_eos_token false, add_space_prefix false, eot_token_id 5.

Weights: N(0, 1/n_in) for matrices, N(0, 0.1^2) for the embedding (logits of std ~2.4).
Deterministic (fixed seed); made with gguf 0.19.0 and numpy 2.x.

Usage: python3 scripts/make_tiny_gemma3.py [out_path]   (default: tests/data/tiny_gemma3.gguf)
"""

import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT
from gguf.constants import GGML_QUANT_SIZES

SEED = 20250301

N_LAYER = 6
N_EMBD = 64
N_HEAD = 4
N_HEAD_KV = 2
HEAD_DIM = 16
N_FF = 256
WINDOW = 8
PATTERN = 6
N_CTX = 512
EPS = 1e-6
ROPE_BASE = 1e6
ROPE_BASE_SWA = 1e4
# Scales. With a tied head the input embedding e_t stays in the residual stream, and its own
# logit leads the others by about sqrt(n_embd) * cos(e_t, h) standard deviations; a small
# embedding and larger post-norms (each block adds a vector of rms ~POST_NORM_MEAN) keep that
# lead ~1 sd, so greedy decoding does not just repeat its input. output_norm sets the logit
# scale: std ~ EMBD_STD * sqrt(n_embd) * OUTPUT_NORM_MEAN.
EMBD_STD = 0.1
NORM_STD = 0.1          # spread of every norm weight around its mean
NORM_MEAN = 1.0         # attn_norm, ffn_norm, attn_q_norm, attn_k_norm
POST_NORM_MEAN = 1.5    # post_attention_norm, post_ffw_norm
OUTPUT_NORM_MEAN = 3.0  # output_norm

QK_K = 256

# ---------------------------------------------------------------------------------------
# K-quant quantizers (the gguf package only dequantizes these).


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16)


def _safe_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(b == 0, 0.0, a / np.where(b == 0, 1.0, b))


def quantize_q6_k(x: np.ndarray) -> np.ndarray:
    """x [rows, cols] f32 (cols % 256 == 0) -> uint8 [rows, cols / 256 * 210]."""
    rows, cols = x.shape
    b = x.reshape(-1, QK_K).astype(np.float32)                     # [nb, 256]
    nb = b.shape[0]
    sub = b.reshape(nb, 16, 16)
    s = np.abs(sub).max(axis=-1) / 31.0                             # [nb, 16] >= 0
    d = _f16(s.max(axis=-1) / 127.0)                                # [nb]
    df = d.astype(np.float32)
    sc = np.clip(np.rint(_safe_div(s, df[:, None])), 0, 127).astype(np.int8)   # [nb, 16]
    step = df[:, None] * sc.astype(np.float32)                      # [nb, 16]
    q = np.clip(np.rint(_safe_div(sub, step[:, :, None])), -32, 31).astype(np.int16) + 32
    q = q.reshape(nb, QK_K).astype(np.uint8)                        # 0..63
    lo, hi = q & 0x0F, q >> 4
    lo = lo.reshape(nb, 2, 2, 64)                                   # [half, nibble, j]
    ql = (lo[:, :, 0, :] | (lo[:, :, 1, :] << 4)).reshape(nb, 128)
    hi = hi.reshape(nb, 2, 4, 32)                                   # [half, shift, j]
    qh = (hi[:, :, 0, :] | (hi[:, :, 1, :] << 2) | (hi[:, :, 2, :] << 4) | (hi[:, :, 3, :] << 6))
    qh = qh.reshape(nb, 64)
    out = np.concatenate([ql, qh, sc.view(np.uint8), d.reshape(nb, 1).view(np.uint8)], axis=1)
    return out.reshape(rows, -1)


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """x [rows, cols] f32 (cols % 256 == 0) -> uint8 [rows, cols / 256 * 144]."""
    rows, cols = x.shape
    b = x.reshape(-1, QK_K).astype(np.float32)
    nb = b.shape[0]
    sub = b.reshape(nb, 8, 32)
    mn = np.minimum(sub.min(axis=-1), 0.0)                          # [nb, 8] <= 0
    mx = sub.max(axis=-1)
    scale = (mx - mn) / 15.0                                        # [nb, 8]
    m = -mn                                                         # [nb, 8] >= 0
    d = _f16(scale.max(axis=-1) / 63.0)
    dmin = _f16(m.max(axis=-1) / 63.0)
    df, dminf = d.astype(np.float32), dmin.astype(np.float32)
    sc = np.clip(np.rint(_safe_div(scale, df[:, None])), 0, 63).astype(np.uint8)
    mq = np.clip(np.rint(_safe_div(m, dminf[:, None])), 0, 63).astype(np.uint8)
    step = df[:, None] * sc.astype(np.float32)
    off = dminf[:, None] * mq.astype(np.float32)
    q = np.clip(np.rint(_safe_div(sub + off[:, :, None], step[:, :, None])), 0, 15).astype(np.uint8)
    q = q.reshape(nb, 4, 2, 32)                                     # [group, nibble, j]
    qs = (q[:, :, 0, :] | (q[:, :, 1, :] << 4)).reshape(nb, 128)
    scales = np.zeros((nb, 12), dtype=np.uint8)
    scales[:, 0:4] = (sc[:, 0:4] & 0x3F) | ((sc[:, 4:8] >> 4) << 6)
    scales[:, 4:8] = (mq[:, 0:4] & 0x3F) | ((mq[:, 4:8] >> 4) << 6)
    scales[:, 8:12] = (sc[:, 4:8] & 0x0F) | ((mq[:, 4:8] & 0x0F) << 4)
    out = np.concatenate([d.reshape(nb, 1).view(np.uint8), dmin.reshape(nb, 1).view(np.uint8),
                          scales, qs], axis=1)
    return out.reshape(rows, -1)


def quantize(x: np.ndarray, qtype: QT) -> np.ndarray:
    if qtype == QT.Q6_K:
        q = quantize_q6_k(x)
    elif qtype == QT.Q4_K:
        q = quantize_q4_k(x)
    else:
        q = gguf.quants.quantize(x, qtype)
    block, type_size = GGML_QUANT_SIZES[qtype]
    assert q.shape == (x.shape[0], x.shape[1] // block * type_size), (qtype, q.shape)
    # Round trip through the gguf package's dequantizer: catches packing mistakes.
    back = gguf.quants.dequantize(q, qtype).reshape(x.shape)
    rel = np.sqrt(np.mean((back - x) ** 2) / np.mean(x ** 2))
    limit = {QT.Q8_0: 0.02, QT.Q6_K: 0.05, QT.Q5_0: 0.08, QT.Q4_K: 0.15, QT.Q4_0: 0.15}[qtype]
    assert rel < limit, f"{qtype.name}: relative rms error {rel:.4f} >= {limit}"
    return q


# ---------------------------------------------------------------------------------------
# Vocabulary.

WORDS = """
the of and to a in is it you that he was for on are with as I his they be at one have
this from or had by not but what some we can out other were all there when up use
your how said an each she which do their time if will way about many then them would
like so these her make see him two has look more day could go come did no my
who may down now new work get good me very just think say help old
world hello model user question answer test
""".split()

UNPREFIXED = """
the of and to a in is it you that what we how hello world model user test
""".split()

SUFFIXES = ["s", "ed", "ing", "er", "ly", "es", "'s", "n't"]
PUNCT = list(".,!?;:'\"()-/")


def build_vocab():
    """-> (tokens, scores, types, ids) with ids the special-token ids by name."""
    T = gguf.TokenType
    tokens, scores, types = [], [], []

    def add(text, ttype, score=0.0):
        assert text not in index, text
        index[text] = len(tokens)
        tokens.append(text)
        types.append(int(ttype))
        scores.append(float(score))

    index = {}
    add("<pad>", T.CONTROL)
    add("<eos>", T.CONTROL)
    add("<bos>", T.CONTROL)
    add("<unk>", T.UNKNOWN)
    add("<start_of_turn>", T.CONTROL)
    add("<end_of_turn>", T.CONTROL)
    for byte in range(256):
        add(f"<0x{byte:02X}>", T.BYTE)

    # Normal pieces: single characters first, then each word's prefix chain (so the
    # pairwise SPM merge can reach the word), then the word itself.
    normal = ["\n", "\u2581"]
    normal += [chr(c) for c in range(ord("a"), ord("z") + 1)]
    normal += [str(i) for i in range(10)]
    normal += PUNCT
    pieces = [("\u2581" + w) for w in WORDS] + UNPREFIXED + SUFFIXES
    for p in pieces:
        for k in range(2, len(p) + 1):
            normal.append(p[:k])
    seen = set()
    for i, text in enumerate(t for t in normal if not (t in seen or seen.add(t))):
        add(text, T.NORMAL, -float(i))
    ids = {name: index[name] for name in ("<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>")}
    return tokens, scores, types, ids


# ---------------------------------------------------------------------------------------


def main():
    out_path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "tiny_gemma3.gguf")
    rng = np.random.default_rng(SEED)
    tokens, scores, types, ids = build_vocab()
    n_vocab = len(tokens)

    w = gguf.GGUFWriter(out_path, "gemma3")
    w.add_name("tiny-gemma3-random")
    w.add_description("random weights for tests; made by scripts/make_tiny_gemma3.py")
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_layer_norm_rms_eps(EPS)
    w.add_rope_freq_base(ROPE_BASE)
    w.add_rope_freq_base_swa(ROPE_BASE_SWA)
    w.add_sliding_window(WINDOW)
    w.add_sliding_window_pattern(PATTERN)

    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(ids["<bos>"])
    w.add_eos_token_id(ids["<eos>"])
    w.add_unk_token_id(ids["<unk>"])
    w.add_pad_token_id(ids["<pad>"])
    w.add_eot_token_id(ids["<end_of_turn>"])
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(False)

    def matrix(name, n_in, n_out, qtype, std=None):
        x = rng.standard_normal((n_out, n_in), dtype=np.float32)
        x *= np.float32(std if std is not None else 1.0 / np.sqrt(n_in))
        q = quantize(x, qtype)
        w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qtype)

    def norm(name, n, mean=NORM_MEAN):
        x = (mean + NORM_STD * rng.standard_normal(n)).astype(np.float32)
        w.add_tensor(name, x)

    qd, kvd = N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM
    matrix("token_embd.weight", N_EMBD, n_vocab, QT.Q8_0, std=EMBD_STD)
    for il in range(N_LAYER):
        p = f"blk.{il}."
        norm(p + "attn_norm.weight", N_EMBD)
        matrix(p + "attn_q.weight", N_EMBD, qd, QT.Q5_0)
        matrix(p + "attn_k.weight", N_EMBD, kvd, QT.Q5_0)
        matrix(p + "attn_v.weight", N_EMBD, kvd, QT.Q8_0)
        norm(p + "attn_q_norm.weight", HEAD_DIM)
        norm(p + "attn_k_norm.weight", HEAD_DIM)
        matrix(p + "attn_output.weight", qd, N_EMBD, QT.Q4_0)
        norm(p + "post_attention_norm.weight", N_EMBD, POST_NORM_MEAN)
        norm(p + "ffn_norm.weight", N_EMBD)
        matrix(p + "ffn_gate.weight", N_EMBD, N_FF, QT.Q8_0)
        matrix(p + "ffn_up.weight", N_EMBD, N_FF, QT.Q8_0)
        matrix(p + "ffn_down.weight", N_FF, N_EMBD, QT.Q6_K if il % 2 == 0 else QT.Q4_K)
        norm(p + "post_ffw_norm.weight", N_EMBD, POST_NORM_MEAN)
    norm("output_norm.weight", N_EMBD, OUTPUT_NORM_MEAN)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {os.path.normpath(out_path)}: {n_vocab} tokens, {os.path.getsize(out_path)} bytes")


if __name__ == "__main__":
    main()

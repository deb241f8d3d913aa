#!/usr/bin/env python3
"""Write tests/data/tiny.gguf and tests/data/tiny_expect.json.

tiny.gguf is written with the `gguf` PyPI package's GGUFWriter (a writer independent of
geist): GGUF version 3, general.alignment = 64, metadata of every value type (and arrays
of ints, floats, strings, bools, an empty array and a nested array), a few gemma3-like
keys, and small tensors of types F32, F16, Q8_0, Q4_K, Q5_0 and Q6_K.

tiny_expect.json describes what a reader must find. Keys, types and values come from
what this script asked the writer to write; tensor offsets, the data offset and shapes
are read back with gguf's GGUFReader, and each tensor's FNV-1a-64 hash is computed from
the bytes this script supplied. Made with gguf 0.19.0; the output is deterministic.

Usage: python3 scripts/make_test_gguf.py [out_dir]   (default: tests/data)

JSON layout:
  {"version": 3, "alignment": 64, "data_offset": N, "file_size": N,
   "kv": [{"key": k, "type": "UINT32", "value": v}                      scalars
          {"key": k, "type": "ARRAY", "elem_type": "INT32", "value": [..]}  arrays
          {"key": k, "type": "ARRAY", "elem_type": "ARRAY", "count": n}     nested arrays
         ...],                                       (in file order)
   "tensors": [{"name", "type", "n_dims", "ne": [4 ints], "offset", "n_bytes",
                "fnv1a64": "hex"}, ...]}              (in file order)
"""

import json
import os
import struct
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT

ALIGNMENT = 64


class Writer(gguf.GGUFWriter):
    """GGUFWriter that also packs empty arrays (the stock one refuses them; the spec
    allows count 0). Only used for arrays with an explicit sub_type."""

    def _pack_val(self, val, vtype, add_vtype, sub_type=None):
        if vtype == VT.ARRAY and len(val) == 0 and sub_type is not None:
            out = bytearray()
            if add_vtype:
                out += self._pack("I", vtype)
            out += self._pack("I", sub_type) + self._pack("Q", 0)
            return bytes(out)
        return super()._pack_val(val, vtype, add_vtype, sub_type)


def fnv1a64(data: bytes) -> str:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def f16_bytes(x: float) -> bytes:
    return np.array([x], dtype=np.float16).tobytes()


def q4_k_rows(rng, rows: int, cols: int) -> np.ndarray:
    """Synthetic Q4_K blocks (d, dmin f16; scales[12]; qs[128]) with small finite d."""
    out = bytearray()
    for _ in range(rows * cols // 256):
        out += f16_bytes(0.0125) + f16_bytes(0.003)
        out += rng.integers(0, 64, 12, dtype=np.uint8).tobytes()
        out += rng.integers(0, 256, 128, dtype=np.uint8).tobytes()
    return np.frombuffer(bytes(out), dtype=np.uint8).reshape(rows, -1)


def q6_k_rows(rng, rows: int, cols: int) -> np.ndarray:
    """Synthetic Q6_K blocks (ql[128]; qh[64]; int8 scales[16]; d f16)."""
    out = bytearray()
    for _ in range(rows * cols // 256):
        out += rng.integers(0, 256, 192, dtype=np.uint8).tobytes()
        out += rng.integers(-32, 32, 16, dtype=np.int8).tobytes()
        out += f16_bytes(0.00625)
    return np.frombuffer(bytes(out), dtype=np.uint8).reshape(rows, -1)


# (key, GGUF value type, value, array element type or None), in file order.
# Float values are exactly representable in float32 so readers compare exactly.
KVS = [
    ("general.architecture", VT.STRING, "gemma3", None),
    ("general.name", VT.STRING, "tiny test model", None),
    ("gemma3.context_length", VT.UINT32, 128, None),
    ("gemma3.embedding_length", VT.UINT32, 64, None),
    ("gemma3.block_count", VT.UINT32, 1, None),
    ("gemma3.feed_forward_length", VT.UINT32, 256, None),
    ("gemma3.attention.head_count", VT.UINT32, 4, None),
    ("gemma3.attention.head_count_kv", VT.UINT32, 1, None),
    ("gemma3.attention.layer_norm_rms_epsilon", VT.FLOAT32, 9.5367431640625e-07, None),
    ("gemma3.rope.freq_base", VT.FLOAT32, 10000.0, None),
    ("gemma3.attention.sliding_window", VT.UINT32, 32, None),
    ("tokenizer.ggml.model", VT.STRING, "llama", None),
    ("tokenizer.ggml.tokens", VT.ARRAY, ["<pad>", "<eos>", "<bos>", "\u2581hello", "\u4e16", ""], VT.STRING),
    ("tokenizer.ggml.scores", VT.ARRAY, [0.0, -1.5, -2.25, -3.0, -1000.0, 0.5], VT.FLOAT32),
    ("tokenizer.ggml.token_type", VT.ARRAY, [3, 3, 3, 1, 1, 6], VT.INT32),
    ("tokenizer.ggml.add_bos_token", VT.BOOL, True, None),
    ("test.u8", VT.UINT8, 200, None),
    ("test.i8", VT.INT8, -100, None),
    ("test.u16", VT.UINT16, 65000, None),
    ("test.i16", VT.INT16, -30000, None),
    ("test.u32", VT.UINT32, 4000000000, None),
    ("test.i32", VT.INT32, -2000000000, None),
    ("test.f32", VT.FLOAT32, -3.140625, None),
    ("test.bool_false", VT.BOOL, False, None),
    ("test.string", VT.STRING, "line one\nline \"two\" \u00e9", None),
    ("test.empty_string", VT.STRING, "", None),
    ("test.u64", VT.UINT64, 18000000000000000000, None),
    ("test.i64", VT.INT64, -9000000000000000000, None),
    ("test.f64", VT.FLOAT64, 2.718281828459045, None),
    ("test.arr_u8", VT.ARRAY, [0, 1, 255], VT.UINT8),
    ("test.arr_i16", VT.ARRAY, [-32768, 0, 32767], VT.INT16),
    ("test.arr_u64", VT.ARRAY, [0, 18446744073709551615], VT.UINT64),
    ("test.arr_i64", VT.ARRAY, [-1, 1], VT.INT64),
    ("test.arr_f64", VT.ARRAY, [0.25, -1e300], VT.FLOAT64),
    ("test.arr_bool", VT.ARRAY, [True, False, True], VT.BOOL),
    ("test.arr_empty", VT.ARRAY, [], VT.INT32),
    ("test.arr_nested", VT.ARRAY, [[1, 2], [3]], VT.ARRAY),
]


def make_tensors(rng):
    """(name, array, raw_dtype) in file order. numpy shape is [.., ne1, ne0]."""
    q8 = gguf.quants.quantize(rng.standard_normal((8, 64)).astype(np.float32), QT.Q8_0)
    q5 = gguf.quants.quantize(rng.standard_normal((4, 64)).astype(np.float32), QT.Q5_0)
    return [
        ("token_embd.weight", q8, QT.Q8_0),
        ("blk.0.attn_norm.weight", rng.standard_normal(64).astype(np.float32), QT.F32),
        ("blk.0.attn_q.weight", rng.standard_normal((4, 64)).astype(np.float16), QT.F16),
        ("blk.0.attn_k.weight", q5, QT.Q5_0),
        ("blk.0.ffn_up.weight", q4_k_rows(rng, 2, 256), QT.Q4_K),
        ("blk.0.ffn_down.weight", q6_k_rows(rng, 2, 256), QT.Q6_K),
        ("test.f32_4d", rng.standard_normal((2, 1, 3, 4)).astype(np.float32), QT.F32),
    ]


def json_value(vtype, value, sub):
    if vtype == VT.ARRAY:
        if sub == VT.ARRAY:
            return {"elem_type": "ARRAY", "count": len(value)}
        return {"elem_type": sub.name, "value": list(value)}
    return {"value": value}


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data")
    path = os.path.join(out_dir, "tiny.gguf")
    rng = np.random.default_rng(1234)
    tensors = make_tensors(rng)

    w = Writer(path, arch=None)
    w.add_custom_alignment(ALIGNMENT)  # adds general.alignment (UINT32) first
    for key, vtype, value, sub in KVS:
        w.add_key_value(key, value, vtype, sub_type=sub)
    for name, arr, qt in tensors:
        w.add_tensor(name, arr, raw_dtype=qt if qt not in (QT.F32, QT.F16) else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    r = gguf.GGUFReader(path)
    kv = [{"key": "general.alignment", "type": "UINT32", "value": ALIGNMENT}]
    for key, vtype, value, sub in KVS:
        kv.append({"key": key, "type": vtype.name, **json_value(vtype, value, sub)})
    out_tensors = []
    for (name, arr, qt), t in zip(tensors, r.tensors):
        assert t.name == name and t.tensor_type == qt, (t.name, name)
        ne = [int(x) for x in t.shape] + [1] * (4 - len(t.shape))
        out_tensors.append({
            "name": name, "type": qt.name, "n_dims": len(t.shape), "ne": ne,
            "offset": int(t.data_offset - r.data_offset), "n_bytes": int(t.n_bytes),
            "fnv1a64": fnv1a64(arr.tobytes()),
        })
    expect = {"version": 3, "alignment": ALIGNMENT, "data_offset": int(r.data_offset),
              "file_size": os.path.getsize(path), "kv": kv, "tensors": out_tensors}
    with open(os.path.join(out_dir, "tiny_expect.json"), "w") as f:
        json.dump(expect, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {path} ({expect['file_size']} bytes, {len(kv)} keys, "
          f"{len(out_tensors)} tensors)")


if __name__ == "__main__":
    main()

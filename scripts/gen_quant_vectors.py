#!/usr/bin/env python3
"""Generate the bit-exact dequantization vectors in tests/data/quant/.

The reference is the `gguf` PyPI package (gguf.quants.dequantize), an implementation
independent of geist. Vectors committed with this repo were made with gguf 0.19.0 and
numpy 2.4.6. The output is deterministic (fixed seed): rerunning must reproduce the
committed files byte for byte.

Usage: python3 scripts/gen_quant_vectors.py [out_dir]   (default: tests/data/quant)

File formats (all little-endian, no padding):

  <TYPE>.bin, one per dequantizable type (e.g. Q4_K.bin):
    char[4]  magic     "GQV1"
    uint32   type_id   ggml type number (F32=0, F16=1, ..., Q6_K=14, BF16=30)
    uint64   n         number of elements (a multiple of the block size)
    uint64   raw_len   bytes of raw data (n / block_size * block_bytes)
    uint8    raw[raw_len]   packed blocks as stored in a GGUF tensor
    float32  out[n]         gguf.quants.dequantize(raw, type)

  fp32_to_fp16.bin, rounding cases for float -> half:
    char[4]  magic     "GQH1"
    uint64   count
    uint32   f32_bits[count]
    uint16   f16_bits[count]  np.float32(x).astype(np.float16), bits
"""

import os
import struct
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES

SEED = 20240611

# Blocks per type: >= 64 for the 32-element formats, 32 for the 256-element K-quants.
N_BLOCKS_SMALL = 128
N_BLOCKS_K = 32
N_PLAIN = 4096  # elements for F32 / F16 / BF16

# Byte offsets of the f16 scale fields inside one block, per type. Everything else in
# a block is quant bits or 6/8-bit sub-scales and stays random.
F16_FIELDS = {
    T.Q4_0: [0],
    T.Q4_1: [0, 2],       # d, m
    T.Q5_0: [0],
    T.Q5_1: [0, 2],       # d, m
    T.Q8_0: [0],
    T.Q2_K: [80, 82],     # after scales[16], qs[64]: d, dmin
    T.Q3_K: [108],        # after hmask[32], qs[64], scales[12]: d
    T.Q4_K: [0, 2],       # d, dmin
    T.Q5_K: [0, 2],       # d, dmin
    T.Q6_K: [208],        # after ql[128], qh[64], scales[16]: d
}


def random_scales(rng, count):
    """f16 bit patterns of finite values with |x| in [1e-4, 2] and random sign."""
    mag = np.exp(rng.uniform(np.log(1e-4), np.log(2.0), size=count))
    sign = np.where(rng.random(count) < 0.5, -1.0, 1.0)
    return (mag * sign).astype(np.float16).view(np.uint16)


def set_f16(blocks, row, off, bits):
    blocks[row, off:off + 2] = np.frombuffer(struct.pack("<H", int(bits)), dtype=np.uint8)


def quant_blocks(rng, qtype):
    """(n_blocks, block_bytes) uint8: random blocks, then a few edge blocks at the front."""
    block_size, block_bytes = GGML_QUANT_SIZES[qtype]
    n_blocks = N_BLOCKS_K if block_size == 256 else N_BLOCKS_SMALL
    blocks = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    fields = F16_FIELDS[qtype]
    for off in fields:
        scales = random_scales(rng, n_blocks)
        for row in range(n_blocks):
            set_f16(blocks, row, off, scales[row])

    # Edge blocks. Row 0: zero scales. Row 1: all quant bytes 0xFF (max quants), negative
    # scales. Row 2: all quant bytes 0x00. Row 3: subnormal f16 scales. Row 4: largest
    # finite f16 scales (65504; outputs stay finite in float32). Row 5: -0.0 scales.
    edges = [
        (0, 0xFF, [0x0000] * len(fields)),
        (1, 0xFF, [0xBC00, 0xB800][:len(fields)]),   # -1.0, -0.5
        (2, 0x00, [0x3C00, 0x4000][:len(fields)]),   # 1.0, 2.0
        (3, None, [0x0001, 0x03FF][:len(fields)]),   # smallest / largest subnormal
        (4, 0xFF, [0x7BFF, 0xFBFF][:len(fields)]),   # +65504, -65504
        (5, None, [0x8000] * len(fields)),
    ]
    for row, fill, scale_bits in edges:
        if fill is not None:
            blocks[row, :] = fill
        for off, bits in zip(fields, scale_bits):
            set_f16(blocks, row, off, bits)
    return blocks


def plain_raw(rng, qtype):
    """Raw bytes for F32/F16/BF16: random bit patterns plus every special class."""
    if qtype == T.F32:
        bits = rng.integers(0, 2**32, size=N_PLAIN, dtype=np.uint64).astype(np.uint32)
        specials = [0x00000000, 0x80000000, 0x00000001, 0x807FFFFF, 0x7F800000, 0xFF800000,
                    0x7FC00000, 0x7F800001, 0xFFFFFFFF, 0x3F800000, 0x7F7FFFFF]
    else:
        bits = rng.integers(0, 2**16, size=N_PLAIN, dtype=np.uint32).astype(np.uint16)
        specials = [0x0000, 0x8000, 0x0001, 0x03FF, 0x8001, 0x0400, 0x7BFF, 0x7C00, 0xFC00,
                    0x7C01, 0x7E00, 0xFFFF, 0x3C00, 0x7F80, 0xFF80, 0x7FC0, 0x7F81, 0x0080]
    bits[:len(specials)] = specials
    return bits.view(np.uint8)


def write_vector(path, qtype, raw):
    out = gguf.quants.dequantize(raw, qtype)
    out = np.ascontiguousarray(out, dtype=np.float32).reshape(-1)
    block_size, block_bytes = GGML_QUANT_SIZES[qtype]
    n = out.size
    assert raw.size == n // block_size * block_bytes, (qtype.name, raw.size, n)
    with open(path, "wb") as f:
        f.write(b"GQV1")
        f.write(struct.pack("<IQQ", int(qtype), n, raw.size))
        f.write(raw.tobytes())
        f.write(out.astype("<f4").tobytes())


def fp16_rounding_cases(rng):
    """float32 bit patterns that exercise float -> half rounding."""
    cases = []
    # Midpoints between adjacent finite halves (ties), and one float32 ulp either side.
    h = np.arange(0, 0x7C00, dtype=np.uint32)
    h = np.concatenate([h[rng.permutation(h.size)[:3000]], [0, 1, 0x3FF, 0x400, 0x7BFE, 0x7BFF]])
    lo = h.astype(np.uint16).view(np.float16).astype(np.float64)
    hi = (h + 1).astype(np.uint16).view(np.float16).astype(np.float64)  # 0x7C00 = inf
    hi = np.where(np.isinf(hi), 65536.0, hi)
    mid = ((lo + hi) / 2).astype(np.float32)  # exact: 12 significant bits
    mid_bits = mid.view(np.uint32)
    for delta in (-1, 0, 1):
        cases.append(mid_bits.astype(np.int64) + delta)
    # Random float32 bit patterns, and random values in the half range.
    cases.append(rng.integers(0, 2**32, size=4000, dtype=np.int64))
    cases.append(rng.uniform(-70000, 70000, size=2000).astype(np.float32).view(np.uint32))
    cases.append((np.exp(rng.uniform(np.log(1e-9), np.log(1e-3), size=2000))
                  .astype(np.float32).view(np.uint32)))
    # Named boundaries: zero, float subnormals, 2^-25 (tie to 0), just above, min half
    # subnormal, min normal, max half, 65520 (tie to inf), inf, NaNs with payloads.
    named = [0x00000000, 0x80000000, 0x00000001, 0x007FFFFF, 0x33000000, 0x33000001,
             0xB3000000, 0xB3000001, 0x33800000, 0x337FFFFF, 0x387FC000, 0x387FE000,
             0x387FFFFF, 0x38800000, 0x477FE000, 0x477FEFFF, 0x477FF000, 0x477FF001,
             0xC77FF000, 0x47800000, 0x7F7FFFFF, 0x7F800000, 0xFF800000, 0x7FC00000,
             0xFFC00000, 0x7F800001, 0x7F802000, 0x7FBFFFFF, 0xFFFFFFFF, 0x7FFFE000]
    cases.append(np.array(named, dtype=np.int64))
    f32 = (np.concatenate(cases) & 0xFFFFFFFF).astype(np.uint32)
    f16 = f32.view(np.float32).astype(np.float16).view(np.uint16)
    return f32, f16


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "quant")
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(SEED)
    types = [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0,
             T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]
    with np.errstate(all="ignore"):
        for qtype in types:
            if qtype in (T.F32, T.F16, T.BF16):
                raw = plain_raw(rng, qtype)
            else:
                raw = quant_blocks(rng, qtype).reshape(-1)
            write_vector(os.path.join(out_dir, f"{qtype.name}.bin"), qtype, raw)
        f32, f16 = fp16_rounding_cases(rng)
    with open(os.path.join(out_dir, "fp32_to_fp16.bin"), "wb") as f:
        f.write(b"GQH1")
        f.write(struct.pack("<Q", f32.size))
        f.write(f32.astype("<u4").tobytes())
        f.write(f16.astype("<u2").tobytes())
    print(f"wrote {len(types) + 1} files to {out_dir} (gguf {gguf_version()}, numpy {np.__version__})")


def gguf_version():
    try:
        from importlib.metadata import version
        return version("gguf")
    except Exception:
        return "unknown"


if __name__ == "__main__":
    main()

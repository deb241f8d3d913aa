// On-disk block layouts of the GGUF/ggml quantized types: little-endian, blocks packed
// back to back with no padding, every f16 field stored as raw IEEE half bits.
// These structs mirror the bytes exactly (their sizes are asserted below). Data in a
// mapped file has no alignment guarantee, so read a block with block_load (memcpy),
// never by casting a pointer into the file.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

namespace geist::quant {

static_assert(std::endian::native == std::endian::little,
              "block layouts are little-endian; a big-endian host needs byte swaps");

constexpr int kQK = 32;    // elements per block of the 32-element formats
constexpr int kQK_K = 256; // elements per super-block of the K-quants

// Q4_0: x[i] = d * (q[i] - 8), q in [0, 15].
// qs[j] holds element j in its low nibble and element j + 16 in its high nibble.
struct BlockQ4_0 {
  uint16_t d;            // f16 scale
  uint8_t qs[kQK / 2];   // [16] nibbles
};

// Q4_1: x[i] = d * q[i] + m, q in [0, 15]; nibble order as Q4_0.
struct BlockQ4_1 {
  uint16_t d;            // f16 scale
  uint16_t m;            // f16 offset (the block minimum)
  uint8_t qs[kQK / 2];   // [16] nibbles
};

// Q5_0: x[i] = d * (q[i] - 16), q in [0, 31]. Low 4 bits as the Q4_0 nibbles; bit 4
// of element i is bit i of qh read as a little-endian uint32.
struct BlockQ5_0 {
  uint16_t d;            // f16 scale
  uint8_t qh[4];         // 32 high bits, element i = bit i
  uint8_t qs[kQK / 2];   // [16] low nibbles
};

// Q5_1: x[i] = d * q[i] + m, q in [0, 31]; bits as Q5_0.
struct BlockQ5_1 {
  uint16_t d;            // f16 scale
  uint16_t m;            // f16 offset
  uint8_t qh[4];         // 32 high bits
  uint8_t qs[kQK / 2];   // [16] low nibbles
};

// Q8_0: x[i] = d * q[i], q int8.
struct BlockQ8_0 {
  uint16_t d;            // f16 scale
  int8_t qs[kQK];        // [32]
};

// Q2_K: 16 sub-blocks of 16 elements. Sub-block j has 4-bit scale and 4-bit min in
// scales[j] (low, high nibble); x = d * sc * q - dmin * m, q in [0, 3].
// Element e = 128*h + 32*s + l (h in 0..1, s in 0..3, l in 0..31) is bits 2s..2s+1 of
// qs[32*h + l]; its sub-block is e / 16.
struct BlockQ2_K {
  uint8_t scales[kQK_K / 16];  // [16] (min << 4) | scale
  uint8_t qs[kQK_K / 4];       // [64] 2-bit quants
  uint16_t d;                  // f16 super-block scale of the scales
  uint16_t dmin;               // f16 super-block scale of the mins
};

// Q3_K: 16 sub-blocks of 16 elements, 6-bit signed scales (stored + 32), 3-bit quants
// q = low2 - (high bit set ? 0 : 4), in [-4, 3]; x = d * (sc - 32) * q.
// Low 2 bits: as Q2_K's qs. High bit of element e = 32*b + l (b in 0..7) is bit b of
// hmask[l]. Scales: scale j has low 4 bits = scales[j % 8] >> (4 * (j / 8)) and
// high 2 bits = scales[8 + j % 4] >> (2 * (j / 4)).
struct BlockQ3_K {
  uint8_t hmask[kQK_K / 8];  // [32] high bits
  uint8_t qs[kQK_K / 4];     // [64] low 2 bits
  uint8_t scales[12];        // 16 packed 6-bit scales
  uint16_t d;                // f16 super-block scale
};

// Q4_K: 8 sub-blocks of 32 elements with 6-bit scale sc[j] and 6-bit min m[j] packed in
// scales[12] (see unpack_scale_min_k4); x = d * sc * q - dmin * m, q in [0, 15].
// Element e = 64*c + 32*s + l (c in 0..3, s in 0..1) is nibble s of qs[32*c + l];
// its sub-block is e / 32.
struct BlockQ4_K {
  uint16_t d;                // f16 super-block scale of the scales
  uint16_t dmin;             // f16 super-block scale of the mins
  uint8_t scales[12];        // 8 x (6-bit scale, 6-bit min)
  uint8_t qs[kQK_K / 2];     // [128] nibbles
};

// Q5_K: as Q4_K plus a fifth bit: bit 4 of element e = 32*b + l is bit b of qh[l].
struct BlockQ5_K {
  uint16_t d;                // f16 super-block scale of the scales
  uint16_t dmin;             // f16 super-block scale of the mins
  uint8_t scales[12];        // as Q4_K
  uint8_t qh[kQK_K / 8];     // [32] fifth bits
  uint8_t qs[kQK_K / 2];     // [128] low nibbles
};

// Q6_K: 16 sub-blocks of 16 elements with int8 scales; x = d * sc * (q - 32), q 6-bit.
// Element e = 128*h + 32*s + l (h in 0..1, s in 0..3, l in 0..31):
//   low 4 bits: nibble (s / 2) of ql[64*h + 32*(s % 2) + l]
//   high 2 bits: bits 2s..2s+1 of qh[32*h + l]
// its sub-block is e / 16.
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];       // [128] low nibbles
  uint8_t qh[kQK_K / 4];       // [64] high 2-bit pairs
  int8_t scales[kQK_K / 16];   // [16] signed sub-block scales
  uint16_t d;                  // f16 super-block scale
};

// Bytes per block, as in the GGUF specification (and the table in ggml_type.cpp;
// quant_dequant_unit checks the two agree).
static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ2_K) == 84);
static_assert(sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);

// Scale and min of sub-block j (0..7) of a Q4_K/Q5_K block, both 6-bit. Bytes 0-3 hold
// the scales of sub-blocks 0-3 in their low 6 bits, bytes 4-7 the mins; sub-blocks 4-7
// take their low 4 bits from bytes 8-11 (scale low nibble, min high nibble) and their
// top 2 bits from the top 2 bits of bytes 0-3 (scale) and 4-7 (min).
inline void unpack_scale_min_k4(const uint8_t packed[12], int j, int *sc, int *mn) {
  if (j < 4) {
    *sc = packed[j] & 0x3F;
    *mn = packed[j + 4] & 0x3F;
  } else {
    *sc = (packed[j + 4] & 0x0F) | ((packed[j - 4] >> 6) << 4);
    *mn = (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4);
  }
}

// Copy block i of a packed array of Block into a local value; src may be unaligned.
template <typename Block>
inline Block block_load(const void *src, int64_t i) {
  Block b;
  std::memcpy(&b, static_cast<const uint8_t *>(src) + i * static_cast<int64_t>(sizeof(Block)),
              sizeof(Block));
  return b;
}

}  // namespace geist::quant

// dequantize_row against gguf-py, bit for bit. The vectors in tests/data/quant/<TYPE>.bin
// come from scripts/gen_quant_vectors.py (format documented there): raw GGUF blocks and
// gguf.quants.dequantize's float32 output for them.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "quant/block_formats.h"
#include "quant/quant.h"
#include "test_util.h"

namespace geist::quant {
namespace {

struct Vector {
  uint32_t type_id = 0;
  int64_t n = 0;
  std::vector<uint8_t> raw;     // [raw_len] packed blocks
  std::vector<float> expected;  // [n]
};

template <typename T>
T read_le(const std::vector<uint8_t> &b, size_t off) {
  T v;
  std::memcpy(&v, b.data() + off, sizeof(T));
  return v;
}

// Parses <TYPE>.bin; fails the test (returns false) on a malformed file.
bool load_vector(const std::string &type_name, Vector *v) {
  const std::vector<uint8_t> b = test::read_file(test::data_path("quant/" + type_name + ".bin"));
  if (b.size() < 24 || std::memcmp(b.data(), "GQV1", 4) != 0) {
    ADD_FAILURE() << type_name << ".bin: missing or bad magic";
    return false;
  }
  v->type_id = read_le<uint32_t>(b, 4);
  v->n = static_cast<int64_t>(read_le<uint64_t>(b, 8));
  const uint64_t raw_len = read_le<uint64_t>(b, 16);
  if (b.size() != 24 + raw_len + static_cast<uint64_t>(v->n) * 4) {
    ADD_FAILURE() << type_name << ".bin: size does not match its header";
    return false;
  }
  v->raw.assign(b.begin() + 24, b.begin() + 24 + static_cast<ptrdiff_t>(raw_len));
  v->expected.resize(static_cast<size_t>(v->n));
  std::memcpy(v->expected.data(), b.data() + 24 + raw_len, static_cast<size_t>(v->n) * 4);
  return true;
}

// Equal bits, or both NaN.
bool same_float(float a, float b) {
  if (std::isnan(a) && std::isnan(b)) return true;
  return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

void check_type(GgmlType t) {
  const TypeTraits &tt = traits(t);
  Vector v;
  if (!load_vector(tt.name, &v)) return;
  ASSERT_EQ(v.type_id, static_cast<uint32_t>(t));
  ASSERT_EQ(v.raw.size(), row_bytes(t, v.n));
  ASSERT_GE(v.n / tt.block_size, 16) << "too few blocks to be a meaningful test";

  // Run on a deliberately misaligned copy (odd address) to prove no aligned loads.
  std::vector<uint8_t> shifted(v.raw.size() + 1);
  std::memcpy(shifted.data() + 1, v.raw.data(), v.raw.size());
  std::vector<float> got(static_cast<size_t>(v.n), -12345.0f);
  ASSERT_TRUE(dequantize_row(t, shifted.data() + 1, got.data(), v.n));

  int64_t mismatches = 0;
  for (int64_t i = 0; i < v.n; ++i) {
    if (same_float(got[i], v.expected[i])) continue;
    if (++mismatches <= 8) {
      ADD_FAILURE() << tt.name << " element " << i << " (block " << i / tt.block_size
                    << "): got " << got[i] << " (0x" << std::hex
                    << std::bit_cast<uint32_t>(got[i]) << "), want " << std::dec
                    << v.expected[i] << " (0x" << std::hex
                    << std::bit_cast<uint32_t>(v.expected[i]) << std::dec << ")";
    }
  }
  EXPECT_EQ(mismatches, 0) << tt.name << ": " << mismatches << " of " << v.n << " differ";
}

TEST(QuantDequant, F32) { check_type(GgmlType::F32); }
TEST(QuantDequant, F16) { check_type(GgmlType::F16); }
TEST(QuantDequant, BF16) { check_type(GgmlType::BF16); }
TEST(QuantDequant, Q4_0) { check_type(GgmlType::Q4_0); }
TEST(QuantDequant, Q4_1) { check_type(GgmlType::Q4_1); }
TEST(QuantDequant, Q5_0) { check_type(GgmlType::Q5_0); }
TEST(QuantDequant, Q5_1) { check_type(GgmlType::Q5_1); }
TEST(QuantDequant, Q8_0) { check_type(GgmlType::Q8_0); }
TEST(QuantDequant, Q2_K) { check_type(GgmlType::Q2_K); }
TEST(QuantDequant, Q3_K) { check_type(GgmlType::Q3_K); }
TEST(QuantDequant, Q4_K) { check_type(GgmlType::Q4_K); }
TEST(QuantDequant, Q5_K) { check_type(GgmlType::Q5_K); }
TEST(QuantDequant, Q6_K) { check_type(GgmlType::Q6_K); }

// The block structs and the type table must agree on bytes per block.
TEST(QuantDequant, BlockSizesMatchTypeTable) {
  EXPECT_EQ(sizeof(BlockQ4_0), traits(GgmlType::Q4_0).block_bytes);
  EXPECT_EQ(sizeof(BlockQ4_1), traits(GgmlType::Q4_1).block_bytes);
  EXPECT_EQ(sizeof(BlockQ5_0), traits(GgmlType::Q5_0).block_bytes);
  EXPECT_EQ(sizeof(BlockQ5_1), traits(GgmlType::Q5_1).block_bytes);
  EXPECT_EQ(sizeof(BlockQ8_0), traits(GgmlType::Q8_0).block_bytes);
  EXPECT_EQ(sizeof(BlockQ2_K), traits(GgmlType::Q2_K).block_bytes);
  EXPECT_EQ(sizeof(BlockQ3_K), traits(GgmlType::Q3_K).block_bytes);
  EXPECT_EQ(sizeof(BlockQ4_K), traits(GgmlType::Q4_K).block_bytes);
  EXPECT_EQ(sizeof(BlockQ5_K), traits(GgmlType::Q5_K).block_bytes);
  EXPECT_EQ(sizeof(BlockQ6_K), traits(GgmlType::Q6_K).block_bytes);
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                     GgmlType::Q8_0}) {
    EXPECT_EQ(traits(t).block_size, kQK) << type_name(t);
  }
  for (GgmlType t : {GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K,
                     GgmlType::Q6_K}) {
    EXPECT_EQ(traits(t).block_size, kQK_K) << type_name(t);
  }
}

// Every type the table marks dequantizable is handled (has a vector file and code).
TEST(QuantDequant, EveryDequantTypeIsCovered) {
  int count = 0;
  for (uint32_t id = 0; id < 64; ++id) {
    const TypeTraits *tt = type_traits(id);
    if (tt == nullptr || !tt->has_dequant) continue;
    ++count;
    std::vector<uint8_t> zeros(tt->block_bytes, 0);
    std::vector<float> out(static_cast<size_t>(tt->block_size));
    EXPECT_TRUE(dequantize_row(static_cast<GgmlType>(id), zeros.data(), out.data(),
                               tt->block_size))
        << tt->name;
  }
  EXPECT_EQ(count, 13);
}

TEST(QuantDequant, RejectsUnsupportedTypes) {
  std::vector<uint8_t> src(4096, 0);
  std::vector<float> dst(256, 7.0f);
  for (GgmlType t : {GgmlType::Q8_1, GgmlType::Q8_K, GgmlType::IQ2_XXS, GgmlType::IQ4_NL,
                     GgmlType::IQ4_XS, GgmlType::I8, GgmlType::I32, GgmlType::F64,
                     GgmlType::TQ1_0, GgmlType::MXFP4}) {
    EXPECT_FALSE(dequantize_row(t, src.data(), dst.data(), 256)) << type_name(t);
  }
  // Ids with no ggml type at all.
  EXPECT_FALSE(dequantize_row(static_cast<GgmlType>(4), src.data(), dst.data(), 32));
  EXPECT_FALSE(dequantize_row(static_cast<GgmlType>(63), src.data(), dst.data(), 32));
  EXPECT_FALSE(dequantize_row(static_cast<GgmlType>(1000), src.data(), dst.data(), 32));
  for (float f : dst) EXPECT_EQ(f, 7.0f) << "a failed call wrote to dst";
}

TEST(QuantDequant, RejectsBadLength) {
  std::vector<uint8_t> src(4096, 0);
  std::vector<float> dst(512, 7.0f);
  EXPECT_FALSE(dequantize_row(GgmlType::Q4_0, src.data(), dst.data(), 31));
  EXPECT_FALSE(dequantize_row(GgmlType::Q4_0, src.data(), dst.data(), 33));
  EXPECT_FALSE(dequantize_row(GgmlType::Q8_0, src.data(), dst.data(), 16));
  EXPECT_FALSE(dequantize_row(GgmlType::Q4_K, src.data(), dst.data(), 32));
  EXPECT_FALSE(dequantize_row(GgmlType::Q6_K, src.data(), dst.data(), 257));
  EXPECT_FALSE(dequantize_row(GgmlType::Q4_0, src.data(), dst.data(), -32));
  EXPECT_FALSE(dequantize_row(GgmlType::F32, src.data(), dst.data(), -1));
  for (float f : dst) EXPECT_EQ(f, 7.0f) << "a failed call wrote to dst";
  // Zero elements is a valid (empty) row.
  EXPECT_TRUE(dequantize_row(GgmlType::Q4_K, nullptr, nullptr, 0));
  EXPECT_TRUE(dequantize_row(GgmlType::F16, src.data(), dst.data(), 1));
}

}  // namespace
}  // namespace geist::quant

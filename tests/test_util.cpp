#include "test_util.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>

#include "engine/model_paths.h"
#include "quant/quant.h"

namespace geist::test {

std::string data_path(const std::string &rel) { return std::string(GEIST_TEST_DATA_DIR) + "/" + rel; }

std::string default_model_path() {
  std::string p = geist::default_model_file();
  std::ifstream f(p, std::ios::binary);
  return f.good() ? p : std::string();
}

std::vector<uint8_t> read_file(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << "cannot read " << path;
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

}  // namespace geist::test

namespace geist::test {

std::vector<uint8_t> random_row(quant::GgmlType t, int64_t k, std::mt19937 &rng) {
  using quant::GgmlType;
  if (t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_int_distribution<int> ex(-20, 6);
    std::vector<uint8_t> row(quant::row_bytes(t, k));
    for (int64_t i = 0; i < k; ++i) {
      const float v = std::ldexp(nd(rng), ex(rng));
      if (t == GgmlType::F32) {
        std::memcpy(row.data() + 4 * i, &v, 4);
      } else {
        uint32_t bits;
        std::memcpy(&bits, &v, 4);
        const uint16_t h = t == GgmlType::F16 ? quant::fp32_to_fp16(v) : static_cast<uint16_t>(bits >> 16);
        std::memcpy(row.data() + 2 * i, &h, 2);
      }
    }
    return row;
  }
  const quant::TypeTraits &tt = quant::traits(t);
  std::vector<uint8_t> row(quant::row_bytes(t, k));
  for (auto &b : row) b = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> scale(0.001f, 0.05f);
  for (int64_t b = 0; b < k / tt.block_size; ++b) {
    uint8_t *p = row.data() + b * tt.block_bytes;
    auto put = [&](int off) {
      uint16_t h = quant::fp32_to_fp16(scale(rng));
      std::memcpy(p + off, &h, 2);
    };
    switch (t) {
      case GgmlType::Q2_K: put(80); put(82); break;
      case GgmlType::Q3_K: put(108); break;
      case GgmlType::Q4_K: case GgmlType::Q5_K: put(0); put(2); break;
      case GgmlType::Q6_K: put(208); break;
      case GgmlType::Q4_1: case GgmlType::Q5_1: {  // d, then a negative min (as quantizers make)
        put(0);
        const uint16_t m = quant::fp32_to_fp16(-8.0f * scale(rng));
        std::memcpy(p + 2, &m, 2);
        break;
      }
      default: put(0); break;
    }
  }
  return row;
}

}  // namespace geist::test

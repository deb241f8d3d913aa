// Float hyperparameters of a GGUF (epsilons, RoPE bases, softcaps) that no model can run
// with: NaN, infinities, zero and negative values are refused at load with a message that
// names the key, on both architectures. The cases patch one f32 value of the tiny models.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "engine/model.h"
#include "test_util.h"

namespace geist {
namespace {

// Offset of the f32 value of key k in b (after its name and the u32 type), or 0 if the
// key is absent or not an f32.
size_t f32_value_at(const std::vector<uint8_t> &b, const std::string &k) {
  const auto it = std::search(b.begin(), b.end(), k.begin(), k.end());
  if (it == b.end()) return 0;
  const size_t at = size_t(it - b.begin()) + k.size();
  uint32_t type = 0;
  std::memcpy(&type, &b[at], 4);
  return type == 6 ? at + 4 : 0;  // GGUF type 6: float32
}

struct File {
  const char *path, *arch;
};

TEST(ModelLoad, FloatHyperparametersMustBeFiniteAndPositive) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  int checked = 0;
  for (const File &f : {File{"tiny_gemma3.gguf", "gemma3"}, File{"gemma4/tiny_gemma4_a_q8_0.gguf", "gemma4"}}) {
    const std::vector<uint8_t> good = test::read_file(test::data_path(f.path));
    ASSERT_TRUE(Model::load_from_memory(good.data(), good.size())) << f.path;
    const std::string a = f.arch;
    struct Key {
      std::string name;
      std::vector<float> bad;
    };
    const std::vector<Key> keys = {
        {a + ".attention.layer_norm_rms_epsilon", {nan, inf, 0.0f, -1e-6f}},
        {a + ".rope.freq_base", {nan, inf, -inf, 0.0f, -10000.0f}},
        {a + ".rope.freq_base_swa", {nan, inf, 0.0f, -1.0f}},
        {a + ".final_logit_softcapping", {nan, inf, -30.0f}},
    };
    for (const Key &k : keys) {
      const size_t at = f32_value_at(good, k.name);
      if (at == 0) continue;  // this file does not carry the key
      for (float v : k.bad) {
        std::vector<uint8_t> b = good;
        std::memcpy(&b[at], &v, 4);
        Result<std::unique_ptr<Model>> m = Model::load_from_memory(b.data(), b.size());
        SCOPED_TRACE(k.name + " = " + std::to_string(v));
        ASSERT_FALSE(m);
        EXPECT_EQ(m.status().code(), GEIST_E_BAD_FORMAT);
        EXPECT_NE(m.status().message().find(k.name), std::string::npos) << m.status().message();
        ++checked;
      }
    }
  }
  EXPECT_GE(checked, 8) << "too few keys found in the tiny models";
}

}  // namespace
}  // namespace geist

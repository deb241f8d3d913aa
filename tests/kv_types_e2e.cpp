// KV cache types on the default model (CPU backend): the logits of every position of a
// 1024-token text (two windows of the 512-token sliding window, so the rings wrap) with
// f16, bf16 and q8_0 KV rows against f32 rows. Prints mean/max KL(f32 || type), top-1
// agreement and the perplexity of each (the issue-13 report, docs/CUDA.md and the note).
// Both activation modes. With f32 activations the cost of the rounding shows alone
// (measured, AVX-512, 2 threads: KL f16 2.0e-6, bf16 1.2e-4, q8_0 2.5e-3; top-1 1024,
// 1019, 1010 of 1024). With the default 8-bit activations any perturbation of the
// activations moves some of their per-row quantization steps, and the model's own q8
// noise dominates (f16, bf16 and q8_0 alike: KL ~0.03, top-1 ~95 %; the perplexity of
// f32 KV itself is 1.926 there against 1.889 with f32 activations). Bounds: a few times
// the measured values.
// Also: the same bits for any chunk size with a typed cache, and a snapshot of a typed
// session restores exactly (another type is GEIST_E_MISMATCH).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backends/cpu/ops.h"
#include "engine/model.h"
#include "engine/session.h"
#include "test_util.h"

namespace geist {
namespace {

constexpr size_t kTokens = 1024;

std::unique_ptr<Session> make(const Model &m, KvType t, int chunk) {
  SessionParams p;
  p.n_ctx = kTokens + 16;
  p.chunk = chunk;
  p.type_k = p.type_v = t;
  Result<std::unique_ptr<Session>> s = Session::create(m, p);
  EXPECT_TRUE(s) << s.status().to_string();
  return s ? std::move(s).value() : nullptr;
}

std::vector<float> logits(Session &s, const std::vector<int32_t> &ids) {
  std::vector<float> out(ids.size() * size_t(s.n_vocab()));
  Status st = s.prefill_with_logits(ids.data(), ids.size(), 0, out.data());
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return out;
}

double log_sum_exp(const float *x, int64_t n) {
  const double m = *std::max_element(x, x + n);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(double(x[i]) - m);
  return m + std::log(s);
}

TEST(KvTypesE2e, AgainstF32OnTheDefaultModel) {
  const std::string path = test::default_model_path();
  if (path.empty()) GTEST_SKIP() << "default model not fetched (scripts/fetch_model.py)";
  Result<std::unique_ptr<Model>> mr = Model::load(path);
  ASSERT_TRUE(mr) << mr.status().to_string();
  const Model &m = **mr;
  const std::vector<uint8_t> bytes = test::read_file(test::data_path("text/kjv_genesis.txt"));
  std::vector<int32_t> ids;
  ASSERT_TRUE(m.tokenizer().encode(std::string(bytes.begin(), bytes.end()), true, false, &ids).is_ok());
  ASSERT_GE(ids.size(), kTokens);
  ids.resize(kTokens);
  const int64_t nv = m.info().n_vocab;

  const cpu::ActivationMode old_mode = cpu::activation_mode();
  for (cpu::ActivationMode mode : {cpu::ActivationMode::F32, cpu::ActivationMode::Q8}) {
    cpu::set_activation_mode(mode);
    const bool q8 = mode == cpu::ActivationMode::Q8;
    std::unique_ptr<Session> f32 = make(m, KvType::F32, 256);
    const std::vector<float> ref = logits(*f32, ids);
    auto ppl = [&](const std::vector<float> &lg) {
      double nll = 0;
      for (size_t i = 0; i + 1 < kTokens; ++i) {
        const float *row = lg.data() + i * nv;
        nll += log_sum_exp(row, nv) - row[ids[i + 1]];
      }
      return std::exp(nll / double(kTokens - 1));
    };
    std::printf("%s activations\nkv f32 : perplexity %.4f\n", q8 ? "8-bit" : "f32", ppl(ref));
    for (KvType t : {KvType::F16, KvType::BF16, KvType::Q8_0}) {
      std::unique_ptr<Session> s = make(m, t, 256);
      ASSERT_TRUE(s);
      const std::vector<float> got = logits(*s, ids);
      double kl_sum = 0, kl_max = 0;
      int top1 = 0;
      for (size_t r = 0; r < kTokens; ++r) {
        const float *a = ref.data() + r * nv, *b = got.data() + r * nv;
        const double la = log_sum_exp(a, nv), lb = log_sum_exp(b, nv);
        double kl = 0;
        for (int64_t v = 0; v < nv; ++v) kl += std::exp(a[v] - la) * ((a[v] - la) - (b[v] - lb));
        kl_sum += kl;
        kl_max = std::max(kl_max, kl);
        top1 += std::max_element(a, a + nv) - a == std::max_element(b, b + nv) - b;
      }
      const double kl_mean = kl_sum / double(kTokens);
      std::printf("kv %-4s: KL mean %.3g max %.3g, top-1 %d/%zu, perplexity %.4f\n", kv_type_name(t), kl_mean, kl_max,
                  top1, kTokens, ppl(got));
      const double kl_bound = q8 ? 0.1 : t == KvType::F16 ? 1e-4 : t == KvType::BF16 ? 1e-3 : 1e-2;
      EXPECT_LE(kl_mean, kl_bound) << kv_type_name(t);
      EXPECT_GE(top1, int((q8 ? 0.9 : 0.97) * kTokens)) << kv_type_name(t);

      // Any chunking, the same bits; a snapshot restores exactly, into the same type only.
      std::unique_ptr<Session> s7 = make(m, t, 7);
      const std::vector<int32_t> head(ids.begin(), ids.begin() + 300);
      const std::vector<float> a7 = logits(*s7, head);
      EXPECT_EQ(std::memcmp(a7.data(), got.data(), a7.size() * sizeof(float)), 0) << kv_type_name(t);
      std::vector<uint8_t> img(s7->snapshot_size());
      size_t w = 0;
      ASSERT_TRUE(s7->snapshot(img.data(), img.size(), &w).is_ok());
      std::unique_ptr<Session> r = make(m, t, 64);
      ASSERT_TRUE(r->restore(img.data(), w).is_ok());
      const std::vector<int32_t> tail(ids.begin() + 300, ids.begin() + 400);
      const std::vector<float> cont = logits(*r, tail);
      EXPECT_EQ(std::memcmp(cont.data(), got.data() + 300 * nv, cont.size() * sizeof(float)), 0) << kv_type_name(t);
      EXPECT_EQ(f32->restore(img.data(), w).code(), GEIST_E_MISMATCH);
    }
  }
  cpu::set_activation_mode(old_mode);
}

}  // namespace
}  // namespace geist

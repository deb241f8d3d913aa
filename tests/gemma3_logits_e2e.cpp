// Geist's logits on the default model against two independent engines (tests/data/ref):
// HF transformers in float32 on the GGUF's dequantized weights (scripts/gen_hf_ref.py) and
// llama.cpp (scripts/gen_llamacpp_ref.py). Per position: KL(ref || geist) over the
// reference's top-20 tokens plus the rest of the mass as one bucket, and top-1 agreement.
// Also the llama.cpp-style perplexity of a public-domain text.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <vector>

#include "backends/cpu/ops.h"
#include "engine/model.h"
#include "engine/perplexity.h"
#include "engine/session.h"
#include "test_util.h"

namespace geist {
namespace {

using nlohmann::json;

json load_json(const std::string &rel) {
  std::vector<uint8_t> b = test::read_file(test::data_path(rel));
  return json::parse(b.begin(), b.end());
}

// KL(p || q) with p given by the reference's top-k logits and log-sum-exp, the remaining
// mass of both distributions lumped into one bucket.
double kl_topk(const json &pos, const std::vector<double> &logq) {
  const double lse = pos["lse"].get<double>();
  double kl = 0, p_top = 0, q_top = 0;
  for (const auto &e : pos["top"]) {
    const int id = e[0].get<int>();
    const double lp = e[1].get<double>() - lse;
    const double p = std::exp(lp);
    kl += p * (lp - logq[id]);
    p_top += p;
    q_top += std::exp(logq[id]);
  }
  const double p_rest = std::max(0.0, 1.0 - p_top), q_rest = std::max(1e-30, 1.0 - q_top);
  if (p_rest > 1e-12) kl += p_rest * std::log(p_rest / q_rest);
  return kl;
}

std::vector<double> log_softmax(const float *l, int64_t n) {
  double mx = l[0];
  for (int64_t i = 1; i < n; ++i) mx = std::max(mx, double(l[i]));
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(double(l[i]) - mx);
  const double lse = mx + std::log(s);
  std::vector<double> out(n);
  for (int64_t i = 0; i < n; ++i) out[i] = double(l[i]) - lse;
  return out;
}

struct Agreement {
  double kl_mean = 0, kl_max = 0, top1 = 0;
  int n = 0;
};

// Run every case of a reference file (token ids + per-position top-k logits) through a
// fresh session in the given activation mode and compare.
Agreement compare_with(const Model &m, const json &ref, cpu::ActivationMode mode) {
  cpu::set_activation_mode(mode);
  SessionParams sp;
  sp.n_ctx = 2048;
  sp.chunk = 256;
  auto s = Session::create(m, sp);
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  Agreement a;
  if (!s.is_ok()) return a;
  const int64_t nv = (*s)->n_vocab();
  double kl_sum = 0;
  int n_agree = 0;
  for (const auto &c : ref["cases"]) {
    std::vector<int32_t> ids = c["ids"].get<std::vector<int32_t>>();
    std::vector<float> logits(ids.size() * nv);
    (*s)->clear();
    Status st = (*s)->prefill_with_logits(ids.data(), ids.size(), 0, logits.data());
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    double case_max = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      const json &pos = c["positions"][i];
      const float *row = logits.data() + i * nv;
      const double kl = kl_topk(pos, log_softmax(row, nv));
      kl_sum += kl;
      case_max = std::max(case_max, kl);
      int64_t arg = 0;
      for (int64_t v = 1; v < nv; ++v) {
        if (row[v] > row[arg]) arg = v;
      }
      n_agree += arg == pos["top"][0][0].get<int64_t>();
      ++a.n;
    }
    a.kl_max = std::max(a.kl_max, case_max);
    std::printf("  case of %zu tokens: max KL %.3g\n", ids.size(), case_max);
  }
  cpu::set_activation_mode(cpu::ActivationMode::Q8);
  a.kl_mean = kl_sum / a.n;
  a.top1 = double(n_agree) / a.n;
  std::printf("%d positions: mean KL %.3g, max KL %.3g, top-1 agreement %.2f%%\n", a.n, a.kl_mean, a.kl_max,
              100 * a.top1);
  return a;
}

std::unique_ptr<Model> load_default() {
  auto m = Model::load(test::default_model_path());
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  return m.is_ok() ? std::move(m).value() : nullptr;
}

// Exact arithmetic (f32 activations) against HF transformers in float32 on the same
// dequantized weights: only f32 rounding separates the two.
TEST(Gemma3Logits, ExactModeMatchesTransformers) {
  GEIST_REQUIRE_MODEL(path);
  auto m = load_default();
  ASSERT_TRUE(m);
  Agreement a = compare_with(*m, load_json("ref/gemma3_270m_hf_logits.json"), cpu::ActivationMode::F32);
  EXPECT_LE(a.kl_mean, 1e-5);
  EXPECT_LE(a.kl_max, 1e-4);
  EXPECT_GE(a.top1, 0.995);
}

// The default 8-bit activations against the same exact reference: the cost of quantizing
// activations. llama.cpp (llama-cpp-python 0.3.36, f32 KV cache, no flash attention) scores
// mean KL 0.0138, max 0.401, top-1 96.72% on these 1160 positions; with its defaults
// 0.0145, 0.659, 96.72%. The bounds allow that much and no more.
TEST(Gemma3Logits, Q8ModeCloseToTransformers) {
  GEIST_REQUIRE_MODEL(path);
  auto m = load_default();
  ASSERT_TRUE(m);
  Agreement a = compare_with(*m, load_json("ref/gemma3_270m_hf_logits.json"), cpu::ActivationMode::Q8);
  EXPECT_LE(a.kl_mean, 0.02);
  EXPECT_LE(a.kl_max, 0.5);
  EXPECT_GE(a.top1, 0.95);
}

// Against llama.cpp (f32 KV cache, no flash attention). llama.cpp's own default settings
// differ from this reference by mean KL 4.95e-3, max 0.074, top-1 96.96% on these
// positions (measured with llama-cpp-python 0.3.36), so the bounds sit at that noise floor.
TEST(Gemma3Logits, MatchesLlamaCpp) {
  GEIST_REQUIRE_MODEL(path);
  auto m = load_default();
  ASSERT_TRUE(m);
  Agreement a = compare_with(*m, load_json("ref/gemma3_270m_logits.json"), cpu::ActivationMode::Q8);
  EXPECT_LE(a.kl_mean, 1e-2);
  EXPECT_LE(a.kl_max, 0.15);
  EXPECT_GE(a.top1, 0.95);
}

TEST(Gemma3Perplexity, WithinOnePercentOfLlamaCpp) {
  GEIST_REQUIRE_MODEL(path);
  auto m = Model::load(path);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  json ref = load_json("ref/gemma3_270m_ppl.json");
  std::vector<uint8_t> text = test::read_file(std::string(GEIST_SOURCE_DIR) + "/" + ref["text"].get<std::string>());
  std::vector<int32_t> tokens;
  ASSERT_TRUE((*m)->tokenizer().encode(std::string(text.begin(), text.end()), true, false, &tokens).is_ok());
  ASSERT_EQ(tokens.size(), ref["n_tokens"].get<size_t>()) << "tokenization differs from llama.cpp's";
  const int n_ctx = ref["n_ctx"].get<int>();
  SessionParams sp;
  sp.n_ctx = n_ctx;
  sp.chunk = n_ctx;
  auto s = Session::create(**m, sp);
  ASSERT_TRUE(s.is_ok());
  auto r = compute_perplexity(**s, tokens, n_ctx, 0);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const double ref_ppl = ref["ppl"].get<double>();
  std::printf("perplexity: geist %.4f, llama.cpp %.4f (ratio %.5f), %lld predictions\n", r->ppl, ref_ppl,
              r->ppl / ref_ppl, (long long)r->n_scored);
  EXPECT_EQ(r->n_scored, ref["n_scored"].get<int64_t>());
  EXPECT_NEAR(r->ppl / ref_ppl, 1.0, 0.01);
}

}  // namespace
}  // namespace geist

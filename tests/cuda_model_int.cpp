// The CUDA backend at model level, against the CPU backend (same arithmetic: 8-bit
// activations against the CPU default, f32 against GEIST_ACT=f32) and HF transformers,
// plus every session guarantee on the GPU by memcmp. Runs on a machine with an NVIDIA
// GPU and a -DGEIST_CUDA=ON build; otherwise every test SKIPs with the reason.
//
// Models: the committed tiny ones (tests/data/tiny_gemma3.gguf, tests/data/gemma4/*), and
// any listed in GEIST_CUDA_TEST_MODELS (colon-separated paths: the device runs add the
// synthetic Gemma 3 270M and Gemma 4 E4B geometries made there).
//
// Tolerances: the matmuls, embeddings, norms and RoPE of the two backends give the same
// bits as the CPU's generic tier, the oracle (tests/cuda_ops_int.cpp); GELU and softcap
// evaluate tanh in double on the GPU (within 1 ulp of libm's tanhf) and attention's exp
// differs in the last bit. Those ulps pass through the layers, so the logits are compared
// by distribution: against the generic tier (ctest runs this file with GEIST_ISA=generic)
// mean KL(CPU || CUDA) <= 1e-3 and top-1 equal at >= 99 % of positions (issue 13). The
// SIMD tiers compute tanh and the softmax their own way (a vector tanh from their exp, an
// online softmax), so against them the bound is what those differences cost on these
// models: KL <= 2e-3, top-1 >= 95 % (measured on the H200 host, AVX-512: worst KL 1.1e-3,
// top-1 289/300, both on tiny_gemma4_b_q8_0 with 8-bit activations). The HF references:
// within 1e-3 absolute, as on the CPU (gemma4_logits_int.cpp).
//
// Models from GEIST_CUDA_TEST_MODELS have random weights at real sizes: their activations
// grow layer after layer, so a last-bit difference can move logits by whole units (E4B:
// max |diff| ~50, KL ~1e-3 even between f32 paths). Their agreement is printed, not
// asserted; every bit-exact invariance below is asserted on them too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "backends/cpu/ops.h"
#include "backends/cuda/kernels.h"
#include "decode_batch_check.h"
#include "queued_decode_check.h"
#include "engine/model.h"
#include "engine/session.h"
#include "test_util.h"

namespace geist {
namespace {

// The committed models (asserted against the CPU) and the extra ones (reported).
constexpr size_t kCommittedModels = 5;

std::vector<std::string> model_paths() {
  std::vector<std::string> out = {test::data_path("tiny_gemma3.gguf"), test::data_path("gemma4/tiny_gemma4_a_f32.gguf"),
                                  test::data_path("gemma4/tiny_gemma4_a_q8_0.gguf"),
                                  test::data_path("gemma4/tiny_gemma4_b_f32.gguf"),
                                  test::data_path("gemma4/tiny_gemma4_b_q8_0.gguf")};
  if (const char *e = std::getenv("GEIST_CUDA_TEST_MODELS")) {
    std::stringstream ss(e);
    for (std::string p; std::getline(ss, p, ':');) {
      if (!p.empty()) out.push_back(p);
    }
  }
  return out;
}

std::string base(const std::string &p) { return p.substr(p.find_last_of('/') + 1); }

// The model on the CUDA backend, or a skip reason.
Result<std::unique_ptr<Model>> load_cuda(const std::string &path) {
  ModelParams p;
  p.backend = BackendKind::Cuda;
  return Model::load(path, p);
}

#define LOAD_CUDA_OR_SKIP(var, path)                                                         \
  std::unique_ptr<Model> var;                                                                \
  {                                                                                          \
    Result<std::unique_ptr<Model>> r_ = load_cuda(path);                                     \
    if (!r_ && (r_.status().code() == GEIST_E_UNSUPPORTED)) GTEST_SKIP() << r_.status().message(); \
    ASSERT_TRUE(r_) << r_.status().to_string();                                              \
    var = std::move(r_).value();                                                             \
  }

std::unique_ptr<Model> load_cpu(const std::string &path) {
  Result<std::unique_ptr<Model>> r = Model::load(path);
  EXPECT_TRUE(r) << r.status().to_string();
  return r ? std::move(r).value() : nullptr;
}

std::vector<int32_t> random_ids(const Model &m, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  const int32_t hi = int32_t(std::min<int64_t>(m.info().n_vocab, 100000)) - 1;
  std::uniform_int_distribution<int32_t> d(1, hi);
  std::vector<int32_t> v(n);
  for (auto &x : v) x = d(rng);
  return v;
}

// A session, or null if this KV type cannot be made for the model (q8_0 rows that are
// not a multiple of 32 wide, a type the backend does not store): *why says which.
std::unique_ptr<Session> try_session(const Model &m, int chunk, int64_t n_ctx, KvType kv, std::string *why) {
  SessionParams p;
  p.n_ctx = n_ctx;
  p.chunk = chunk;
  p.type_k = p.type_v = kv;
  p.sampling.temperature = 0;
  Result<std::unique_ptr<Session>> s = Session::create(m, p);
  if (!s) {
    EXPECT_EQ(s.status().code(), GEIST_E_UNSUPPORTED) << s.status().to_string();
    *why = s.status().message();
    return nullptr;
  }
  return std::move(s).value();
}

std::unique_ptr<Session> session(const Model &m, int chunk, int64_t n_ctx = 1024, KvType kv = KvType::F32) {
  std::string why;
  std::unique_ptr<Session> s = try_session(m, chunk, n_ctx, kv, &why);
  EXPECT_TRUE(s) << why;
  return s;
}

// Logits after every token: [n][n_vocab].
std::vector<float> all_logits(Session &s, const std::vector<int32_t> &ids) {
  std::vector<float> out(ids.size() * size_t(s.n_vocab()));
  Status st = s.prefill_with_logits(ids.data(), ids.size(), 0, out.data());
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return out;
}

struct Agreement {
  double kl_mean = 0, kl_max = 0, max_abs = 0;
  int top1 = 0, n = 0;
};

Agreement compare(const std::vector<float> &ref, const std::vector<float> &got, int64_t nv) {
  Agreement g;
  const size_t rows = ref.size() / size_t(nv);
  double sum = 0;
  for (size_t r = 0; r < rows; ++r) {
    const float *a = ref.data() + r * nv, *b = got.data() + r * nv;
    auto lse = [&](const float *x) {
      const double m = *std::max_element(x, x + nv);
      double s = 0;
      for (int64_t v = 0; v < nv; ++v) s += std::exp(double(x[v]) - m);
      return m + std::log(s);
    };
    const double la = lse(a), lb = lse(b);
    double kl = 0;
    for (int64_t v = 0; v < nv; ++v) {
      kl += std::exp(a[v] - la) * ((a[v] - la) - (b[v] - lb));
      g.max_abs = std::max(g.max_abs, double(std::fabs(a[v] - b[v])));
    }
    sum += kl;
    g.kl_max = std::max(g.kl_max, kl);
    g.top1 += std::max_element(a, a + nv) - a == std::max_element(b, b + nv) - b;
    ++g.n;
  }
  g.kl_mean = sum / double(std::max(g.n, 1));
  return g;
}

bool same_bits(const std::vector<float> &a, const std::vector<float> &b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class ActModeGuard {
 public:
  explicit ActModeGuard(cpu::ActivationMode m) : old_(cpu::activation_mode()) { cpu::set_activation_mode(m); }
  ~ActModeGuard() { cpu::set_activation_mode(old_); }

 private:
  cpu::ActivationMode old_;
};

// CUDA logits of every position against the CPU's, in both activation modes.
TEST(CudaModel, LogitsMatchTheCpuBackend) {
  // f32 activations: every device op is within a few ulp of the CPU's (the ops tests), and
  // the logits agree to KL ~1e-12 on the H200. 8-bit activations: the device's attention
  // sums V in 64-key chunks (not the CPU's single run), a ~1e-7 relative change that moves
  // some activations across a quantization step; on these tiny random models that shows as
  // KL up to ~1e-3 and a few top-1 flips in 300 (measured: 1.1e-3 and 289/300 on
  // tiny_gemma4_b_q8_0), as the CPU's own SIMD tiers against the generic one do.
  const bool oracle = cpu::active_isa() == cpu::Isa::Generic;
  std::printf("CPU reference: the %s tier\n", cpu::isa_name(cpu::active_isa()));
  const std::vector<std::string> paths = model_paths();
  for (cpu::ActivationMode mode : {cpu::ActivationMode::Q8, cpu::ActivationMode::F32}) {
    ActModeGuard guard(mode);
    for (size_t i = 0; i < paths.size(); ++i) {
      const std::string &path = paths[i];
      LOAD_CUDA_OR_SKIP(gpu, path);
      std::unique_ptr<Model> cpu_m = load_cpu(path);
      ASSERT_TRUE(cpu_m);
      const std::vector<int32_t> ids = random_ids(*cpu_m, 300, 7);
      std::unique_ptr<Session> a = session(*cpu_m, 64), b = session(*gpu, 64);
      const std::vector<float> ref = all_logits(*a, ids), got = all_logits(*b, ids);
      const Agreement g = compare(ref, got, cpu_m->info().n_vocab);
      std::printf("%-32s %s: KL mean %.3g max %.3g, top-1 %d/%d, max |diff| %.3g\n", base(path).c_str(),
                  mode == cpu::ActivationMode::Q8 ? "q8 " : "f32", g.kl_mean, g.kl_max, g.top1, g.n, g.max_abs);
      if (i >= kCommittedModels) continue;  // random weights at real sizes: reported only
      const bool q8 = mode == cpu::ActivationMode::Q8;
      const double kl_bound = q8 ? 4e-3 : (oracle ? 1e-3 : 2e-3), top1_bound = q8 ? 0.95 : (oracle ? 0.99 : 0.95);
      EXPECT_LE(g.kl_mean, kl_bound) << path;
      EXPECT_GE(g.top1, int(top1_bound * g.n)) << path;
    }
  }
}

// The tiny Gemma 4 F32 models against HF transformers (tests/data/gemma4/ref_*.json), as
// gemma4_logits_int.cpp checks the CPU: f32 activations, max |logit - HF| <= 1e-3.
TEST(CudaModel, Gemma4MatchesTransformers) {
  ActModeGuard guard(cpu::ActivationMode::F32);
  for (const char *name : {"a", "b"}) {
    const std::string path = test::data_path(std::string("gemma4/tiny_gemma4_") + name + "_f32.gguf");
    LOAD_CUDA_OR_SKIP(gpu, path);
    const std::vector<uint8_t> raw = test::read_file(test::data_path(std::string("gemma4/ref_") + name + ".json"));
    const nlohmann::json j = nlohmann::json::parse(raw.begin(), raw.end());
    double worst = 0;
    for (const auto &p : j["prompts"]) {
      const std::vector<int32_t> ids = p["ids"].get<std::vector<int32_t>>();
      const std::vector<uint8_t> lb = test::read_file(test::data_path("gemma4/" + p["logits"].get<std::string>()));
      std::vector<float> ref(lb.size() / 4);
      std::memcpy(ref.data(), lb.data(), lb.size());
      std::unique_ptr<Session> s = session(*gpu, 7, 256);
      const std::vector<float> got = all_logits(*s, ids);
      ASSERT_EQ(got.size(), ref.size());
      for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, double(std::fabs(ref[i] - got[i])));
    }
    std::printf("tiny_gemma4_%s_f32 on CUDA vs transformers: max |diff| %.3g\n", name, worst);
    EXPECT_LE(worst, 1e-3);
  }
}

// Batch invariance on the GPU, by memcmp: every chunking, pin + reset + requests of
// 1..400 tokens, snapshot/restore, and 4 concurrent sessions equal a straight prefill.
TEST(CudaModel, BatchInvariantBitForBit) {
  for (const std::string &path : model_paths()) {
    LOAD_CUDA_OR_SKIP(gpu, path);
    const int64_t nv = gpu->info().n_vocab;
    const std::vector<int32_t> ids = random_ids(*gpu, 600, 11);
    std::unique_ptr<Session> straight = session(*gpu, 512);
    const std::vector<float> ref = all_logits(*straight, ids);
    for (int chunk : {1, 3, 7, 8, 64}) {
      std::unique_ptr<Session> s = session(*gpu, chunk);
      EXPECT_TRUE(same_bits(all_logits(*s, ids), ref)) << base(path) << " chunk " << chunk;
    }
    // Pin a 200-token prefix, then requests after reset.
    const size_t P = 200;
    std::unique_ptr<Session> pinned = session(*gpu, 64);
    ASSERT_TRUE(pinned->pin_prefix(ids.data(), P).is_ok());
    for (size_t len : {size_t(1), size_t(7), size_t(64), size_t(130), size_t(400)}) {
      pinned->reset();
      std::vector<float> out(len * size_t(nv));
      ASSERT_TRUE(pinned->prefill_with_logits(ids.data() + P, len, 0, out.data()).is_ok());
      const std::vector<float> want(ref.begin() + P * nv, ref.begin() + (P + len) * nv);
      EXPECT_TRUE(same_bits(out, want)) << base(path) << " request of " << len << " after reset";
    }
    // Snapshot after 300 tokens, restore into a session of another chunk size, continue.
    std::unique_ptr<Session> a = session(*gpu, 32);
    ASSERT_TRUE(a->prefill(ids.data(), 300).is_ok());
    std::vector<uint8_t> img(a->snapshot_size());
    size_t written = 0;
    ASSERT_TRUE(a->snapshot(img.data(), img.size(), &written).is_ok());
    std::unique_ptr<Session> b = session(*gpu, 5);
    ASSERT_TRUE(b->restore(img.data(), written).is_ok());
    std::vector<float> out(300 * size_t(nv));
    ASSERT_TRUE(b->prefill_with_logits(ids.data() + 300, 300, 0, out.data()).is_ok());
    EXPECT_TRUE(same_bits(out, std::vector<float>(ref.begin() + 300 * nv, ref.end()))) << base(path) << " restore";
    // Four sessions at once, from four threads.
    std::vector<std::vector<float>> got(4);
    std::vector<std::thread> th;
    for (int t = 0; t < 4; ++t) {
      th.emplace_back([&, t] {
        std::unique_ptr<Session> s = session(*gpu, t == 0 ? 1 : 64 * t);
        if (s) got[t] = all_logits(*s, ids);
      });
    }
    for (auto &x : th) x.join();
    for (int t = 0; t < 4; ++t) EXPECT_TRUE(same_bits(got[t], ref)) << base(path) << " concurrent session " << t;
  }
}

// Sessions decoding together in one step (Session::decode_batch), and sequences of several
// rows sharing a step: each bit-identical to running alone, on the device; the greedy
// tokens computed on the device are the scan's argmax of the downloaded logits, and the
// sampled ones the host's draw on them. By default a session's sampled draws are the
// step's and a batched step leaves the rows on the device; then again with both off
// (GEIST_CUDA_SAMPLE=0: sampled draws on the host; GEIST_CUDA_BATCH_LAZY=0: rows to the host).
TEST(CudaModel, DecodeBatchEqualsDecodingAlone) {
  const std::vector<std::string> paths = model_paths();
  for (size_t i = 0; i < kCommittedModels; ++i) {
    LOAD_CUDA_OR_SKIP(gpu, paths[i]);
    test::expect_decode_batch_equals_alone(*gpu, base(paths[i]), 1);
    test::expect_mixed_step_equals_alone(*gpu, base(paths[i]));
    test::expect_draws_follow_the_logits(*gpu, base(paths[i]), 1);
    test::expect_batch_rows_outlive_the_lead(*gpu, base(paths[i]), 1);
    test::EnvGuard host("GEIST_CUDA_SAMPLE", "0");
    test::EnvGuard eager("GEIST_CUDA_BATCH_LAZY", "0");
    test::expect_decode_batch_equals_alone(*gpu, base(paths[i]), 1);
    test::expect_draws_follow_the_logits(*gpu, base(paths[i]), 1);
    test::expect_batch_rows_outlive_the_lead(*gpu, base(paths[i]), 1);
  }
}

// An image moves between backends (KV rows stored by position in the same types): a CPU
// image restores on CUDA and the reverse, and the continuation agrees with the other
// backend's as the logits do; an image of another KV type is a mismatch.
TEST(CudaModel, SnapshotsMoveBetweenBackends) {
  const std::string path = test::data_path("gemma4/tiny_gemma4_a_q8_0.gguf");
  LOAD_CUDA_OR_SKIP(gpu, path);
  std::unique_ptr<Model> cpu_m = load_cpu(path);
  ASSERT_TRUE(cpu_m);
  const std::vector<int32_t> ids = random_ids(*cpu_m, 120, 3);
  for (KvType kv : {KvType::F32, KvType::F16, KvType::BF16, KvType::Q8_0}) {
    std::string why;
    std::unique_ptr<Session> c = try_session(*cpu_m, 16, 256, kv, &why), g = try_session(*gpu, 16, 256, kv, &why);
    if (!c || !g) {
      std::printf("kv %s: %s\n", kv_type_name(kv), why.c_str());
      continue;
    }
    ASSERT_TRUE(c->prefill(ids.data(), 80).is_ok());
    ASSERT_TRUE(g->prefill(ids.data(), 80).is_ok());
    std::vector<uint8_t> ic(c->snapshot_size()), ig(g->snapshot_size());
    size_t wc = 0, wg = 0;
    ASSERT_TRUE(c->snapshot(ic.data(), ic.size(), &wc).is_ok());
    ASSERT_TRUE(g->snapshot(ig.data(), ig.size(), &wg).is_ok());
    std::unique_ptr<Session> g2 = session(*gpu, 16, 256, kv), c2 = session(*cpu_m, 16, 256, kv);
    ASSERT_TRUE(g2->restore(ic.data(), wc).is_ok()) << kv_type_name(kv);
    ASSERT_TRUE(c2->restore(ig.data(), wg).is_ok()) << kv_type_name(kv);
    const std::vector<int32_t> rest(ids.begin() + 80, ids.end());
    const int64_t nv = cpu_m->info().n_vocab;
    const Agreement x = compare(all_logits(*c, rest), all_logits(*g2, rest), nv);
    const Agreement y = compare(all_logits(*g, rest), all_logits(*c2, rest), nv);
    std::printf("kv %s: CPU image on CUDA KL %.3g top-1 %d/%d; CUDA image on CPU KL %.3g top-1 %d/%d\n",
                kv_type_name(kv), x.kl_mean, x.top1, x.n, y.kl_mean, y.top1, y.n);
    EXPECT_LE(x.kl_mean, 1e-3);
    EXPECT_LE(y.kl_mean, 1e-3);
    std::unique_ptr<Session> other = session(*gpu, 16, 256, kv == KvType::F32 ? KvType::F16 : KvType::F32);
    EXPECT_EQ(other->restore(ic.data(), wc).code(), GEIST_E_MISMATCH);
  }
}

// Saved states of a GPU session live in device memory (save and load are device-side
// copies) and are snapshots without the bytes: the same image, the same logits after a
// load as after the session it was saved from, for any chunk of the loading session.
TEST(CudaModel, SavedStatesStayOnTheDevice) {
  const std::string path = test::data_path("gemma4/tiny_gemma4_a_q8_0.gguf");
  LOAD_CUDA_OR_SKIP(gpu, path);
  std::unique_ptr<Model> cpu_m = load_cpu(path);
  ASSERT_TRUE(cpu_m);
  const std::vector<int32_t> ids = random_ids(*cpu_m, 200, 4);
  const std::vector<int32_t> rest(ids.begin() + 120, ids.end());
  for (KvType kv : {KvType::F32, KvType::F16}) {  // (the tiny model's 16-wide heads take no q8_0)
    SCOPED_TRACE(kv_type_name(kv));
    // Pinned at 30, 90 more: with chunk 16 the pin's checkpoint rows are overwritten, so
    // the state carries its checkpoint section.
    std::unique_ptr<Session> g = session(*gpu, 16, 256, kv);
    ASSERT_TRUE(g);
    ASSERT_TRUE(g->pin_prefix(ids.data(), 30).is_ok());
    ASSERT_TRUE(g->prefill(ids.data() + 30, 90).is_ok());
    SessionState st;
    Status s = g->save_state(&st);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    EXPECT_GE(st.bytes(), g->state_bytes());
    EXPECT_LE(st.bytes(), g->state_bytes() * 9 / 8);
    std::vector<uint8_t> ig(g->snapshot_size()), is(st.snapshot_size());
    size_t wg = 0, ws = 0;
    ASSERT_TRUE(g->snapshot(ig.data(), ig.size(), &wg).is_ok());
    ASSERT_TRUE(st.snapshot(is.data(), is.size(), &ws).is_ok());
    EXPECT_TRUE(ig == is) << "a state's snapshot is its session's";
    for (int chunk : {1, 16, 64}) {
      SCOPED_TRACE("chunk " + std::to_string(chunk));
      std::unique_ptr<Session> g2 = session(*gpu, chunk, 256, kv);
      ASSERT_TRUE(g2);
      ASSERT_TRUE(g2->prefill(ids.data() + 150, 7).is_ok());  // something to replace
      s = g2->load_state(st);
      ASSERT_TRUE(s.is_ok()) << s.to_string();
      std::unique_ptr<Session> ref = session(*gpu, 16, 256, kv);
      ASSERT_TRUE(ref);
      ASSERT_TRUE(ref->restore(ig.data(), wg).is_ok());
      EXPECT_TRUE(same_bits(all_logits(*ref, rest), all_logits(*g2, rest))) << "load_state vs restore";
      ref->reset();
      g2->reset();
      EXPECT_TRUE(same_bits(all_logits(*ref, rest), all_logits(*g2, rest))) << "after reset to the pin";
    }
    // Host and device states do not mix.
    std::unique_ptr<Session> c = session(*cpu_m, 16, 256, kv);
    ASSERT_TRUE(c);
    EXPECT_EQ(c->load_state(st).code(), GEIST_E_MISMATCH);
    ASSERT_TRUE(c->prefill(ids.data(), 40).is_ok());
    SessionState cs;
    ASSERT_TRUE(c->save_state(&cs).is_ok());
    EXPECT_EQ(g->load_state(cs).code(), GEIST_E_MISMATCH);
  }
}

// KV types on the GPU: each against f32 KV (information; bounds are loose sanity checks).
TEST(CudaModel, KvTypes) {
  for (const std::string &path : model_paths()) {
    LOAD_CUDA_OR_SKIP(gpu, path);
    const std::vector<int32_t> ids = random_ids(*gpu, 256, 5);
    std::unique_ptr<Session> f = session(*gpu, 64);
    const std::vector<float> ref = all_logits(*f, ids);
    for (KvType kv : {KvType::F16, KvType::BF16, KvType::Q8_0}) {
      std::string why;
      std::unique_ptr<Session> s = try_session(*gpu, 64, 1024, kv, &why);
      if (!s) {
        std::printf("%-32s kv %-4s: %s\n", base(path).c_str(), kv_type_name(kv), why.c_str());
        continue;
      }
      const Agreement g = compare(ref, all_logits(*s, ids), gpu->info().n_vocab);
      std::printf("%-32s kv %-4s vs f32: KL mean %.3g max %.3g, top-1 %d/%d\n", base(path).c_str(), kv_type_name(kv),
                  g.kl_mean, g.kl_max, g.top1, g.n);
      EXPECT_LE(g.kl_mean, 0.05);
      // And the same bits for any chunking with a typed cache.
      std::unique_ptr<Session> s3 = session(*gpu, 3, 1024, kv), s64 = session(*gpu, 64, 1024, kv);
      EXPECT_TRUE(same_bits(all_logits(*s3, ids), all_logits(*s64, ids))) << kv_type_name(kv);
    }
  }
}

// Faults: a device that does not exist, a KV cache larger than the device; the model
// stays usable after a refused session.
TEST(CudaModel, FaultsAreCleanErrors) {
  const std::string path = test::data_path("tiny_gemma3.gguf");
  LOAD_CUDA_OR_SKIP(gpu, path);
  ModelParams p;
  p.backend = BackendKind::Cuda;
  p.device = 999;
  Result<std::unique_ptr<Model>> bad = Model::load(path, p);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.status().code(), GEIST_E_INVALID_ARGUMENT) << bad.status().to_string();
  std::printf("device 999: %s\n", bad.status().message().c_str());

  // A context whose KV cache cannot fit (tiny_gemma3's rows times 2^24 positions is small,
  // so ask through a q8_0-incompatible path instead when it fits): try n_ctx 2^24.
  SessionParams sp;
  sp.n_ctx = int64_t(1) << 24;
  sp.chunk = 65536;
  Result<std::unique_ptr<Session>> big = Session::create(*gpu, sp);
  if (!big) {
    EXPECT_EQ(big.status().code(), GEIST_E_OUT_OF_MEMORY) << big.status().to_string();
    std::printf("n_ctx 2^24: %s\n", big.status().message().c_str());
  }
  std::unique_ptr<Session> ok = session(*gpu, 8);
  ASSERT_TRUE(ok);
  const std::vector<int32_t> ids = random_ids(*gpu, 20, 1);
  EXPECT_TRUE(ok->prefill(ids.data(), ids.size()).is_ok());
}

// A device error in the middle of a forward pass (injected: GEIST_CUDA_INJECT_FAULT=N
// fails the N-th op of a new session's exec): the call returns the error naming the
// device, the session goes back to its pin, and what follows is bit-identical to a
// session that never failed.
TEST(CudaModel, ADeviceErrorMidForwardRecoversToThePin) {
  const std::string path = test::data_path("gemma4/tiny_gemma4_a_q8_0.gguf");
  LOAD_CUDA_OR_SKIP(gpu, path);
  const std::vector<int32_t> ids = random_ids(*gpu, 120, 9);
  std::unique_ptr<Session> clean = session(*gpu, 16);
  const std::vector<float> ref = all_logits(*clean, ids);
  for (const char *at : {"1", "40", "500"}) {
    setenv("GEIST_CUDA_INJECT_FAULT", at, 1);
    std::unique_ptr<Session> s = session(*gpu, 16);
    unsetenv("GEIST_CUDA_INJECT_FAULT");
    ASSERT_TRUE(s);
    Status st = s->pin_prefix(ids.data(), 40);
    if (st.is_ok()) {  // the fault comes later: in the request after the pin
      std::vector<float> out(80 * size_t(gpu->info().n_vocab));
      st = s->prefill_with_logits(ids.data() + 40, 80, 0, out.data());
      ASSERT_FALSE(st.is_ok()) << "fault at op " << at << " never fired";
      EXPECT_EQ(s->n_tokens(), 40u) << "back at the pin";
    } else {
      EXPECT_EQ(s->n_tokens(), 0u) << "no pin: empty";
      ASSERT_TRUE(s->pin_prefix(ids.data(), 40).is_ok());
    }
    EXPECT_NE(st.message().find("CUDA 0"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("injected fault"), std::string::npos) << st.message();
    std::printf("fault at op %s: %s\n", at, st.message().c_str());
    // From the pin, the rest equals the clean run bit for bit.
    s->reset();
    std::vector<float> out(80 * size_t(gpu->info().n_vocab));
    ASSERT_TRUE(s->prefill_with_logits(ids.data() + 40, 80, 0, out.data()).is_ok());
    EXPECT_TRUE(same_bits(out, std::vector<float>(ref.begin() + 40 * gpu->info().n_vocab, ref.end()))) << at;
  }
}

// Queued decode, greedy and sampled (the default; GEIST_CUDA_QUEUE=0 waits): each decode step returns
// once it is queued and the next takes its token on the device. Tokens, the logits read
// between steps and a snapshot are bit-identical to waited steps, through reads, snapshots,
// a batch step, a prefill, a sampler change and a reset between queued steps
// (queued_decode_check.h).
TEST(CudaModel, QueuedDecodeEqualsWaitedDecode) {
  for (const std::string &path : model_paths()) {
    LOAD_CUDA_OR_SKIP(gpu, path);
    test::expect_queued_equals_waited(*gpu, base(path), random_ids(*gpu, 27, 5), "GEIST_CUDA_QUEUE", "1", "0");
    test::EnvGuard on("GEIST_CUDA_SAMPLE", "1");  // sampled draws on the device (the default)
    test::expect_queued_equals_waited(*gpu, base(path), random_ids(*gpu, 27, 5), "GEIST_CUDA_QUEUE", "1", "0",
                                      test::sampled_sampling());
  }
}

// A device error found while waiting for a queued step (injected:
// GEIST_CUDA_INJECT_WAIT_FAULT=N fails the N-th wait of a new session's exec), or raised
// while a fed step is recorded (GEIST_CUDA_INJECT_FAULT=N: its N-th op): the call returns the
// error naming the device, the session is back at its pin, and decoding from there equals a
// session that never failed; found by logits(), the session is at its pin at once
// (queued_decode_check.h).
TEST(CudaModel, AQueuedStepsDeviceErrorRecoversToThePin) {
  const std::string path = test::data_path("gemma4/tiny_gemma4_a_q8_0.gguf");
  LOAD_CUDA_OR_SKIP(gpu, path);
  test::expect_queued_faults_recover(*gpu, random_ids(*gpu, 24, 9), "GEIST_CUDA_QUEUE", "1", "0",
                                     {{"GEIST_CUDA_INJECT_WAIT_FAULT", "1"},
                                      {"GEIST_CUDA_INJECT_WAIT_FAULT", "2"},
                                      {"GEIST_CUDA_INJECT_WAIT_FAULT", "7"},
                                      {"GEIST_CUDA_INJECT_WAIT_FAULT", "30"},
                                      {"GEIST_CUDA_INJECT_FAULT", "1200"},
                                      {"GEIST_CUDA_INJECT_FAULT", "2500"}},
                                     "GEIST_CUDA_INJECT_WAIT_FAULT", "CUDA 0");
  test::EnvGuard on("GEIST_CUDA_SAMPLE", "1");
  test::expect_queued_faults_recover(*gpu, random_ids(*gpu, 24, 9), "GEIST_CUDA_QUEUE", "1", "0",
                                     {{"GEIST_CUDA_INJECT_WAIT_FAULT", "2"},
                                      {"GEIST_CUDA_INJECT_WAIT_FAULT", "30"},
                                      {"GEIST_CUDA_INJECT_FAULT", "2500"}},
                                     "GEIST_CUDA_INJECT_WAIT_FAULT", "CUDA 0", test::sampled_sampling());
}


// A KV cache far larger than any device: a clean GEIST_E_OUT_OF_MEMORY naming the size.
TEST(CudaModel, KvCacheLargerThanTheDevice) {
  const std::string path = test::data_path("gemma4/tiny_gemma4_a_f32.gguf");
  LOAD_CUDA_OR_SKIP(gpu, path);
  SessionParams sp;
  sp.n_ctx = int64_t(1) << 24;
  sp.chunk = 65536;
  // Rows are tiny here; make each position large instead with many sessions' worth: the
  // same model at 2^24 positions is about 2 GiB, so hold sessions until the device is full.
  std::vector<std::unique_ptr<Session>> held;
  Status last;
  for (int i = 0; i < 4096 && last.is_ok(); ++i) {
    Result<std::unique_ptr<Session>> r = Session::create(*gpu, sp);
    if (r) {
      held.push_back(std::move(r).value());
    } else {
      last = r.status();
    }
  }
  ASSERT_FALSE(last.is_ok()) << "4096 sessions of 2^24 positions fit on the device";
  EXPECT_EQ(last.code(), GEIST_E_OUT_OF_MEMORY) << last.to_string();
  std::printf("after %zu sessions: %s\n", held.size(), last.message().c_str());
  held.clear();
  std::unique_ptr<Session> ok = session(*gpu, 8);
  ASSERT_TRUE(ok);
  const std::vector<int32_t> ids = random_ids(*gpu, 20, 1);
  EXPECT_TRUE(ok->prefill(ids.data(), ids.size()).is_ok());
}

// What a session reports (geist run's "device memory" line) is what the device lost: the
// weights, the KV cache and the exec's scratch account for the device memory the model and a
// session took, to within what the driver keeps for itself (the captured graphs, allocation
// granules); and 200 more requests of the shapes already seen take no more of either.
// cudaMemGetInfo counts the whole device, so another process allocating or freeing beside
// this one moves the count (H100, 2026-12-07: 8 of the 15 model ctest variants failed while
// the ops tests ran beside them; the two rerun alone passed): a model is measured up to 4
// times and passes if one measurement is within the bounds; every one is printed.
TEST(CudaModel, DeviceMemoryIsWeightsKvAndScratch) {
#if !(defined(GEIST_HAVE_CUDA) && GEIST_HAVE_CUDA)
  GTEST_SKIP() << "built without CUDA (-DGEIST_CUDA=ON)";
#else
  Result<uint64_t> before = cuda::device_memory_used(0);
  if (!before) GTEST_SKIP() << before.status().message();
  auto used_since = [](uint64_t used0) { return int64_t(cuda::device_memory_used(0).value()) - int64_t(used0); };
  for (const std::string &path : model_paths()) {
    SCOPED_TRACE(base(path));
    // One session's life on the model: pin, then requests (reset, prefill, 4 decodes). With
    // more > 0: what is wrong with the device's count against the report ("" if nothing).
    auto run = [&](const Model &m, int warm, int more, uint64_t used0) -> std::string {
      std::unique_ptr<Session> s = session(m, 16, 256);
      if (!s) return "no session";
      const std::vector<int32_t> pre = random_ids(m, 24, 3), req = random_ids(m, 40, 4);
      EXPECT_TRUE(s->pin_prefix(pre.data(), pre.size()).is_ok());
      auto request = [&] {
        s->reset();
        EXPECT_TRUE(s->prefill(req.data(), req.size()).is_ok());
        int32_t tok = 0;
        for (int i = 0; i < 4; ++i) EXPECT_TRUE(s->decode_step(&tok).is_ok());
      };
      for (int r = 0; r < warm; ++r) request();
      if (more == 0) return "";
      const int64_t used = used_since(used0), scratch = int64_t(s->scratch_bytes());
      const int64_t weights = int64_t(m.info().packed_bytes), kv = int64_t(s->kv_bytes_reserved());
      const int64_t reported = weights + kv + scratch;
      std::printf("%s: device memory taken %.1f MiB, reported %.1f MiB (weights %.1f + KV %.1f + scratch %.1f)\n",
                  base(path).c_str(), used / 1048576.0, reported / 1048576.0, weights / 1048576.0, kv / 1048576.0,
                  scratch / 1048576.0);
      for (int r = 0; r < more; ++r) request();
      EXPECT_EQ(int64_t(s->scratch_bytes()), scratch);
      const int64_t after = used_since(used0);
      std::printf("%s: after %d more requests %.1f MiB\n", base(path).c_str(), more, after / 1048576.0);
      if (used < reported) return "the report counts bytes the device did not lose";
      if (used > reported + reported / 10 + (int64_t(64) << 20)) return "device memory the report does not see";
      if (after > used + (int64_t(4) << 20)) return "growth over the requests";
      return "";
    };
    {
      // The kernels this model runs are loaded into the context (lazily, on first launch)
      // before the measurement, so that their code is not counted against the report.
      LOAD_CUDA_OR_SKIP(warm, path);
      (void)run(*warm, 2, 0, 0);
    }
    std::string why = "not measured";
    for (int attempt = 0; attempt < 4 && !why.empty(); ++attempt) {
      const uint64_t used0 = cuda::device_memory_used(0).value();
      LOAD_CUDA_OR_SKIP(gpu, path);
      why = run(*gpu, 3, 200, used0);
      if (!why.empty()) std::printf("%s: measurement %d: %s\n", base(path).c_str(), attempt + 1, why.c_str());
    }
    EXPECT_EQ(why, "") << "in each of 4 measurements (the last one's reason)";
  }
#endif
}

}  // namespace
}  // namespace geist

// Several sessions decoding in one step (Session::decode_batch, geist_decode_batch) on the
// CPU, over the committed tiny models: bit-identical to each session decoding alone, for
// any set of sessions and thread count, and every bad call refused before anything changes.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "decode_batch_check.h"
#include "queued_decode_check.h"
#include "engine/model.h"
#include "engine/session.h"
#include "geist/geist.h"
#include "test_util.h"

namespace geist {
namespace {

const char *const kModels[] = {"tiny_gemma3.gguf", "gemma4/tiny_gemma4_a_f32.gguf", "gemma4/tiny_gemma4_a_q8_0.gguf",
                               "gemma4/tiny_gemma4_b_f32.gguf", "gemma4/tiny_gemma4_b_q8_0.gguf"};

std::unique_ptr<Model> load(const std::string &rel) {
  Result<std::unique_ptr<Model>> m = Model::load(test::data_path(rel));
  EXPECT_TRUE(m) << m.status().to_string();
  return m ? std::move(m).value() : nullptr;
}

TEST(DecodeBatch, EqualsDecodingAlone) {
  for (const char *rel : kModels) {
    std::unique_ptr<Model> m = load(rel);
    ASSERT_TRUE(m);
    for (int threads : {1, 2}) test::expect_decode_batch_equals_alone(*m, rel, threads);
  }
}

// The step's greedy token (Exec::greedy) is what sampling the logits gives, and only taken
// where the sampler draws the plain argmax.
TEST(DecodeBatch, DrawsFollowTheLogits) {
  for (const char *rel : kModels) {
    std::unique_ptr<Model> m = load(rel);
    ASSERT_TRUE(m);
    for (int threads : {1, 2}) test::expect_draws_follow_the_logits(*m, rel, threads);
  }
}

TEST(DecodeBatch, RowsOutliveTheLead) {
  for (const char *rel : kModels) {
    std::unique_ptr<Model> m = load(rel);
    ASSERT_TRUE(m);
    test::expect_batch_rows_outlive_the_lead(*m, rel, 2);
  }
}

TEST(DecodeBatch, SequencesOfSeveralRowsInOneStep) {
  for (const char *rel : kModels) {
    std::unique_ptr<Model> m = load(rel);
    ASSERT_TRUE(m);
    test::expect_mixed_step_equals_alone(*m, rel);
  }
}

// Session::step_batch: sessions prefilling chunks and sessions decoding, in one step, over
// several steps: every session's tokens and logits equal those of its twin doing the same
// prefill or decode_step alone (greedy and sampled sessions, whose histories take the
// prefilled tokens).
TEST(DecodeBatch, StepBatchPrefillAndDecodeEqualAlone) {
  for (const char *rel : kModels) {
    std::unique_ptr<Model> m = load(rel);
    ASSERT_TRUE(m);
    const size_t nv = size_t(m->info().n_vocab);
    constexpr int kN = 4;
    std::vector<std::unique_ptr<Session>> s, r;
    for (int i = 0; i < kN; ++i) {
      s.push_back(test::batch_session(*m, 16, 2, i));
      r.push_back(test::batch_session(*m, 16, 2, i));
      ASSERT_TRUE(s.back() && r.back());
    }
    const std::vector<int32_t> ids = test::batch_ids(*m, 200, 31);
    // Sessions 0 and 2 start with a prompt (decoders); 1 and 3 start empty (prefillers).
    for (int i : {0, 2}) {
      ASSERT_TRUE(s[i]->prefill(ids.data() + i, 5).is_ok());
      ASSERT_TRUE(r[i]->prefill(ids.data() + i, 5).is_ok());
    }
    size_t at = 40;  // next prompt token for the prefillers
    for (int step = 0; step < 6; ++step) {
      std::vector<Session *> ss;
      std::vector<const int32_t *> toks;
      std::vector<size_t> counts;
      for (int i = 0; i < kN; ++i) {
        ss.push_back(s[i].get());
        // Prefillers take chunks of 1-4 tokens for 3 steps, then decode.
        const bool prefill = (i % 2 == 1) && step < 3;
        const size_t c = prefill ? size_t(1 + (step + i) % 4) : 0;
        toks.push_back(prefill ? ids.data() + at : nullptr);
        counts.push_back(c);
        at += c;
      }
      std::vector<int32_t> out(kN, -7);
      const Status st = Session::step_batch(ss.data(), toks.data(), counts.data(), kN, out.data());
      ASSERT_TRUE(st.is_ok()) << rel << " step " << step << ": " << st.to_string();
      for (int i = 0; i < kN; ++i) {
        if (counts[i] > 0) {
          ASSERT_TRUE(r[i]->prefill(toks[i], counts[i]).is_ok());
          EXPECT_EQ(out[i], -7) << "a prefilling session's out is left alone";
        } else {
          int32_t want = -1;
          ASSERT_TRUE(r[i]->decode_step(&want).is_ok());
          EXPECT_EQ(out[i], want) << rel << " step " << step << " session " << i;
        }
        ASSERT_EQ(s[i]->n_tokens(), r[i]->n_tokens());
        EXPECT_EQ(0, std::memcmp(s[i]->logits(), r[i]->logits(), nv * sizeof(float)))
            << rel << " step " << step << " session " << i;
      }
    }
  }
}

// step_batch refuses, changing nothing: rows above the chunk, a bad token id, a chunk
// without its tokens, a context without room for the chunk.
TEST(DecodeBatch, StepBatchBadCallsChangeNothing) {
  std::unique_ptr<Model> m = load("tiny_gemma3.gguf");
  ASSERT_TRUE(m);
  const size_t nv = size_t(m->info().n_vocab);
  std::unique_ptr<Session> a = test::batch_session(*m, 4, 1, 0), b = test::batch_session(*m, 4, 1, 1);
  const std::vector<int32_t> ids = test::batch_ids(*m, 8, 9);
  ASSERT_TRUE(a->prefill(ids.data(), 8).is_ok());
  const std::vector<float> before(a->logits(), a->logits() + nv);
  Session *ss[2] = {a.get(), b.get()};
  int32_t out[2] = {-1, -1};
  const int32_t *t4[2] = {nullptr, ids.data()};
  size_t c4[2] = {0, 4};  // 1 + 4 rows > a's chunk of 4
  EXPECT_EQ(Session::step_batch(ss, t4, c4, 2, out).code(), GEIST_E_INVALID_ARGUMENT);
  size_t c3[2] = {0, 3};
  const int32_t bad[3] = {1, -5, 2};
  const int32_t *tb[2] = {nullptr, bad};
  EXPECT_EQ(Session::step_batch(ss, tb, c3, 2, out).code(), GEIST_E_INVALID_ARGUMENT);
  const int32_t *tn[2] = {nullptr, nullptr};
  EXPECT_EQ(Session::step_batch(ss, tn, c3, 2, out).code(), GEIST_E_INVALID_ARGUMENT);
  EXPECT_EQ(Session::step_batch(ss, nullptr, c3, 2, out).code(), GEIST_E_INVALID_ARGUMENT);
  EXPECT_EQ(Session::step_batch(ss, t4, nullptr, 2, out).code(), GEIST_E_INVALID_ARGUMENT);
  size_t c00[2] = {0, 0};  // b has no logits to decode from
  EXPECT_EQ(Session::step_batch(ss, t4, c00, 2, out).code(), GEIST_E_STATE);
  SessionParams p;
  p.n_ctx = 10;
  p.chunk = 8;
  Result<std::unique_ptr<Session>> small = Session::create(*m, p);
  ASSERT_TRUE(small);
  ASSERT_TRUE((*small)->prefill(ids.data(), 8).is_ok());
  Session *s2[2] = {small->get(), b.get()};
  const int32_t *t3[2] = {ids.data(), ids.data()};
  size_t c33[2] = {3, 3};  // 8 + 3 > 10
  EXPECT_EQ(Session::step_batch(s2, t3, c33, 2, out).code(), GEIST_E_CONTEXT_FULL);
  EXPECT_EQ((*small)->n_tokens(), 8u);
  EXPECT_EQ(a->n_tokens(), 8u);
  EXPECT_EQ(b->n_tokens(), 0u);
  EXPECT_EQ(0, std::memcmp(a->logits(), before.data(), nv * sizeof(float)));
  EXPECT_EQ(out[0], -1);
}

// Every refused call leaves every session as it was (tokens, logits).
TEST(DecodeBatch, BadCallsChangeNothing) {
  std::unique_ptr<Model> m = load("tiny_gemma3.gguf"), other = load("tiny_gemma3.gguf");
  ASSERT_TRUE(m && other);
  const size_t nv = size_t(m->info().n_vocab);
  std::unique_ptr<Session> a = test::batch_session(*m, 2, 1, 0), b = test::batch_session(*m, 2, 1, 1),
                           c = test::batch_session(*m, 2, 1, 2), fresh = test::batch_session(*m, 2, 1, 3),
                           alien = test::batch_session(*other, 2, 1, 4);
  const std::vector<int32_t> ids = test::batch_ids(*m, 8, 9);
  for (Session *s : {a.get(), b.get(), c.get(), alien.get()}) ASSERT_TRUE(s->prefill(ids.data(), 8).is_ok());
  const std::vector<float> before(a->logits(), a->logits() + nv);
  int32_t out[4] = {-1, -1, -1, -1};
  auto code = [&](std::vector<Session *> ss) {
    return Session::decode_batch(ss.data(), ss.size(), out).code();
  };
  EXPECT_EQ(Session::decode_batch(nullptr, 1, out).code(), GEIST_E_INVALID_ARGUMENT);
  EXPECT_EQ(code({}), GEIST_E_INVALID_ARGUMENT);
  EXPECT_EQ(code({a.get(), nullptr}), GEIST_E_INVALID_ARGUMENT);
  EXPECT_EQ(code({a.get(), a.get()}), GEIST_E_INVALID_ARGUMENT);
  EXPECT_EQ(code({a.get(), alien.get()}), GEIST_E_INVALID_ARGUMENT);
  EXPECT_EQ(code({a.get(), fresh.get()}), GEIST_E_STATE);
  EXPECT_EQ(code({a.get(), b.get(), c.get()}), GEIST_E_INVALID_ARGUMENT);  // a's chunk is 2
  {
    std::vector<Session *> ss = {a.get(), b.get()};
    EXPECT_EQ(Session::decode_batch(ss.data(), 2, nullptr).code(), GEIST_E_INVALID_ARGUMENT);
  }
  EXPECT_EQ(a->n_tokens(), 8u);
  EXPECT_EQ(b->n_tokens(), 8u);
  EXPECT_EQ(0, std::memcmp(a->logits(), before.data(), nv * sizeof(float)));
  // A full context: a session of 9 tokens of context with 8 used takes one more, then no more.
  SessionParams p;
  p.n_ctx = 9;
  p.chunk = 4;
  p.sampling.temperature = 0;
  Result<std::unique_ptr<Session>> small = Session::create(*m, p);
  ASSERT_TRUE(small);
  ASSERT_TRUE((*small)->prefill(ids.data(), 8).is_ok());
  std::vector<Session *> ss = {small->get(), b.get()};
  EXPECT_TRUE(Session::decode_batch(ss.data(), 2, out).is_ok());
  EXPECT_EQ(Session::decode_batch(ss.data(), 2, out).code(), GEIST_E_CONTEXT_FULL);
  EXPECT_EQ((*small)->n_tokens(), 9u);
  EXPECT_EQ(b->n_tokens(), 9u);
}

// The C ABI: the same tokens as geist_session_decode_step one session at a time.
TEST(DecodeBatch, CApi) {
  geist_model *m = nullptr;
  ASSERT_EQ(geist_model_load(test::data_path("tiny_gemma3.gguf").c_str(), nullptr, &m), GEIST_OK);
  geist_session_params sp = geist_session_params_default();
  sp.n_ctx = 256;
  sp.sampling.temperature = 0;
  geist_session *s[3] = {}, *r[3] = {};
  const std::vector<int32_t> ids = {7, 8, 9, 10, 11, 12, 13, 14, 15};
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(geist_session_create(m, &sp, &s[i]), GEIST_OK);
    ASSERT_EQ(geist_session_create(m, &sp, &r[i]), GEIST_OK);
    ASSERT_EQ(geist_session_prefill_tokens(s[i], ids.data() + i, size_t(4 + i)), GEIST_OK) << geist_last_error();
    ASSERT_EQ(geist_session_prefill_tokens(r[i], ids.data() + i, size_t(4 + i)), GEIST_OK);
  }
  for (int step = 0; step < 5; ++step) {
    geist_token got[3] = {-1, -1, -1};
    ASSERT_EQ(geist_decode_batch(s, 3, got), GEIST_OK) << geist_last_error();
    for (int i = 0; i < 3; ++i) {
      geist_token want = -1;
      ASSERT_EQ(geist_session_decode_step(r[i], &want), GEIST_OK);
      EXPECT_EQ(got[i], want);
      size_t nv = 0;
      const float *la = geist_session_logits(s[i], &nv), *lb = geist_session_logits(r[i], nullptr);
      EXPECT_EQ(0, std::memcmp(la, lb, nv * sizeof(float)));
    }
  }
  geist_session *twice[2] = {s[0], s[0]};
  geist_token t2[2];
  EXPECT_EQ(geist_decode_batch(twice, 2, t2), GEIST_E_INVALID_ARGUMENT);
  EXPECT_NE(std::string(geist_last_error()).find("same"), std::string::npos);
  EXPECT_EQ(geist_decode_batch(nullptr, 2, t2), GEIST_E_INVALID_ARGUMENT);
  for (int i = 0; i < 3; ++i) {
    geist_session_free(s[i]);
    geist_session_free(r[i]);
  }
  geist_model_free(m);
}

// geist_step_batch: one session decoding, one prefilling, as the single-session calls do.
TEST(DecodeBatch, StepBatchCApi) {
  geist_model *m = nullptr;
  ASSERT_EQ(geist_model_load(test::data_path("tiny_gemma3.gguf").c_str(), nullptr, &m), GEIST_OK);
  geist_session_params sp = geist_session_params_default();
  sp.n_ctx = 256;
  sp.chunk = 8;
  sp.sampling.temperature = 0;
  geist_session *s[2] = {}, *r[2] = {};
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(geist_session_create(m, &sp, &s[i]), GEIST_OK);
    ASSERT_EQ(geist_session_create(m, &sp, &r[i]), GEIST_OK);
  }
  const std::vector<int32_t> ids = {7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18};
  ASSERT_EQ(geist_session_prefill_tokens(s[0], ids.data(), 4), GEIST_OK);
  ASSERT_EQ(geist_session_prefill_tokens(r[0], ids.data(), 4), GEIST_OK);
  for (int step = 0; step < 3; ++step) {
    const geist_token *toks[2] = {nullptr, ids.data() + 3 * step};
    const size_t counts[2] = {0, 3};
    geist_token out[2] = {-1, -1};
    ASSERT_EQ(geist_step_batch(s, toks, counts, 2, out), GEIST_OK) << geist_last_error();
    geist_token want = -1;
    ASSERT_EQ(geist_session_decode_step(r[0], &want), GEIST_OK);
    ASSERT_EQ(geist_session_prefill_tokens(r[1], toks[1], 3), GEIST_OK);
    EXPECT_EQ(out[0], want);
    EXPECT_EQ(out[1], -1);
    for (int i = 0; i < 2; ++i) {
      size_t nv = 0;
      const float *la = geist_session_logits(s[i], &nv), *lb = geist_session_logits(r[i], nullptr);
      ASSERT_NE(la, nullptr);
      EXPECT_EQ(0, std::memcmp(la, lb, nv * sizeof(float))) << "step " << step << " session " << i;
    }
  }
  geist_token out[2];
  const size_t too_many[2] = {0, 8};  // 1 + 8 rows > the chunk of 8
  const geist_token *toks[2] = {nullptr, ids.data()};
  EXPECT_EQ(geist_step_batch(s, toks, too_many, 2, out), GEIST_E_INVALID_ARGUMENT);
  EXPECT_EQ(geist_step_batch(s, toks, nullptr, 2, out), GEIST_E_INVALID_ARGUMENT);
  geist_session *twice[2] = {s[0], s[0]};
  const size_t zeros[2] = {0, 0};
  EXPECT_EQ(geist_step_batch(twice, nullptr, zeros, 2, out), GEIST_E_INVALID_ARGUMENT);
  EXPECT_NE(std::string(geist_last_error()).find("same"), std::string::npos);
  for (int i = 0; i < 2; ++i) {
    geist_session_free(s[i]);
    geist_session_free(r[i]);
  }
  geist_model_free(m);
}

// Queued decode, greedy and sampled, emulated on the CPU (GEIST_CPU_QUEUE=1: a queued step's drawn token
// reaches the session only at its wait, and the next step takes it from the exec, as on a
// GPU): bit-identical to waited decode through every call that can come between steps, on
// every committed model; and a failure at a wait (GEIST_CPU_INJECT_WAIT_FAULT=N) takes the
// session back to its pin (queued_decode_check.h; the same checks run on a GPU in
// cuda_model_int.cpp).
TEST(QueuedDecode, EmulatedOnTheCpuEqualsWaited) {
  for (const char *rel : kModels) {
    std::unique_ptr<Model> m = load(rel);
    ASSERT_TRUE(m);
    test::expect_queued_equals_waited(*m, rel, test::batch_ids(*m, 27, 5), "GEIST_CPU_QUEUE", "1", "0");
    test::expect_queued_equals_waited(*m, rel, test::batch_ids(*m, 27, 5), "GEIST_CPU_QUEUE", "1", "0",
                                      test::sampled_sampling());
  }
}

TEST(QueuedDecode, AFailureAtTheWaitRecoversToThePin) {
  std::unique_ptr<Model> m = load("gemma4/tiny_gemma4_a_q8_0.gguf");
  ASSERT_TRUE(m);
  test::expect_queued_faults_recover(*m, test::batch_ids(*m, 24, 9), "GEIST_CPU_QUEUE", "1", "0",
                                     {{"GEIST_CPU_INJECT_WAIT_FAULT", "1"},
                                      {"GEIST_CPU_INJECT_WAIT_FAULT", "2"},
                                      {"GEIST_CPU_INJECT_WAIT_FAULT", "7"},
                                      {"GEIST_CPU_INJECT_WAIT_FAULT", "30"}},
                                     "GEIST_CPU_INJECT_WAIT_FAULT", "CPU");
  test::expect_queued_faults_recover(*m, test::batch_ids(*m, 24, 9), "GEIST_CPU_QUEUE", "1", "0",
                                     {{"GEIST_CPU_INJECT_WAIT_FAULT", "2"}, {"GEIST_CPU_INJECT_WAIT_FAULT", "30"}},
                                     "GEIST_CPU_INJECT_WAIT_FAULT", "CPU", test::sampled_sampling());
}

}  // namespace
}  // namespace geist

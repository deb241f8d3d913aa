// libFuzzer entry for Session::restore (src/engine/snapshot.cpp, docs/SNAPSHOT.md).
// Properties checked on every input, under ASan+UBSan (the fuzz preset):
// - a refused restore returns a message and leaves the target session byte-identical
//   (its own snapshot before == after) and its logits bitwise unchanged;
// - an accepted restore is canonical: the session's snapshot right after it equals the
//   image restored; the state is then usable (decode, reset, snapshot again).
//
// Input: one mode byte, then the image. The checksum rejects nearly every mutation, so
// the mode byte lets the fuzzer get past it and reach the structure checks:
//   bit 0  recompute the checksum (XXH3-64 of [32, size) at offset 24)
//   bit 1  also set the size field (offset 16) to the image's length
//   bit 2  restore into a fresh session (else into the shared one, which holds a pinned
//          state with a wrapped ring)
//   bits 3-4  the fresh session's shape: chunk 1, 3, 16 or n_ctx 24 (smaller than some
//          seeds: GEIST_E_CONTEXT_FULL)
//
// Model: $GEIST_FUZZ_MODEL, else the tiny Gemma 3 of the source tree.
// Activations: f32 unless $GEIST_ACT is set. An accepted image may hold any floats, and
// NaN/inf (or huge) KV rows make NaN activations, which the q8 activation quantizer
// converts to int (undefined; src/quant/dot.cpp round_even). GEIST_ACT=q8 shows it.
// Outcomes: GEIST_FUZZ_STATS=1 prints at exit how many inputs each check refused (by
// status and the message's first words) and how many restored.
// Seeds: GEIST_FUZZ_WRITE_SEEDS=DIR makes the binary write valid images of several
// shapes (with mode bytes) into DIR and exit; scripts/fuzz_snapshot.sh does this.
#include <xxhash.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backends/cpu/ops.h"
#include "engine/model.h"
#include "engine/session.h"

#ifndef GEIST_FUZZ_MODEL_DEFAULT
#define GEIST_FUZZ_MODEL_DEFAULT "tests/data/tiny_gemma3.gguf"
#endif

namespace {

using geist::Model;
using geist::Session;
using geist::SessionParams;
using geist::Status;

constexpr int64_t kCtx = 96;

Model *g_model = nullptr;
Session *g_shared = nullptr;          // the reused target
std::vector<uint8_t> *g_shared_img;   // its state, restored before each input that targets it

std::map<std::string, uint64_t> *g_outcomes;  // non-null with GEIST_FUZZ_STATS

void count(const Status &st) {
  if (!g_outcomes) return;
  // The message up to its first number, quote or parenthesis: which check refused.
  const std::string &m = st.message();
  size_t cut = m.find_first_of("0123456789'(");
  std::string key = std::string(geist_status_name(st.code())) + " " + m.substr(0, cut);
  while (key.back() == ' ') key.pop_back();
  (*g_outcomes)[key] += 1;
}

void print_outcomes() {
  if (g_outcomes->empty()) return;  // the -jobs parent, which runs no inputs
  std::fprintf(stderr, "snapshot_fuzz outcomes:\n");
  for (const auto &[k, n] : *g_outcomes) std::fprintf(stderr, "  %10llu  %s\n", (unsigned long long)n, k.c_str());
}

[[noreturn]] void die(const char *what) {
  std::fprintf(stderr, "snapshot_fuzz: %s\n", what);
  std::abort();
}

std::unique_ptr<Session> make(int chunk, int64_t n_ctx) {
  SessionParams p;
  p.n_ctx = n_ctx;
  p.n_threads = 1;
  p.chunk = chunk;
  p.sampling.temperature = 0.8f;
  p.sampling.repeat_penalty = 1.1f;
  p.sampling.repeat_last_n = -1;  // keep all history: a restore is then exactly canonical
  p.sampling.seed = 7;
  auto s = Session::create(*g_model, p);
  if (!s) die(s.status().to_string().c_str());
  return std::move(s).value();
}

std::vector<uint8_t> image(const Session &s) {
  std::vector<uint8_t> b(s.snapshot_size());
  size_t w = 0;
  Status st = s.snapshot(b.data(), b.size(), &w);
  if (!st || w != b.size()) die("snapshot failed");
  return b;
}

std::vector<int32_t> tokens(size_t n, uint32_t seed) {
  std::vector<int32_t> t(n);
  uint32_t x = seed * 2654435761u + 1u;
  for (auto &v : t) {
    x = x * 1664525u + 1013904223u;
    v = int32_t((x >> 8) % uint32_t(g_model->info().n_vocab));
  }
  return t;
}

// A session pinned at n_pin, then n_more prefilled, then n_decode sampled.
std::unique_ptr<Session> shaped(size_t n_pin, size_t n_more, int n_decode, int chunk, uint32_t seed) {
  std::unique_ptr<Session> s = make(chunk, kCtx);
  const std::vector<int32_t> t = tokens(n_pin + n_more, seed);
  if (n_pin && !s->pin_prefix(t.data(), n_pin)) die("pin");
  if (n_more && !s->prefill(t.data() + n_pin, n_more)) die("prefill");
  for (int i = 0; i < n_decode; ++i) {
    int32_t tok;
    if (!s->decode_step(&tok)) die("decode");
  }
  return s;
}

void write_seeds(const char *dir) {
  struct Shape {
    size_t pin, more;
    int decode;
  };
  const Shape shapes[] = {{0, 0, 0}, {0, 3, 0}, {0, 20, 1}, {5, 0, 0}, {12, 0, 0},
                          {3, 12, 0}, {2, 1, 0}, {10, 2, 2}, {6, 30, 0}};
  int i = 0;
  for (const Shape &sh : shapes) {
    const std::vector<uint8_t> img = image(*shaped(sh.pin, sh.more, sh.decode, 4, uint32_t(i + 1)));
    for (uint8_t mode : {0x00, 0x01, 0x03, 0x07, 0x0F, 0x17, 0x1F}) {
      const std::string path = std::string(dir) + "/seed_" + std::to_string(i) + "_m" + std::to_string(mode);
      FILE *f = std::fopen(path.c_str(), "wb");
      if (!f) die("cannot write a seed");
      std::fputc(mode, f);
      std::fwrite(img.data(), 1, img.size(), f);
      std::fclose(f);
    }
    ++i;
  }
}

// Exercise an accepted state: it must be canonical and usable.
void exercise(Session &s, const uint8_t *img, size_t size) {
  const std::vector<uint8_t> again = image(s);
  if (again.size() != size || std::memcmp(again.data(), img, size) != 0) die("restore is not canonical");
  int32_t tok;
  if (s.logits() != nullptr && s.n_tokens() < size_t(s.n_ctx())) {
    if (!s.decode_step(&tok)) die("decode after restore");
    if (tok < 0 || tok >= s.n_vocab()) die("decoded token out of range");
  } else if (s.logits() == nullptr) {
    if (s.decode_step(&tok).code() != GEIST_E_STATE) die("decode without logits");
    const int32_t one = 2;
    if (!s.prefill(&one, 1)) die("prefill after restoring an empty image");
  }
  if (s.n_pinned() > 0) {
    s.reset();
    if (s.n_tokens() != s.n_pinned()) die("reset");
    if (s.n_tokens() < size_t(s.n_ctx()) && !s.decode_step(&tok)) die("decode after reset");
  }
  (void)image(s);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
  if (!std::getenv("GEIST_ACT")) geist::cpu::set_activation_mode(geist::cpu::ActivationMode::F32);
  const char *path = std::getenv("GEIST_FUZZ_MODEL");
  if (!path || !*path) path = GEIST_FUZZ_MODEL_DEFAULT;
  auto m = Model::load(path);
  if (!m) die(m.status().to_string().c_str());
  g_model = std::move(m).value().release();
  if (const char *dir = std::getenv("GEIST_FUZZ_WRITE_SEEDS")) {
    write_seeds(dir);
    std::exit(0);
  }
  if (const char *e = std::getenv("GEIST_FUZZ_STATS"); e && *e && *e != '0') {
    g_outcomes = new std::map<std::string, uint64_t>();
    std::atexit(print_outcomes);
  }
  // Pinned at 9, ring of 8 + 4 - 1 = 11 wrapped by 20 more tokens.
  g_shared = shaped(9, 20, 1, 4, 99).release();
  g_shared_img = new std::vector<uint8_t>(image(*g_shared));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  // An exactly sized heap copy, so ASan sees any read past the end.
  std::vector<uint8_t> img(data + 1, data + size);
  if ((mode & 2) && img.size() >= 24) {
    const uint64_t n = img.size();
    std::memcpy(img.data() + 16, &n, 8);
  }
  if ((mode & 1) && img.size() >= 32) {
    const uint64_t sum = XXH3_64bits(img.data() + 32, img.size() - 32);
    std::memcpy(img.data() + 24, &sum, 8);
  }
  const uint8_t *p = img.empty() ? reinterpret_cast<const uint8_t *>("") : img.data();

  std::unique_ptr<Session> fresh;
  Session *t;
  if (mode & 4) {
    static const int kChunk[4] = {1, 3, 16, 4};
    const int shape = (mode >> 3) & 3;
    fresh = make(kChunk[shape], shape == 3 ? 24 : kCtx);
    t = fresh.get();
  } else {
    t = g_shared;
    if (!t->restore(g_shared_img->data(), g_shared_img->size())) die("cannot restore the shared state");
  }

  const std::vector<uint8_t> before = image(*t);
  const float *l0 = t->logits();
  const std::vector<float> logits = l0 ? std::vector<float>(l0, l0 + t->n_vocab()) : std::vector<float>();
  Status st = t->restore(p, img.size());
  count(st);
  if (!st) {
    if (st.message().empty()) die("an error without a message");
    if (st.code() != GEIST_E_BAD_FORMAT && st.code() != GEIST_E_UNSUPPORTED && st.code() != GEIST_E_MISMATCH &&
        st.code() != GEIST_E_CONTEXT_FULL) {
      die(("unexpected status: " + st.to_string()).c_str());
    }
    if (image(*t) != before) die("a refused restore changed the session");
    const float *l1 = t->logits();
    if ((l1 == nullptr) != logits.empty() ||
        (l1 && std::memcmp(l1, logits.data(), logits.size() * sizeof(float)) != 0)) {
      die("a refused restore changed the logits");
    }
    return 0;
  }
  exercise(*t, p, img.size());
  return 0;
}

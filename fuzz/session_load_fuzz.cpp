// libFuzzer entry for the session-file loader the CLI uses: `geist run --prompt-cache
// FILE` and `geist chat --load FILE` both call geist_session_load_file
// (include/geist/geist.h; Session::load_file in src/engine/snapshot.cpp). Each input is
// written to a regular file and loaded into a session of the tiny model through the
// public C ABI only, as the CLI does. Checked on every input, under ASan+UBSan:
// - a refused load returns one of the statuses the header lists for it, with a message
//   (geist_session_error), and leaves the session unchanged: same tokens
//   (geist_session_tokens), pin, n_ctx, logits bit for bit and snapshot image;
// - an accepted load is the file: the session's snapshot right after it equals the file's
//   bytes, and save_file over it writes the same bytes; the state is then usable the way
//   the CLI uses it (tokens, reset to the pin, set_sampling, decode a token in range, clear);
// - geist_snapshot_file_check (the CLI's "may this file be replaced" question, asked before
//   loading) accepts only an empty file or one starting with the snapshot magic, accepts
//   every file that loads, and neither it nor load_file changes the file.
//
// Input: one mode byte, then the file's bytes. The checksum rejects nearly every
// mutation, so the mode byte lets the fuzzer get past it (as fuzz/snapshot_fuzz.cpp):
//   bit 0  recompute the checksum (XXH3-64 of [32, size) at offset 24)
//   bit 1  also set the size field (offset 16) to the file's length
//   bit 2  load into a fresh session (else into the shared one, which holds a pinned
//          state with a wrapped sliding-window ring)
//   bits 3-4  the fresh session's shape: chunk 1, 3, 16, or n_ctx 24 (smaller than some
//          seeds: GEIST_E_CONTEXT_FULL)
//
// Model: $GEIST_FUZZ_MODEL, else the tiny Gemma 3 of the source tree.
// Activations: f32 unless $GEIST_ACT is set (an accepted file may hold any floats; see
// fuzz/snapshot_fuzz.cpp for why q8 activations of NaN rows are UB).
// Files: one scratch file in $GEIST_FUZZ_TMPDIR, else /dev/shm, else $TMPDIR or /tmp,
// removed at exit.
// Outcomes: GEIST_FUZZ_STATS=1 prints at exit how many loads each check refused.
// Seeds: GEIST_FUZZ_WRITE_SEEDS=DIR writes valid session files of several shapes (with
// mode bytes) into DIR and exits; fuzz/run.sh session_load_fuzz does this.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "backends/cpu/ops.h"  // set_activation_mode: the one call outside the C ABI
#include "geist/geist.h"

#ifndef GEIST_FUZZ_MODEL_DEFAULT
#define GEIST_FUZZ_MODEL_DEFAULT "tests/data/tiny_gemma3.gguf"
#endif

namespace {

constexpr int64_t kCtx = 96;

geist_model *g_model = nullptr;
int64_t g_vocab = 0;
geist_session *g_shared = nullptr;     // the reused target
std::vector<uint8_t> *g_shared_img;    // its state, restored before each input that targets it
std::string *g_path;                   // the scratch file
std::map<std::string, uint64_t> *g_outcomes;  // non-null with GEIST_FUZZ_STATS

[[noreturn]] void die(const char *what, const char *detail = "") {
  std::fprintf(stderr, "session_load_fuzz: %s %s\n", what, detail);
  std::abort();
}

void check(geist_status st, const char *what, geist_session *s = nullptr) {
  if (st != GEIST_OK) die(what, s ? geist_session_error(s) : geist_status_name(st));
}

void count(geist_status st, const char *msg) {
  if (!g_outcomes) return;
  // The message from after the file name up to its first number or parenthesis: which
  // check refused (the path is in the message; cut it off so the key is stable).
  std::string m = msg;
  if (size_t at = m.find(*g_path); at != std::string::npos) m.erase(0, at + g_path->size());
  while (!m.empty() && (m[0] == '\'' || m[0] == ':' || m[0] == ' ')) m.erase(0, 1);
  const size_t cut = m.find_first_of("0123456789'(");
  std::string key = std::string(geist_status_name(st)) + " " + m.substr(0, cut);
  while (key.back() == ' ') key.pop_back();
  (*g_outcomes)[key] += 1;
}

void print_outcomes() {
  if (g_outcomes->empty()) return;  // the -jobs parent, which runs no inputs
  std::fprintf(stderr, "session_load_fuzz outcomes:\n");
  for (const auto &[k, n] : *g_outcomes) std::fprintf(stderr, "  %10llu  %s\n", (unsigned long long)n, k.c_str());
}

void remove_scratch() {
  if (g_path) ::unlink(g_path->c_str());
}

geist_session *make(int chunk, int64_t n_ctx) {
  geist_session_params p = geist_session_params_default();
  p.n_ctx = n_ctx;
  p.n_threads = 1;
  p.chunk = chunk;
  p.sampling.temperature = 0.8f;
  p.sampling.repeat_penalty = 1.1f;
  p.sampling.repeat_last_n = -1;  // keep all history: a load is then exactly canonical
  p.sampling.seed = 7;
  geist_session *s = nullptr;
  check(geist_session_create(g_model, &p, &s), "cannot create a session");
  return s;
}

std::vector<uint8_t> image(geist_session *s) {
  size_t n = 0;
  check(geist_session_snapshot_size(s, &n), "snapshot_size", s);
  std::vector<uint8_t> b(n);
  size_t w = 0;
  check(geist_session_snapshot(s, b.data(), b.size(), &w), "snapshot", s);
  if (w != n) die("snapshot wrote another size than snapshot_size said");
  return b;
}

std::vector<geist_token> tokens_of(geist_session *s) {
  size_t n = 0;
  geist_status st = geist_session_tokens(s, nullptr, 0, &n);
  if (st != GEIST_OK && st != GEIST_E_BUFFER_TOO_SMALL) die("tokens (size)", geist_status_name(st));
  if (n != geist_session_n_tokens(s)) die("geist_session_tokens and n_tokens disagree");
  std::vector<geist_token> t(n);
  size_t n2 = 0;
  check(geist_session_tokens(s, t.data(), t.size(), &n2), "tokens", s);
  if (n2 != n) die("tokens: the count changed");
  return t;
}

std::vector<float> logits_of(geist_session *s) {
  size_t nv = 0;
  const float *l = geist_session_logits(s, &nv);
  if (!l) {
    if (nv != 0) die("no logits but n_vocab set");
    return {};
  }
  if (int64_t(nv) != g_vocab) die("logits of another width");
  return std::vector<float>(l, l + nv);
}

std::vector<geist_token> ids(size_t n, uint32_t seed) {
  std::vector<geist_token> t(n);
  uint32_t x = seed * 2654435761u + 1u;
  for (auto &v : t) {
    x = x * 1664525u + 1013904223u;
    v = geist_token((x >> 8) % uint32_t(g_vocab));
  }
  return t;
}

// A session pinned at n_pin, then n_more prefilled, then n_decode sampled.
geist_session *shaped(size_t n_pin, size_t n_more, int n_decode, int chunk, uint32_t seed) {
  geist_session *s = make(chunk, kCtx);
  const std::vector<geist_token> t = ids(n_pin + n_more, seed);
  if (n_pin) check(geist_session_pin_prefix(s, t.data(), n_pin), "pin", s);
  if (n_more) check(geist_session_prefill_tokens(s, t.data() + n_pin, n_more), "prefill", s);
  for (int i = 0; i < n_decode; ++i) {
    geist_token tok;
    check(geist_session_decode_step(s, &tok), "decode", s);
  }
  return s;
}

void write_file(const std::string &path, const uint8_t *p, size_t n, int mode_byte = -1) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) die("cannot open", path.c_str());
  std::vector<uint8_t> all;
  if (mode_byte >= 0) all.push_back(uint8_t(mode_byte));
  all.insert(all.end(), p, p + n);
  size_t off = 0;
  while (off < all.size()) {
    const ssize_t w = ::write(fd, all.data() + off, all.size() - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) die("cannot write", path.c_str());
    off += size_t(w);
  }
  if (::close(fd) != 0) die("cannot close", path.c_str());
}

std::vector<uint8_t> read_file(const std::string &path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) die("cannot open for reading", path.c_str());
  std::vector<uint8_t> b;
  uint8_t chunk[65536];
  for (;;) {
    const ssize_t r = ::read(fd, chunk, sizeof chunk);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) die("cannot read", path.c_str());
    if (r == 0) break;
    b.insert(b.end(), chunk, chunk + r);
  }
  ::close(fd);
  return b;
}

void write_seeds(const char *dir) {
  struct Shape {
    size_t pin, more;
    int decode;
  };
  // Empty, plain, past the window, pinned at the end (compact checkpoint), pinned with
  // more after it, decoded, longer than the small shape's n_ctx.
  const Shape shapes[] = {{0, 0, 0}, {0, 3, 0}, {0, 20, 1}, {5, 0, 0}, {12, 0, 0},
                          {3, 12, 0}, {10, 2, 2}, {6, 30, 0}};
  int i = 0;
  for (const Shape &sh : shapes) {
    geist_session *s = shaped(sh.pin, sh.more, sh.decode, 4, uint32_t(i + 1));
    // Through the saver the CLI uses, so the seeds are the files it writes.
    const std::string plain = std::string(dir) + "/plain_" + std::to_string(i) + ".geistsnap";
    check(geist_session_save_file(s, plain.c_str()), "save_file", s);
    const std::vector<uint8_t> img = image(s);
    geist_session_free(s);
    for (int mode : {0x00, 0x03, 0x07, 0x1F}) {
      write_file(std::string(dir) + "/seed_" + std::to_string(i) + "_m" + std::to_string(mode), img.data(),
                 img.size(), mode);
    }
    ::unlink(plain.c_str());
    ++i;
  }
}

bool allowed_refusal(geist_status st) {
  // geist_session_restore's statuses plus GEIST_E_IO for the file; a regular file that
  // was just written reads fine, so IO is not expected, but the header allows it.
  return st == GEIST_E_BAD_FORMAT || st == GEIST_E_UNSUPPORTED || st == GEIST_E_MISMATCH ||
         st == GEIST_E_CONTEXT_FULL || st == GEIST_E_IO;
}

// Use an accepted state the way the CLI does after a load.
void exercise(geist_session *s, const std::vector<uint8_t> &file) {
  const std::vector<uint8_t> again = image(s);
  if (again != file) die("an accepted load is not the file (snapshot after load != file bytes)");
  const std::vector<geist_token> t = tokens_of(s);
  for (geist_token x : t) {
    if (x < 0 || x >= g_vocab) die("a loaded token out of range");
  }
  const size_t n_pinned = geist_session_n_pinned(s);
  if (n_pinned > t.size()) die("n_pinned > n_tokens");
  const size_t n_ctx = geist_session_n_ctx(s);
  geist_token tok;
  if (n_pinned > 0) {  // run --prompt-cache: back to the cache's pinned prefix
    check(geist_session_reset(s), "reset", s);
    if (geist_session_n_tokens(s) != n_pinned) die("reset did not go back to the pin");
    if (tokens_of(s) != std::vector<geist_token>(t.begin(), t.begin() + n_pinned)) die("reset: tokens");
  }
  geist_sampling_params sp = geist_sampling_params_default();
  sp.seed = 11;
  check(geist_session_set_sampling(s, &sp), "set_sampling", s);
  if (geist_session_n_tokens(s) == 0) {
    if (geist_session_decode_step(s, &tok) != GEIST_E_STATE) die("decode without logits");
    const geist_token one = 2;
    check(geist_session_prefill_tokens(s, &one, 1), "prefill after loading an empty file", s);
  }
  if (geist_session_n_tokens(s) < n_ctx) {
    check(geist_session_decode_step(s, &tok), "decode after load", s);
    if (tok < 0 || tok >= g_vocab) die("decoded token out of range");
  }
  check(geist_session_clear(s), "clear", s);
  if (geist_session_n_tokens(s) != 0 || geist_session_n_pinned(s) != 0) die("clear");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
  if (!std::getenv("GEIST_ACT")) geist::cpu::set_activation_mode(geist::cpu::ActivationMode::F32);
  const char *path = std::getenv("GEIST_FUZZ_MODEL");
  if (!path || !*path) path = GEIST_FUZZ_MODEL_DEFAULT;
  geist_model_params mp = geist_model_params_default();
  if (geist_model_load(path, &mp, &g_model) != GEIST_OK) die("cannot load the model", geist_last_error());
  geist_model_info info;
  check(geist_model_get_info(g_model, &info), "model info");
  g_vocab = info.n_vocab;

  const char *dir = std::getenv("GEIST_FUZZ_TMPDIR");
  struct stat st;
  if (!dir || !*dir) dir = ::stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) ? "/dev/shm" : nullptr;
  if (!dir) dir = std::getenv("TMPDIR");
  if (!dir || !*dir) dir = "/tmp";
  g_path = new std::string(std::string(dir) + "/geist_session_load_fuzz." + std::to_string(::getpid()) +
                           ".geistsnap");
  std::atexit(remove_scratch);

  if (const char *seeds = std::getenv("GEIST_FUZZ_WRITE_SEEDS")) {
    write_seeds(seeds);
    std::exit(0);
  }
  if (const char *e = std::getenv("GEIST_FUZZ_STATS"); e && *e && *e != '0') {
    g_outcomes = new std::map<std::string, uint64_t>();
    std::atexit(print_outcomes);
  }
  // Pinned at 9, ring of 8 + 4 - 1 = 11 wrapped by 20 more tokens.
  g_shared = shaped(9, 20, 1, 4, 99);
  g_shared_img = new std::vector<uint8_t>(image(g_shared));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  std::vector<uint8_t> file(data + 1, data + size);
  if ((mode & 2) && file.size() >= 24) {
    const uint64_t n = file.size();
    std::memcpy(file.data() + 16, &n, 8);
  }
  if ((mode & 1) && file.size() >= 32) {
    const uint64_t sum = XXH3_64bits(file.data() + 32, file.size() - 32);
    std::memcpy(file.data() + 24, &sum, 8);
  }
  write_file(*g_path, file.data(), file.size());

  geist_session *fresh = nullptr;
  geist_session *t;
  if (mode & 4) {
    static const int kChunk[4] = {1, 3, 16, 4};
    const int shape = (mode >> 3) & 3;
    fresh = make(kChunk[shape], shape == 3 ? 24 : kCtx);
    t = fresh;
  } else {
    t = g_shared;
    check(geist_session_restore(t, g_shared_img->data(), g_shared_img->size()), "cannot restore the shared state", t);
  }

  const std::vector<uint8_t> before = image(t);
  const std::vector<geist_token> tok_before = tokens_of(t);
  const size_t pinned_before = geist_session_n_pinned(t), ctx_before = geist_session_n_ctx(t);
  const std::vector<float> logits_before = logits_of(t);

  // The CLI first asks whether it may later write the file (geist_snapshot_file_check):
  // only an empty file or a geist snapshot may be replaced, and asking changes nothing.
  const geist_status chk = geist_snapshot_file_check(g_path->c_str());
  const bool magic = file.size() >= 8 && std::memcmp(file.data(), "GEISTSNP", 8) == 0;
  if (chk != GEIST_OK && chk != GEIST_E_IO) die("snapshot_file_check: unexpected status", geist_status_name(chk));
  if (chk == GEIST_OK && !magic && !file.empty()) die("snapshot_file_check accepts replacing a file that is no snapshot");
  if (chk != GEIST_OK && !*geist_last_error()) die("snapshot_file_check refused without a message");
  if (read_file(*g_path) != file) die("snapshot_file_check changed the file");

  const geist_status st = geist_session_load_file(t, g_path->c_str());
  if (st == GEIST_OK && chk != GEIST_OK) die("a loadable file may not be replaced (snapshot_file_check)", geist_last_error());
  if (read_file(*g_path) != file) die("load_file changed the file");
  if (st != GEIST_OK) {
    const char *msg = geist_session_error(t);
    count(st, msg ? msg : "");
    if (!msg || !*msg) die("a refused load without a message");
    if (!allowed_refusal(st)) die("unexpected status", (std::string(geist_status_name(st)) + ": " + msg).c_str());
    if (tokens_of(t) != tok_before) die("a refused load changed the tokens", msg);
    if (geist_session_n_pinned(t) != pinned_before || geist_session_n_ctx(t) != ctx_before) {
      die("a refused load changed the pin or n_ctx", msg);
    }
    const std::vector<float> logits_after = logits_of(t);
    if (logits_after.size() != logits_before.size() ||
        (!logits_after.empty() &&
         std::memcmp(logits_after.data(), logits_before.data(), logits_after.size() * sizeof(float)) != 0)) {
      die("a refused load changed the logits", msg);
    }
    if (image(t) != before) die("a refused load changed the session state", msg);
  } else {
    count(st, "loaded");
    // run --prompt-cache saves the state back over the file: the same bytes again.
    check(geist_session_save_file(t, g_path->c_str()), "save_file over the loaded file", t);
    if (read_file(*g_path) != file) die("saving a loaded session did not give the file back");
    exercise(t, file);
  }
  if (fresh) geist_session_free(fresh);
  return 0;
}

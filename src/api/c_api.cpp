// The public C ABI (include/geist/geist.h) over the engine's C++ classes. Every entry
// point catches everything: no exception crosses into C.
#include <atomic>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "backends/cpu/isa.h"
#include "engine/model.h"
#include "engine/session.h"
#include "engine/snapshot_file.h"
#include "engine/tokenizer.h"
#include "geist/geist.h"
#include "geist_version.h"  // generated at build time (cmake/version.cmake)

struct geist_model {
  std::shared_ptr<geist::Model> model;
};

struct geist_session {
  std::shared_ptr<geist::Model> model;  // keeps the weights alive
  std::unique_ptr<geist::Session> session;
  std::string error;
  // Set while a call runs on this session: a second thread's call is refused with
  // GEIST_E_STATE instead of racing (one uncontended atomic exchange per call).
  std::atomic<bool> busy{false};
};

struct geist_state {
  std::shared_ptr<geist::Model> model;  // the last save's: keeps its backend alive
  geist::SessionState state;
  // > 0: that many readers (a load, a snapshot); -1: a save is writing it. A save while
  // another thread reads it (or the reverse) is refused instead of racing.
  std::atomic<int> users{0};
};

namespace {

thread_local std::string t_last_error;

geist_status fail(geist_status code, const std::string &msg, geist_session *s = nullptr) {
  try {
    t_last_error = msg;
    if (s) s->error = msg;
  } catch (...) {
  }
  return code;
}

geist_status report(const geist::Status &st, geist_session *s = nullptr) {
  if (st.is_ok()) return GEIST_OK;
  return fail(st.code(), st.message(), s);
}

// Runs fn, turning exceptions into statuses (and recording the message).
template <typename Fn>
geist_status guarded(geist_session *s, Fn &&fn) noexcept {
  try {
    return fn();
  } catch (const std::bad_alloc &) {
    return fail(GEIST_E_OUT_OF_MEMORY, "out of memory", s);
  } catch (const std::exception &e) {
    return fail(GEIST_E_INTERNAL, std::string("internal error: ") + e.what(), s);
  } catch (...) {
    return fail(GEIST_E_INTERNAL, "internal error: unknown exception", s);
  }
}

// Marks s busy for the scope of one call; ok() is false if another thread holds it.
class InUse {
 public:
  explicit InUse(const geist_session *s) : s_(const_cast<geist_session *>(s)) {
    held_ = !s_->busy.exchange(true, std::memory_order_acquire);
  }
  ~InUse() {
    if (held_) s_->busy.store(false, std::memory_order_release);
  }
  InUse(const InUse &) = delete;
  InUse &operator=(const InUse &) = delete;
  bool ok() const { return held_; }
  // The status of a refused call. The message goes to this thread's last error only:
  // the session's own message belongs to the thread that holds it.
  static geist_status refuse() {
    return fail(GEIST_E_STATE, "the session is in use by another thread (a session takes one call at a time)");
  }

 private:
  geist_session *s_;
  bool held_ = false;
};

#define GEIST_SESSION_ENTER(s)                                   \
  if ((s) == nullptr) return fail(GEIST_E_INVALID_ARGUMENT, "s is NULL"); \
  InUse in_use_(s);                                              \
  if (!in_use_.ok()) return InUse::refuse()

geist::SamplerParams to_cpp(const geist_sampling_params &p) {
  geist::SamplerParams q;
  q.temperature = p.temperature;
  q.top_k = p.top_k;
  q.top_p = p.top_p;
  q.min_p = p.min_p;
  q.repeat_penalty = p.repeat_penalty;
  q.repeat_last_n = p.repeat_last_n;
  q.seed = p.seed;
  return q;
}

geist_status copy_out(const std::string &bytes, char *buf, size_t cap, size_t *n_out) {
  *n_out = bytes.size();
  if (cap < bytes.size()) {
    return fail(GEIST_E_BUFFER_TOO_SMALL, "needs " + std::to_string(bytes.size()) + " bytes, the buffer holds " +
                                              std::to_string(cap));
  }
  if (!bytes.empty()) std::memcpy(buf, bytes.data(), bytes.size());
  return GEIST_OK;
}

// The tokens t of a session or state ("whose") to out, as geist_session_tokens documents:
// *n_out = t.size(); GEIST_E_BUFFER_TOO_SMALL (nothing copied) when cap is short.
geist_status copy_tokens(const std::vector<int32_t> &t, const char *whose, geist_token *out, size_t cap,
                         size_t *n_out, geist_session *s) {
  if (out == nullptr && cap > 0) return fail(GEIST_E_INVALID_ARGUMENT, "out is NULL but cap > 0", s);
  *n_out = t.size();
  if (cap < t.size()) {
    return fail(GEIST_E_BUFFER_TOO_SMALL, std::string("the ") + whose + " has " + std::to_string(t.size()) +
                                              " tokens, the buffer holds " + std::to_string(cap), s);
  }
  if (!t.empty()) std::memcpy(out, t.data(), t.size() * sizeof(geist_token));
  return GEIST_OK;
}

#define GEIST_NULL_CHECK(p, s)                                                   \
  do {                                                                          \
    if ((p) == nullptr) return fail(GEIST_E_INVALID_ARGUMENT, #p " is NULL", s); \
  } while (0)

geist_status load_common(geist::Result<std::unique_ptr<geist::Model>> r, geist_model **out) {
  if (!r) return report(r.status());
  auto *m = new geist_model;
  m->model = std::shared_ptr<geist::Model>(std::move(r).value());
  *out = m;
  return GEIST_OK;
}

// A caller's parameter struct as this library knows it: the fields that fit in its
// struct_size over the defaults (geist.h, "Parameter structs"). min is the first sized
// version's size.
template <class T>
geist_status read_sized(const T *p, const T &dflt, size_t min, const char *name, T *out) {
  *out = dflt;
  if (p == nullptr) return GEIST_OK;
  const size_t n = p->struct_size;
  if (n < min) {
    return fail(GEIST_E_INVALID_ARGUMENT, std::string(name) + ".struct_size is " + std::to_string(n) +
                                              ": start from " + name + "_default(), which sets it");
  }
  if (n > sizeof(T)) {
    return fail(GEIST_E_UNSUPPORTED, std::string(name) + ".struct_size is " + std::to_string(n) +
                                         ", larger than this library's " + std::to_string(sizeof(T)) +
                                         ": the caller was built against a newer geist.h");
  }
  std::memcpy(static_cast<void *>(out), p, n);
  out->struct_size = sizeof(T);
  return GEIST_OK;
}

geist_status sampling_params(const geist_sampling_params *p, geist_sampling_params *out) {
  return read_sized(p, geist_sampling_params_default(), sizeof(geist_sampling_params), "geist_sampling_params", out);
}

geist_status model_params(const geist_model_params *p, geist::ModelParams *q) {
  geist_model_params d;
  if (geist_status st = read_sized(p, geist_model_params_default(), sizeof(geist_model_params),
                                   "geist_model_params", &d);
      st != GEIST_OK) {
    return st;
  }
  if (d.backend != GEIST_BACKEND_CPU && d.backend != GEIST_BACKEND_CUDA) {
    return fail(GEIST_E_INVALID_ARGUMENT, "backend " + std::to_string(d.backend) + " is not a geist_backend_kind");
  }
  if (d.device < 0) return fail(GEIST_E_INVALID_ARGUMENT, "device " + std::to_string(d.device) + " is negative");
  q->prefetch = d.prefetch != 0;
  q->backend = d.backend == GEIST_BACKEND_CUDA ? geist::BackendKind::Cuda : geist::BackendKind::Cpu;
  q->device = d.device;
  return GEIST_OK;
}

bool kv_type(int32_t t, geist::KvType *out) {
  if (t < GEIST_KV_F32 || t > GEIST_KV_Q8_0) return false;
  *out = static_cast<geist::KvType>(t);
  return true;
}

}  // namespace

namespace {
// geist_decode_batch and geist_step_batch: hold every session for the call (a repeated one
// is refused before it would be taken twice), then run(engine sessions).
template <class Run>
geist_status batch_call(geist_session *const *sessions, size_t n, Run run) {
  return guarded(nullptr, [&]() -> geist_status {
    for (size_t i = 0; i < n; ++i) {
      if (sessions[i] == nullptr) return fail(GEIST_E_INVALID_ARGUMENT, "session " + std::to_string(i) + " is NULL");
    }
    std::vector<geist::Session *> ss(n);
    for (size_t i = 0; i < n; ++i) {
      for (size_t k = 0; k < i; ++k) {
        if (sessions[k] == sessions[i]) {
          return fail(GEIST_E_INVALID_ARGUMENT,
                      "sessions " + std::to_string(k) + " and " + std::to_string(i) + " are the same");
        }
      }
      ss[i] = sessions[i]->session.get();
    }
    std::vector<std::unique_ptr<InUse>> held;
    held.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      held.push_back(std::make_unique<InUse>(sessions[i]));
      if (!held.back()->ok()) return InUse::refuse();
    }
    const geist::Status st = run(ss.data());
    if (!st.is_ok()) {
      for (size_t i = 0; i < n; ++i) (void)report(st, sessions[i]);
    }
    return report(st);
  });
}
}  // namespace

extern "C" {

const char *geist_version(void) {
  return GEIST_VERSION " (commit " GEIST_GIT_COMMIT ")";
}

const char *geist_last_error(void) { return t_last_error.c_str(); }

geist_model_params geist_model_params_default(void) {
  geist_model_params p;
  std::memset(&p, 0, sizeof p);
  p.struct_size = sizeof p;
  p.prefetch = 1;
  p.backend = GEIST_BACKEND_CPU;
  p.device = 0;
  return p;
}

geist_status geist_model_load(const char *path, const geist_model_params *p, geist_model **out) {
  return guarded(nullptr, [&] {
    GEIST_NULL_CHECK(out, nullptr);
    *out = nullptr;
    GEIST_NULL_CHECK(path, nullptr);
    geist::ModelParams q;
    if (geist_status st = model_params(p, &q); st != GEIST_OK) return st;
    return load_common(geist::Model::load(path, q), out);
  });
}

geist_status geist_model_load_from_memory(const void *data, size_t size, const geist_model_params *p,
                                          geist_model **out) {
  return guarded(nullptr, [&] {
    GEIST_NULL_CHECK(out, nullptr);
    *out = nullptr;
    GEIST_NULL_CHECK(data, nullptr);
    if (size == 0) return fail(GEIST_E_INVALID_ARGUMENT, "size is 0");
    geist::ModelParams q;
    if (geist_status st = model_params(p, &q); st != GEIST_OK) return st;
    return load_common(geist::Model::load_from_memory(data, size, q), out);
  });
}

void geist_model_free(geist_model *m) { delete m; }

geist_status geist_model_get_info(const geist_model *m, geist_model_info *out) {
  return guarded(nullptr, [&] {
    GEIST_NULL_CHECK(m, nullptr);
    GEIST_NULL_CHECK(out, nullptr);
    const geist::Model &model = *m->model;
    const geist::models::ModelInfo &i = model.info();
    std::memset(out, 0, sizeof *out);
    out->arch = i.arch.c_str();
    out->name = i.name.c_str();
    out->n_vocab = i.n_vocab;
    out->n_ctx_train = i.n_ctx_train;
    out->n_embd = i.n_embd;
    out->n_layer = i.n_layer;
    out->n_params = i.n_params;
    out->file_size = model.file().file_size();
    out->fingerprint = model.fingerprint();
    out->bos = model.tokenizer().bos();
    out->eos = model.tokenizer().eos();
    out->eot = model.tokenizer().vocab().eot;
    out->add_bos = model.tokenizer().vocab().add_bos && model.tokenizer().bos() >= 0 ? 1 : 0;
    out->load_seconds = model.load_seconds();
    return GEIST_OK;
  });
}

geist_status geist_model_get_backend(const geist_model *m, geist_backend_info *out) {
  return guarded(nullptr, [&] {
    GEIST_NULL_CHECK(m, nullptr);
    GEIST_NULL_CHECK(out, nullptr);
    static const std::string detail = geist::cpu::isa_description();
    const geist::models::ModelInfo &i = m->model->info();
    const geist::Backend &b = m->model->arch().backend();
    std::memset(out, 0, sizeof *out);
    out->isa = geist::cpu::isa_name(geist::cpu::active_isa());
    out->isa_detail = detail.c_str();
    out->isa_best = geist::cpu::isa_name(geist::cpu::best_isa());
    out->packed_bytes = i.packed_bytes;
    out->repack_seconds = i.repack_seconds;
    out->backend = b.name();
    out->device = m->model->device().c_str();
    return GEIST_OK;
  });
}

geist_status geist_tokenize(const geist_model *m, const char *text, size_t len, int add_bos, int parse_special,
                            geist_token *out, size_t cap, size_t *n_out) {
  return guarded(nullptr, [&] {
    GEIST_NULL_CHECK(m, nullptr);
    GEIST_NULL_CHECK(n_out, nullptr);
    if (text == nullptr && len > 0) return fail(GEIST_E_INVALID_ARGUMENT, "text is NULL but len > 0");
    if (out == nullptr && cap > 0) return fail(GEIST_E_INVALID_ARGUMENT, "out is NULL but cap > 0");
    std::vector<int32_t> ids;
    geist_status st = report(m->model->tokenizer().encode(std::string_view(text ? text : "", len), add_bos != 0,
                                                          parse_special != 0, &ids));
    if (st != GEIST_OK) return st;
    *n_out = ids.size();
    if (cap < ids.size()) {
      return fail(GEIST_E_BUFFER_TOO_SMALL, "the text has " + std::to_string(ids.size()) +
                                                " tokens, the buffer holds " + std::to_string(cap));
    }
    if (!ids.empty()) std::memcpy(out, ids.data(), ids.size() * sizeof(geist_token));
    return GEIST_OK;
  });
}

geist_status geist_token_to_piece(const geist_model *m, geist_token t, char *buf, size_t cap, size_t *n_out) {
  return guarded(nullptr, [&] {
    GEIST_NULL_CHECK(m, nullptr);
    GEIST_NULL_CHECK(n_out, nullptr);
    if (buf == nullptr && cap > 0) return fail(GEIST_E_INVALID_ARGUMENT, "buf is NULL but cap > 0");
    if (t < 0 || t >= m->model->info().n_vocab) {
      return fail(GEIST_E_INVALID_ARGUMENT, "token id " + std::to_string(t) + " outside [0, " +
                                                std::to_string(m->model->info().n_vocab) + ")");
    }
    return copy_out(m->model->tokenizer().token_to_piece(t, true), buf, cap, n_out);
  });
}

geist_status geist_detokenize(const geist_model *m, const geist_token *t, size_t n, int render_special, char *buf,
                              size_t cap, size_t *n_out) {
  return guarded(nullptr, [&] {
    GEIST_NULL_CHECK(m, nullptr);
    GEIST_NULL_CHECK(n_out, nullptr);
    if (t == nullptr && n > 0) return fail(GEIST_E_INVALID_ARGUMENT, "t is NULL but n > 0");
    if (buf == nullptr && cap > 0) return fail(GEIST_E_INVALID_ARGUMENT, "buf is NULL but cap > 0");
    const int64_t nv = m->model->info().n_vocab;
    for (size_t i = 0; i < n; ++i) {
      if (t[i] < 0 || t[i] >= nv) {
        return fail(GEIST_E_INVALID_ARGUMENT, "token " + std::to_string(i) + " has id " + std::to_string(t[i]) +
                                                  " outside [0, " + std::to_string(nv) + ")");
      }
    }
    geist::StreamDecoder dec(m->model->tokenizer(), render_special != 0);
    std::string text;
    for (size_t i = 0; i < n; ++i) text += dec.push(t[i]);
    text += dec.flush();
    return copy_out(text, buf, cap, n_out);
  });
}

int geist_token_is_eog(const geist_model *m, geist_token t) {
  if (m == nullptr) return 0;
  return m->model->tokenizer().is_eog(t) ? 1 : 0;
}

geist_sampling_params geist_sampling_params_default(void) {
  const geist::SamplerParams d;
  geist_sampling_params p;
  std::memset(&p, 0, sizeof p);
  p.struct_size = sizeof p;
  p.temperature = d.temperature;
  p.top_k = d.top_k;
  p.top_p = d.top_p;
  p.min_p = d.min_p;
  p.repeat_penalty = d.repeat_penalty;
  p.repeat_last_n = d.repeat_last_n;
  p.seed = d.seed;
  return p;
}

geist_session_params geist_session_params_default(void) {
  const geist::SessionParams d;
  geist_session_params p;
  std::memset(&p, 0, sizeof p);
  p.struct_size = sizeof p;
  p.n_ctx = d.n_ctx;
  p.n_threads = d.n_threads;
  p.chunk = d.chunk;
  p.type_k = static_cast<int32_t>(d.type_k);
  p.type_v = static_cast<int32_t>(d.type_v);
  p.sampling = geist_sampling_params_default();
  return p;
}

geist_status geist_session_create(geist_model *m, const geist_session_params *p, geist_session **out) {
  return guarded(nullptr, [&] {
    GEIST_NULL_CHECK(out, nullptr);
    *out = nullptr;
    GEIST_NULL_CHECK(m, nullptr);
    geist_session_params d;
    if (geist_status st = read_sized(p, geist_session_params_default(), sizeof(geist_session_params),
                                     "geist_session_params", &d);
        st != GEIST_OK) {
      return st;
    }
    geist_sampling_params sp;
    if (geist_status st = sampling_params(&d.sampling, &sp); st != GEIST_OK) return st;
    geist::KvType tk, tv;
    if (!kv_type(d.type_k, &tk) || !kv_type(d.type_v, &tv)) {
      return fail(GEIST_E_INVALID_ARGUMENT, "type_k " + std::to_string(d.type_k) + " / type_v " +
                                                std::to_string(d.type_v) + ": not a geist_kv_type (0..3)");
    }
    if (d.n_threads > 512) return fail(GEIST_E_INVALID_ARGUMENT, "n_threads " + std::to_string(d.n_threads) +
                                                                    " out of range [0, 512]");
    geist::SessionParams q;
    q.n_ctx = d.n_ctx;
    q.n_threads = d.n_threads;
    q.chunk = d.chunk;
    q.type_k = tk;
    q.type_v = tv;
    q.sampling = to_cpp(sp);
    geist::Result<std::unique_ptr<geist::Session>> r = geist::Session::create(*m->model, q);
    if (!r) return report(r.status());
    auto *s = new geist_session;
    s->model = m->model;
    s->session = std::move(r).value();
    *out = s;
    return GEIST_OK;
  });
}

void geist_session_free(geist_session *s) { delete s; }

const char *geist_session_error(const geist_session *s) { return s ? s->error.c_str() : ""; }

geist_status geist_session_prefill_tokens(geist_session *s, const geist_token *t, size_t n) {
  GEIST_SESSION_ENTER(s);
  return guarded(s, [&] {
    GEIST_NULL_CHECK(t, s);
    return report(s->session->prefill(t, n), s);
  });
}

geist_status geist_session_prefill_logits(geist_session *s, const geist_token *t, size_t n, size_t first, float *out,
                                          size_t cap) {
  GEIST_SESSION_ENTER(s);
  return guarded(s, [&] {
    GEIST_NULL_CHECK(t, s);
    GEIST_NULL_CHECK(out, s);
    if (n == 0 || first >= n) {
      return fail(GEIST_E_INVALID_ARGUMENT, "logits requested from row " + std::to_string(first) + " of " +
                                                std::to_string(n), s);
    }
    const size_t nv = static_cast<size_t>(s->session->n_vocab());
    if ((n - first) > SIZE_MAX / nv || cap < (n - first) * nv) {
      return fail(GEIST_E_BUFFER_TOO_SMALL, "logits of " + std::to_string(n - first) + " rows need " +
                                                std::to_string((n - first) * nv) + " floats, the buffer holds " +
                                                std::to_string(cap), s);
    }
    return report(s->session->prefill_with_logits(t, n, first, out), s);
  });
}

geist_status geist_session_pin_prefix(geist_session *s, const geist_token *t, size_t n) {
  GEIST_SESSION_ENTER(s);
  return guarded(s, [&] {
    GEIST_NULL_CHECK(t, s);
    return report(s->session->pin_prefix(t, n), s);
  });
}

geist_status geist_session_unpin(geist_session *s) {
  GEIST_SESSION_ENTER(s);
  s->session->unpin();
  return GEIST_OK;
}

geist_status geist_session_reset(geist_session *s) {
  GEIST_SESSION_ENTER(s);
  return guarded(s, [&] {
    s->session->reset();
    return GEIST_OK;
  });
}

geist_status geist_session_clear(geist_session *s) {
  GEIST_SESSION_ENTER(s);
  s->session->clear();
  return GEIST_OK;
}

geist_status geist_session_decode_step(geist_session *s, geist_token *out) {
  GEIST_SESSION_ENTER(s);
  return guarded(s, [&] { return report(s->session->decode_step(out), s); });
}

geist_status geist_session_wait(geist_session *s) {
  GEIST_SESSION_ENTER(s);
  return guarded(s, [&] { return report(s->session->wait(), s); });
}

geist_status geist_decode_batch(geist_session *const *sessions, size_t n, geist_token *out) {
  if (sessions == nullptr || out == nullptr || n == 0) {
    return fail(GEIST_E_INVALID_ARGUMENT, "geist_decode_batch needs sessions, n >= 1 and out");
  }
  return batch_call(sessions, n, [&](geist::Session *const *ss) { return geist::Session::decode_batch(ss, n, out); });
}

geist_status geist_step_batch(geist_session *const *sessions, const geist_token *const *tokens, const size_t *n_tokens,
                              size_t n, geist_token *out) {
  if (sessions == nullptr || n_tokens == nullptr || out == nullptr || n == 0) {
    return fail(GEIST_E_INVALID_ARGUMENT, "geist_step_batch needs sessions, n_tokens, n >= 1 and out");
  }
  return batch_call(sessions, n, [&](geist::Session *const *ss) {
    return geist::Session::step_batch(ss, tokens, n_tokens, n, out);
  });
}

geist_status geist_session_sample(geist_session *s, geist_token *out) {
  GEIST_SESSION_ENTER(s);
  return guarded(s, [&] { return report(s->session->sample(out), s); });
}

geist_status geist_session_set_sampling(geist_session *s, const geist_sampling_params *p) {
  GEIST_SESSION_ENTER(s);
  return guarded(s, [&] {
    GEIST_NULL_CHECK(p, s);
    geist_sampling_params sp;
    if (geist_status st = sampling_params(p, &sp); st != GEIST_OK) return fail(st, std::string(geist_last_error()), s);
    return report(s->session->set_sampling(to_cpp(sp)), s);
  });
}

const float *geist_session_logits(const geist_session *s, size_t *n_vocab) {
  if (n_vocab) *n_vocab = 0;
  if (s == nullptr) return nullptr;
  // A row left on the device by a greedy step is copied here (Session::logits): device work,
  // so the call takes the session as the others do.
  InUse in_use_(s);
  if (!in_use_.ok()) {
    (void)InUse::refuse();
    return nullptr;
  }
  if (geist::Status st = s->session->sync_logits(); !st.is_ok()) {
    (void)report(st, const_cast<geist_session *>(s));
    return nullptr;
  }
  const float *l = s->session->logits();
  if (n_vocab) *n_vocab = l ? static_cast<size_t>(s->session->n_vocab()) : 0;
  return l;
}

size_t geist_session_n_tokens(const geist_session *s) { return s ? s->session->n_tokens() : 0; }
size_t geist_session_n_pinned(const geist_session *s) { return s ? s->session->n_pinned() : 0; }
size_t geist_session_n_ctx(const geist_session *s) { return s ? static_cast<size_t>(s->session->n_ctx()) : 0; }
size_t geist_session_n_vocab(const geist_session *s) { return s ? static_cast<size_t>(s->session->n_vocab()) : 0; }
int32_t geist_session_n_threads(const geist_session *s) { return s ? s->session->n_threads() : 0; }
int32_t geist_session_chunk(const geist_session *s) { return s ? s->session->chunk() : 0; }

geist_status geist_session_tokens(const geist_session *s, geist_token *out, size_t cap, size_t *n_out) {
  GEIST_SESSION_ENTER(s);
  auto *ms = const_cast<geist_session *>(s);  // error message only
  GEIST_NULL_CHECK(n_out, ms);
  return copy_tokens(s->session->tokens(), "session", out, cap, n_out, ms);
}

geist_status geist_session_snapshot_size(const geist_session *s, size_t *size) {
  GEIST_SESSION_ENTER(s);
  auto *ms = const_cast<geist_session *>(s);
  GEIST_NULL_CHECK(size, ms);
  *size = s->session->snapshot_size();
  return GEIST_OK;
}

geist_status geist_session_snapshot(const geist_session *s, void *buf, size_t cap, size_t *written) {
  GEIST_SESSION_ENTER(s);
  auto *ms = const_cast<geist_session *>(s);
  return guarded(ms, [&] {
    GEIST_NULL_CHECK(written, ms);
    if (buf == nullptr && cap > 0) return fail(GEIST_E_INVALID_ARGUMENT, "buf is NULL but cap > 0", ms);
    return report(s->session->snapshot(buf, cap, written), ms);
  });
}

geist_status geist_session_restore(geist_session *s, const void *buf, size_t size) {
  GEIST_SESSION_ENTER(s);
  return guarded(s, [&] { return report(s->session->restore(buf, size), s); });
}

geist_status geist_session_save_file(const geist_session *s, const char *path) {
  GEIST_SESSION_ENTER(s);
  auto *ms = const_cast<geist_session *>(s);
  return guarded(ms, [&] {
    GEIST_NULL_CHECK(path, ms);
    return report(s->session->save_file(path), ms);
  });
}

geist_status geist_session_load_file(geist_session *s, const char *path) {
  GEIST_SESSION_ENTER(s);
  return guarded(s, [&] {
    GEIST_NULL_CHECK(path, s);
    return report(s->session->load_file(path), s);
  });
}

namespace {

// Shared (readers) or exclusive (a save) use of a state for one call; ok() false if it
// conflicts with another thread's.
class StateUse {
 public:
  StateUse(const geist_state *st, bool write) : st_(const_cast<geist_state *>(st)), write_(write) {
    int cur = write_ ? 0 : st_->users.load(std::memory_order_relaxed);
    if (write_) {
      held_ = st_->users.compare_exchange_strong(cur, -1, std::memory_order_acquire);
    } else {
      while (cur >= 0 && !st_->users.compare_exchange_weak(cur, cur + 1, std::memory_order_acquire)) {
      }
      held_ = cur >= 0;
    }
  }
  ~StateUse() {
    if (!held_) return;
    if (write_) {
      st_->users.store(0, std::memory_order_release);
    } else {
      st_->users.fetch_sub(1, std::memory_order_release);
    }
  }
  StateUse(const StateUse &) = delete;
  StateUse &operator=(const StateUse &) = delete;
  bool ok() const { return held_; }

 private:
  geist_state *st_;
  bool write_;
  bool held_ = false;
};

geist_status state_busy() {
  return fail(GEIST_E_STATE, "the state is in use by another thread (a save needs it alone)");
}

}  // namespace

geist_status geist_state_create(geist_state **out) {
  return guarded(nullptr, [&] {
    GEIST_NULL_CHECK(out, nullptr);
    *out = nullptr;
    *out = new geist_state();
    return GEIST_OK;
  });
}

void geist_state_free(geist_state *st) {
  delete st;
}

geist_status geist_session_state_bytes(const geist_session *s, size_t *bytes) {
  GEIST_SESSION_ENTER(s);
  auto *ms = const_cast<geist_session *>(s);
  GEIST_NULL_CHECK(bytes, ms);
  *bytes = s->session->state_bytes();
  return GEIST_OK;
}

geist_status geist_session_save_state(const geist_session *s, geist_state *st) {
  GEIST_SESSION_ENTER(s);
  auto *ms = const_cast<geist_session *>(s);
  return guarded(ms, [&] {
    GEIST_NULL_CHECK(st, ms);
    StateUse use(st, true);
    if (!use.ok()) return state_busy();
    if (geist::Status r = s->session->save_state(&st->state); !r.is_ok()) return report(r, ms);
    st->model = s->model;
    return GEIST_OK;
  });
}

geist_status geist_session_load_state(geist_session *s, const geist_state *st) {
  GEIST_SESSION_ENTER(s);
  return guarded(s, [&] {
    GEIST_NULL_CHECK(st, s);
    StateUse use(st, false);
    if (!use.ok()) return state_busy();
    return report(s->session->load_state(st->state), s);
  });
}

size_t geist_state_bytes(const geist_state *st) {
  if (st == nullptr) return 0;
  StateUse use(st, false);
  return use.ok() ? st->state.bytes() : 0;
}

geist_status geist_state_tokens(const geist_state *st, geist_token *out, size_t cap, size_t *n_out) {
  return guarded(nullptr, [&] {
    GEIST_NULL_CHECK(st, nullptr);
    GEIST_NULL_CHECK(n_out, nullptr);
    StateUse use(st, false);
    if (!use.ok()) return state_busy();
    return copy_tokens(st->state.tokens(), "state", out, cap, n_out, nullptr);
  });
}

geist_status geist_state_snapshot_size(const geist_state *st, size_t *size) {
  return guarded(nullptr, [&] {
    GEIST_NULL_CHECK(st, nullptr);
    GEIST_NULL_CHECK(size, nullptr);
    StateUse use(st, false);
    if (!use.ok()) return state_busy();
    if (st->state.empty()) return fail(GEIST_E_STATE, "the state is empty (nothing was saved into it)");
    *size = st->state.snapshot_size();
    return GEIST_OK;
  });
}

geist_status geist_state_snapshot(const geist_state *st, void *buf, size_t cap, size_t *written) {
  return guarded(nullptr, [&] {
    GEIST_NULL_CHECK(st, nullptr);
    GEIST_NULL_CHECK(written, nullptr);
    if (buf == nullptr && cap > 0) return fail(GEIST_E_INVALID_ARGUMENT, "buf is NULL but cap > 0");
    StateUse use(st, false);
    if (!use.ok()) return state_busy();
    return report(st->state.snapshot(buf, cap, written));
  });
}

geist_status geist_snapshot_file_check(const char *path) {
  return guarded(nullptr, [&] {
    GEIST_NULL_CHECK(path, nullptr);
    return report(geist::check_snapshot_target(path));
  });
}

geist_status geist_session_stats(const geist_session *s, struct geist_session_stats *out) {
  GEIST_SESSION_ENTER(s);
  auto *ms = const_cast<geist_session *>(s);
  GEIST_NULL_CHECK(out, ms);
  const geist::SessionStats &st = s->session->stats();
  std::memset(out, 0, sizeof *out);
  out->n_prefill_tokens = st.n_prefill_tokens;
  out->prefill_seconds = st.prefill_seconds;
  out->n_decode_tokens = st.n_decode_tokens;
  out->decode_seconds = st.decode_seconds;
  out->n_pins = st.n_pins;
  out->n_pinned_tokens = st.n_pinned_tokens;
  out->pin_seconds = st.pin_seconds;
  out->n_resets = st.n_resets;
  out->reset_seconds = st.reset_seconds;
  out->n_reset_rows = st.n_reset_rows;
  out->n_snapshots = st.n_snapshots;
  out->snapshot_seconds = st.snapshot_seconds;
  out->n_restores = st.n_restores;
  out->restore_seconds = st.restore_seconds;
  out->kv_bytes_reserved = s->session->kv_bytes_reserved();
  out->checkpoint_bytes = s->session->checkpoint_bytes();
  out->last_prefill_seconds = st.last_prefill_seconds;
  out->last_decode_seconds = st.last_decode_seconds;
  out->scratch_bytes = s->session->scratch_bytes();
  return GEIST_OK;
}

}  // extern "C"

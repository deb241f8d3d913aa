// geist.hpp: a header-only C++17 RAII wrapper over the C ABI in geist.h.
//
// geist::api::Model and geist::api::Session own their handles (move-only). Fallible calls return a
// geist::api::Error (a status plus its message; contextually true on failure) or, with the
// *_or_throw helpers, throw geist::api::Exception — pick per call site. Thread safety and
// ownership are those of the C ABI: a Model may be shared by any number of threads and
// Sessions; a Session is used by one thread at a time. A Session keeps its Model's
// weights alive, so a Model may be destroyed before its Sessions.
#ifndef GEIST_GEIST_HPP
#define GEIST_GEIST_HPP

#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "geist/geist.h"

// Namespace geist::api (geist:: itself is the engine's internal namespace).
namespace geist::api {

// Result of a fallible call: OK or a status with its message.
struct Error {
  geist_status status = GEIST_OK;
  std::string message;
  explicit operator bool() const { return status != GEIST_OK; }  // true on failure
  bool ok() const { return status == GEIST_OK; }
  std::string to_string() const {
    return ok() ? std::string("OK") : std::string(geist_status_name(status)) + ": " + message;
  }
};

class Exception : public std::runtime_error {
 public:
  explicit Exception(Error e) : std::runtime_error(e.to_string()), error_(std::move(e)) {}
  const Error &error() const { return error_; }

 private:
  Error error_;
};

namespace detail {
inline Error from(geist_status s) { return s == GEIST_OK ? Error{} : Error{s, geist_last_error()}; }
inline void throw_if(const Error &e) {
  if (e) throw Exception(e);
}
}  // namespace detail

// OK if Session::save_file may write path (the rule of geist_snapshot_file_check).
inline Error snapshot_file_check(const std::string &path) {
  return detail::from(geist_snapshot_file_check(path.c_str()));
}

class Session;

// A saved session state (geist_state): kept where the session keeps its KV rows, loaded
// into any session of the same model. Empty until the first Session::save_state.
class State {
 public:
  State() = default;
  ~State() { geist_state_free(st_); }
  State(State &&o) noexcept : st_(std::exchange(o.st_, nullptr)) {}
  State &operator=(State &&o) noexcept {
    if (this != &o) {
      geist_state_free(st_);
      st_ = std::exchange(o.st_, nullptr);
    }
    return *this;
  }
  State(const State &) = delete;
  State &operator=(const State &) = delete;

  static Error create(State *out) {
    geist_state *st = nullptr;
    Error e = detail::from(geist_state_create(&st));
    if (!e) *out = State(st);
    return e;
  }
  size_t bytes() const { return geist_state_bytes(st_); }  // memory held, host and device
  std::vector<geist_token> tokens() const {
    size_t n = 0;
    geist_state_tokens(st_, nullptr, 0, &n);
    std::vector<geist_token> t(n);
    if (geist_state_tokens(st_, t.data(), t.size(), &n) != GEIST_OK) t.clear();
    return t;
  }
  // The state's snapshot image (copies its KV rows to the host).
  Error snapshot(std::vector<uint8_t> *out) const {
    size_t n = 0;
    geist_status s = geist_state_snapshot_size(st_, &n);
    if (s != GEIST_OK) return detail::from(s);
    out->resize(n);
    s = geist_state_snapshot(st_, out->data(), out->size(), &n);
    out->resize(s == GEIST_OK ? n : 0);
    return detail::from(s);
  }
  geist_state *get() const { return st_; }
  explicit operator bool() const { return st_ != nullptr; }

 private:
  explicit State(geist_state *st) : st_(st) {}
  geist_state *st_ = nullptr;
};

class Model {
 public:
  Model() = default;
  ~Model() { geist_model_free(m_); }
  Model(Model &&o) noexcept : m_(std::exchange(o.m_, nullptr)) {}
  Model &operator=(Model &&o) noexcept {
    if (this != &o) {
      geist_model_free(m_);
      m_ = std::exchange(o.m_, nullptr);
    }
    return *this;
  }
  Model(const Model &) = delete;
  Model &operator=(const Model &) = delete;

  static Error load(const std::string &path, Model *out, const geist_model_params *p = nullptr) {
    geist_model *m = nullptr;
    Error e = detail::from(geist_model_load(path.c_str(), p, &m));
    if (!e) *out = Model(m);
    return e;
  }
  static Model load_or_throw(const std::string &path, const geist_model_params *p = nullptr) {
    Model m;
    detail::throw_if(load(path, &m, p));
    return m;
  }
  // The caller keeps data alive and unchanged while the model or any session lives.
  static Error load_from_memory(const void *data, size_t size, Model *out, const geist_model_params *p = nullptr) {
    geist_model *m = nullptr;
    Error e = detail::from(geist_model_load_from_memory(data, size, p, &m));
    if (!e) *out = Model(m);
    return e;
  }

  explicit operator bool() const { return m_ != nullptr; }
  geist_model *get() const { return m_; }

  geist_model_info info() const {
    geist_model_info i{};
    geist_model_get_info(m_, &i);
    return i;
  }

  geist_backend_info backend() const {
    geist_backend_info b{};
    geist_model_get_backend(m_, &b);
    return b;
  }

  Error tokenize(std::string_view text, bool add_bos, bool parse_special, std::vector<geist_token> *out) const {
    size_t n = 0;
    geist_status s = geist_tokenize(m_, text.data(), text.size(), add_bos, parse_special, nullptr, 0, &n);
    if (s != GEIST_OK && s != GEIST_E_BUFFER_TOO_SMALL) return detail::from(s);
    const size_t base = out->size();
    out->resize(base + n);
    s = geist_tokenize(m_, text.data(), text.size(), add_bos, parse_special, out->data() + base, n, &n);
    if (s != GEIST_OK) out->resize(base);
    return detail::from(s);
  }
  std::vector<geist_token> tokenize_or_throw(std::string_view text, bool add_bos, bool parse_special) const {
    std::vector<geist_token> t;
    detail::throw_if(tokenize(text, add_bos, parse_special, &t));
    return t;
  }

  // One token's bytes (control tokens as their text). "" for a bad id.
  std::string piece(geist_token t) const {
    char small[64];
    size_t n = 0;
    geist_status s = geist_token_to_piece(m_, t, small, sizeof small, &n);
    if (s == GEIST_OK) return std::string(small, n);
    if (s != GEIST_E_BUFFER_TOO_SMALL) return std::string();
    std::string big(n, '\0');
    if (geist_token_to_piece(m_, t, big.data(), big.size(), &n) != GEIST_OK) return std::string();
    return big;
  }

  Error detokenize(const std::vector<geist_token> &t, bool render_special, std::string *out) const {
    size_t n = 0;
    geist_status s = geist_detokenize(m_, t.data(), t.size(), render_special, nullptr, 0, &n);
    if (s != GEIST_OK && s != GEIST_E_BUFFER_TOO_SMALL) return detail::from(s);
    out->assign(n, '\0');
    return detail::from(geist_detokenize(m_, t.data(), t.size(), render_special, out->data(), n, &n));
  }

  bool is_eog(geist_token t) const { return geist_token_is_eog(m_, t) != 0; }

 private:
  explicit Model(geist_model *m) : m_(m) {}
  geist_model *m_ = nullptr;
};

class Session {
 public:
  Session() = default;
  ~Session() { geist_session_free(s_); }
  Session(Session &&o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  Session &operator=(Session &&o) noexcept {
    if (this != &o) {
      geist_session_free(s_);
      s_ = std::exchange(o.s_, nullptr);
    }
    return *this;
  }
  Session(const Session &) = delete;
  Session &operator=(const Session &) = delete;

  static Error create(const Model &m, const geist_session_params *p, Session *out) {
    geist_session *s = nullptr;
    Error e = detail::from(geist_session_create(m.get(), p, &s));
    if (!e) *out = Session(s);
    return e;
  }
  static Session create_or_throw(const Model &m, const geist_session_params *p = nullptr) {
    Session s;
    detail::throw_if(create(m, p, &s));
    return s;
  }

  explicit operator bool() const { return s_ != nullptr; }
  geist_session *get() const { return s_; }

  Error prefill(const geist_token *t, size_t n) { return err(geist_session_prefill_tokens(s_, t, n)); }
  Error prefill(const std::vector<geist_token> &t) { return prefill(t.data(), t.size()); }
  // Logits after every token from `first` on: out is resized to (n - first) * n_vocab.
  Error prefill_logits(const std::vector<geist_token> &t, size_t first, std::vector<float> *out) {
    const size_t nv = geist_session_n_vocab(s_);
    if (first < t.size()) out->resize((t.size() - first) * nv);
    return err(geist_session_prefill_logits(s_, t.data(), t.size(), first, out->data(), out->size()));
  }
  Error pin_prefix(const geist_token *t, size_t n) { return err(geist_session_pin_prefix(s_, t, n)); }
  Error pin_prefix(const std::vector<geist_token> &t) { return pin_prefix(t.data(), t.size()); }
  Error unpin() { return err(geist_session_unpin(s_)); }
  Error reset() { return err(geist_session_reset(s_)); }
  Error clear() { return err(geist_session_clear(s_)); }
  Error decode_step(geist_token *out) { return err(geist_session_decode_step(s_, out)); }
  Error wait() { return err(geist_session_wait(s_)); }
  Error sample(geist_token *out) { return err(geist_session_sample(s_, out)); }
  // geist_decode_batch: one token for each session in one step; out[i] is sessions[i]'s.
  static Error decode_batch(const std::vector<Session *> &sessions, std::vector<geist_token> *out) {
    std::vector<geist_session *> ss;
    ss.reserve(sessions.size());
    for (Session *s : sessions) ss.push_back(s ? s->s_ : nullptr);
    out->resize(sessions.size());
    return detail::from(geist_decode_batch(ss.data(), ss.size(), out->data()));
  }
  // geist_step_batch: chunks[i] empty decodes sessions[i] (its token in (*out)[i]); a
  // non-empty one is prefilled. One forward step for all of them.
  static Error step_batch(const std::vector<Session *> &sessions, const std::vector<std::vector<geist_token>> &chunks,
                          std::vector<geist_token> *out) {
    std::vector<geist_session *> ss;
    std::vector<const geist_token *> ts;
    std::vector<size_t> ns;
    for (size_t i = 0; i < sessions.size(); ++i) {
      ss.push_back(sessions[i] ? sessions[i]->s_ : nullptr);
      const bool has = i < chunks.size() && !chunks[i].empty();
      ts.push_back(has ? chunks[i].data() : nullptr);
      ns.push_back(has ? chunks[i].size() : 0);
    }
    out->assign(sessions.size(), -1);
    return detail::from(geist_step_batch(ss.data(), ts.data(), ns.data(), ss.size(), out->data()));
  }
  Error set_sampling(const geist_sampling_params &p) { return err(geist_session_set_sampling(s_, &p)); }

  // nullptr when the session has no logits.
  const float *logits(size_t *n_vocab = nullptr) const { return geist_session_logits(s_, n_vocab); }
  size_t n_tokens() const { return geist_session_n_tokens(s_); }
  size_t n_pinned() const { return geist_session_n_pinned(s_); }
  size_t n_ctx() const { return geist_session_n_ctx(s_); }
  size_t n_vocab() const { return geist_session_n_vocab(s_); }
  int n_threads() const { return geist_session_n_threads(s_); }  // host threads it computes with
  std::vector<geist_token> tokens() const {
    std::vector<geist_token> t(n_tokens());
    size_t n = 0;
    geist_session_tokens(s_, t.data(), t.size(), &n);
    return t;
  }

  Error snapshot(std::vector<uint8_t> *out) const {
    size_t n = 0;
    geist_status s = geist_session_snapshot_size(s_, &n);
    if (s != GEIST_OK) return err(s);
    out->resize(n);
    s = geist_session_snapshot(s_, out->data(), out->size(), &n);
    out->resize(s == GEIST_OK ? n : 0);
    return err(s);
  }
  Error restore(const void *data, size_t size) { return err(geist_session_restore(s_, data, size)); }
  Error restore(const std::vector<uint8_t> &img) { return restore(img.data(), img.size()); }
  // Saved states (geist_session_save_state): device-side copies on a GPU.
  Error save_state(State *st) const { return err(geist_session_save_state(s_, st->get())); }
  Error load_state(const State &st) { return err(geist_session_load_state(s_, st.get())); }
  size_t state_bytes() const {
    size_t n = 0;
    return geist_session_state_bytes(s_, &n) == GEIST_OK ? n : 0;
  }
  Error save_file(const std::string &path) const { return err(geist_session_save_file(s_, path.c_str())); }
  Error load_file(const std::string &path) { return err(geist_session_load_file(s_, path.c_str())); }

  geist_session_stats_t stats() const {
    geist_session_stats_t st{};
    geist_session_stats(s_, &st);
    return st;
  }

 private:
  explicit Session(geist_session *s) : s_(s) {}
  // The thread's last error is the failed call's message in every case (a call refused
  // because another thread holds the session does not touch the session's message).
  Error err(geist_status st) const { return st == GEIST_OK ? Error{} : Error{st, geist_last_error()}; }
  geist_session *s_ = nullptr;
};

}  // namespace geist::api

#endif  // GEIST_GEIST_HPP

// What the generation commands (run, chat, perplexity) share. They run on the public API
// (geist/geist.hpp) only: model and session options, loading with CLI-style errors, and
// streaming token text to a terminal.
#pragma once

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "geist/geist.hpp"

namespace geist::cli {

// Where a model runs and how its sessions store KV rows: --backend, --device, -ctk, -ctv.
struct DeviceOptions {
  std::string backend = "cpu";
  int device = 0;
  std::string type_k = "f32", type_v = "f32";
};
void add_device_options(CLI::App *sub, DeviceOptions *o);
// The model parameters of o (backend, device) over the defaults.
geist_model_params model_params(const DeviceOptions &o);
// Set p's KV types from o.
void apply_kv_types(const DeviceOptions &o, geist_session_params *p);

// Options of a generating session: the model file, the session's geometry, sampling.
struct GenOptions {
  std::string model;
  DeviceOptions dev;
  int threads = 0;
  int64_t n_ctx = 0;
  int batch = 256;
  // -s -1: drawn from std::random_device when the first session is made, printed on
  // stderr (mutable: the draw happens once, in create_session).
  mutable geist_sampling_params sampling = geist_sampling_params_default();
  bool random_seed = false;
  mutable bool seed_drawn = false;
};

// -m, -t, -c, -b and the sampling flags (--temp, --top-k, --top-p, --min-p,
// --repeat-penalty, --repeat-last-n, -s) on sub, bound to *o.
void add_gen_options(CLI::App *sub, GenOptions *o);

// One line "geist: error: MESSAGE" on stderr; returns the exit code to use (1).
int report(const api::Error &e);

// Load a model on dev's backend (the CPU if null); on failure print one error line and
// return false. A missing default model gets a hint on how to fetch it. *load_seconds:
// wall time of the load.
bool load_api_model(const std::string &path, api::Model *out, double *load_seconds = nullptr,
                    const DeviceOptions *dev = nullptr);

// Whether the snapshot file `path` named by `flag` (--prompt-cache, --save) may be
// written: never one of `inputs` (the model, the prompt file; compared by identity) and
// only what api::snapshot_file_check allows. Prints one error line and returns false if
// not. Called before any work is done.
bool check_snapshot_target(const char *flag, const std::string &path,
                           const std::vector<std::pair<std::string, const char *>> &inputs);

// A session with o's context, threads, chunk and sampling; prints the error on failure.
bool create_session(const api::Model &m, const GenOptions &o, api::Session *out);

// Threads a session created with `requested` (0: all) runs on.
int effective_threads(int requested);

// Token ids to the text a reader sees, one token at a time: control tokens print
// nothing, a multi-byte UTF-8 character split over byte-fallback tokens is held until it
// is complete, ill-formed bytes become U+FFFD (as geist_detokenize does). Not thread-safe.
class TextStream {
 public:
  explicit TextStream(const api::Model &m) : m_(&m) {}
  // The text that token t completes (possibly empty).
  std::string push(geist_token t);
  // The held bytes of an unfinished character (as U+FFFD), and forget them.
  std::string flush();

 private:
  bool hidden(geist_token t);  // renders as nothing when special tokens are not rendered
  const api::Model *m_;
  std::vector<int8_t> hidden_;  // [n_vocab]: -1 unknown, 0 shown, 1 hidden
  std::string pending_;         // bytes of an incomplete UTF-8 sequence (at most 3)
};

// Write bytes to stdout and flush (streamed output). False once stdout failed (a full
// disk, a closed pipe): the caller stops generating; main reports the error.
inline bool emit(const std::string &s) {
  if (s.empty()) return !std::ferror(stdout);
  const bool ok = std::fwrite(s.data(), 1, s.size(), stdout) == s.size();
  return std::fflush(stdout) == 0 && ok;
}

}  // namespace geist::cli

namespace geist::cli {

// Gemma chat turns (model-spec.md 7.8), as token ids; contents are trimmed; markers are
// parsed as special tokens, the user's and system's text never is. Gemma 3 folds the
// system text into the first user turn:
//   <bos><start_of_turn>user\n{system}\n\n{user_1}<end_of_turn>\n<start_of_turn>model\n
//   {reply_1}<end_of_turn>\n<start_of_turn>user\n{user_2}<end_of_turn>\n...
// Gemma 4 (arch "gemma4") has a system turn and its own markers:
//   <bos><|turn>system\n{system}<turn|>\n<|turn>user\n{user_1}<turn|>\n<|turn>model\n
//   {reply_1}<turn|>\n<|turn>user\n...
class ChatFormat {
 public:
  // The marker tokens of m. Fails if m cannot tokenize them.
  static api::Error make(const api::Model &m, ChatFormat *out);

  // The start of a conversation up to where the first user's text goes:
  // <bos><start_of_turn>user\n[{system}\n\n] (system may be empty; Gemma 4: the system
  // turn, then <|turn>user\n).
  api::Error open(const std::string &system, std::vector<geist_token> *out) const;
  // {user}<end_of_turn>\n<start_of_turn>model\n: the rest of a user turn that open() or
  // next_user() began.
  api::Error user_text(const std::string &user, std::vector<geist_token> *out) const;
  // <start_of_turn>user\n: a later user turn's start (after a closed model turn).
  void next_user(std::vector<geist_token> *out) const;
  // What closes a model turn after the reply that ended with `last` (or did not end with
  // an end-of-generation token: last = -1): "\n" after <end_of_turn>, else
  // <end_of_turn>\n.
  const std::vector<geist_token> &close_model(geist_token last) const;
  // True if t is empty or ends with a closed model turn (a new user turn may start).
  bool at_turn_boundary(const std::vector<geist_token> &t) const;

 private:
  const api::Model *m_ = nullptr;
  geist_token bos_ = -1, eot_ = -1;
  std::vector<geist_token> user_open_;   // <start_of_turn>user\n
  std::vector<geist_token> user_close_;  // <end_of_turn>\n<start_of_turn>model\n
  std::vector<geist_token> turn_end_;    // <end_of_turn>\n
  std::vector<geist_token> after_eot_;   // \n
  std::vector<geist_token> system_open_;  // Gemma 4: <|turn>system\n
  bool gemma4_ = false;
};

// s without leading and trailing ASCII whitespace.
std::string trim(const std::string &s);

}  // namespace geist::cli

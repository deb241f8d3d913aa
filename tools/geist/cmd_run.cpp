// geist run: generate text from a prompt, streaming it as it decodes. Runs on the public
// API (geist/geist.hpp).
//
// --prompt-cache FILE keeps the session state after the prompt in FILE (a session
// snapshot). A later run reuses the longest part of it that its own prompt starts with:
// all of it (no prefill at all: the logits are in the snapshot), the cached tokens
// followed by more prompt, or the cache's pinned prefix followed by more prompt. The
// output is the same as without the cache (batch invariance), for any seed.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "api_common.h"
#include "commands.h"

namespace geist::cli {
namespace {

struct RunOptions {
  GenOptions g;
  std::string prompt, prompt_file, system, prompt_cache;
  int n_predict = 128;
  bool chat = false, ignore_eos = false;
};

bool starts_with(const std::vector<geist_token> &a, const std::vector<geist_token> &prefix, size_t n) {
  return n <= a.size() && n <= prefix.size() && std::equal(prefix.begin(), prefix.begin() + n, a.begin());
}

// Brings s to the state after `prompt`, reusing the cache file where it matches; saves
// the state after the prompt to the file unless the file already held exactly it.
// Returns false after printing an error.
bool eval_with_cache(api::Session &s, const std::vector<geist_token> &prompt, const RunOptions &o) {
  const std::string &path = o.prompt_cache;
  size_t reused = 0;
  bool loaded = false;
  std::error_code ec;
  if (std::filesystem::exists(path, ec)) {
    if (api::Error e = s.load_file(path)) {
      std::fprintf(stderr, "geist: warning: prompt cache not used: %s\n", e.message.c_str());
    } else {
      loaded = true;
    }
  }
  if (loaded) {
    const std::vector<geist_token> cached = s.tokens();
    const size_t n_pinned = s.n_pinned();
    api::Error e;
    if (cached == prompt) {
      reused = prompt.size();
    } else if (cached.size() < prompt.size() && starts_with(prompt, cached, cached.size())) {
      reused = cached.size();
    } else if (n_pinned > 0 && n_pinned <= prompt.size() && starts_with(prompt, cached, n_pinned)) {
      e = s.reset();
      reused = n_pinned;
    } else {
      e = s.clear();
    }
    // The snapshot carries the RNG of the run that made it: reseed from this run's seed,
    // as a fresh session would be (prefill does not draw from the RNG).
    if (!e) e = s.set_sampling(o.g.sampling);
    if (!e && reused > 0 && reused < prompt.size()) e = s.prefill(prompt.data() + reused, prompt.size() - reused);
    if (e) {
      report(e);
      return false;
    }
  }
  if (reused == 0) {
    // Pinned, so that a later prompt that diverges after this one still reuses it.
    if (api::Error e = s.pin_prefix(prompt)) {
      report(e);
      return false;
    }
  }
  std::fprintf(stderr, "prompt cache: reused %zu of %zu tokens\n", reused, prompt.size());
  if (reused < prompt.size()) {
    if (api::Error e = s.save_file(path)) {
      std::fprintf(stderr, "geist: warning: prompt cache not saved: %s\n", e.message.c_str());
    }
  }
  return true;
}

int run(const RunOptions &o) {
  if (!o.prompt.empty() && !o.prompt_file.empty()) {
    std::fprintf(stderr, "geist: error: pass either -p TEXT or -f FILE, not both\n");
    return 2;
  }
  if (!o.system.empty() && !o.chat) {
    std::fprintf(stderr, "geist: error: --system needs --chat (it is the system turn of a chat prompt)\n");
    return 2;
  }
  // The cache is written after the prompt is evaluated: refuse a path geist may not write
  // before any work is done.
  if (!o.prompt_cache.empty() &&
      !check_snapshot_target("--prompt-cache", o.prompt_cache,
                             {{o.g.model, "the model file"}, {o.prompt_file, "the prompt file (-f)"}})) {
    return 1;
  }
  std::string prompt = o.prompt;
  if (!o.prompt_file.empty()) {
    if (!read_text_file(o.prompt_file, &prompt)) return 1;
    if (prompt.empty() && !o.chat) {
      std::fprintf(stderr, "geist: error: the prompt file '%s' is empty\n", o.prompt_file.c_str());
      return 2;
    }
  }
  if (prompt.empty() && !o.chat) {
    std::fprintf(stderr, "geist: error: no prompt; pass -p TEXT or -f FILE\n");
    return 2;
  }
  api::Model model;
  double load_s = 0;
  if (!load_api_model(o.g.model, &model, &load_s, &o.g.dev)) return 1;

  std::vector<geist_token> tokens;
  if (o.chat) {
    ChatFormat chat;
    api::Error e = ChatFormat::make(model, &chat);
    if (!e) e = chat.open(o.system, &tokens);
    if (!e) e = chat.user_text(prompt, &tokens);
    if (e) return report(e);
  } else if (api::Error e = model.tokenize(prompt, true, false, &tokens)) {
    return report(e);
  }
  if (tokens.empty()) {
    std::fprintf(stderr, "geist: error: the prompt tokenized to nothing\n");
    return 2;
  }

  api::Session s;
  if (!create_session(model, o.g, &s)) return 1;
  if (tokens.size() > s.n_ctx()) {
    std::fprintf(stderr, "geist: error: the prompt has %zu tokens but the context holds %zu (raise -c)\n",
                 tokens.size(), s.n_ctx());
    return 1;
  }
  if (!o.prompt_cache.empty()) {
    if (!eval_with_cache(s, tokens, o)) return 1;
  } else if (api::Error e = s.prefill(tokens)) {
    return report(e);
  }

  TextStream text(model);
  for (int n_gen = 0; n_gen < o.n_predict; ++n_gen) {
    geist_token next = -1;
    api::Error e = s.decode_step(&next);
    const bool full = e.status == GEIST_E_CONTEXT_FULL;
    // No room to append: the logits still give one last token (sampled, not appended).
    if (full) e = s.sample(&next);
    if (e) return report(e);
    if (!o.ignore_eos && model.is_eog(next)) break;
    if (!emit(text.push(next))) return 1;  // main reports the write error
    if (full) {
      std::fprintf(stderr, "\ngeist: context of %zu tokens is full; stopping\n", s.n_ctx());
      break;
    }
  }
  emit(text.flush());
  emit("\n");
  if (api::Error e = s.wait()) return report(e);  // the last step may still be queued (its time counts)

  const geist_session_stats_t st = s.stats();
  const geist_backend_info b = model.backend();
  const uint64_t n_prefill = st.n_prefill_tokens + st.n_pinned_tokens;
  const double prefill_s = st.prefill_seconds + st.pin_seconds;
  std::fprintf(stderr,
               "\nload %.0f ms | prefill %llu tokens in %.0f ms (%.1f tokens/s) | decode %llu tokens in %.0f ms "
               "(%.1f tokens/s) | %d host thread%s | %s\n",
               load_s * 1e3, (unsigned long long)n_prefill, prefill_s * 1e3,
               prefill_s > 0 ? double(n_prefill) / prefill_s : 0.0, (unsigned long long)st.n_decode_tokens,
               st.decode_seconds * 1e3, st.decode_seconds > 0 ? double(st.n_decode_tokens) / st.decode_seconds : 0.0,
               s.n_threads(), s.n_threads() == 1 ? "" : "s", b.device);
  // What the run holds: on a GPU all of it is device memory (the captured graphs' own is the
  // driver's); on the CPU the weights not repacked are read from the mapped file, and the KV
  // cache is reserved address space.
  const bool on_device = std::strcmp(b.backend, "cpu") != 0;
  const double mib = 1048576.0;
  const double w = double(b.packed_bytes) / mib, kv = double(st.kv_bytes_reserved) / mib,
               sc = double(st.scratch_bytes) / mib;
  if (on_device) {
    std::fprintf(stderr, "device memory: weights %.1f MiB + KV %.1f MiB + scratch %.1f MiB = %.1f MiB\n", w, kv, sc,
                 w + kv + sc);
  } else {
    std::fprintf(stderr, "memory: weights %.1f MiB repacked (the rest mapped from the file), KV %.1f MiB reserved, "
                 "scratch %.1f MiB\n", w, kv, sc);
  }
  return 0;
}

}  // namespace

Runner add_run(CLI::App &app) {
  auto o = std::make_shared<RunOptions>();
  CLI::App *sub = app.add_subcommand("run", "Generate text from a prompt, streaming it as it decodes");
  sub->add_option("-p,--prompt", o->prompt, "Prompt text");
  sub->add_option("-f,--file", o->prompt_file, "Read the prompt from a file (at most 256 MiB; a pipe or - works too)");
  sub->add_option("-n,--n-predict", o->n_predict, "Tokens to generate")
      ->capture_default_str()
      ->check(int_range(0, 1 << 30));
  add_gen_options(sub, &o->g);
  sub->add_flag("--chat", o->chat, "Wrap the prompt in the model's chat turns");
  sub->add_option("--system", o->system, "System text for --chat");
  sub->add_flag("--ignore-eos", o->ignore_eos, "Keep generating past end-of-generation tokens");
  sub->add_option("--prompt-cache", o->prompt_cache,
                  "Session snapshot file: reuse the prompt's state saved there by an earlier run, and save it");
  return [o] { return run(*o); };
}

}  // namespace geist::cli

// geist chat: a conversation in the model's chat turns on one session (public API).
//
// User turns come from stdin, one line each; each reply streams to stdout followed by a
// newline. The session holds the whole conversation, so a turn costs only its own tokens.
// --system TEXT folds into the first user turn and is pinned: "/reset" goes back to it
// (or to an empty conversation without --system). --save FILE writes the session after
// every turn (atomically); --load FILE continues a saved conversation, RNG included, so a
// conversation split over processes gives the replies of one process.
// A turn that does not fit in the context is not applied: the session stays as before it.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "api_common.h"
#include "commands.h"

namespace geist::cli {
namespace {

struct ChatOptions {
  GenOptions g;
  std::string system, save, load;
  int n_predict = 512;
};

// kOutputFailed: stdout failed mid-reply; the chat stops and main reports the error.
enum class Turn { kApplied, kNotApplied, kFailed, kOutputFailed };

// One user turn and the model's reply (streamed). kNotApplied if the context cannot hold
// it (message printed, session as before); kFailed after printing an error.
Turn chat_turn(api::Session &s, const api::Model &model, const ChatFormat &fmt, const std::string &user,
               const ChatOptions &o, std::vector<uint8_t> *backup) {
  const std::vector<geist_token> history = s.tokens();
  std::vector<geist_token> add;
  api::Error e;
  if (history.empty()) {
    e = fmt.open("", &add);  // a system text is pinned at start, never empty here
  } else if (fmt.at_turn_boundary(history)) {
    fmt.next_user(&add);
  }  // else: inside the first user turn, after the pinned system text
  if (!e) e = fmt.user_text(user, &add);
  if (e) {
    report(e);
    return Turn::kFailed;
  }
  // Keep the state before the turn if the reply could run out of context (the session
  // cannot be truncated; the snapshot is how the turn is undone).
  const size_t worst = history.size() + add.size() + size_t(o.n_predict) + fmt.close_model(-1).size();
  const bool may_fill = worst > s.n_ctx();
  if (may_fill) {
    if (api::Error se = s.snapshot(backup)) {
      report(se);
      return Turn::kFailed;
    }
  }
  if (api::Error pe = s.prefill(add)) {
    if (pe.status != GEIST_E_CONTEXT_FULL) {
      report(pe);
      return Turn::kFailed;
    }
    std::fprintf(stderr,
                 "geist: context full: the conversation has %zu tokens and this turn %zu more, the context holds "
                 "%zu; the turn was not applied (/reset, or a larger -c)\n",
                 history.size(), add.size(), s.n_ctx());
    return Turn::kNotApplied;
  }

  TextStream text(model);
  geist_token last = -1;
  bool full = false;
  for (int k = 0; k < o.n_predict; ++k) {
    geist_token t = -1;
    if (api::Error de = s.decode_step(&t)) {
      if (de.status != GEIST_E_CONTEXT_FULL) {
        report(de);
        return Turn::kFailed;
      }
      full = true;
      break;
    }
    if (model.is_eog(t)) {
      last = t;  // appended: <end_of_turn> is part of the history
      break;
    }
    if (!emit(text.push(t))) return Turn::kOutputFailed;
  }
  if (!emit(text.flush()) || !emit("\n")) return Turn::kOutputFailed;
  if (!full) {
    if (api::Error ce = s.prefill(fmt.close_model(last))) {
      if (ce.status != GEIST_E_CONTEXT_FULL) {
        report(ce);
        return Turn::kFailed;
      }
      full = true;
    }
  }
  if (full) {
    if (api::Error re = s.restore(*backup)) {  // may_fill held: the bound above was exceeded
      report(re);
      return Turn::kFailed;
    }
    std::fprintf(stderr,
                 "geist: context full: the context of %zu tokens filled up during the reply; the turn was not "
                 "applied (/reset, or a larger -c)\n",
                 s.n_ctx());
    return Turn::kNotApplied;
  }
  return Turn::kApplied;
}

int chat(const ChatOptions &o) {
  // --save is written after every turn: refuse a path geist may not write now, before the
  // model loads and the first reply streams.
  if (!o.save.empty() && !check_snapshot_target("--save", o.save, {{o.g.model, "the model file"}})) return 1;
  api::Model model;
  if (!load_api_model(o.g.model, &model, nullptr, &o.g.dev)) return 1;
  ChatFormat fmt;
  if (api::Error e = ChatFormat::make(model, &fmt)) return report(e);
  api::Session s;
  if (!create_session(model, o.g, &s)) return 1;
  if (!o.load.empty()) {
    // The file's sampler state (RNG, history) replaces the fresh one; the sampling
    // params stay those of this command line.
    if (api::Error e = s.load_file(o.load)) return report(e);
    if (s.n_tokens() > 0 && !trim(o.system).empty()) {
      std::fprintf(stderr, "geist: note: --system ignored: '%s' holds a conversation\n", o.load.c_str());
    }
  }
  if (s.n_tokens() == 0 && !trim(o.system).empty()) {
    std::vector<geist_token> start;
    if (api::Error e = fmt.open(o.system, &start)) return report(e);
    if (api::Error e = s.pin_prefix(start)) return report(e);
  }

  const bool tty = isatty(STDIN_FILENO) == 1;
  std::vector<uint8_t> backup;
  std::string line;
  int turns = 0;
  for (;;) {
    if (tty) {
      std::fputs("> ", stderr);
      std::fflush(stderr);
    }
    if (!std::getline(std::cin, line)) break;
    const std::string user = trim(line);
    if (user.empty()) continue;
    if (user == "/reset") {
      if (api::Error e = s.reset()) return report(e);
      if (tty) std::fputs("(conversation reset)\n", stderr);
    } else {
      const Turn r = chat_turn(s, model, fmt, user, o, &backup);
      if (r == Turn::kFailed || r == Turn::kOutputFailed) return 1;
      if (r == Turn::kNotApplied) continue;
      ++turns;
    }
    if (!o.save.empty()) {
      if (api::Error e = s.save_file(o.save)) return report(e);
    }
  }
  if (tty) std::fputc('\n', stderr);
  const geist_session_stats_t st = s.stats();
  std::fprintf(stderr,
               "chat: %d turn%s | context %zu of %zu tokens | prefill %llu tokens in %.0f ms | decode %llu tokens in "
               "%.0f ms (%.1f tokens/s) | %d threads\n",
               turns, turns == 1 ? "" : "s", s.n_tokens(), s.n_ctx(),
               (unsigned long long)(st.n_prefill_tokens + st.n_pinned_tokens),
               (st.prefill_seconds + st.pin_seconds) * 1e3, (unsigned long long)st.n_decode_tokens,
               st.decode_seconds * 1e3, st.decode_seconds > 0 ? double(st.n_decode_tokens) / st.decode_seconds : 0.0,
               effective_threads(o.g.threads));
  return 0;
}

}  // namespace

Runner add_chat(CLI::App &app) {
  auto o = std::make_shared<ChatOptions>();
  CLI::App *sub = app.add_subcommand("chat", "Chat with the model: user turns from stdin, one per line");
  sub->add_option("-n,--n-predict", o->n_predict, "Most tokens per reply")
      ->capture_default_str()
      ->check(int_range(0, 1 << 30));
  add_gen_options(sub, &o->g);
  sub->add_option("--system", o->system, "System text (folded into the first user turn and pinned)");
  sub->add_option("--save", o->save, "Save the session to this file after every turn");
  sub->add_option("--load", o->load, "Continue the conversation saved in this file");
  sub->footer("A line '/reset' goes back to the start (the system text, if any). EOF ends the chat.");
  return [o] { return chat(*o); };
}

}  // namespace geist::cli

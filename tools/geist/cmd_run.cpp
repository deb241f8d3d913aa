// geist run: generate text from a prompt, streaming it as it decodes.
#include <cstdio>
#include <string>
#include <vector>

#include "base/timer.h"
#include "commands.h"
#include "engine/sampler.h"
#include "engine/session.h"

namespace geist::cli {
namespace {

struct RunOptions {
  std::string model, prompt, prompt_file, system;
  int n_predict = 128;
  int threads = 0;
  int64_t n_ctx = 0;
  int batch = 256;
  bool chat = false, ignore_eos = false;
  SamplerParams sp;
};

// Gemma 3 chat turns (model-spec.md 7.8): system text folds into the first user turn.
// Markers are parsed as special tokens; the user's text never is.
Status chat_tokens(const Tokenizer &tok, const std::string &system, const std::string &user,
                   std::vector<int32_t> *out) {
  out->push_back(tok.bos());
  GEIST_RETURN_IF_ERROR(tok.encode("<start_of_turn>user\n", false, true, out));
  if (!system.empty()) GEIST_RETURN_IF_ERROR(tok.encode(system + "\n\n", false, false, out));
  GEIST_RETURN_IF_ERROR(tok.encode(user, false, false, out));
  return tok.encode("<end_of_turn>\n<start_of_turn>model\n", false, true, out);
}

int run(const RunOptions &o) {
  std::string prompt = o.prompt;
  if (!o.prompt_file.empty() && !read_text_file(o.prompt_file, &prompt)) return 1;
  if (prompt.empty() && !o.chat) {
    std::fprintf(stderr, "geist: error: no prompt; pass -p TEXT or -f FILE\n");
    return 2;
  }
  std::unique_ptr<Model> model = load_model_or_report(o.model);
  if (!model) return 1;
  const Tokenizer &tok = model->tokenizer();

  std::vector<int32_t> tokens;
  Status st = o.chat ? chat_tokens(tok, o.system, prompt, &tokens) : tok.encode(prompt, true, false, &tokens);
  if (!st) return report(st);
  if (tokens.empty()) {
    std::fprintf(stderr, "geist: error: the prompt tokenized to nothing\n");
    return 2;
  }

  SessionParams sp;
  sp.n_ctx = o.n_ctx;
  sp.n_threads = o.threads;
  sp.chunk = o.batch;
  Result<std::unique_ptr<Session>> sr = Session::create(*model, sp);
  if (!sr) return report(sr.status());
  Session &s = **sr;
  if (tokens.size() > static_cast<size_t>(s.n_ctx())) {
    std::fprintf(stderr, "geist: error: the prompt has %zu tokens but the context holds %lld (raise -c)\n",
                 tokens.size(), (long long)s.n_ctx());
    return 1;
  }

  Timer tp;
  if (Status e = s.prefill(tokens.data(), tokens.size()); !e) return report(e);
  const double prefill_s = tp.seconds();

  Sampler sampler(o.sp);
  for (int32_t t : tokens) sampler.accept(t);
  StreamDecoder dec(tok);
  Timer td;
  int n_gen = 0;
  for (; n_gen < o.n_predict; ++n_gen) {
    const int32_t next = sampler.sample(s.logits(), s.n_vocab());
    if (!o.ignore_eos && tok.is_eog(next)) break;
    std::string piece = dec.push(next);
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    if (s.n_tokens() + 1 > static_cast<size_t>(s.n_ctx())) {
      std::fprintf(stderr, "\ngeist: context of %lld tokens is full; stopping\n", (long long)s.n_ctx());
      ++n_gen;
      break;
    }
    if (Status e = s.prefill(&next, 1); !e) return report(e);
  }
  std::string rest = dec.flush();
  std::fwrite(rest.data(), 1, rest.size(), stdout);
  std::fputc('\n', stdout);
  const double decode_s = td.seconds();
  std::fprintf(stderr,
               "\nload %.0f ms | prefill %zu tokens in %.0f ms (%.1f tokens/s) | decode %d tokens in %.0f ms "
               "(%.1f tokens/s) | %d threads\n",
               model->load_seconds() * 1e3, tokens.size(), prefill_s * 1e3, tokens.size() / prefill_s, n_gen,
               decode_s * 1e3, n_gen > 0 ? n_gen / decode_s : 0.0, s.n_threads());
  return 0;
}

}  // namespace

Runner add_run(CLI::App &app) {
  auto o = std::make_shared<RunOptions>();
  CLI::App *sub = app.add_subcommand("run", "Generate text from a prompt, streaming it as it decodes");
  add_model_option(sub, &o->model);
  sub->add_option("-p,--prompt", o->prompt, "Prompt text");
  sub->add_option("-f,--file", o->prompt_file, "Read the prompt from a file");
  sub->add_option("-n,--n-predict", o->n_predict, "Tokens to generate")->capture_default_str()->check(CLI::Range(0, 1 << 30));
  sub->add_option("-t,--threads", o->threads, "Threads (0: all)")->capture_default_str()->check(CLI::Range(0, 512));
  sub->add_option("-c,--ctx-size", o->n_ctx, "Context size in tokens (0: the model's)")->capture_default_str()->check(CLI::Range(int64_t(0), int64_t(1) << 24));
  sub->add_option("-b,--batch-size", o->batch, "Prefill chunk size")->capture_default_str()->check(CLI::Range(1, 65536));
  sub->add_option("--temp", o->sp.temperature, "Temperature (0: greedy)")->capture_default_str()->check(CLI::Range(0.0f, 100.0f));
  sub->add_option("--top-k", o->sp.top_k, "Top-k (0: off)")->capture_default_str();
  sub->add_option("--top-p", o->sp.top_p, "Top-p (1: off)")->capture_default_str()->check(CLI::Range(0.0f, 1.0f));
  sub->add_option("--min-p", o->sp.min_p, "Min-p (0: off)")->capture_default_str()->check(CLI::Range(0.0f, 1.0f));
  sub->add_option("--repeat-penalty", o->sp.repeat_penalty, "Repetition penalty (1: off)")->capture_default_str()->check(CLI::PositiveNumber);
  sub->add_option("--repeat-last-n", o->sp.repeat_last_n, "Tokens the penalty looks back (0: off, -1: all)")->capture_default_str();
  sub->add_option("-s,--seed", o->sp.seed, "Sampling seed")->capture_default_str();
  sub->add_flag("--chat", o->chat, "Wrap the prompt in the model's chat turns");
  sub->add_option("--system", o->system, "System text for --chat");
  sub->add_flag("--ignore-eos", o->ignore_eos, "Keep generating past end-of-generation tokens");
  return [o] { return run(*o); };
}

}  // namespace geist::cli

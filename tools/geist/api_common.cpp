#include "api_common.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <fstream>
#include <random>

#include "base/file_util.h"
#include "commands.h"

#include "base/thread_pool.h"
#include "engine/model_paths.h"

namespace geist::cli {
namespace {

const char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

enum class Utf8 { Valid, Incomplete, Invalid };

// The UTF-8 sequence at p[0..n) (n >= 1): Valid with *len its length; Incomplete if the n
// bytes are a proper prefix of a valid sequence; Invalid with *len the length of the
// maximal ill-formed subpart (Unicode's "substitution of maximal subparts", as the
// tokenizer's detokenizer does).
Utf8 utf8_step(const uint8_t *p, size_t n, size_t *len) {
  const uint8_t b = p[0];
  *len = 1;
  if (b < 0x80) return Utf8::Valid;
  size_t need = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte (Unicode table 3-7)
  if (b >= 0xC2 && b <= 0xDF) {
    need = 2;
  } else if (b >= 0xE0 && b <= 0xEF) {
    need = 3;
    if (b == 0xE0) lo = 0xA0;  // overlong
    if (b == 0xED) hi = 0x9F;  // surrogates
  } else if (b >= 0xF0 && b <= 0xF4) {
    need = 4;
    if (b == 0xF0) lo = 0x90;  // overlong
    if (b == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    return Utf8::Invalid;
  }
  for (size_t k = 1; k < need; ++k) {
    if (k >= n) {
      *len = n;
      return Utf8::Incomplete;
    }
    if (p[k] < lo || p[k] > hi) {
      *len = k;
      return Utf8::Invalid;
    }
    lo = 0x80;
    hi = 0xBF;
  }
  *len = need;
  return Utf8::Valid;
}

}  // namespace

void add_device_options(CLI::App *sub, DeviceOptions *o) {
  sub->add_option("--backend", o->backend, "Where the model runs: cpu, or cuda (a build with -DGEIST_CUDA=ON)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "cuda"}));
  sub->add_option("--device", o->device, "GPU ordinal for --backend cuda")
      ->capture_default_str()
      ->check(int_range(0, 1023));
  const auto kv_types = CLI::IsMember({"f32", "f16", "bf16", "q8_0"});
  sub->add_option("--cache-type-k", o->type_k, "KV cache type of K rows: f32, f16, bf16, q8_0 (also -ctk)")
      ->capture_default_str()
      ->check(kv_types);
  sub->add_option("--cache-type-v", o->type_v, "KV cache type of V rows: f32, f16, bf16, q8_0 (also -ctv)")
      ->capture_default_str()
      ->check(kv_types);
}

geist_model_params model_params(const DeviceOptions &o) {
  geist_model_params p = geist_model_params_default();
  p.backend = o.backend == "cuda" ? GEIST_BACKEND_CUDA : GEIST_BACKEND_CPU;
  p.device = o.device;
  return p;
}

void apply_kv_types(const DeviceOptions &o, geist_session_params *p) {
  auto code = [](const std::string &t) {
    return t == "f16" ? GEIST_KV_F16 : t == "bf16" ? GEIST_KV_BF16 : t == "q8_0" ? GEIST_KV_Q8_0 : GEIST_KV_F32;
  };
  p->type_k = code(o.type_k);
  p->type_v = code(o.type_v);
}

void add_gen_options(CLI::App *sub, GenOptions *o) {
  o->model = default_model_file();
  sub->add_option("-m,--model", o->model, "GGUF model file (default: the fetched default model)")
      ->capture_default_str();
  add_device_options(sub, &o->dev);
  sub->add_option("-t,--threads", o->threads, "Threads (0: all)")->capture_default_str()->check(int_range(0, 512));
  sub->add_option("-c,--ctx-size", o->n_ctx, "Context size in tokens (0: the model's)")
      ->capture_default_str()
      ->check(int_range(int64_t(0), int64_t(1) << 24));
  sub->add_option("-b,--batch-size", o->batch, "Prefill chunk size")
      ->capture_default_str()
      ->check(int_range(1, 65536));
  geist_sampling_params &sp = o->sampling;
  sub->add_option("--temp", sp.temperature, "Temperature (0: greedy)")
      ->capture_default_str()
      ->check(real_range(0.0, 100.0));
  sub->add_option("--top-k", sp.top_k, "Top-k (0: off)")->capture_default_str();
  sub->add_option("--top-p", sp.top_p, "Top-p (1: off)")->capture_default_str()->check(real_range(0.0, 1.0));
  sub->add_option("--min-p", sp.min_p, "Min-p (0: off)")->capture_default_str()->check(real_range(0.0, 1.0));
  sub->add_option("--repeat-penalty", sp.repeat_penalty, "Repetition penalty (1: off)")
      ->capture_default_str()
      ->check(real_above(0.0))
      ->check(real_range(0.0, 1e4));
  sub->add_option("--repeat-last-n", sp.repeat_last_n, "Tokens the penalty looks back (0: off, -1: all)")
      ->capture_default_str();
  // A uint64; -1 asks for a random one (llama.cpp's meaning), printed so the run can be
  // repeated. Anything else (2^64, -2, "abc") is an error, not a silent alias.
  sub->add_option_function<std::string>(
         "-s,--seed",
         [o](const std::string &v) {
           if (v == "-1") {
             o->random_seed = true;
             return;
           }
           o->random_seed = false;
           std::from_chars(v.data(), v.data() + v.size(), o->sampling.seed);
         },
         "Sampling seed: 0 to 2^64-1, or -1 for a random one (default " + std::to_string(sp.seed) + ")")
      ->check(CLI::Validator(
          [](std::string &v) -> std::string {
            if (v == "-1") return std::string();
            uint64_t x;
            const auto r = std::from_chars(v.data(), v.data() + v.size(), x);
            if (r.ec == std::errc::result_out_of_range) return "'" + v + "' is outside [0, 2^64-1] (or -1: random)";
            if (v.empty() || r.ec != std::errc() || r.ptr != v.data() + v.size()) {
              return "'" + v + "' is not a seed (0 to 2^64-1, or -1: random)";
            }
            return std::string();
          },
          "UINT64|-1"));
}

int report(const api::Error &e) {
  std::fprintf(stderr, "geist: error: %s\n", e.message.c_str());
  return 1;
}

bool load_api_model(const std::string &path, api::Model *out, double *load_seconds, const DeviceOptions *dev) {
  if (path == default_model_file() && !std::ifstream(path).good()) {
    std::fprintf(stderr,
                 "geist: error: default model not found at %s; run 'python3 scripts/fetch_model.py' or pass -m\n",
                 path.c_str());
    return false;
  }
  note_model_path(path);
  const auto t0 = std::chrono::steady_clock::now();
  const geist_model_params mp = model_params(dev ? *dev : DeviceOptions{});
  if (api::Error e = api::Model::load(path, out, &mp)) {
    report(e);
    return false;
  }
  if (load_seconds) *load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return true;
}

bool check_snapshot_target(const char *flag, const std::string &path,
                           const std::vector<std::pair<std::string, const char *>> &inputs) {
  for (const auto &[file, what] : inputs) {
    if (!file.empty() && same_file(path, file)) {
      std::fprintf(stderr, "geist: error: %s '%s' is %s; refusing to write it\n", flag, path.c_str(), what);
      return false;
    }
  }
  if (api::Error e = api::snapshot_file_check(path)) {
    std::fprintf(stderr, "geist: error: %s: %s\n", flag, e.message.c_str());
    return false;
  }
  return true;
}

bool create_session(const api::Model &m, const GenOptions &o, api::Session *out) {
  geist_session_params p = geist_session_params_default();
  if (o.random_seed && !o.seed_drawn) {
    std::random_device rd;
    o.sampling.seed = (uint64_t(rd()) << 32) ^ rd();
    o.seed_drawn = true;
    std::fprintf(stderr, "seed: %llu (random; pass -s %llu to repeat)\n", (unsigned long long)o.sampling.seed,
                 (unsigned long long)o.sampling.seed);
  }
  p.n_ctx = o.n_ctx;
  p.n_threads = o.threads;
  p.chunk = o.batch;
  apply_kv_types(o.dev, &p);
  p.sampling = o.sampling;
  if (api::Error e = api::Session::create(m, &p, out)) {
    report(e);
    return false;
  }
  return true;
}

// The API does not report a session's thread count; this is the engine's rule for 0.
int effective_threads(int requested) {
  return requested > 0 ? requested : ThreadPool::hardware_threads();
}

bool TextStream::hidden(geist_token t) {
  if (hidden_.empty()) hidden_.assign(size_t(m_->info().n_vocab), -1);
  if (t < 0 || size_t(t) >= hidden_.size()) return true;
  int8_t &h = hidden_[size_t(t)];
  if (h < 0) {
    // token_to_piece renders control tokens as their text; detokenize without
    // render_special drops exactly the tokens a reader should not see.
    std::string text;
    h = (m_->detokenize({t}, false, &text) || text.empty()) ? 1 : 0;
  }
  return h == 1;
}

std::string TextStream::push(geist_token t) {
  if (hidden(t)) return std::string();
  pending_ += m_->piece(t);
  std::string out;
  const auto *p = reinterpret_cast<const uint8_t *>(pending_.data());
  size_t i = 0;
  while (i < pending_.size()) {
    size_t len = 1;
    const Utf8 st = utf8_step(p + i, pending_.size() - i, &len);
    if (st == Utf8::Incomplete) break;
    if (st == Utf8::Valid) {
      out.append(pending_, i, len);
    } else {
      out.append(kReplacement);
    }
    i += len;
  }
  pending_.erase(0, i);
  return out;
}

std::string TextStream::flush() {
  std::string out = pending_.empty() ? std::string() : std::string(kReplacement);
  pending_.clear();
  return out;
}

}  // namespace geist::cli

namespace geist::cli {

std::string trim(const std::string &s) {
  const char *ws = " \t\r\n\v\f";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return std::string();
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

api::Error ChatFormat::make(const api::Model &m, ChatFormat *out) {
  ChatFormat f;
  f.m_ = &m;
  const geist_model_info info = m.info();
  f.bos_ = info.bos;
  f.gemma4_ = info.arch && std::string(info.arch) == "gemma4";
  const char *open = f.gemma4_ ? "<|turn>user\n" : "<start_of_turn>user\n";
  const char *close = f.gemma4_ ? "<turn|>\n<|turn>model\n" : "<end_of_turn>\n<start_of_turn>model\n";
  const char *end = f.gemma4_ ? "<turn|>\n" : "<end_of_turn>\n";
  if (api::Error e = m.tokenize(open, false, true, &f.user_open_)) return e;
  if (api::Error e = m.tokenize(close, false, true, &f.user_close_)) return e;
  if (api::Error e = m.tokenize(end, false, true, &f.turn_end_)) return e;
  if (f.gemma4_) {
    if (api::Error e = m.tokenize("<|turn>system\n", false, true, &f.system_open_)) return e;
  }
  // <end_of_turn> is one control token in Gemma vocabularies; if this one lacks it, the
  // reply is closed with the whole marker text.
  if (f.turn_end_.size() >= 2 && m.is_eog(f.turn_end_[0])) {
    f.eot_ = f.turn_end_[0];
    f.after_eot_.assign(f.turn_end_.begin() + 1, f.turn_end_.end());
  }
  *out = std::move(f);
  return {};
}

api::Error ChatFormat::open(const std::string &system, std::vector<geist_token> *out) const {
  if (bos_ >= 0) out->push_back(bos_);
  const std::string sys = trim(system);
  if (gemma4_) {  // a system turn of its own
    if (!sys.empty()) {
      out->insert(out->end(), system_open_.begin(), system_open_.end());
      if (api::Error e = m_->tokenize(sys, false, false, out)) return e;
      out->insert(out->end(), turn_end_.begin(), turn_end_.end());
    }
    out->insert(out->end(), user_open_.begin(), user_open_.end());
    return {};
  }
  out->insert(out->end(), user_open_.begin(), user_open_.end());
  return sys.empty() ? api::Error{} : m_->tokenize(sys + "\n\n", false, false, out);
}

api::Error ChatFormat::user_text(const std::string &user, std::vector<geist_token> *out) const {
  if (api::Error e = m_->tokenize(trim(user), false, false, out)) return e;
  out->insert(out->end(), user_close_.begin(), user_close_.end());
  return {};
}

void ChatFormat::next_user(std::vector<geist_token> *out) const {
  out->insert(out->end(), user_open_.begin(), user_open_.end());
}

const std::vector<geist_token> &ChatFormat::close_model(geist_token last) const {
  return last >= 0 && last == eot_ ? after_eot_ : turn_end_;
}

bool ChatFormat::at_turn_boundary(const std::vector<geist_token> &t) const {
  return t.empty() ||
         (t.size() >= turn_end_.size() && std::equal(turn_end_.begin(), turn_end_.end(), t.end() - turn_end_.size()));
}

}  // namespace geist::cli

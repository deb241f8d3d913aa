// The HTTP side of `geist serve` (cpp-httplib): routes, authentication, limits, OpenAI
// response shapes, SSE streaming, /metrics, and the startup and shutdown sequence.
#if __has_include(<malloc.h>)
#include <malloc.h>  // mallopt (glibc)
#endif
#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdlib>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>

#include <httplib.h>

#include <nlohmann/json.hpp>

#include "chat_page.h"
#include "disk_cache.h"
#include "engine.h"
#include "serve_options.h"

namespace geist::serve {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// JSON text; token pieces may hold partial UTF-8 sequences, which become U+FFFD.
std::string dump(const json &j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

void send_json(httplib::Response &res, int status, const json &j) {
  res.status = status;
  res.set_content(dump(j), "application/json");
}

void send_error(httplib::Response &res, const ApiError &e) {
  if (e.http_status == 503) res.set_header("Retry-After", "1");
  send_json(res, e.http_status, e.to_json());
}

ApiError server_error(int status, std::string code, std::string message) {
  ApiError e;
  e.http_status = status;
  e.type = status == 401   ? "invalid_request_error"
           : status >= 500 ? "server_error"
                           : "invalid_request_error";
  e.code = std::move(code);
  e.message = std::move(message);
  return e;
}

std::string random_id(const char *prefix) {
  static std::mutex mu;
  static std::mt19937_64 rng{(uint64_t(std::random_device{}()) << 32) ^ std::random_device{}()};
  std::lock_guard<std::mutex> lk(mu);
  char b[40];
  std::snprintf(b, sizeof b, "%s%016llx%08llx", prefix, (unsigned long long)rng(),
                (unsigned long long)(rng() & 0xffffffffu));
  return b;
}

// Compares without an early exit, so the time taken does not tell how much matched.
bool same_secret(const std::string &a, const std::string &b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i)
    diff |= uint8_t(a[i]) ^ uint8_t(b.empty() ? 0 : b[i % b.size()]);
  return diff == 0;
}

// The socket of the connection `req` came on, or -1. httplib 0.11 gives a handler no
// access to its connection (Request carries only the addresses, and DataSink::is_writable
// polls for writability, which a socket whose peer has closed still has), so this looks
// for the open socket with the request's local and remote address and port: a TCP
// connection's four are unique among the process's sockets, and the handler's thread owns
// that socket until it returns. Linux (/proc/self/fd); a few hundred syscalls, so it is
// called once per request, and only for one that is still running after a while.
int connection_socket(const httplib::Request &req) {
  DIR *dir = opendir("/proc/self/fd");
  if (!dir) return -1;
  auto name_of = [](const sockaddr_storage &a, socklen_t len, std::string *host, int *port) {
    char h[NI_MAXHOST], p[NI_MAXSERV];
    if (getnameinfo(reinterpret_cast<const sockaddr *>(&a), len, h, sizeof h, p, sizeof p,
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
      return false;
    }
    *host = h;
    *port = std::atoi(p);
    return true;
  };
  int found = -1;
  const int own = dirfd(dir);
  while (const dirent *e = readdir(dir)) {
    char *end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == own) continue;
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    std::string host;
    int port = -1;
    if (getpeername(int(fd), reinterpret_cast<sockaddr *>(&a), &len) != 0 ||
        !name_of(a, len, &host, &port) || port != req.remote_port || host != req.remote_addr) {
      continue;
    }
    len = sizeof a;
    if (getsockname(int(fd), reinterpret_cast<sockaddr *>(&a), &len) != 0 ||
        !name_of(a, len, &host, &port) || port != req.local_port || host != req.local_addr) {
      continue;
    }
    found = int(fd);
    break;
  }
  closedir(dir);
  return found;
}

// Whether the client of connected socket `fd` has closed its side: the socket reads as
// end-of-file (or has failed) without consuming anything a pipelined request sent. A
// client that only shuts down its sending side (shutdown(SHUT_WR)) while it waits for the
// answer looks the same; HTTP clients do not do that.
bool peer_closed(int fd) {
  pollfd p{fd, short(POLLIN | POLLRDHUP), 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLHUP | POLLERR | POLLNVAL)) return true;
  if (!(p.revents & (POLLIN | POLLRDHUP))) return false;
  char c;
  const ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

json bytes_of(const std::string &s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(int(c));
  return b;
}

class Server {
 public:
  explicit Server(const ServeOptions &o) : o_(o) {}
  int run();

 private:
  void routes();
  bool authorized(const httplib::Request &req, httplib::Response &res);
  void handle_generate(Endpoint ep, const httplib::Request &req, httplib::Response &res);
  bool build_chat_prompt(const GenRequest &r, Job *job, ApiError *err) const;
  bool build_prompt(const GenRequest &r, Job *job, ApiError *err) const;
  api::Error tokenize_prompt(const std::string &text, std::vector<geist_token> *out) const;
  json usage_json(const Job::Output &out) const;
  json timings_json(const Job::Output &out) const;
  json logprobs_json(Endpoint ep, const std::vector<TokenLogprob> &lps, size_t from,
                     size_t to) const;
  json final_json(Endpoint ep, const std::string &id, time_t created, const Job::Output &out) const;
  json chunk_json(Endpoint ep, const std::string &id, time_t created, const json &delta_or_text,
                  const json &logprobs, const json &finish, bool with_usage) const;
  void stream(Endpoint ep, std::shared_ptr<Job> job, bool include_usage, httplib::Response &res);
  std::string metrics_text() const;
  bool load_model();

  ServeOptions o_;
  std::string api_key_;
  httplib::Server svr_;
  api::Model model_;
  cli::ChatFormat fmt_;
  std::unique_ptr<DiskCache> disk_;  // declared before the engine: destroyed after it
  std::unique_ptr<Engine> engine_;
  std::string model_id_;
  time_t created_ = std::time(nullptr);
  std::atomic<bool> ready_{false}, draining_{false};

  mutable std::mutex http_mu_;
  std::map<std::pair<std::string, int>, uint64_t> http_counts_;  // (route, status) -> count
};

bool Server::authorized(const httplib::Request &req, httplib::Response &res) {
  if (api_key_.empty() || req.path == "/health" || req.path == "/" || req.path == "/index.html")
    return true;
  const std::string h = req.get_header_value("Authorization");
  const std::string bearer = "Bearer ";
  if (h.size() > bearer.size() && h.compare(0, bearer.size(), bearer) == 0 &&
      same_secret(h.substr(bearer.size()), api_key_)) {
    return true;
  }
  send_error(res, server_error(401, "invalid_api_key",
                               h.empty() ? "no API key: send 'Authorization: Bearer KEY'"
                                         : "incorrect API key"));
  res.set_header("WWW-Authenticate", "Bearer");
  return false;
}

bool Server::build_chat_prompt(const GenRequest &r, Job *job, ApiError *err) const {
  // Leading system messages become the system text; then turns alternate user/assistant
  // (consecutive messages of one role are joined), starting and ending with the user.
  std::string system;
  size_t i = 0;
  for (; i < r.messages.size() && r.messages[i].role == "system"; ++i) {
    system += (system.empty() ? "" : "\n\n") + r.messages[i].content;
  }
  std::vector<ChatMessage> turns;
  for (; i < r.messages.size(); ++i) {
    const ChatMessage &m = r.messages[i];
    if (m.role == "system") {
      *err = ApiError::invalid(
          "a system message must come before the conversation's first user message",
          "messages[" + std::to_string(i) + "].role", "invalid_value");
      return false;
    }
    if (!turns.empty() && turns.back().role == m.role) {
      turns.back().content += "\n\n" + m.content;
    } else {
      turns.push_back(m);
    }
  }
  if (turns.empty() || turns.front().role != "user" || turns.back().role != "user") {
    *err = ApiError::invalid(
        "the messages must hold a user message first (after any system messages) and last",
        "messages", "invalid_value");
    return false;
  }
  std::vector<geist_token> &t = job->prompt;
  api::Error e = fmt_.open(system, &t);
  if (!cli::trim(system).empty()) job->boundaries.push_back(t.size());
  for (size_t k = 0; k < turns.size() && !e; ++k) {
    if (turns[k].role == "user") {
      if (k > 0) fmt_.next_user(&t);
      // Everything before the newest user text: the part a regenerated or edited last
      // message shares.
      if (k + 1 == turns.size()) job->boundaries.push_back(t.size());
      e = fmt_.user_text(turns[k].content, &t);
    } else {
      e = model_.tokenize(cli::trim(turns[k].content), false, false, &t);
      const std::vector<geist_token> &close = fmt_.close_model(-1);
      t.insert(t.end(), close.begin(), close.end());
    }
  }
  if (e) {
    *err = server_error(500, "tokenizer_error", "cannot tokenize the messages: " + e.message);
    return false;
  }
  return true;
}

// A completion prompt's tokens: its special tokens parsed, BOS first unless the text begins
// with it already (a chat template written out by hand). model-spec 7.7: one BOS, never
// two (the tokenizer, as llama.cpp's, adds BOS whatever the text holds, so the added one
// goes when the text's own follows it).
api::Error Server::tokenize_prompt(const std::string &text, std::vector<geist_token> *out) const {
  if (api::Error e = model_.tokenize(text, true, true, out)) return e;
  const geist_model_info info = model_.info();
  if (info.add_bos && info.bos >= 0 && out->size() >= 2 && (*out)[0] == info.bos && (*out)[1] == info.bos) {
    out->erase(out->begin());
  }
  return {};
}

bool Server::build_prompt(const GenRequest &r, Job *job, ApiError *err) const {
  if (r.endpoint == Endpoint::kChat) {
    if (!build_chat_prompt(r, job, err)) return false;
  } else if (r.prompt_is_tokens) {
    const int64_t nv = model_.info().n_vocab;
    for (int32_t t : r.prompt_tokens) {
      if (t < 0 || t >= nv) {
        *err = ApiError::invalid("token id " + std::to_string(t) +
                                     " is outside the vocabulary [0, " + std::to_string(nv) + ")",
                                 "prompt");
        return false;
      }
    }
    job->prompt = r.prompt_tokens;
  } else if (api::Error e = tokenize_prompt(r.prompt, &job->prompt)) {
    *err = server_error(500, "tokenizer_error", "cannot tokenize the prompt: " + e.message);
    return false;
  }
  const size_t n = job->prompt.size();
  const size_t n_ctx = engine_->n_ctx();
  if (n == 0) {
    *err = ApiError::invalid("the prompt is empty",
                             r.endpoint == Endpoint::kChat ? "messages" : "prompt");
    return false;
  }
  if (n >= n_ctx) {
    *err = ApiError::invalid("the prompt has " + std::to_string(n) + " tokens; the context holds " +
                                 std::to_string(n_ctx) + " (prompt and reply together; see -c)",
                             r.endpoint == Endpoint::kChat ? "messages" : "prompt",
                             "context_length_exceeded");
    return false;
  }
  const int64_t room = int64_t(n_ctx - n);
  job->max_tokens = r.max_tokens < 0 ? room : std::min<int64_t>(r.max_tokens, room);
  job->sampling = resolve_sampling(o_.g.sampling, r.sampling, o_.fixed_seed);
  job->stop = r.stop;
  job->logprobs = r.logprobs;
  job->top_logprobs = r.top_logprobs;
  job->cache_prompt = r.cache_prompt;
  return true;
}

json Server::usage_json(const Job::Output &out) const {
  return json{{"prompt_tokens", out.n_prompt},
              {"completion_tokens", out.n_generated},
              {"total_tokens", out.n_prompt + out.n_generated},
              {"prompt_tokens_details", {{"cached_tokens", out.n_cached}}}};
}

json Server::timings_json(const Job::Output &out) const {
  return json{{"cache_n", out.n_cached},
              {"cache_source", out.cache_source},
              {"prompt_n", out.n_prompt - out.n_cached},
              {"prompt_ms", out.prompt_ms},
              {"predicted_n", out.n_generated},
              {"predicted_ms", out.generate_ms},
              {"queue_ms", out.queue_ms}};
}

json Server::logprobs_json(Endpoint ep, const std::vector<TokenLogprob> &lps, size_t from,
                           size_t to) const {
  if (ep == Endpoint::kChat) {
    json content = json::array();
    for (size_t i = from; i < to; ++i) {
      const std::string piece = model_.piece(lps[i].token);
      json top = json::array();
      for (const auto &[id, lp] : lps[i].top) {
        const std::string p = model_.piece(id);
        top.push_back({{"token", p}, {"logprob", lp}, {"bytes", bytes_of(p)}});
      }
      content.push_back({{"token", piece},
                         {"logprob", lps[i].logprob},
                         {"bytes", bytes_of(piece)},
                         {"top_logprobs", std::move(top)}});
    }
    return json{{"content", std::move(content)}};
  }
  json tokens = json::array(), token_lps = json::array(), tops = json::array(),
       offsets = json::array();
  size_t offset = 0;
  for (size_t i = from; i < to; ++i) {
    const std::string piece = model_.piece(lps[i].token);
    tokens.push_back(piece);
    token_lps.push_back(lps[i].logprob);
    json top = json::object();
    for (const auto &[id, lp] : lps[i].top) top[model_.piece(id)] = lp;
    tops.push_back(std::move(top));
    offsets.push_back(offset);
    offset += piece.size();
  }
  return json{{"tokens", std::move(tokens)},
              {"token_logprobs", std::move(token_lps)},
              {"top_logprobs", std::move(tops)},
              {"text_offset", std::move(offsets)}};
}

json Server::final_json(Endpoint ep, const std::string &id, time_t created,
                        const Job::Output &out) const {
  json choice = {{"index", 0}, {"finish_reason", out.finish_reason}, {"logprobs", nullptr}};
  if (ep == Endpoint::kChat) {
    choice["message"] = {{"role", "assistant"}, {"content", out.text}};
  } else {
    choice["text"] = out.text;
  }
  json j = {{"id", id},
            {"object", ep == Endpoint::kChat ? "chat.completion" : "text_completion"},
            {"created", created},
            {"model", model_id_},
            {"system_fingerprint", std::string("geist-") + geist_version()},
            {"choices", json::array({std::move(choice)})},
            {"usage", usage_json(out)},
            {"timings", timings_json(out)}};
  return j;
}

json Server::chunk_json(Endpoint ep, const std::string &id, time_t created,
                        const json &delta_or_text, const json &logprobs, const json &finish,
                        bool with_usage) const {
  json choice = {{"index", 0}, {"logprobs", logprobs}, {"finish_reason", finish}};
  choice[ep == Endpoint::kChat ? "delta" : "text"] = delta_or_text;
  json j = {{"id", id},
            {"object", ep == Endpoint::kChat ? "chat.completion.chunk" : "text_completion"},
            {"created", created},
            {"model", model_id_},
            {"system_fingerprint", std::string("geist-") + geist_version()},
            {"choices", json::array({std::move(choice)})}};
  if (with_usage) j["usage"] = nullptr;
  return j;
}

// The SSE stream of one job: chunks as the engine emits text, then the final chunk, the
// usage chunk when asked, and [DONE]. A write that fails (the client went away) cancels
// the job, which frees its slot at the engine's next step.
void Server::stream(Endpoint ep, std::shared_ptr<Job> job, bool include_usage,
                    httplib::Response &res) {
  struct State {
    std::shared_ptr<Job> job;
    std::string id;
    time_t created;
    size_t text_off = 0, lp_off = 0;
    bool opened = false;
    Clock::time_point last_write = Clock::now();
  };
  auto st = std::make_shared<State>();
  st->job = job;
  st->id = random_id(ep == Endpoint::kChat ? "chatcmpl-" : "cmpl-");
  st->created = std::time(nullptr);
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, st, ep, include_usage](size_t, httplib::DataSink &sink) -> bool {
        auto send = [&](const json &j) {
          const std::string s = "data: " + dump(j) + "\n\n";
          st->last_write = Clock::now();
          return sink.write(s.data(), s.size());
        };
        if (ep == Endpoint::kChat && !st->opened) {
          st->opened = true;
          if (!send(chunk_json(ep, st->id, st->created, {{"role", "assistant"}, {"content", ""}},
                               nullptr, nullptr, include_usage))) {
            return false;
          }
        }
        Job &j = *st->job;
        std::string text;
        json lps = nullptr;
        bool done = false;
        Job::Output snap;
        {
          std::unique_lock<std::mutex> lk(j.mu);
          j.cv.wait_for(lk, std::chrono::milliseconds(500), [&] {
            return j.out.done || j.out.text.size() > st->text_off ||
                   j.out.logprobs.size() > st->lp_off;
          });
          text = j.out.text.substr(st->text_off);
          st->text_off = j.out.text.size();
          if (j.out.logprobs.size() > st->lp_off) {
            lps = logprobs_json(ep, j.out.logprobs, st->lp_off, j.out.logprobs.size());
            st->lp_off = j.out.logprobs.size();
          }
          done = j.out.done;
          if (done) snap = j.out;
        }
        if (!text.empty() || !lps.is_null()) {
          const json delta = ep == Endpoint::kChat ? json{{"content", text}} : json(text);
          if (!send(chunk_json(ep, st->id, st->created, delta, lps, nullptr, include_usage)))
            return false;
        }
        if (!done) {
          // A comment line now and then: a client that went away is noticed while the
          // prompt is still being computed, not only at the first token.
          if (Clock::now() - st->last_write > std::chrono::seconds(2)) {
            st->last_write = Clock::now();
            static const char ping[] = ": ping\n\n";
            if (!sink.write(ping, sizeof ping - 1)) return false;
          }
          return true;
        }
        if (snap.error) {
          if (!send(snap.error->to_json())) return false;
        } else {
          const json delta = ep == Endpoint::kChat ? json::object() : json("");
          json fin = chunk_json(ep, st->id, st->created, delta, nullptr, snap.finish_reason,
                                include_usage);
          fin["timings"] = timings_json(snap);
          if (!send(fin)) return false;
          if (include_usage) {
            json u = chunk_json(ep, st->id, st->created, nullptr, nullptr, nullptr, false);
            u["choices"] = json::array();
            u["usage"] = usage_json(snap);
            if (!send(u)) return false;
          }
        }
        static const char kDone[] = "data: [DONE]\n\n";
        if (!sink.write(kDone, sizeof kDone - 1)) return false;
        sink.done();
        return true;
      },
      [job](bool success) {
        if (!success) job->cancel();
      });
}

void Server::handle_generate(Endpoint ep, const httplib::Request &req, httplib::Response &res) {
  if (!ready_) return send_error(res, server_error(503, "loading", "the model is loading"));
  GenRequest r;
  ApiError err;
  if (!parse_gen_request(ep, req.body, &r, &err)) return send_error(res, err);
  auto job = std::make_shared<Job>();
  if (!build_prompt(r, job.get(), &err)) return send_error(res, err);
  switch (engine_->submit(job)) {
    case Engine::Submit::kOk:
      break;
    case Engine::Submit::kQueueFull:
      return send_error(
          res, server_error(503, "server_busy", "every slot is busy and the queue is full; retry"));
    case Engine::Submit::kDraining:
      res.set_header("Connection", "close");
      return send_error(res, server_error(503, "shutting_down", "the server is shutting down"));
  }
  if (r.stream) return stream(ep, job, r.include_usage, res);
  // Non-streaming: nothing is written until the end, so the connection is watched
  // instead; a client that went away cancels the job, which frees its slot (or its place
  // in the queue) at the engine's next step.
  Job::Output out;
  bool client_gone = false;
  {
    int fd = -2;  // not looked up yet
    std::unique_lock<std::mutex> lk(job->mu);
    while (!job->cv.wait_for(lk, std::chrono::milliseconds(100), [&] { return job->out.done; })) {
      if (client_gone) continue;
      lk.unlock();
      if (fd == -2) fd = connection_socket(req);
      if (fd >= 0 && peer_closed(fd)) {
        client_gone = true;
        job->cancel();
      }
      lk.lock();
    }
    out = job->out;
  }
  if (client_gone && out.finish_reason == "cancelled") {
    // Nobody reads this; the status is what the log and /metrics show (nginx's 499).
    return send_error(
        res, server_error(499, "client_closed_request", "the client closed the connection"));
  }
  if (out.error) return send_error(res, *out.error);
  if (out.finish_reason == "cancelled") {
    return send_error(
        res, server_error(503, "cancelled", "the request was cancelled (server shutting down)"));
  }
  json j = final_json(ep, random_id(ep == Endpoint::kChat ? "chatcmpl-" : "cmpl-"),
                      std::time(nullptr), out);
  if (r.logprobs)
    j["choices"][0]["logprobs"] = logprobs_json(ep, out.logprobs, 0, out.logprobs.size());
  send_json(res, 200, j);
}

std::string Server::metrics_text() const {
  // engine_ is set before ready_ (an atomic) and read only after it.
  const EngineStats s = ready_ ? engine_->stats() : EngineStats{};
  std::ostringstream m;
  m.precision(15);
  auto metric = [&](const char *name, const char *type, const char *help, double v) {
    m << "# HELP geist_" << name << ' ' << help << "\n# TYPE geist_" << name << ' ' << type
      << "\ngeist_" << name << ' ' << v << '\n';
  };
  {
    std::lock_guard<std::mutex> lk(http_mu_);
    m << "# HELP geist_http_requests_total HTTP requests answered, by route and status.\n"
         "# TYPE geist_http_requests_total counter\n";
    for (const auto &[k, v] : http_counts_) {
      m << "geist_http_requests_total{route=\"" << k.first << "\",status=\"" << k.second << "\"} "
        << v << '\n';
    }
  }
  metric("requests_started_total", "counter", "Generation requests a slot took.",
         double(s.jobs_started));
  metric("requests_finished_total", "counter", "Generation requests that finished.",
         double(s.jobs_finished));
  metric("requests_cancelled_total", "counter",
         "Generation requests cancelled (client gone, shutdown).", double(s.jobs_cancelled));
  metric("requests_failed_total", "counter", "Generation requests that failed in the engine.",
         double(s.jobs_failed));
  metric("requests_rejected_total", "counter", "Requests refused because the queue was full.",
         double(s.jobs_rejected));
  metric("prompt_tokens_total", "counter", "Prompt tokens of started requests.",
         double(s.prompt_tokens));
  metric("prompt_tokens_computed_total", "counter", "Prompt tokens prefilled (not reused).",
         double(s.prefilled_tokens));
  metric("cached_tokens_total", "counter", "Prompt tokens reused from a live slot or the cache.",
         double(s.cached_tokens));
  metric("generated_tokens_total", "counter", "Tokens generated.", double(s.generated_tokens));
  metric("prefix_cache_hits_total", "counter", "Requests that restored a cached snapshot.",
         double(s.cache_hits));
  metric("prefix_slot_hits_total", "counter", "Requests that continued a live slot's tokens.",
         double(s.slot_hits));
  metric("prefix_misses_total", "counter", "Requests that reused nothing.", double(s.misses));
  metric("prefix_cache_entries", "gauge", "Snapshots in the RAM cache.", double(s.cache_entries));
  metric("prefix_cache_bytes", "gauge", "Bytes charged to the prefix cache (saved states, tokens, overhead).", double(s.cache_bytes));
  metric("prefix_cache_capacity_bytes", "gauge", "The prefix cache's hard cap (--cache-ram).",
         double(s.cache_capacity));
  metric("prefix_cache_evictions_total", "counter", "Saved states evicted from the prefix cache.",
         double(s.cache_evictions));
  metric("snapshots_total", "counter", "Session states saved into the prefix cache (the names say snapshot: kept for dashboards).",
         double(s.snapshots_taken));
  metric("snapshot_buffers_reused_total", "counter",
         "States saved into a state evicted to make their room (no allocation).",
         double(s.snapshot_buffers_reused));
  metric("steps_total", "counter",
         "Engine steps (forward passes over the decoding slots and the prompt chunks due).",
         double(s.steps));
  metric("step_sequences_total", "counter",
         "Requests advanced by those steps (decode rows plus prompt chunks, summed over steps).",
         double(s.step_sequences));
  metric("steps_mixed_total", "counter", "Steps that held prompt rows and decode rows together.",
         double(s.steps_mixed));
  metric("decode_steps_total", "counter", "Batched decode steps.", double(s.decode_steps));
  metric("decode_rows_total", "counter", "Tokens decoded by those steps (rows per step summed).",
         double(s.decode_rows));
  metric("prefill_seconds_total", "counter", "Time spent prefilling prompts.", s.prefill_seconds);
  metric("decode_seconds_total", "counter", "Time spent in decode steps.", s.decode_seconds);
  metric("snapshot_seconds_total", "counter", "Time spent saving session states into the prefix cache.",
         s.snapshot_seconds);
  metric("restore_seconds_total", "counter", "Time spent loading cached session states.",
         s.restore_seconds);
  metric("queue_depth", "gauge", "Requests waiting for a slot.", double(s.queue_depth));
  metric("slots_busy", "gauge", "Slots running a request.", double(s.slots_busy));
  metric("slots_total", "gauge", "Slots (--parallel).", double(s.slots_total));
  metric("ready", "gauge", "1 when the model is loaded and requests are served.",
         ready_ && !draining_ ? 1 : 0);
  return m.str();
}

void Server::routes() {
  svr_.set_pre_routing_handler([this](const httplib::Request &req, httplib::Response &res) {
    if (!authorized(req, res)) return httplib::Server::HandlerResponse::Handled;
    if (draining_ && req.path != "/health" && req.path != "/metrics") {
      res.set_header("Connection", "close");
      send_error(res, server_error(503, "shutting_down", "the server is shutting down"));
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  svr_.set_error_handler([](const httplib::Request &req, httplib::Response &res) {
    if (!res.body.empty()) return;
    // An error httplib raised (a request it could not read, or too large) ends the
    // connection: what follows on it cannot be trusted to be a request.
    if (res.status == 400 || res.status == 413 || res.status == 414 || res.status == 431) {
      res.set_header("Connection", "close");
    }
    if (res.status == 404) {
      send_error(res, server_error(404, "not_found", "no route " + req.method + " " + req.path));
    } else if (res.status == 413) {
      send_error(res, server_error(413, "request_too_large",
                                   "the request body is larger than --max-body"));
    } else {
      send_error(
          res, server_error(res.status, "http_error", "HTTP error " + std::to_string(res.status)));
    }
  });
  svr_.set_exception_handler(
      [](const httplib::Request &, httplib::Response &res, std::exception_ptr ep) {
        std::string what = "unknown exception";
        try {
          if (ep) std::rethrow_exception(ep);
        } catch (const std::exception &e) {
          what = e.what();
        } catch (...) {
        }
        send_error(res, server_error(500, "internal_error", "internal error: " + what));
      });
  svr_.set_logger([this](const httplib::Request &req, const httplib::Response &res) {
    std::string route = req.path;
    static const char *known[] = {"/health",
                                  "/v1/models",
                                  "/models",
                                  "/v1/completions",
                                  "/completions",
                                  "/v1/chat/completions",
                                  "/chat/completions",
                                  "/tokenize",
                                  "/detokenize",
                                  "/metrics",
                                  "/"};
    bool k = false;
    for (const char *p : known) k = k || route == p;
    if (!k) route = "other";
    {
      std::lock_guard<std::mutex> lk(http_mu_);
      ++http_counts_[{route, res.status}];
    }
    if (!o_.quiet && req.path != "/health" && req.path != "/metrics") {
      std::fprintf(stderr, "geist serve: %s %s %d\n", req.method.c_str(), req.path.c_str(),
                   res.status);
    }
  });

  svr_.Get("/health", [this](const httplib::Request &, httplib::Response &res) {
    if (draining_) return send_json(res, 503, {{"status", "shutting down"}});
    if (!ready_) return send_json(res, 503, {{"status", "loading"}});
    send_json(res, 200, {{"status", "ok"}});
  });
  auto models = [this](const httplib::Request &, httplib::Response &res) {
    json m = {{"id", model_id_}, {"object", "model"}, {"created", created_}, {"owned_by", "geist"}};
    if (ready_) {
      const geist_model_info i = model_.info();
      m["meta"] = {{"n_ctx", engine_->n_ctx()},
                   {"n_ctx_train", i.n_ctx_train},
                   {"n_vocab", i.n_vocab},
                   {"n_params", i.n_params},
                   {"arch", i.arch}};
    }
    send_json(res, 200, {{"object", "list"}, {"data", json::array({m})}});
  };
  svr_.Get("/v1/models", models);
  svr_.Get("/models", models);
  for (const char *p : {"/v1/completions", "/completions"}) {
    svr_.Post(p, [this](const httplib::Request &req, httplib::Response &res) {
      handle_generate(Endpoint::kCompletions, req, res);
    });
  }
  for (const char *p : {"/v1/chat/completions", "/chat/completions"}) {
    svr_.Post(p, [this](const httplib::Request &req, httplib::Response &res) {
      handle_generate(Endpoint::kChat, req, res);
    });
  }
  svr_.Post("/tokenize", [this](const httplib::Request &req, httplib::Response &res) {
    if (!ready_) return send_error(res, server_error(503, "loading", "the model is loading"));
    TokenizeRequest r;
    ApiError err;
    if (!parse_tokenize_request(req.body, &r, &err)) return send_error(res, err);
    std::vector<geist_token> t;
    if (api::Error e = model_.tokenize(r.content, r.add_special, r.parse_special, &t)) {
      return send_error(res, server_error(500, "tokenizer_error", e.message));
    }
    json out = json::array();
    for (geist_token id : t) {
      if (r.with_pieces) {
        out.push_back({{"id", id}, {"piece", model_.piece(id)}});
      } else {
        out.push_back(id);
      }
    }
    send_json(res, 200, {{"tokens", std::move(out)}});
  });
  svr_.Post("/detokenize", [this](const httplib::Request &req, httplib::Response &res) {
    if (!ready_) return send_error(res, server_error(503, "loading", "the model is loading"));
    std::vector<int32_t> t;
    ApiError err;
    if (!parse_detokenize_request(req.body, &t, &err)) return send_error(res, err);
    const int64_t nv = model_.info().n_vocab;
    for (int32_t id : t) {
      if (id >= nv) {
        return send_error(
            res, ApiError::invalid("token id " + std::to_string(id) +
                                       " is outside the vocabulary [0, " + std::to_string(nv) + ")",
                                   "tokens"));
      }
    }
    std::string text;
    if (api::Error e = model_.detokenize(t, false, &text)) {
      return send_error(res, server_error(500, "tokenizer_error", e.message));
    }
    send_json(res, 200, {{"content", text}});
  });
  svr_.Get("/metrics", [this](const httplib::Request &, httplib::Response &res) {
    res.set_content(metrics_text(), "text/plain; version=0.0.4");
  });
  auto page = [](const httplib::Request &, httplib::Response &res) {
    res.set_header("Content-Security-Policy",
                   "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                   "connect-src 'self'");
    res.set_header("X-Content-Type-Options", "nosniff");
    res.set_content(kChatPageHtml, "text/html; charset=utf-8");
  };
  svr_.Get("/", page);
  svr_.Get("/index.html", page);
}

bool Server::load_model() {
  if (!cli::load_api_model(o_.g.model, &model_, nullptr, &o_.g.dev)) return false;
  if (api::Error e = cli::ChatFormat::make(model_, &fmt_)) return cli::report(e), false;
  EngineOptions eo;
  eo.n_parallel = o_.parallel;
  eo.queue_max = size_t(o_.queue);
  eo.cache_bytes = size_t(cache_mib(o_)) << 20;
  eo.min_snapshot_tokens = size_t(o_.min_snapshot_tokens);
  eo.prefill_budget = o_.g.batch;
  geist_session_params p = geist_session_params_default();
  p.n_ctx = o_.g.n_ctx;
  p.n_threads = o_.g.threads;
  p.chunk = o_.g.batch;
  cli::apply_kv_types(o_.g.dev, &p);
  p.sampling = o_.g.sampling;
  eo.session = p;
  std::vector<DiskCache::File> files;
  if (!o_.cache_dir.empty()) {
    disk_ = std::make_unique<DiskCache>(o_.cache_dir, size_t(o_.cache_disk_mib) << 20);
    if (api::Error e = disk_->open()) return cli::report(e), false;
    files = disk_->read_all(eo.cache_bytes);
    eo.on_snapshot = [d = disk_.get()](uint64_t h, std::shared_ptr<const api::State> st) {
      d->put(h, std::move(st));
    };
    eo.on_use = [d = disk_.get()](uint64_t h) { d->touch(h); };
  }
  engine_ = std::make_unique<Engine>(model_, eo);
  size_t loaded = 0;
  const size_t n_files = files.size();
  if (api::Error e = engine_->start(std::move(files), &loaded)) return cli::report(e), false;
  if (disk_) {
    std::fprintf(stderr, "geist serve: cache dir %s: %zu entr%s loaded (%zu file%s read)\n",
                 o_.cache_dir.c_str(), loaded, loaded == 1 ? "y" : "ies", n_files,
                 n_files == 1 ? "" : "s");
  }
  return true;
}

int Server::run() {
  if (o_.parallel > o_.g.batch) {
    std::fprintf(stderr,
                 "geist: error: --parallel %d is above the batch size -b %d (one decode step holds "
                 "at most -b "
                 "requests)\n",
                 o_.parallel, o_.g.batch);
    return 1;
  }
  api_key_ = o_.api_key;
  if (!o_.api_key_file.empty()) {
    std::ifstream f(o_.api_key_file);
    if (!f || !std::getline(f, api_key_)) {
      std::fprintf(stderr, "geist: error: cannot read an API key from '%s'\n",
                   o_.api_key_file.c_str());
      return 1;
    }
    api_key_ = cli::trim(api_key_);
  }
  if (!o_.api_key.empty() || !o_.api_key_file.empty()) {
    if (api_key_.empty()) {
      std::fprintf(stderr, "geist: error: the API key is empty\n");
      return 1;
    }
  }
#ifdef M_MMAP_THRESHOLD
  // Snapshot images (MiBs each) come and go with the cache: with glibc's sliding mmap
  // threshold they would move into the heap after the first free and fragment it, and the
  // process would hold far more than --cache-ram. A fixed threshold keeps every large
  // buffer its own mapping, returned to the system when freed.
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
#endif
  std::string file = o_.g.model;
  const size_t slash = file.find_last_of('/');
  model_id_ = !o_.alias.empty()            ? o_.alias
              : slash == std::string::npos ? file
                                           : file.substr(slash + 1);

  // Signals: SIGTERM/SIGINT are taken by one thread (sigwait), blocked everywhere else;
  // a write to a client that went away must fail, not kill the process.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
  std::mutex sig_mu;
  std::condition_variable sig_cv;
  int n_signals = 0;
  std::thread([&set, &sig_mu, &sig_cv, &n_signals] {
    for (;;) {
      int sig = 0;
      if (sigwait(&set, &sig) != 0) continue;
      std::lock_guard<std::mutex> lk(sig_mu);
      ++n_signals;
      sig_cv.notify_all();
    }
  }).detach();

  const size_t threads =
      o_.http_threads > 0 ? size_t(o_.http_threads) : size_t(o_.parallel + o_.queue + 8);
  svr_.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  svr_.set_read_timeout(o_.read_timeout_s, 0);
  svr_.set_write_timeout(o_.write_timeout_s, 0);
  svr_.set_keep_alive_timeout(o_.keep_alive_s);
  svr_.set_payload_max_length(size_t(o_.max_body_mib) << 20);
  svr_.set_tcp_nodelay(true);
  // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, with which a second server on
  // the same port would silently share it with the first.
  svr_.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  routes();
  if (!svr_.bind_to_port(o_.host, o_.port)) {
    std::fprintf(
        stderr,
        "geist: error: cannot listen on %s:%d (in use, or not an address of this machine)\n",
        o_.host.c_str(), o_.port);
    return 1;
  }
  std::thread listener([this] { svr_.listen_after_bind(); });
  std::fprintf(stderr, "geist serve: listening on http://%s:%d (loading %s)\n", o_.host.c_str(),
               o_.port, o_.g.model.c_str());
  auto wait_signal = [&](int count, Clock::duration d) {
    std::unique_lock<std::mutex> lk(sig_mu);
    return sig_cv.wait_for(lk, d, [&] { return n_signals >= count; });
  };
  int rc = 0;
  if (!load_model()) {
    rc = 1;
  } else {
    ready_ = true;
    std::fprintf(stderr,
                 "geist serve: ready: %s, %d slot%s, context %zu, prefix cache %d MiB%s%s\n",
                 model_id_.c_str(), o_.parallel, o_.parallel == 1 ? "" : "s", engine_->n_ctx(),
                 cache_mib(o_), o_.g.dev.backend == "cuda" ? " (device memory)" : "", "");
    while (!wait_signal(1, std::chrono::hours(24))) {
    }
    // Draining: new work gets 503; queued and running requests may finish within the grace
    // time (or until a second signal), then the rest are cancelled.
    std::fprintf(stderr, "geist serve: shutting down (a second signal cancels running requests)\n");
    draining_ = true;
    engine_->drain();
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(o_.shutdown_grace_s));
    while (!engine_->idle() && Clock::now() < deadline &&
           !wait_signal(2, std::chrono::milliseconds(50))) {
    }
    if (!engine_->idle()) {
      std::fprintf(stderr, "geist serve: cancelling the requests still running\n");
      engine_->cancel_all();
      for (int i = 0; i < 200 && !engine_->idle(); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  // stop() does nothing before the listener is running: wait for it (a load that fails at
  // once can get here first).
  for (int i = 0; i < 5000 && !svr_.is_running(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  svr_.stop();
  listener.join();
  if (engine_) engine_->stop();
  if (disk_) disk_->flush();  // the entries queued for the disk are written before exit
  if (rc == 0) std::fprintf(stderr, "geist serve: stopped\n");
  return rc;
}

}  // namespace

int run_server(const ServeOptions &o) {
  Server s(o);
  return s.run();
}

}  // namespace geist::serve

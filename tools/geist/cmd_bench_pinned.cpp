// geist bench pinned: the workload of an app that keeps one session per document figure.
// S sessions, R requests each; every prompt is P tokens, of which the first round(f * P)
// (BOS + the session's system turn) are the same for all of a session's requests and the
// rest (the request's question, closed by the model-turn markers) differs per request;
// prefill runs in chunks of c tokens and G tokens are generated greedily. Modes:
//   full      clear, prefill the whole prompt, every request
//   pin       pin the prefix once per session, then reset + the remainder per request
//   snapshot  pin once, snapshot to memory once, then restore + the remainder per request
// Each mode runs in its own child process (forked after the model is loaded), so its peak
// RSS is that of a process serving only that mode; the parent drives them in lockstep, one
// request at a time (bench::interleaved_schedule), so machine noise hits all modes alike.
// Statistics and the JSON document: bench_stats.h; docs/BENCH.md.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "api_common.h"
#include "bench_common.h"
#include "svg_plot.h"

namespace geist::cli {
namespace {

using bench::fmt;

enum Mode { kFull, kPin, kSnapshot };
const char *const kModeNames[] = {"full", "pin", "snapshot"};

struct PinnedOptions {
  BenchCommon c;
  int threads = 0;
  int64_t n_ctx = 0;
  int sessions = 3, requests = 20, prompt = 600, chunk = 64, gen = 16;
  double fraction = 0.4;
  std::vector<std::string> modes = {"full", "pin", "snapshot"};
};

// The prompts: prefix[s] is session s's constant part, rest[s][r] request r's own part.
struct Workload {
  std::vector<std::vector<geist_token>> prefix;             // [S][n_prefix]
  std::vector<std::vector<std::vector<geist_token>>> rest;  // [S][R][P - n_prefix]
};

double now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// tokens of text (markers such as <start_of_turn> parsed as special tokens), or a failure.
api::Error tokens_of(const api::Model &m, const std::string &text, bool bos,
                     std::vector<geist_token> *out) {
  return m.tokenize(text, bos, true, out);
}

// head + as much corpus as fits + tail, exactly n tokens (head and tail cut when n is small).
std::vector<geist_token> compose(std::vector<geist_token> head,
                                 const std::vector<geist_token> &corpus, size_t offset,
                                 const std::vector<geist_token> &tail, size_t n) {
  if (head.size() + tail.size() <= n) {
    const std::vector<geist_token> body =
        corpus_slice(corpus, offset, n - head.size() - tail.size());
    head.insert(head.end(), body.begin(), body.end());
  }
  head.insert(head.end(), tail.begin(), tail.end());
  head.resize(n, corpus[offset % corpus.size()]);
  return head;
}

// Gemma 3 chat turns around corpus text: the prefix is
//   <bos><start_of_turn>user\nYou answer questions about figure {s} of a document...\n{corpus}
// and each request "\n\nFigure {s}, question {r}:
// ...\n{corpus}<end_of_turn>\n<start_of_turn>model\n", with a different corpus offset for every
// session and request.
api::Error build_workload(const api::Model &m, const PinnedOptions &o, int n_prefix, Workload *w) {
  std::vector<geist_token> corpus, close;
  if (api::Error e = corpus_tokens(m, &corpus)) return e;
  if (api::Error e = tokens_of(m, "<end_of_turn>\n<start_of_turn>model\n", false, &close)) return e;
  const size_t n_rest = size_t(o.prompt - n_prefix);
  for (int s = 0; s < o.sessions; ++s) {
    std::vector<geist_token> open;
    const std::string sys =
        fmt("<start_of_turn>user\nYou answer questions about figure %d of a long document. "
            "Read this part of it first:\n",
            s + 1);
    if (api::Error e = tokens_of(m, sys, true, &open)) return e;
    w->prefix.push_back(compose(open, corpus, size_t(s) * 409, {}, size_t(n_prefix)));
    w->rest.emplace_back();
    for (int r = 0; r < o.requests; ++r) {
      std::vector<geist_token> head;
      const std::string q =
          fmt("\n\nFigure %d, question %d: what does this passage tell us?\n", s + 1, r + 1);
      if (api::Error e = tokens_of(m, q, false, &head)) return e;
      w->rest[s].push_back(
          compose(head, corpus, 1000 + size_t(s * o.requests + r) * 173, close, n_rest));
    }
  }
  return {};
}

// ---- Parent <-> worker messages over pipes -----------------------------------------

struct Cmd {
  enum Op : int32_t { kSetup = 1, kRequest = 2, kFinish = 3 } op;
  int32_t session, request;
};

// A worker's reply: status 0 or an error text; numbers and token ids per op.
struct Msg {
  int32_t status = 0;
  std::vector<double> d;
  std::vector<int32_t> tokens;
  std::string text;
};

bool write_all(int fd, const void *p, size_t n) {
  const char *c = static_cast<const char *>(p);
  while (n > 0) {
    const ssize_t k = ::write(fd, c, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    c += k, n -= size_t(k);
  }
  return true;
}

bool read_all(int fd, void *p, size_t n) {
  char *c = static_cast<char *>(p);
  while (n > 0) {
    const ssize_t k = ::read(fd, c, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    c += k, n -= size_t(k);
  }
  return true;
}

bool send_msg(int fd, const Msg &m) {
  const uint32_t h[4] = {uint32_t(m.status), uint32_t(m.d.size()), uint32_t(m.tokens.size()),
                         uint32_t(m.text.size())};
  return write_all(fd, h, sizeof h) && write_all(fd, m.d.data(), m.d.size() * sizeof(double)) &&
         write_all(fd, m.tokens.data(), m.tokens.size() * sizeof(int32_t)) &&
         write_all(fd, m.text.data(), m.text.size());
}

bool recv_msg(int fd, Msg *m) {
  uint32_t h[4];
  if (!read_all(fd, h, sizeof h) || h[1] > (1u << 24) || h[2] > (1u << 24) || h[3] > (1u << 16))
    return false;
  m->status = int32_t(h[0]);
  m->d.resize(h[1]);
  m->tokens.resize(h[2]);
  m->text.resize(h[3]);
  return read_all(fd, m->d.data(), h[1] * sizeof(double)) &&
         read_all(fd, m->tokens.data(), h[2] * sizeof(int32_t)) &&
         read_all(fd, m->text.data(), h[3]);
}

// ---- The worker: one mode's sessions, in a child process ----------------------------

class Worker {
 public:
  Worker(const api::Model &m, Mode mode, const Workload &w, const geist_session_params &p, int gen)
      : m_(m), mode_(mode), w_(w), p_(p), gen_(gen), s_(w.prefix.size()), img_(w.prefix.size()) {}

  Msg handle(const Cmd &c) {
    try {
      if (c.op == Cmd::kSetup) return setup(c.session);
      if (c.op == Cmd::kRequest) return request(c.session, c.request);
      return finish();
    } catch (const std::exception &e) {
      return fail(api::Error{GEIST_E_INTERNAL, e.what()});
    }
  }

 private:
  static Msg fail(const api::Error &e) {
    Msg m;
    m.status = e.status == GEIST_OK ? GEIST_E_INTERNAL : e.status;
    m.text = e.message;
    return m;
  }

  // d = {pin or prefix-prefill ms, snapshot ms, checkpoint bytes, snapshot bytes}.
  Msg setup(int s) {
    if (api::Error e = api::Session::create(m_, &p_, &s_[s])) return fail(e);
    api::Session &x = s_[s];
    Msg r;
    double t = now_ms();
    if (mode_ == kFull) {  // the reference: a plain prefill of the same prefix, then clear
      if (api::Error e = x.prefill(w_.prefix[s])) return fail(e);
      r.d = {now_ms() - t, 0, -1, -1};
      if (api::Error e = x.clear()) return fail(e);
      return r;
    }
    if (api::Error e = x.pin_prefix(w_.prefix[s])) return fail(e);
    const double pin = now_ms() - t;
    double snap = 0;
    if (mode_ == kSnapshot) {
      t = now_ms();
      if (api::Error e = x.snapshot(&img_[s])) return fail(e);
      snap = now_ms() - t;
    }
    r.d = {pin, snap, double(x.stats().checkpoint_bytes),
           mode_ == kSnapshot ? double(img_[s].size()) : -1.0};
    return r;
  }

  // d = {request ms, reset ms, prefill ms, RSS bytes after, decode ms of each token...};
  // tokens = the generated ids.
  Msg request(int s, int r) {
    api::Session &x = s_[s];
    const std::vector<geist_token> &rest = w_.rest[s][r];
    std::vector<geist_token> whole;
    if (mode_ == kFull) {
      whole = w_.prefix[s];
      whole.insert(whole.end(), rest.begin(), rest.end());
    }
    Msg m;
    std::vector<double> decode;
    const double t0 = now_ms();
    api::Error e = mode_ == kFull ? x.clear() : mode_ == kPin ? x.reset() : x.restore(img_[s]);
    const double t1 = now_ms();
    if (!e) e = mode_ == kFull ? x.prefill(whole) : x.prefill(rest);
    const double t2 = now_ms();
    for (int g = 0; !e && g < gen_; ++g) {
      geist_token t = -1;
      const double a = now_ms();
      e = x.decode_step(&t);
      decode.push_back(now_ms() - a);
      m.tokens.push_back(t);
    }
    if (!e) e = x.wait();  // a request ends when its last step has run (on a GPU it may be queued)
    const double t3 = now_ms();
    if (e) return fail(e);
    m.d = {t3 - t0, t1 - t0, t2 - t1, double(proc_status_bytes("VmRSS"))};
    m.d.insert(m.d.end(), decode.begin(), decode.end());
    return m;
  }

  // d = {VmHWM bytes, VmRSS bytes}.
  Msg finish() {
    Msg m;
    m.d = {double(proc_status_bytes("VmHWM")), double(proc_status_bytes("VmRSS"))};
    return m;
  }

  const api::Model &m_;
  Mode mode_;
  const Workload &w_;
  geist_session_params p_;
  int gen_;
  std::vector<api::Session> s_;
  std::vector<std::vector<uint8_t>> img_;  // [S] snapshot images (snapshot mode)
};

struct Child {
  Mode mode;
  pid_t pid = -1;
  int cmd_fd = -1, reply_fd = -1;
  // A device backend's state (a CUDA context) does not survive fork(): its modes run in
  // this process instead, one worker object each (peak RSS is then the whole process's).
  std::shared_ptr<Worker> local;
};

// Forks a worker for `mode`. The child closes every fd in *open_fds (other children's
// pipes, so a worker sees EOF when the parent goes away) and never returns.
bool spawn_worker(Mode mode, const api::Model &m, const Workload &w, const geist_session_params &p,
                  int gen, std::vector<int> *open_fds, Child *out) {
  int cmd[2], reply[2];
  if (pipe(cmd) != 0) return false;
  if (pipe(reply) != 0) {
    close(cmd[0]), close(cmd[1]);
    return false;
  }
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid < 0) return false;
  if (pid == 0) {
    for (int fd : *open_fds) close(fd);
    close(cmd[1]);
    close(reply[0]);
    Worker worker(m, mode, w, p, gen);
    Cmd c{};
    while (read_all(cmd[0], &c, sizeof c)) {
      if (!send_msg(reply[1], worker.handle(c)) || c.op == Cmd::kFinish) break;
    }
    _exit(0);  // no atexit handlers or destructors of the parent's state
  }
  close(cmd[0]);
  close(reply[1]);
  out->mode = mode;
  out->pid = pid;
  out->cmd_fd = cmd[1];
  out->reply_fd = reply[0];
  open_fds->push_back(cmd[1]);
  open_fds->push_back(reply[0]);
  return true;
}

// Sends a command and waits for the reply; false after printing an error.
bool call(const Child &c, Cmd cmd, Msg *reply) {
  if (c.local) {
    *reply = c.local->handle(cmd);
  } else if (!write_all(c.cmd_fd, &cmd, sizeof cmd) || !recv_msg(c.reply_fd, reply)) {
    int status = 0;
    std::string how = "ended";
    if (waitpid(c.pid, &status, 0) == c.pid) {
      how = WIFSIGNALED(status) ? fmt("was killed by signal %d", WTERMSIG(status))
                                : fmt("exited with status %d", WEXITSTATUS(status));
    }
    std::fprintf(stderr, "geist: error: the %s worker process %s unexpectedly\n",
                 kModeNames[c.mode], how.c_str());
    return false;
  }
  if (reply->status != 0) {
    std::fprintf(stderr, "geist: error: %s mode: %s\n", kModeNames[c.mode], reply->text.c_str());
    return false;
  }
  return true;
}

bool malformed(const Child &c) {
  std::fprintf(stderr, "geist: error: the %s worker sent a malformed reply\n", kModeNames[c.mode]);
  return false;
}

void stop_workers(std::vector<Child> &children) {
  for (Child &c : children) c.local.reset();
  for (Child &c : children) {
    if (c.cmd_fd >= 0) close(c.cmd_fd);
    if (c.reply_fd >= 0) close(c.reply_fd);
    c.cmd_fd = c.reply_fd = -1;
  }
  for (Child &c : children) {
    if (c.pid > 0) waitpid(c.pid, nullptr, 0);
    c.pid = -1;
  }
}

// ---- Report ------------------------------------------------------------------------

// Milliseconds with precision that suits the size.
std::string msv(double v) {
  if (!std::isfinite(v)) return "-";
  return bench::ms(v, v < 1 ? 3 : v < 10 ? 2 : 1);
}

std::string ratio_s(double v, double full) {
  const double r = bench::ratio(v, full);
  return std::isfinite(r) ? fmt("%.2fx", r) : "-";
}

void print_report(const bench::Environment &env, const bench::PinnedParams &p,
                  const std::vector<bench::PinnedMode> &modes, int identical, int n_compared,
                  int64_t model_rss) {
  std::printf("%s", bench::environment_text(env).c_str());
  std::printf(
      "\npinned workload: %d sessions x %d requests; prompt %d tokens = prefix %d (BOS + system "
      "turn, "
      "f %.2f) + %d per request; prefill chunk %d; %d generated tokens (greedy)\n",
      p.sessions, p.requests, p.prompt_tokens, p.prefix_tokens, p.prefix_fraction,
      p.prompt_tokens - p.prefix_tokens, p.chunk, p.gen_tokens);
  std::printf(
      "modes each in their own process, interleaved request by request; percentiles over requests "
      "2..%d "
      "of every session (%d per mode); first requests on their own\n\n",
      p.requests, p.sessions * (p.requests - 1));
  std::vector<bench::PinnedSummary> sum;
  for (const auto &m : modes) sum.push_back(bench::summarize(m));
  std::vector<std::vector<std::string>> rows;
  for (size_t i = 0; i < modes.size(); ++i) {
    const bench::PinnedSummary &s = sum[i];
    const std::string setup =
        modes[i].mode == "full" ? "-" : msv(s.pin.mean) + " / " + msv(s.pin.max);
    rows.push_back({modes[i].mode, msv(s.request.p50), msv(s.request.p95), msv(s.request.max),
                    msv(s.prefill.p50), msv(s.prefill.p95), msv(s.decode.p50), msv(s.reset.p50),
                    msv(s.first_request.mean) + " / " + msv(s.first_request.max), setup,
                    bench::mib(modes[i].peak_rss)});
  }
  std::printf(
      "%s", bench::format_table({"mode", "P50 ms", "P95 ms", "max ms", "prefill P50", "prefill P95",
                                 "decode/token P50", "reset P50", "first request mean / max",
                                 "pin mean / max", "peak RSS MiB"},
                                rows, "lrrrrrrrrrr")
                .c_str());
  std::printf("(reset: clear for full, reset for pin, restore of the snapshot for snapshot)\n");

  const bench::PinnedMode *full = nullptr;
  const bench::PinnedSummary *fs = nullptr;
  for (size_t i = 0; i < modes.size(); ++i)
    if (modes[i].mode == "full") full = &modes[i], fs = &sum[i];
  if (full && modes.size() > 1) {
    rows.clear();
    for (size_t i = 0; i < modes.size(); ++i) {
      if (&modes[i] == full) continue;
      const bench::PinnedSummary &s = sum[i];
      rows.push_back(
          {modes[i].mode, ratio_s(s.request.p50, fs->request.p50),
           ratio_s(s.request.p95, fs->request.p95), ratio_s(s.request.max, fs->request.max),
           ratio_s(s.prefill.p50, fs->prefill.p50), ratio_s(s.prefill.p95, fs->prefill.p95),
           ratio_s(s.first_request.mean, fs->first_request.mean),
           ratio_s(double(modes[i].peak_rss), double(full->peak_rss))});
    }
    std::printf("\nratio to full (below 1: faster or smaller)\n%s",
                bench::format_table({"mode", "P50", "P95", "max", "prefill P50", "prefill P95",
                                     "first request", "peak RSS"},
                                    rows, "lrrrrrrr")
                    .c_str());
  }
  std::printf("\n");
  for (size_t i = 0; i < modes.size(); ++i) {
    const bench::PinnedMode &m = modes[i];
    const bench::PinnedSummary &s = sum[i];
    if (m.mode == "full") {
      std::printf(
          "full: setup (a plain prefill of each session's %d prefix tokens, for reference) mean %s "
          "ms, "
          "max %s ms\n",
          p.prefix_tokens, msv(s.prefix_prefill.mean).c_str(), msv(s.prefix_prefill.max).c_str());
    } else {
      std::printf("%s: pin of %d tokens mean %s ms, max %s ms", m.mode.c_str(), p.prefix_tokens,
                  msv(s.pin.mean).c_str(), msv(s.pin.max).c_str());
      if (fs)
        std::printf(" (%s a plain prefill of them)",
                    ratio_s(s.pin.mean, fs->prefix_prefill.mean).c_str());
      std::printf("; checkpoint %s", bench::bytes_text(m.checkpoint_bytes).c_str());
      if (m.mode == "snapshot")
        std::printf("; snapshot of %s in %s ms", bench::bytes_text(m.snapshot_bytes).c_str(),
                    msv(s.snapshot.mean).c_str());
      std::printf("\n");
    }
  }
  std::printf(
      "memory: RSS with the model loaded, no session: %s MiB; RSS once every session ran its "
      "first request -> after the last request:",
      bench::mib(model_rss).c_str());
  for (size_t i = 0; i < modes.size(); ++i)
    std::printf("%s %s %s -> %s MiB", i ? "," : "", modes[i].mode.c_str(),
                bench::mib(modes[i].rss_after_first).c_str(),
                bench::mib(modes[i].rss_after_last).c_str());
  std::printf("\n");
  if (identical >= 0) {
    std::printf(
        "outputs: the %d generated tokens of %d of %d requests are identical across the modes%s\n",
        p.gen_tokens, identical, n_compared, identical == n_compared ? "" : " (NOT all: a bug)");
  }
}

std::string plot(const bench::PinnedParams &p, const std::vector<bench::PinnedMode> &modes) {
  std::vector<PlotSeries> series;
  for (const auto &m : modes) {
    PlotSeries s{m.mode, {}};
    for (const auto &row : m.request_ms)
      for (size_t r = 1; r < row.size(); ++r) s.values_ms.push_back(row[r]);
    series.push_back(std::move(s));
  }
  for (const auto &m : modes) {
    PlotSeries s{m.mode + ": first requests", {}};
    for (const auto &row : m.request_ms)
      if (!row.empty()) s.values_ms.push_back(row[0]);
    series.push_back(std::move(s));
  }
  return svg_latency_plot(
      fmt("geist bench pinned: request latency, %d sessions x %d requests, %d-token prompts "
          "(%d pinned), %d generated",
          p.sessions, p.requests, p.prompt_tokens, p.prefix_tokens, p.gen_tokens),
      series);
}

// ---- The run -----------------------------------------------------------------------

// Runs the schedule over the workers, filling modes[i] from child i. tokens[i][s][r]: the
// ids generated. False after printing an error.
bool drive(std::vector<Child> &children, const PinnedOptions &o,
           std::vector<bench::PinnedMode> *modes,
           std::vector<std::vector<std::vector<std::vector<int32_t>>>> *tokens) {
  const size_t nm = children.size();
  for (size_t i = 0; i < nm; ++i) {
    bench::PinnedMode &m = (*modes)[i];
    m.request_ms.assign(o.sessions, {});
    m.prefill_ms.assign(o.sessions, {});
    m.reset_ms.assign(o.sessions, {});
    (*tokens)[i].assign(o.sessions, {});
  }
  const std::vector<bench::Step> steps =
      bench::interleaved_schedule(o.sessions, o.requests, int(nm));
  Progress progress("bench pinned", steps.size(), !o.c.no_progress);
  for (const bench::Step &st : steps) {
    const Child &c = children[st.mode];
    bench::PinnedMode &m = (*modes)[st.mode];
    Msg r;
    const Cmd cmd{st.kind == bench::Step::kSetup ? Cmd::kSetup : Cmd::kRequest, st.session,
                  st.request};
    if (!call(c, cmd, &r)) return false;
    if (st.kind == bench::Step::kSetup) {
      if (r.d.size() != 4) return malformed(c);
      if (c.mode == kFull) {
        m.prefix_prefill_ms.push_back(r.d[0]);
      } else {
        m.pin_ms.push_back(r.d[0]);
        m.checkpoint_bytes = int64_t(r.d[2]);
      }
      if (c.mode == kSnapshot) {
        m.snapshot_ms.push_back(r.d[1]);
        m.snapshot_bytes = int64_t(r.d[3]);
      }
    } else {
      if (r.d.size() != size_t(4 + o.gen)) return malformed(c);
      m.request_ms[st.session].push_back(r.d[0]);
      m.reset_ms[st.session].push_back(r.d[1]);
      m.prefill_ms[st.session].push_back(r.d[2]);
      if (st.request == 0 && st.session == o.sessions - 1) m.rss_after_first = int64_t(r.d[3]);
      m.rss_after_last = int64_t(r.d[3]);
      if (st.request > 0) m.decode_ms.insert(m.decode_ms.end(), r.d.begin() + 4, r.d.end());
      (*tokens)[st.mode][st.session].push_back(std::move(r.tokens));
    }
    progress.step();
  }
  progress.done();
  for (size_t i = 0; i < nm; ++i) {
    Msg r;
    if (!call(children[i], Cmd{Cmd::kFinish, 0, 0}, &r)) return false;
    if (r.d.size() != 2) return malformed(children[i]);
    (*modes)[i].peak_rss = int64_t(r.d[0]);
  }
  return true;
}

int run(const PinnedOptions &o) {
  std::vector<Mode> mode_ids;
  for (const std::string &name : o.modes) {
    Mode id = name == "full" ? kFull : name == "pin" ? kPin : kSnapshot;
    for (Mode seen : mode_ids) {
      if (seen == id) {
        std::fprintf(stderr, "geist: error: --mode lists '%s' twice\n", name.c_str());
        return 2;
      }
    }
    mode_ids.push_back(id);
  }
  if (!outputs_writable(o.c)) return 1;
  api::Model model;
  if (!load_api_model(o.c.model, &model, nullptr, &o.c.dev)) return 1;
  const geist_model_info info = model.info();
  const int64_t n_ctx = o.n_ctx > 0 ? o.n_ctx : info.n_ctx_train;
  if (int64_t(o.prompt) + o.gen > n_ctx) {
    std::fprintf(stderr,
                 "geist: error: a prompt of %d tokens plus %d generated needs a context of %d, but "
                 "it holds %lld "
                 "(lower -P or -n, or raise -c)\n",
                 o.prompt, o.gen, o.prompt + o.gen, (long long)n_ctx);
    return 1;
  }
  bench::PinnedParams p;
  p.sessions = o.sessions, p.requests = o.requests, p.prompt_tokens = o.prompt, p.chunk = o.chunk;
  p.gen_tokens = o.gen, p.prefix_fraction = o.fraction;
  p.prefix_tokens = int(std::clamp(std::lround(o.fraction * o.prompt), 1L, long(o.prompt - 1)));
  Workload w;
  if (api::Error e = build_workload(model, o, p.prefix_tokens, &w)) return report(e);
  const bench::Environment env =
      collect_environment("pinned", model, o.c.model, bench_threads(o.threads), n_ctx, o.c.hash);
  const int64_t model_rss = proc_status_bytes("VmRSS");

  geist_session_params sp = geist_session_params_default();
  sp.n_ctx = n_ctx;
  sp.n_threads = o.threads;
  sp.chunk = o.chunk;
  apply_kv_types(o.c.dev, &sp);
  sp.sampling.temperature = 0;  // greedy: every mode must generate the same tokens
  signal(SIGPIPE, SIG_IGN);     // a worker that dies is reported, not fatal to the parent
  std::vector<Child> children;
  std::vector<int> open_fds;
  const bool in_process = o.c.dev.backend != "cpu";
  if (in_process) {
    std::printf("note: the %s backend's modes run in this process (a device context does not survive fork): "
                "the peak RSS column is the whole process's\n",
                o.c.dev.backend.c_str());
  }
  for (Mode id : mode_ids) {
    Child c;
    if (in_process) {
      c.mode = id;
      c.local = std::make_shared<Worker>(model, id, w, sp, o.gen);
      children.push_back(c);
      continue;
    }
    if (!spawn_worker(id, model, w, sp, o.gen, &open_fds, &c)) {
      std::fprintf(stderr, "geist: error: cannot start a worker process: %s\n",
                   std::strerror(errno));
      stop_workers(children);
      return 1;
    }
    children.push_back(c);
  }
  std::vector<bench::PinnedMode> modes(mode_ids.size());
  for (size_t i = 0; i < mode_ids.size(); ++i) modes[i].mode = kModeNames[mode_ids[i]];
  std::vector<std::vector<std::vector<std::vector<int32_t>>>> tokens(
      mode_ids.size());  // [mode][s][r][g]
  const bool ok = drive(children, o, &modes, &tokens);
  stop_workers(children);
  if (!ok) return 1;

  int identical = -1, n_compared = 0;
  if (modes.size() > 1 && o.gen > 0) {
    identical = 0;
    for (int s = 0; s < o.sessions; ++s)
      for (int r = 0; r < o.requests; ++r) {
        bool same = true;
        for (size_t i = 1; i < modes.size(); ++i) same = same && tokens[i][s][r] == tokens[0][s][r];
        identical += same;
        ++n_compared;
      }
  }
  print_report(env, p, modes, identical, n_compared, model_rss);
  const nlohmann::json doc = bench::pinned_json(env, p, modes,
                                                identical < 0             ? -1
                                                : identical == n_compared ? 1
                                                                          : 0,
                                                model_rss);
  if (!write_outputs(o.c, doc, o.c.plot.empty() ? std::string() : plot(p, modes))) return 1;
  return 0;
}

}  // namespace

Runner add_bench_pinned(CLI::App &bench) {
  auto o = std::make_shared<PinnedOptions>();
  CLI::App *sub =
      bench.add_subcommand("pinned",
                           "The pinned-prefix workload: sessions x requests sharing a prefix, "
                           "modes full / pin / snapshot, P50/P95, pin cost, peak RSS");
  add_bench_common(sub, &o->c);
  sub->add_option("-t,--threads", o->threads, "Threads per session (0: all)")
      ->capture_default_str()
      ->check(int_range(0, 512));
  sub->add_option("-c,--ctx-size", o->n_ctx, "Context of each session in tokens (0: the model's)")
      ->capture_default_str()
      ->check(int_range(int64_t(0), int64_t(1) << 24));
  sub->add_option("-S,--sessions", o->sessions, "Sessions (document figures)")
      ->capture_default_str()
      ->check(int_range(1, 1000));
  sub->add_option("-R,--requests", o->requests, "Requests per session")
      ->capture_default_str()
      ->check(int_range(1, 1000000));
  sub->add_option("-P,--prompt-tokens", o->prompt, "Tokens of each prompt (prefix + request)")
      ->capture_default_str()
      ->check(int_range(2, 1 << 24));
  sub->add_option("-f,--prefix-fraction", o->fraction,
                  "Fraction of the prompt that is the session's constant prefix")
      ->capture_default_str()
      ->check(real_range(0.0, 1.0));
  sub->add_option("-b,--chunk", o->chunk, "Prefill chunk in tokens (as apps call prefill_tokens)")
      ->capture_default_str()
      ->check(int_range(1, 65536));
  sub->add_option("-n,-G,--gen-tokens", o->gen, "Tokens generated per request (greedy)")
      ->capture_default_str()
      ->check(int_range(0, 1 << 20));
  sub->add_option("--mode", o->modes, "Modes to run, comma-separated: full, pin, snapshot")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::IsMember({"full", "pin", "snapshot"}));
  return [o] { return run(*o); };
}

}  // namespace geist::cli

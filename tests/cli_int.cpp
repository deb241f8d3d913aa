// The geist CLI as a subprocess: every bad input ends with a non-zero exit status (not a
// signal), exactly one stderr line "geist: error: ..." naming the problem and nothing on
// stdout; --help and inspect succeed; with the default model, run prints text and a stats
// line. Each child runs under a 60 s watchdog (killed and reported if it hangs).
//
// On the tiny random-weight model (tests/data/tiny_gemma3.gguf, fast): run's prompt cache
// gives the output of a run without it (greedy and sampled) and reports what it reused;
// chat keeps a valid Gemma 3 conversation in its session, continues one across processes
// through --save/--load exactly, refuses bad files, and leaves the session as it was when
// a turn does not fit; perplexity prints the engine's number.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/model.h"
#include "engine/perplexity.h"
#include "engine/session.h"
#include "geist/geist.hpp"
#include "test_util.h"

extern char **environ;

namespace geist {
namespace {

namespace fs = std::filesystem;

const char *kGeist = GEIST_BINARY_DIR "/tools/geist";

struct ProcResult {
  bool exited = false;    // normal exit (WIFEXITED)
  int code = -1;          // exit status if exited
  int signal = 0;         // terminating signal if not
  bool timed_out = false;
  std::string out, err;
};

// A fresh temporary directory (unique within the process), removed at the end.
class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    const auto *info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() / ("geist_cli_int_" + std::to_string(getpid()) + "_" +
                                         (info ? info->name() : "x") + "_" + std::to_string(counter++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string &name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

std::string slurp(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void write_bytes(const std::string &path, const std::vector<uint8_t> &b) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char *>(b.data()), std::streamsize(b.size()));
  ASSERT_TRUE(f.good()) << "cannot write " << path;
}

// How to run a child: stdin from a file holding `input` (from /dev/null if empty),
// stdout to a temporary file or to `stdout_path` (e.g. /dev/full), extra environment
// variables "K=V".
struct RunOptions {
  std::string input;
  int timeout_s = 60;
  std::string stdout_path;
  std::vector<std::string> env;
};

ProcResult run_geist_with(const std::vector<std::string> &args, const RunOptions &o);

// Run geist with args, stdout and stderr to files in dir, stdin from a file holding
// `input` (from /dev/null if input is empty).
ProcResult run_geist(const std::vector<std::string> &args, const std::string &input = "", int timeout_s = 60) {
  RunOptions o;
  o.input = input;
  o.timeout_s = timeout_s;
  return run_geist_with(args, o);
}

ProcResult run_geist_with(const std::vector<std::string> &args, const RunOptions &o) {
  const std::string &input = o.input;
  const int timeout_s = o.timeout_s;
  ProcResult r;
  TempDir dir;
  const std::string out_path = dir.file("stdout"), err_path = dir.file("stderr"), in_path = dir.file("stdin");
  if (!input.empty()) {
    std::ofstream f(in_path, std::ios::binary);
    f << input;
  }
  std::vector<std::string> argv_s = {kGeist};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char *> argv;
  for (std::string &s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_s;
  for (char **e = environ; *e; ++e) env_s.push_back(*e);
  env_s.insert(env_s.end(), o.env.begin(), o.env.end());
  std::vector<char *> envp;
  for (std::string &s : env_s) envp.push_back(s.data());
  envp.push_back(nullptr);

  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, input.empty() ? "/dev/null" : in_path.c_str(), O_RDONLY, 0);
  if (o.stdout_path.empty()) {
    posix_spawn_file_actions_addopen(&fa, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  } else {
    posix_spawn_file_actions_addopen(&fa, 1, o.stdout_path.c_str(), O_WRONLY, 0);
  }
  posix_spawn_file_actions_addopen(&fa, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, kGeist, &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    ADD_FAILURE() << "posix_spawn " << kGeist << ": " << std::strerror(rc);
    return r;
  }
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  for (;;) {
    const pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (w < 0) {
      ADD_FAILURE() << "waitpid: " << std::strerror(errno);
      return r;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      r.timed_out = true;
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  r.exited = WIFEXITED(status);
  r.code = r.exited ? WEXITSTATUS(status) : -1;
  r.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  r.out = slurp(out_path);
  r.err = slurp(err_path);
  EXPECT_FALSE(r.timed_out) << "geist did not finish within " << timeout_s << " s";
  return r;
}

std::string describe(const ProcResult &r) {
  return "exit " + (r.exited ? std::to_string(r.code) : "by signal " + std::to_string(r.signal)) +
         "\n--- stdout ---\n" + r.out + "\n--- stderr ---\n" + r.err;
}

// The error contract: clean non-zero exit, one stderr line "geist: error: ..." containing
// every needle, stdout empty (or whitespace only).
void expect_one_error_line(const ProcResult &r, const std::vector<std::string> &needles) {
  SCOPED_TRACE(describe(r));
  EXPECT_TRUE(r.exited) << "killed by signal " << r.signal;
  EXPECT_NE(r.code, 0);
  EXPECT_LT(r.code, 128);  // not a shell-style signal code either
  EXPECT_EQ(r.out.find_first_not_of(" \n"), std::string::npos) << "stdout not empty";
  ASSERT_FALSE(r.err.empty());
  EXPECT_EQ(r.err.rfind("geist: error: ", 0), 0u) << "stderr does not begin with 'geist: error: '";
  EXPECT_EQ(r.err.back(), '\n');
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "stderr is not exactly one line";
  for (const std::string &n : needles) EXPECT_NE(r.err.find(n), std::string::npos) << "no '" << n << "'";
}

void expect_usage(const ProcResult &r, const std::string &subcommand) {
  SCOPED_TRACE(describe(r));
  EXPECT_TRUE(r.exited);
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("Usage:"), std::string::npos);
  EXPECT_NE(r.out.find(subcommand), std::string::npos);
  EXPECT_NE(r.out.find("--help"), std::string::npos);
  EXPECT_TRUE(r.err.empty());
}

TEST(Cli, MissingModelFile) {
  expect_one_error_line(run_geist({"run", "-m", "/nonexistent.gguf", "-p", "hi"}),
                        {"/nonexistent.gguf", "No such file"});
}

TEST(Cli, RunOnNonGguf) {
  const std::string txt = test::data_path("text/kjv_genesis.txt");
  expect_one_error_line(run_geist({"run", "-m", txt, "-p", "hi"}), {"kjv_genesis.txt", "not a GGUF file"});
}

TEST(Cli, InspectNonGguf) {
  const std::string txt = test::data_path("text/kjv_genesis.txt");
  expect_one_error_line(run_geist({"inspect", txt}), {"kjv_genesis.txt", "not a GGUF file"});
}

TEST(Cli, UnsupportedArchitecture) {
  std::vector<uint8_t> b = test::read_file(test::data_path("tiny.gguf"));
  const std::string key = "general.architecture", value = "gemma3";
  const auto key_at = std::search(b.begin(), b.end(), key.begin(), key.end());
  ASSERT_NE(key_at, b.end()) << "no key string in tiny.gguf";
  // The value follows the key: u32 type (8 = string), u64 length 6, then the bytes.
  const auto at = std::search(key_at + key.size(), b.end(), value.begin(), value.end());
  ASSERT_EQ(at - key_at, ptrdiff_t(key.size() + 12)) << "value is not right after the key";
  ASSERT_EQ(at[-8], 6) << "string length";
  std::copy_n("gemma9", 6, at);
  TempDir dir;
  const std::string path = dir.file("gemma9.gguf");
  write_bytes(path, b);
  expect_one_error_line(run_geist({"run", "-m", path, "-p", "hi"}), {"gemma9", "not supported"});
}

TEST(Cli, TruncatedGguf) {
  std::vector<uint8_t> b = test::read_file(test::data_path("tiny.gguf"));
  ASSERT_GT(b.size(), 100u);
  b.resize(100);
  TempDir dir;
  const std::string path = dir.file("truncated.gguf");
  write_bytes(path, b);
  expect_one_error_line(run_geist({"run", "-m", path, "-p", "hi"}), {"truncated.gguf"});
  expect_one_error_line(run_geist({"inspect", path}), {"truncated.gguf"});
}

TEST(Cli, UnknownFlag) {
  expect_one_error_line(run_geist({"run", "--no-such-flag"}), {"--no-such-flag"});
}

TEST(Cli, UnknownSubcommand) {
  expect_one_error_line(run_geist({"frobnicate"}), {"unknown command", "frobnicate"});
}

TEST(Cli, NegativeThreads) {
  // Rejected while parsing, before any model is loaded, so no model is needed.
  expect_one_error_line(run_geist({"run", "-m", "/nonexistent.gguf", "-p", "hi", "-t", "-5"}),
                        {"--threads", "-5"});
}

TEST(Cli, MissingRequiredArguments) {
  expect_one_error_line(run_geist({"perplexity", "-m", "/nonexistent.gguf"}), {"--file"});
}

TEST(Cli, PerplexityNeedsMoreTokens) {
  GEIST_REQUIRE_MODEL(model);
  TempDir dir;
  const std::string txt = dir.file("short.txt");
  {
    std::ofstream f(txt);
    f << "hello world\n";
  }
  expect_one_error_line(run_geist({"perplexity", "-m", model, "-f", txt}), {"need at least", "tokens"});
}

TEST(Cli, PromptLongerThanContext) {
  GEIST_REQUIRE_MODEL(model);
  expect_one_error_line(
      run_geist({"run", "-m", model, "-c", "32", "-f", test::data_path("text/kjv_genesis.txt"), "-n", "4"}),
      {"prompt", "context", "32"});
}

TEST(Cli, Help) {
  expect_usage(run_geist({"--help"}), "SUBCOMMAND");
  expect_usage(run_geist({"run", "--help"}), "run");
  expect_usage(run_geist({"perplexity", "--help"}), "perplexity");
  expect_usage(run_geist({"inspect", "--help"}), "inspect");
  expect_usage(run_geist({"chat", "--help"}), "chat");
  // The top-level usage lists the subcommands.
  const ProcResult r = run_geist({"--help"});
  for (const char *sub : {"run", "chat", "perplexity", "inspect"}) {
    EXPECT_NE(r.out.find(sub), std::string::npos) << sub;
  }
}

TEST(Cli, InspectTiny) {
  const ProcResult r = run_geist({"inspect", test::data_path("tiny.gguf")});
  SCOPED_TRACE(describe(r));
  EXPECT_TRUE(r.exited);
  EXPECT_EQ(r.code, 0);
  EXPECT_TRUE(r.err.empty());
  for (const char *name : {"token_embd.weight", "blk.0.attn_norm.weight", "blk.0.attn_q.weight",
                           "blk.0.attn_k.weight", "blk.0.ffn_up.weight", "blk.0.ffn_down.weight", "test.f32_4d",
                           "general.architecture", "gemma3"}) {
    EXPECT_NE(r.out.find(name), std::string::npos) << name;
  }
}

TEST(Cli, RunGreedy) {
  GEIST_REQUIRE_MODEL(model);
  const ProcResult r =
      run_geist({"run", "-m", model, "-p", "The capital of France is", "-n", "8", "--temp", "0", "-t", "2"});
  SCOPED_TRACE(describe(r));
  EXPECT_TRUE(r.exited);
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find_first_not_of(" \n"), std::string::npos) << "no generated text";
  EXPECT_EQ(r.err.find("error"), std::string::npos);
  for (const char *w : {"prefill", "decode", "tokens/s"}) EXPECT_NE(r.err.find(w), std::string::npos) << w;
}


// ---------------------------------------------------------------------------------------
// The tiny random-weight model: run --prompt-cache, chat, perplexity.

std::string tiny() { return test::data_path("tiny_gemma3.gguf"); }
const char kPrompt[] = "The capital of France is";

std::vector<std::string> cat(std::vector<std::string> a, const std::vector<std::string> &b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

void expect_ok(const ProcResult &r) {
  SCOPED_TRACE(describe(r));
  EXPECT_TRUE(r.exited);
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.err.find("error"), std::string::npos);
}

// {N, M} of the one stderr line "prompt cache: reused N of M tokens"; {-1, -1} if there
// is none, {-2, -2} if there are several.
std::pair<long, long> reuse(const ProcResult &r) {
  const std::string key = "prompt cache: reused ";
  const size_t at = r.err.find(key);
  if (at == std::string::npos) return {-1, -1};
  if (r.err.find(key, at + 1) != std::string::npos) return {-2, -2};
  long n = -1, m = -1;
  if (std::sscanf(r.err.c_str() + at + key.size(), "%ld of %ld tokens", &n, &m) != 2) return {-1, -1};
  return {n, m};
}

size_t count(const std::string &hay, const std::string &needle) {
  size_t n = 0;
  for (size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + 1)) ++n;
  return n;
}

// The tiny model with one metadata byte changed: it runs the same, but its fingerprint
// (so its snapshots' identity) differs.
std::string renamed_tiny(const TempDir &dir) {
  std::vector<uint8_t> b = test::read_file(tiny());
  const std::string from = "tiny-gemma3-random", to = "tiny-gemma3-RANDOM";
  const auto at = std::search(b.begin(), b.end(), from.begin(), from.end());
  EXPECT_NE(at, b.end()) << "general.name not found in the tiny model";
  if (at != b.end()) std::copy(to.begin(), to.end(), at);
  const std::string path = dir.file("renamed.gguf");
  write_bytes(path, b);
  return path;
}

std::vector<std::string> run_args(const std::string &prompt, const std::vector<std::string> &extra = {}) {
  return cat({"run", "-m", tiny(), "-p", prompt, "-n", "24", "-t", "2"}, extra);
}

TEST(CliTiny, RunGreedy) {
  const ProcResult r = run_geist(run_args(kPrompt, {"--temp", "0"}));
  expect_ok(r);
  EXPECT_NE(r.out.find_first_not_of(" \n"), std::string::npos) << "no generated text";
  for (const char *w : {"load", "prefill 16 tokens", "decode 24 tokens", "tokens/s", "2 host threads", "CPU, ",
                        "memory: weights ", " MiB repacked", ", KV ", " MiB reserved, scratch "}) {
    EXPECT_NE(r.err.find(w), std::string::npos) << w << "\n" << r.err;
  }
}

TEST(CliTiny, RunPromptLongerThanContext) {
  TempDir dir;
  const std::string cache = dir.file("cache.snap");
  expect_one_error_line(run_geist(run_args(kPrompt, {"-c", "8"})), {"prompt", "16 tokens", "context", "8"});
  expect_one_error_line(run_geist(run_args(kPrompt, {"-c", "8", "--prompt-cache", cache})),
                        {"prompt", "16 tokens", "context", "8"});
  EXPECT_FALSE(fs::exists(cache));
}

TEST(CliTiny, RunPromptCacheGivesTheSameOutput) {
  TempDir dir;
  const std::string cache = dir.file("cache.snap");
  const std::vector<std::string> greedy = {"--temp", "0"};
  const ProcResult plain = run_geist(run_args(kPrompt, greedy));
  expect_ok(plain);
  EXPECT_EQ(reuse(plain).first, -1) << "no cache, no cache line";

  const ProcResult first = run_geist(run_args(kPrompt, cat(greedy, {"--prompt-cache", cache})));
  expect_ok(first);
  EXPECT_EQ(reuse(first), std::make_pair(0L, 16L)) << first.err;
  EXPECT_EQ(first.out, plain.out);
  EXPECT_TRUE(fs::exists(cache));
  EXPECT_FALSE(fs::exists(cache + ".tmp"));

  const ProcResult second = run_geist(run_args(kPrompt, cat(greedy, {"--prompt-cache", cache})));
  expect_ok(second);
  EXPECT_EQ(reuse(second), std::make_pair(16L, 16L)) << second.err;
  EXPECT_NE(second.err.find("prefill 0 tokens"), std::string::npos) << second.err;
  EXPECT_EQ(second.out, plain.out);
}

TEST(CliTiny, RunPromptCacheReusesAPrefix) {
  TempDir dir;
  const std::string cache = dir.file("cache.snap");
  const std::vector<std::string> args = {"--temp", "0", "--prompt-cache", cache};
  ASSERT_EQ(reuse(run_geist(run_args(kPrompt, args))), std::make_pair(0L, 16L));
  // The cached tokens are a prefix of the prompt: only the rest is prefilled.
  const std::string longer = std::string(kPrompt) + " Paris, and";
  const ProcResult a = run_geist(run_args(longer, args));
  expect_ok(a);
  const auto [na, ma] = reuse(a);
  EXPECT_EQ(na, 16);
  EXPECT_GT(ma, 16);
  EXPECT_EQ(a.out, run_geist(run_args(longer, {"--temp", "0"})).out);
  // Now the file holds `longer` with kPrompt pinned: a prompt that continues kPrompt
  // differently goes back to the pin.
  const std::string other = std::string(kPrompt) + " Berlin";
  const ProcResult b = run_geist(run_args(other, args));
  expect_ok(b);
  EXPECT_EQ(reuse(b).first, 16) << b.err;
  EXPECT_EQ(b.out, run_geist(run_args(other, {"--temp", "0"})).out);
  // Nothing in common: all of it is evaluated.
  const ProcResult c = run_geist(run_args("Once upon a time", args));
  expect_ok(c);
  EXPECT_EQ(reuse(c).first, 0) << c.err;
  EXPECT_EQ(c.out, run_geist(run_args("Once upon a time", {"--temp", "0"})).out);
}

TEST(CliTiny, RunPromptCacheSampledUsesThisRunsSeed) {
  TempDir dir;
  const std::string cache = dir.file("cache.snap");
  const std::vector<std::string> s5 = {"--temp", "0.9", "--seed", "5"}, s6 = {"--temp", "0.9", "--seed", "6"};
  const ProcResult p5 = run_geist(run_args(kPrompt, s5)), p6 = run_geist(run_args(kPrompt, s6));
  ASSERT_NE(p5.out, p6.out) << "the seeds should give different text";
  EXPECT_EQ(run_geist(run_args(kPrompt, cat(s5, {"--prompt-cache", cache}))).out, p5.out);
  const ProcResult r = run_geist(run_args(kPrompt, cat(s6, {"--prompt-cache", cache})));
  expect_ok(r);
  EXPECT_EQ(reuse(r), std::make_pair(16L, 16L));
  EXPECT_EQ(r.out, p6.out);
}

TEST(CliTiny, RunPromptCacheFallsBackOnABadFile) {
  TempDir dir;
  const std::string cache = dir.file("cache.snap");
  const std::vector<std::string> greedy = {"--temp", "0"};
  const ProcResult plain = run_geist(run_args(kPrompt, greedy));
  // A damaged snapshot (geist's own file, cut short) is not used and is replaced.
  ASSERT_EQ(run_geist(run_args(kPrompt, cat(greedy, {"--prompt-cache", cache}))).code, 0);
  std::string img = slurp(cache);
  ASSERT_GT(img.size(), 200u);
  img.resize(img.size() / 2);
  write_bytes(cache, std::vector<uint8_t>(img.begin(), img.end()));
  const ProcResult r = run_geist(run_args(kPrompt, cat(greedy, {"--prompt-cache", cache})));
  SCOPED_TRACE(describe(r));
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(count(r.err, "warning: prompt cache not used"), 1u);
  EXPECT_NE(r.err.find("truncated"), std::string::npos);
  EXPECT_EQ(reuse(r), std::make_pair(0L, 16L));
  EXPECT_EQ(r.out, plain.out);
  // It was replaced by a good one.
  EXPECT_EQ(reuse(run_geist(run_args(kPrompt, cat(greedy, {"--prompt-cache", cache})))), std::make_pair(16L, 16L));

  // A snapshot of another model.
  const std::string other = dir.file("other.snap");
  const ProcResult o =
      run_geist({"run", "-m", renamed_tiny(dir), "-p", kPrompt, "-n", "1", "--prompt-cache", other});
  ASSERT_EQ(o.code, 0) << describe(o);
  const ProcResult m = run_geist(run_args(kPrompt, cat(greedy, {"--prompt-cache", other})));
  EXPECT_EQ(m.code, 0);
  EXPECT_EQ(count(m.err, "warning: prompt cache not used"), 1u) << m.err;
  EXPECT_NE(m.err.find("another model"), std::string::npos) << m.err;
  EXPECT_EQ(m.out, plain.out);
}

std::vector<std::string> chat_args(const std::vector<std::string> &extra, const std::string &model = "") {
  return cat({"chat", "-m", model.empty() ? tiny() : model, "-n", "12", "-t", "2"}, extra);
}

TEST(CliTiny, ChatFirstTurnIsRunChat) {
  for (const std::vector<std::string> &sys : {std::vector<std::string>{}, {"--system", "Be brief."}}) {
    const ProcResult run =
        run_geist(cat({"run", "-m", tiny(), "--chat", "-p", "hello", "-n", "12", "--temp", "0"}, sys));
    const ProcResult chat = run_geist(chat_args(cat({"--temp", "0"}, sys)), "hello\n");
    expect_ok(chat);
    EXPECT_EQ(chat.out, run.out);
    EXPECT_EQ(chat.err.find("> "), std::string::npos) << "prompt shown although stdin is not a terminal";
    EXPECT_NE(chat.err.find("chat: 1 turn"), std::string::npos) << chat.err;
  }
}

// A saved chat session's tokens parsed as Gemma 3 turns: user texts are given, replies
// (at most n_predict tokens each) are found. Fails the test where the tokens deviate.
struct Parsed {
  std::vector<std::vector<geist_token>> replies;
  std::vector<geist_token> ends;  // per reply: the end-of-generation token, or -1
};

Parsed parse_conversation(const api::Model &m, const std::vector<geist_token> &t,
                          const std::vector<std::string> &users, size_t n_predict) {
  Parsed p;
  size_t at = 0;
  auto expect = [&](const std::vector<geist_token> &seq, const std::string &what) {
    const bool ok = at + seq.size() <= t.size() && std::equal(seq.begin(), seq.end(), t.begin() + at);
    EXPECT_TRUE(ok) << what << " expected at token " << at;
    at += seq.size();
    return ok;
  };
  auto toks = [&](const std::string &s, bool special) { return m.tokenize_or_throw(s, false, special); };
  const geist_token eot = toks("<end_of_turn>", true).at(0);
  for (size_t u = 0; u < users.size(); ++u) {
    const std::vector<geist_token> marker = toks("<start_of_turn>user\n", true);
    std::vector<geist_token> open;
    open.reserve(marker.size() + 1);
    if (u == 0) open.push_back(m.info().bos);
    for (geist_token x : marker) open.push_back(x);
    if (!expect(open, "<start_of_turn>user\\n") || !expect(toks(users[u], false), "user text '" + users[u] + "'") ||
        !expect(toks("<end_of_turn>\n<start_of_turn>model\n", true), "end of the user turn")) {
      return p;
    }
    std::vector<geist_token> reply;
    geist_token end = -1;
    while (at < t.size() && reply.size() < n_predict && !m.is_eog(t[at])) reply.push_back(t[at++]);
    if (at < t.size() && m.is_eog(t[at])) end = t[at++];
    p.replies.push_back(reply);
    p.ends.push_back(end);
    // After <end_of_turn> only "\n"; otherwise the whole marker closes the model turn.
    if (!expect(end == eot ? toks("\n", false) : toks("<end_of_turn>\n", true), "end of the model turn")) return p;
  }
  EXPECT_EQ(at, t.size()) << "tokens after the last turn";
  return p;
}

std::vector<geist_token> saved_tokens(const api::Model &m, const std::string &path, size_t *n_pinned = nullptr) {
  api::Session s = api::Session::create_or_throw(m);
  const api::Error e = s.load_file(path);
  EXPECT_FALSE(e) << e.to_string();
  if (n_pinned) *n_pinned = s.n_pinned();
  return s.tokens();
}

std::string detok(const api::Model &m, const std::vector<geist_token> &t) {
  std::string s;
  EXPECT_FALSE(m.detokenize(t, false, &s));
  return s;
}

TEST(CliTiny, ChatHistoryIsAGemmaConversation) {
  TempDir dir;
  const std::string save = dir.file("conv.snap");
  const ProcResult r = run_geist(chat_args({"--temp", "0", "--save", save}), "hello\n  how are you \n");
  expect_ok(r);
  const api::Model m = api::Model::load_or_throw(tiny());
  const Parsed p = parse_conversation(m, saved_tokens(m, save), {"hello", "how are you"}, 12);
  ASSERT_EQ(p.replies.size(), 2u);
  EXPECT_EQ(r.out, detok(m, p.replies[0]) + "\n" + detok(m, p.replies[1]) + "\n");
}

// Gemma 4 turns (model-spec 7.8) on the tiny Gemma 4: a system turn of its own, then
// <|turn>user\n{text}<turn|>\n<|turn>model\n for every user line.
TEST(CliTiny, ChatUsesGemma4TurnsOnGemma4) {
  TempDir dir;
  const std::string save = dir.file("conv4.snap");
  const std::string model = test::data_path("gemma4/tiny_gemma4_a_q8_0.gguf");
  const ProcResult r =
      run_geist(chat_args({"--temp", "0", "--system", " Be brief. ", "--save", save}, model), "hello\nhow are you\n");
  expect_ok(r);
  EXPECT_NE(r.err.find("chat: 2 turns"), std::string::npos) << r.err;
  const api::Model m = api::Model::load_or_throw(model);
  auto toks = [&](const std::string &s, bool special) { return m.tokenize_or_throw(s, false, special); };
  auto cat_t = [](std::vector<geist_token> a, const std::vector<geist_token> &b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  std::vector<geist_token> head{m.info().bos};
  head = cat_t(head, toks("<|turn>system\n", true));
  head = cat_t(head, toks("Be brief.", false));
  head = cat_t(head, toks("<turn|>\n<|turn>user\n", true));
  head = cat_t(head, toks("hello", false));
  head = cat_t(head, toks("<turn|>\n<|turn>model\n", true));
  ASSERT_EQ(toks("<|turn>", true).size(), 1u);  // a control token, not text
  const std::vector<geist_token> t = saved_tokens(m, save);
  ASSERT_GE(t.size(), head.size());
  EXPECT_TRUE(std::equal(head.begin(), head.end(), t.begin())) << "the first turns are not Gemma 4's";
  std::vector<geist_token> second = cat_t(toks("<turn|>\n<|turn>user\n", true), toks("how are you", false));
  second = cat_t(second, toks("<turn|>\n<|turn>model\n", true));
  EXPECT_NE(std::search(t.begin() + head.size(), t.end(), second.begin() + 1, second.end()), t.end())
      << "the second user turn is not framed as Gemma 4's";
}

TEST(CliTiny, ChatClosesAnEndOfTurnReplyWithANewline) {
  // Near-uniform sampling over the 569 tokens ends a reply of up to 300 tokens with an
  // end-of-generation token more often than not; find a seed whose first reply ends on
  // <end_of_turn>, then check the history continues with "\n" and the next user turn.
  const api::Model m = api::Model::load_or_throw(tiny());
  const geist_token eot = m.info().eot;
  ASSERT_GE(eot, 0);
  TempDir dir;
  bool found = false;
  for (int seed = 1; seed <= 40 && !found; ++seed) {
    const std::string save = dir.file("conv" + std::to_string(seed) + ".snap");
    const ProcResult r = run_geist({"chat", "-m", tiny(), "-n", "300", "--temp", "100", "--top-k", "0", "--top-p", "1",
                                    "--min-p", "0", "-s", std::to_string(seed), "--save", save},
                                   "hello\nagain\n");
    ASSERT_EQ(r.code, 0) << describe(r);
    const Parsed p = parse_conversation(m, saved_tokens(m, save), {"hello", "again"}, 300);
    ASSERT_EQ(p.replies.size(), 2u) << "seed " << seed;
    EXPECT_EQ(r.out, detok(m, p.replies[0]) + "\n" + detok(m, p.replies[1]) + "\n") << "seed " << seed;
    found = p.ends[0] == eot;
  }
  EXPECT_TRUE(found) << "no seed in 1..40 ended the first reply with <end_of_turn>";
}

TEST(CliTiny, ChatSaveLoadContinuesExactly) {
  for (const std::vector<std::string> &sampling :
       {std::vector<std::string>{"--temp", "0"}, {"--temp", "0.9", "--seed", "7"}}) {
    SCOPED_TRACE(sampling.size() > 2 ? "sampled" : "greedy");
    TempDir dir;
    const std::string f = dir.file("conv.snap");
    const ProcResult one = run_geist(chat_args(sampling), "hello\nhow are you\nand then?\n");
    expect_ok(one);
    const ProcResult a = run_geist(chat_args(cat(sampling, {"--save", f})), "hello\n");
    const ProcResult b = run_geist(chat_args(cat(sampling, {"--load", f, "--save", f})), "how are you\n");
    const ProcResult c = run_geist(chat_args(cat(sampling, {"--load", f})), "and then?\n");
    expect_ok(a);
    expect_ok(b);
    expect_ok(c);
    EXPECT_FALSE(b.out.empty());
    EXPECT_FALSE(c.out.empty());
    EXPECT_EQ(a.out + b.out + c.out, one.out);
  }
}

TEST(CliTiny, ChatResetGoesBackToThePin) {
  const api::Model m = api::Model::load_or_throw(tiny());
  for (const std::vector<std::string> &sys : {std::vector<std::string>{}, {"--system", "Be brief."}}) {
    SCOPED_TRACE(sys.empty() ? "no system" : "system");
    TempDir dir;
    const std::string f = dir.file("conv.snap");
    const std::vector<std::string> args = cat({"--temp", "0"}, sys);
    const ProcResult two = run_geist(chat_args(args), "hello\nhow are you\n");
    const ProcResult one = run_geist(chat_args(args), "hello\n");
    const ProcResult r = run_geist(chat_args(cat(args, {"--save", f})), "hello\nhow are you\n/reset\nhello\n/reset\n");
    expect_ok(r);
    EXPECT_EQ(r.out, two.out + one.out);
    size_t n_pinned = 0;
    const std::vector<geist_token> t = saved_tokens(m, f, &n_pinned);
    EXPECT_EQ(t.size(), n_pinned) << "the file was saved after the last /reset";
    EXPECT_EQ(n_pinned > 0, !sys.empty());
  }
}

TEST(CliTiny, ChatLoadRefusesBadFiles) {
  TempDir dir;
  const std::string good = dir.file("good.snap");
  ASSERT_EQ(run_geist(chat_args({"--temp", "0", "--save", good}), "hello\n").code, 0);
  const std::vector<uint8_t> img = test::read_file(good);
  ASSERT_GT(img.size(), 200u);

  const std::string missing = dir.file("missing.snap");
  expect_one_error_line(run_geist(chat_args({"--load", missing}), "hi\n"), {"missing.snap", "No such file"});
  const std::string junk = dir.file("junk.snap");
  write_bytes(junk, {'j', 'u', 'n', 'k'});
  expect_one_error_line(run_geist(chat_args({"--load", junk}), "hi\n"), {"junk.snap", "not a geist session snapshot"});
  const std::string cut = dir.file("cut.snap");
  write_bytes(cut, std::vector<uint8_t>(img.begin(), img.begin() + img.size() / 2));
  expect_one_error_line(run_geist(chat_args({"--load", cut}), "hi\n"), {"cut.snap", "truncated"});
  std::vector<uint8_t> flipped = img;
  flipped[flipped.size() / 2] ^= 0x40;
  const std::string bad = dir.file("flipped.snap");
  write_bytes(bad, flipped);
  expect_one_error_line(run_geist(chat_args({"--load", bad}), "hi\n"), {"flipped.snap", "checksum"});
  // The same conversation loaded into another model.
  expect_one_error_line(run_geist(chat_args({"--load", good}, renamed_tiny(dir)), "hi\n"),
                        {"good.snap", "another model"});
}

TEST(CliTiny, ChatLoadRefusesASnapshotOfTheDefaultModel) {
  GEIST_REQUIRE_MODEL(model);
  TempDir dir;
  const std::string f = dir.file("default.snap");
  const ProcResult r = run_geist({"chat", "-m", model, "-c", "64", "-n", "1", "--temp", "0", "--save", f}, "hi\n");
  ASSERT_EQ(r.code, 0) << describe(r);
  expect_one_error_line(run_geist(chat_args({"--load", f}), "hi\n"), {"default.snap", "another model"});
}

TEST(CliTiny, ChatTurnThatDoesNotFitIsNotApplied) {
  TempDir dir;
  const std::string f = dir.file("conv.snap");
  const std::string long_line(90, 'x');
  // Refused at the prefill: the conversation goes on as if the turn had not been sent.
  const ProcResult a = run_geist(chat_args({"--temp", "0", "-c", "64"}), "hello\n" + long_line + "\nhi\n");
  const ProcResult b = run_geist(chat_args({"--temp", "0", "-c", "64"}), "hello\nhi\n");
  SCOPED_TRACE(describe(a));
  EXPECT_EQ(a.code, 0);
  EXPECT_EQ(count(a.err, "context full"), 1u);
  EXPECT_NE(a.err.find("not applied"), std::string::npos);
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(b.err.find("chat: 2 turns"), std::string::npos) << b.err;
  // The context fills during the reply: the reply was shown, the turn is undone, so the
  // same turn again gives the same (cut) reply; nothing was saved.
  const ProcResult c =
      run_geist({"chat", "-m", tiny(), "-t", "2", "--temp", "0", "-c", "30", "-n", "100", "--save", f},
                "hello\nhello\n");
  SCOPED_TRACE(describe(c));
  EXPECT_EQ(c.code, 0);
  EXPECT_EQ(count(c.err, "context full"), 2u);
  ASSERT_EQ(c.out.size() % 2, 0u);
  EXPECT_GT(c.out.size(), 2u);
  EXPECT_EQ(c.out.substr(0, c.out.size() / 2), c.out.substr(c.out.size() / 2));
  EXPECT_NE(c.err.find("chat: 0 turns | context 0 of 30"), std::string::npos);
  EXPECT_FALSE(fs::exists(f));
}

TEST(CliTiny, PerplexityMatchesTheEngine) {
  const std::string text = test::data_path("text/kjv_genesis.txt");
  const ProcResult r = run_geist({"perplexity", "-m", tiny(), "-f", text, "--ctx", "64", "--chunks", "4", "-t", "2"});
  expect_ok(r);
  EXPECT_EQ(r.out.rfind("[1]", 0), 0u) << r.out;
  EXPECT_NE(r.out.find(",[4]"), std::string::npos) << r.out;

  Result<std::unique_ptr<Model>> m = Model::load(tiny());
  ASSERT_TRUE(m) << m.status().to_string();
  SessionParams sp;
  sp.n_ctx = 64;
  sp.chunk = 64;
  Result<std::unique_ptr<Session>> s = Session::create(**m, sp);
  ASSERT_TRUE(s);
  std::string bytes;
  {
    std::ifstream f(text, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(f), {});
  }
  std::vector<int32_t> tokens;
  ASSERT_TRUE((*m)->tokenizer().encode(bytes, true, false, &tokens));
  Result<PerplexityResult> ppl = compute_perplexity(**s, tokens, 64, 4);
  ASSERT_TRUE(ppl);
  char want[128];
  std::snprintf(want, sizeof want, "\nFinal estimate: PPL = %.4f +/- %.5f\n", ppl->ppl, ppl->ppl_stderr);
  EXPECT_NE(r.out.find(want), std::string::npos) << "want" << want << "got " << r.out;
}

// ---- Hardening: files geist must never write, inputs that must not crash or hang ----

std::string file_text(const std::string &path, const std::string &text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  return path;
}

// --prompt-cache onto anything but a geist snapshot (or nothing) is refused before the
// model loads, and the file is left exactly as it was: the prompt file itself, the model
// in use, a user's file, a symlink, a FIFO, a directory, a device.
TEST(CliTiny, PromptCacheNeverReplacesOtherFiles) {
  TempDir dir;
  const std::string prompt = file_text(dir.file("prompt.txt"), "Hello there, how are you\n");
  const std::string model = dir.file("model.gguf");
  write_bytes(model, test::read_file(tiny()));
  const std::string notes = file_text(dir.file("notes.txt"), "keep me\n");
  const std::string snap = dir.file("good.snap");
  ASSERT_EQ(run_geist({"run", "-m", model, "-p", "hi", "-n", "1", "--prompt-cache", snap}).code, 0);
  const std::string link = dir.file("link.snap");
  ASSERT_EQ(symlink(snap.c_str(), link.c_str()), 0);
  const std::string fifo = dir.file("fifo");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const std::string sub = dir.file("sub");
  fs::create_directories(sub);
  struct Case {
    std::vector<std::string> args;
    std::vector<std::string> needles;
  };
  const std::vector<Case> cases = {
      {{"-f", prompt, "--prompt-cache", prompt}, {"prompt.txt", "the prompt file"}},
      {{"-p", "hi", "--prompt-cache", model}, {"model.gguf", "the model file"}},
      {{"-p", "hi", "--prompt-cache", notes}, {"notes.txt", "not a geist snapshot"}},
      {{"-p", "hi", "--prompt-cache", link}, {"link.snap", "symbolic link"}},
      {{"-p", "hi", "--prompt-cache", fifo}, {"fifo", "FIFO"}},
      {{"-p", "hi", "--prompt-cache", sub}, {"sub", "directory"}},
      {{"-p", "hi", "--prompt-cache", "/dev/null"}, {"/dev/null", "character device"}},
      {{"-p", "hi", "--prompt-cache", dir.file("no/such/dir/x.snap")}, {"x.snap", "No such file"}},
  };
  const std::vector<uint8_t> model_bytes = test::read_file(model), snap_bytes = test::read_file(snap);
  for (const Case &c : cases) {
    const ProcResult r = run_geist_with(cat({"run", "-m", model, "-n", "4"}, c.args), {"", 20, "", {}});
    expect_one_error_line(r, c.needles);
    EXPECT_EQ(r.err.find("load "), std::string::npos) << "work was done before the refusal";
  }
  EXPECT_EQ(slurp(prompt), "Hello there, how are you\n");
  EXPECT_TRUE(test::read_file(model) == model_bytes);
  EXPECT_EQ(slurp(notes), "keep me\n");
  EXPECT_TRUE(test::read_file(snap) == snap_bytes);
  struct stat st {};
  ASSERT_EQ(lstat(link.c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode));
  ASSERT_EQ(stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode)) << "/dev/null is no longer a device";
  // The same rule for chat --save, checked before the model loads and a reply streams.
  for (const std::string &target : {notes, link, model, std::string("/dev/null"), dir.file("no/dir/c.snap")}) {
    const ProcResult r = run_geist(chat_args({"--save", target}, model), "hello\n");
    SCOPED_TRACE(target);
    expect_one_error_line(r, {"--save"});
    EXPECT_TRUE(r.out.empty()) << "a reply streamed before the refusal";
  }
  EXPECT_EQ(slurp(notes), "keep me\n");
  EXPECT_TRUE(test::read_file(model) == model_bytes);
}

// An endless prompt file fails fast at the documented limit; a FIFO as the model fails at
// once instead of blocking in open(); a directory as a text file is named as one.
TEST(CliTiny, BadInputFilesFailCleanly) {
  const auto t0 = std::chrono::steady_clock::now();
  expect_one_error_line(run_geist({"run", "-m", tiny(), "-f", "/dev/zero"}), {"/dev/zero", "limit"});
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30.0);
  TempDir dir;
  const std::string fifo = dir.file("model.fifo");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  expect_one_error_line(run_geist({"run", "-m", fifo, "-p", "hi"}, "", 10), {"model.fifo", "FIFO"});
  expect_one_error_line(run_geist({"inspect", fifo}, "", 10), {"model.fifo", "FIFO"});
  const std::string d = dir.file("adir");
  fs::create_directories(d);
  expect_one_error_line(run_geist({"run", "-m", tiny(), "-f", d}), {"adir", "is a directory"});
  expect_one_error_line(run_geist({"perplexity", "-m", tiny(), "-f", d}), {"adir", "is a directory"});
  expect_one_error_line(run_geist({"run", "-m", tiny(), "-f", dir.file("missing.txt")}),
                        {"missing.txt", "No such file"});
  expect_one_error_line(run_geist({"run", "-m", tiny(), "-f", file_text(dir.file("empty.txt"), "")}),
                        {"empty.txt", "empty"});
  // -f - reads stdin.
  const ProcResult r = run_geist({"run", "-m", tiny(), "-f", "-", "-n", "2", "--temp", "0"}, "Hello there");
  EXPECT_EQ(r.code, 0) << describe(r);
}

// Output that cannot be written is an error, not a silent success.
TEST(CliTiny, StdoutWriteErrorsAreReported) {
  if (access("/dev/full", W_OK) != 0) GTEST_SKIP() << "no writable /dev/full here";
  RunOptions o;
  o.stdout_path = "/dev/full";
  for (const std::vector<std::string> &args :
       {run_args(kPrompt, {"--temp", "0"}), std::vector<std::string>{"inspect", tiny()}}) {
    const ProcResult r = run_geist_with(args, o);
    SCOPED_TRACE(describe(r));
    EXPECT_TRUE(r.exited);
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.err.find("geist: error: cannot write the output"), std::string::npos);
  }
  o.input = "hello\n";
  const ProcResult c = run_geist_with(chat_args({"--temp", "0"}), o);
  EXPECT_EQ(c.code, 1) << describe(c);
  EXPECT_NE(c.err.find("cannot write the output"), std::string::npos) << c.err;
}

// Every option value the CLI cannot use gets one precise line (what is wrong, the bound
// as written), exit 2, before the model loads.
TEST(Cli, OptionValuesGetPreciseErrors) {
  const std::string m = "/nonexistent.gguf";  // parsing fails first: no model needed
  struct Case {
    std::vector<std::string> args;
    std::vector<std::string> needles;
  };
  const std::vector<Case> cases = {
      {{"run", "-m", m, "-p", "hi", "--temp", "nan"}, {"--temp", "not a finite number"}},
      {{"run", "-m", m, "-p", "hi", "--top-p", "NaN"}, {"--top-p", "not a finite number"}},
      {{"run", "-m", m, "-p", "hi", "--min-p", "inf"}, {"--min-p", "not a finite number"}},
      {{"run", "-m", m, "-p", "hi", "--temp", "1000"}, {"--temp", "outside [0, 100]"}},
      {{"run", "-m", m, "-p", "hi", "--repeat-penalty", "0"}, {"--repeat-penalty", "greater than 0"}},
      {{"run", "-m", m, "-p", "hi", "--repeat-penalty", "nan"}, {"--repeat-penalty", "not a finite number"}},
      {{"run", "-m", m, "-p", "hi", "-n", "abc"}, {"--n-predict", "'abc' is not an integer"}},
      {{"run", "-m", m, "-p", "hi", "-t", "1.5"}, {"--threads", "not an integer"}},
      {{"run", "-m", m, "-p", "hi", "-c", "99999999999999999999"}, {"--ctx-size", "outside"}},
      {{"run", "-m", m, "-p", "hi", "--seed", "18446744073709551616"}, {"--seed", "outside [0, 2^64-1]"}},
      {{"run", "-m", m, "-p", "hi", "--seed", "-2"}, {"--seed", "not a seed"}},
      {{"chat", "-m", m, "--temp", "nan"}, {"--temp", "not a finite number"}},
      {{"perplexity", "-m", m, "-f", "x", "-c", "abc"}, {"not an integer"}},
      {{"bench", "rows", "-m", m, "--threshold", "nan"}, {"--threshold", "not a finite number"}},
  };
  for (const Case &c : cases) {
    const ProcResult r = run_geist(c.args);
    SCOPED_TRACE(c.args.back());
    expect_one_error_line(r, c.needles);
    EXPECT_EQ(r.code, 2);
    EXPECT_LT(r.err.size(), 160u) << "a long message (a 300-digit bound?)";
  }
}

// Combinations that used to be silently ignored are errors; -1 as a seed is documented
// (a random seed, printed); GEIST_ACT with an unknown value warns.
TEST(CliTiny, AmbiguousCommandLinesAreErrors) {
  TempDir dir;
  const std::string p = file_text(dir.file("p.txt"), "Hello");
  expect_one_error_line(run_geist({"run", "-m", tiny(), "-p", "hi", "-f", p}), {"either -p", "not both"});
  expect_one_error_line(run_geist({"run", "-m", tiny(), "-p", "hi", "--system", "Be brief."}), {"--system", "--chat"});
  const ProcResult r = run_geist({"run", "-m", tiny(), "-p", kPrompt, "-n", "2", "--seed", "-1"});
  EXPECT_EQ(r.code, 0) << describe(r);
  EXPECT_NE(r.err.find("(random; pass -s "), std::string::npos) << r.err;
  RunOptions o;
  o.env = {"GEIST_ACT=bogus"};
  const ProcResult a = run_geist_with({"run", "-m", tiny(), "-p", kPrompt, "-n", "1"}, o);
  EXPECT_EQ(a.code, 0) << describe(a);
  EXPECT_NE(a.err.find("GEIST_ACT=bogus is not one of q8, f32"), std::string::npos) << a.err;
}

// The tiny model with context_length = 2^32 - 1: the default context cannot be made, and
// the message says to pass -c; with -c it runs.
TEST(CliTiny, HugeTrainedContextAsksForCtx) {
  std::vector<uint8_t> b = test::read_file(tiny());
  const std::string key = "gemma3.context_length";
  const auto at = std::search(b.begin(), b.end(), key.begin(), key.end());
  ASSERT_NE(at, b.end());
  const size_t value = size_t(at - b.begin()) + key.size() + 4;  // after the u32 type
  uint32_t type = 0;
  std::memcpy(&type, &b[value - 4], 4);
  ASSERT_EQ(type, 4u) << "context_length is not a u32 in the tiny model";
  const uint32_t huge = 0xFFFFFFFFu;
  std::memcpy(&b[value], &huge, 4);
  TempDir dir;
  const std::string path = dir.file("huge_ctx.gguf");
  write_bytes(path, b);
  expect_one_error_line(run_geist({"run", "-m", path, "-p", "hi", "-n", "1"}), {"4294967295", "-c"});
  EXPECT_EQ(run_geist({"run", "-m", path, "-p", "hi", "-n", "1", "-c", "256"}).code, 0);
}

// A model file truncated while geist runs: the mapping faults (SIGBUS); the message names
// the file. The chat is fed through a pipe so the truncation lands between two turns.
TEST(CliTiny, TruncatedModelWhileRunningNamesTheFile) {
  TempDir dir;
  const std::string model = dir.file("victim.gguf");
  write_bytes(model, test::read_file(tiny()));
  const std::string out_path = dir.file("out"), err_path = dir.file("err");
  int in[2];
  ASSERT_EQ(pipe(in), 0);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  posix_spawn_file_actions_addclose(&fa, in[1]);
  posix_spawn_file_actions_addopen(&fa, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&fa, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  std::vector<std::string> args = {kGeist, "chat", "-m", model, "-n", "4", "-t", "1", "--temp", "0"};
  std::vector<char *> argv;
  for (std::string &a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  ASSERT_EQ(posix_spawn(&pid, kGeist, &fa, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&fa);
  close(in[0]);
  const std::string first = "hello there\n";
  ASSERT_EQ(write(in[1], first.data(), first.size()), ssize_t(first.size()));
  // The first reply ends with a newline on stdout: the model is loaded and in use.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (slurp(out_path).find('\n') == std::string::npos && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(truncate(model.c_str(), 0), 0);
  const std::string second = "tell me about the world and its many wonderful things\n";
  const ssize_t w = write(in[1], second.data(), second.size());
  (void)w;
  close(in[1]);
  int status = 0;
  waitpid(pid, &status, 0);
  const std::string err = slurp(err_path);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    GTEST_SKIP() << "the second turn touched no truncated page (every weight it read was repacked): " << err;
  }
  ASSERT_TRUE(WIFSIGNALED(status)) << "status " << status << ": " << err;
  EXPECT_EQ(WTERMSIG(status), SIGBUS);
  EXPECT_NE(err.find("geist: fatal: bus error"), std::string::npos) << err;
  EXPECT_NE(err.find("victim.gguf"), std::string::npos) << err;
}

}  // namespace
}  // namespace geist

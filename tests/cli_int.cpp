// The geist CLI as a subprocess: every bad input ends with a non-zero exit status (not a
// signal), exactly one stderr line "geist: error: ..." naming the problem and nothing on
// stdout; --help and inspect succeed; with the default model, run prints text and a stats
// line. Each child runs under a 60 s watchdog (killed and reported if it hangs).
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

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

// Run geist with args, stdout and stderr to files in dir, stdin from /dev/null.
ProcResult run_geist(const std::vector<std::string> &args, int timeout_s = 60) {
  ProcResult r;
  TempDir dir;
  const std::string out_path = dir.file("stdout"), err_path = dir.file("stderr");
  std::vector<std::string> argv_s = {kGeist};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char *> argv;
  for (std::string &s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&fa, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, kGeist, &fa, nullptr, argv.data(), environ);
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
  // The top-level usage lists the subcommands.
  const ProcResult r = run_geist({"--help"});
  for (const char *sub : {"run", "perplexity", "inspect"}) EXPECT_NE(r.out.find(sub), std::string::npos) << sub;
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

}  // namespace
}  // namespace geist

// `geist bench` as a subprocess on the tiny random-weight model (tests/data/tiny_gemma3.gguf,
// n_ctx_train 512): each subcommand exits 0 with its table on stdout, writes JSON that
// follows docs/BENCH.md's schema (bench::check_bench_json) and an SVG file; bad flags end
// with one "geist: error: ..." line on stderr and nothing on stdout. Speed is not asserted.
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

#include "bench_stats.h"
#include "test_util.h"

extern char **environ;

namespace geist {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const char *kGeist = GEIST_BINARY_DIR "/tools/geist";

struct ProcResult {
  bool exited = false;
  int code = -1, signal = 0;
  std::string out, err;
};

class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ = fs::temp_directory_path() /
            ("geist_cli_bench_" + std::to_string(getpid()) + "_" + std::to_string(counter++));
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

// geist with args; stdin /dev/null, stdout and stderr to files; killed after timeout_s.
ProcResult run_geist(const std::vector<std::string> &args, int timeout_s = 120) {
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
    if (w < 0 || std::chrono::steady_clock::now() > deadline) {
      ADD_FAILURE() << "geist did not finish within " << timeout_s << " s";
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
  return r;
}

std::string describe(const ProcResult &r) {
  return "exit " + (r.exited ? std::to_string(r.code) : "by signal " + std::to_string(r.signal)) +
         "\n--- stdout ---\n" + r.out + "\n--- stderr ---\n" + r.err;
}

void expect_ok(const ProcResult &r) {
  EXPECT_TRUE(r.exited && r.code == 0) << describe(r);
}

void expect_one_error_line(const ProcResult &r, const std::vector<std::string> &needles) {
  SCOPED_TRACE(describe(r));
  EXPECT_TRUE(r.exited);
  EXPECT_NE(r.code, 0);
  EXPECT_LT(r.code, 128);
  EXPECT_EQ(r.out.find_first_not_of(" \n"), std::string::npos) << "stdout not empty";
  EXPECT_EQ(r.err.rfind("geist: error: ", 0), 0u);
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "stderr is not exactly one line";
  for (const std::string &n : needles)
    EXPECT_NE(r.err.find(n), std::string::npos) << "no '" << n << "'";
}

// Parses a --json file and checks it against the schema; returns it (null on failure).
json load_checked(const std::string &path, const std::string &command) {
  json j;
  try {
    j = json::parse(slurp(path));
  } catch (const std::exception &e) {
    ADD_FAILURE() << path << ": not JSON: " << e.what();
    return json();
  }
  const std::vector<std::string> errors = cli::bench::check_bench_json(j);
  std::string all;
  for (const std::string &e : errors) all += e + "\n";
  EXPECT_TRUE(errors.empty()) << all;
  EXPECT_EQ(j.value("command", ""), command);
  return j;
}

void expect_svg(const std::string &path) {
  const std::string s = slurp(path);
  EXPECT_NE(s.find("<svg"), std::string::npos) << path;
  EXPECT_NE(s.find("</svg>"), std::string::npos) << path;
}

std::string tiny() {
  return test::data_path("tiny_gemma3.gguf");
}

TEST(CliBench, PinnedAllModes) {
  TempDir dir;
  const std::string js = dir.file("p.json"), svg = dir.file("p.svg");
  const ProcResult r = run_geist({"bench", "pinned", "-m", tiny(), "-P", "200", "-S", "2", "-R",
                                  "3", "-n", "3", "--json", js, "--plot", svg});
  expect_ok(r);
  for (const char *s :
       {"geist bench pinned", "kernels:", "model:", "n_ctx: 512", "| mode", "| full", "| pin",
        "| snapshot", "ratio to full", "prefix 80", "6 of 6 requests are identical"})
    EXPECT_NE(r.out.find(s), std::string::npos) << "no '" << s << "' in\n" << r.out;
  const json j = load_checked(js, "pinned");
  ASSERT_TRUE(j.is_object());
  ASSERT_EQ(j["results"]["modes"].size(), 3u);
  for (const json &m : j["results"]["modes"]) {
    EXPECT_EQ(m["request_ms"]["n"], 2 * (3 - 1)) << m["mode"];  // requests after the first
    EXPECT_EQ(m["first_request_ms"]["n"], 2) << m["mode"];
    EXPECT_GT(m["peak_rss_bytes"].get<int64_t>(), 0) << m["mode"];
  }
  EXPECT_EQ(j["results"]["modes"][1]["pin_ms"]["n"], 2);
  EXPECT_GT(j["results"]["modes"][2]["snapshot_bytes"].get<int64_t>(), 0);
  EXPECT_EQ(j["results"]["outputs_identical"], true);
  EXPECT_EQ(j["params"]["prefix_tokens"], 80);
  expect_svg(svg);
}

TEST(CliBench, PinnedOneMode) {
  TempDir dir;
  const std::string js = dir.file("p.json");
  const ProcResult r = run_geist({"bench", "pinned", "-m",     tiny(), "-P",     "64", "-f",
                                  "0.5",   "-S",     "1",      "-R",   "2",      "-n", "0",
                                  "-b",    "16",     "--mode", "pin",  "--json", js,   "--hash"});
  expect_ok(r);
  EXPECT_EQ(r.out.find("ratio to full"), std::string::npos);
  const json j = load_checked(js, "pinned");
  ASSERT_TRUE(j.is_object());
  EXPECT_TRUE(j["results"]["modes"][0]["ratio_to_full"].is_null());
  EXPECT_TRUE(j["results"]["outputs_identical"].is_null());
  EXPECT_EQ(j["environment"]["model"]["sha256"].get<std::string>().size(), 64u);
}

TEST(CliBench, PpTgFormats) {
  TempDir dir;
  const std::string js = dir.file("t.json"), svg = dir.file("t.svg");
  const std::vector<std::string> base = {"bench", "pp-tg", "-m", tiny(), "-p", "32",
                                         "-n",    "8",     "-r", "2",    "-d", "0,16"};
  std::vector<std::string> md = base;
  md.insert(md.end(), {"--json", js, "--plot", svg});
  const ProcResult r = run_geist(md);
  expect_ok(r);
  for (const char *s : {"geist bench pp-tg", "| model", "| backend |", "pp32", "tg8", "pp32 @ d16",
                        "tg8 @ d16", " ± "})
    EXPECT_NE(r.out.find(s), std::string::npos) << "no '" << s << "' in\n" << r.out;
  const json j = load_checked(js, "pp-tg");
  ASSERT_TRUE(j.is_object());
  ASSERT_EQ(j["results"].size(), 4u);
  EXPECT_EQ(j["results"][0]["samples_ns"].size(), 2u);
  EXPECT_GT(j["results"][0]["avg_ts"].get<double>(), 0);
  expect_svg(svg);

  std::vector<std::string> csv = base;
  csv.insert(csv.end(), {"-o", "csv"});
  const ProcResult c = run_geist(csv);
  expect_ok(c);
  EXPECT_EQ(std::count(c.out.begin(), c.out.end(), '\n'), 5) << c.out;
  EXPECT_EQ(c.out.rfind("build_commit,", 0), 0u) << c.out;
  EXPECT_NE(c.err.find("geist bench pp-tg"), std::string::npos) << "environment header on stderr";

  std::vector<std::string> jo = base;
  jo.insert(jo.end(), {"-o", "json"});
  const ProcResult o = run_geist(jo);
  expect_ok(o);
  json a;
  ASSERT_NO_THROW(a = json::parse(o.out)) << o.out;
  ASSERT_TRUE(a.is_array());
  ASSERT_EQ(a.size(), 4u);
  for (const char *k : {"avg_ts", "stddev_ts", "avg_ns", "n_prompt", "n_gen", "n_depth",
                        "n_threads", "model_filename"})
    EXPECT_TRUE(a[3].contains(k)) << k;
  EXPECT_EQ(a[3]["test"], "tg8 @ d16");
}

TEST(CliBench, RowsListAndRange) {
  TempDir dir;
  const std::string js = dir.file("r.json"), svg = dir.file("r.svg");
  const ProcResult r = run_geist(
      {"bench", "rows", "-m", tiny(), "--list", "1,2,17", "-r", "2", "--json", js, "--plot", svg});
  expect_ok(r);
  for (const char *s :
       {"geist bench rows", "| n", "ms/row", "16 (neighbour)", "32 (neighbour)", "flagged:"})
    EXPECT_NE(r.out.find(s), std::string::npos) << "no '" << s << "' in\n" << r.out;
  const json j = load_checked(js, "rows");
  ASSERT_TRUE(j.is_object());
  std::vector<int> ns;
  for (const json &p : j["results"]["points"]) ns.push_back(p["n"]);
  EXPECT_EQ(ns, (std::vector<int>{1, 2, 16, 17, 32}));  // the neighbours 1, 16, 32 are measured too
  EXPECT_EQ(j["results"]["points"][3]["lo"], 16);
  EXPECT_EQ(j["params"]["requested"], json({1, 2, 17}));
  expect_svg(svg);

  const ProcResult range =
      run_geist({"bench", "rows", "-m", tiny(), "--from", "3", "--to", "5", "-r", "1"});
  expect_ok(range);
  EXPECT_NE(range.out.find("| 16 (neighbour)"), std::string::npos) << range.out;
}

// bench batch: decode_batch steps and --concurrent threads; the JSON follows the schema.
TEST(CliBench, BatchBothWays) {
  TempDir dir;
  const std::string js = dir.file("b.json");
  const ProcResult r = run_geist(
      {"bench", "batch", "-m", tiny(), "-S", "1,3", "-n", "4", "-p", "5", "-r", "1", "--json", js, "--no-progress"});
  expect_ok(r);
  for (const char *s : {"geist bench batch", "| sessions", "aggregate t/s", "1.00x"})
    EXPECT_NE(r.out.find(s), std::string::npos) << "no '" << s << "' in\n" << r.out;
  const json j = load_checked(js, "batch");
  ASSERT_TRUE(j.is_object());
  ASSERT_EQ(j["results"].size(), 2u);
  EXPECT_EQ(j["results"][1]["sessions"], 3);
  EXPECT_EQ(j["params"]["concurrent"], false);
  const ProcResult c = run_geist({"bench", "batch", "-m", tiny(), "-S", "2", "-n", "3", "-p", "4", "-r", "1",
                                  "--concurrent", "--no-progress"});
  expect_ok(c);
  EXPECT_NE(c.out.find("P95 step ms"), std::string::npos) << c.out;
  expect_one_error_line(run_geist({"bench", "batch", "-m", tiny(), "--plot", dir.file("b.svg")}), {"--plot"});
}

TEST(CliBench, BadFlags) {
  const std::string m = tiny();
  expect_one_error_line(run_geist({"bench", "pinned", "-m", m, "--mode", "bogus"}),
                        {"--mode", "bogus"});
  expect_one_error_line(run_geist({"bench", "pinned", "-m", m, "--mode", "pin,pin"}),
                        {"--mode", "twice"});
  expect_one_error_line(run_geist({"bench", "pinned", "-m", m, "-f", "1.5"}),
                        {"--prefix-fraction"});
  expect_one_error_line(run_geist({"bench", "pinned", "-m", m, "-S", "0"}), {"--sessions"});
  expect_one_error_line(run_geist({"bench", "pinned", "-m", m, "-P", "600"}), {"context", "512"});
  expect_one_error_line(run_geist({"bench", "pinned", "-m", "/nonexistent.gguf"}),
                        {"/nonexistent.gguf"});
  expect_one_error_line(run_geist({"bench", "pp-tg", "-m", m, "-o", "xml"}), {"--output", "xml"});
  expect_one_error_line(run_geist({"bench", "pp-tg", "-m", m, "-p", "0", "-n", "0"}), {"no test"});
  expect_one_error_line(run_geist({"bench", "pp-tg", "-m", m, "-r", "0"}), {"--repetitions"});
  expect_one_error_line(run_geist({"bench", "rows", "-m", m, "--from", "9", "--to", "2"}),
                        {"--from", "--to"});
  expect_one_error_line(run_geist({"bench", "rows", "-m", m, "--list", "0"}), {"--list"});
  expect_one_error_line(run_geist({"bench", "frobnicate"}), {"frobnicate"});
  expect_one_error_line(run_geist({"bench"}), {"subcommand"});
  expect_one_error_line(run_geist({"bench", "pinned", "-m", m, "-P", "32", "-S", "1", "-R", "1",
                                   "--json", "/nonexistent-dir/x.json"}),
                        {"/nonexistent-dir/x.json"});
}

// --json and --plot replace only geist's own outputs: a user's file, a symlink and a
// device are refused before the run and left as they were; a previous output is replaced.
TEST(CliBench, OutputsReplaceOnlyGeistFiles) {
  TempDir dir;
  const std::string notes = dir.file("notes.txt"), link = dir.file("link.json");
  {
    std::ofstream f(notes);
    f << "keep me\n";
  }
  ASSERT_EQ(symlink(notes.c_str(), link.c_str()), 0);
  const std::vector<std::string> rows = {"bench", "rows", "-m", tiny(), "--list", "1,2", "-r", "1", "--no-progress"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = rows;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  expect_one_error_line(run_geist(with({"--json", notes})), {"--json", "notes.txt", "not a geist bench output"});
  expect_one_error_line(run_geist(with({"--plot", notes})), {"--plot", "notes.txt", "not a geist bench output"});
  expect_one_error_line(run_geist(with({"--json", link})), {"link.json", "symbolic link"});
  expect_one_error_line(run_geist(with({"--plot", "/dev/null"})), {"/dev/null", "not a regular file"});
  std::ifstream in(notes);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "keep me\n");
  // Its own outputs are replaced, and a JSON is not taken for a plot.
  const std::string js = dir.file("r.json"), svg = dir.file("r.svg");
  ASSERT_EQ(run_geist(with({"--json", js, "--plot", svg})).code, 0);
  ASSERT_EQ(run_geist(with({"--json", js, "--plot", svg})).code, 0);
  expect_one_error_line(run_geist(with({"--plot", js})), {"--plot", "not a geist bench output"});
}

TEST(CliBench, Help) {
  const ProcResult r = run_geist({"bench", "--help"});
  expect_ok(r);
  for (const char *s : {"pinned", "pp-tg", "rows", "batch"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s;
  const ProcResult top = run_geist({"--help"});
  EXPECT_NE(top.out.find("bench"), std::string::npos);
}

}  // namespace
}  // namespace geist

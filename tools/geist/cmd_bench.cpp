// geist bench: measurements on the public API (geist/geist.hpp). Subcommands:
//   pinned  the pinned-prefix workload (sessions x requests, modes full / pin / snapshot)
//   pp-tg   llama-bench's prompt processing and text generation tests
//   rows    prefill time of one chunk of n rows, for every n, with the aligned-neighbour test
// docs/BENCH.md describes each, the statistics and the JSON schema.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <utility>

#include "api_common.h"
#include "base/file_util.h"
#include "bench_common.h"
#include "corpus.h"
#include "svg_plot.h"

namespace geist::cli {

void add_bench_common(CLI::App *sub, BenchCommon *o) {
  add_model_option(sub, &o->model);
  add_device_options(sub, &o->dev);
  sub->add_option("--json", o->json, "Write the results as JSON to FILE (schema: docs/BENCH.md)");
  sub->add_option("--plot", o->plot, "Draw the results as an SVG picture in FILE");
  sub->add_flag("--hash", o->hash, "Hash the model file (SHA-256; reads all of it) for the header");
  sub->add_flag("--no-progress", o->no_progress, "No progress bar on stderr");
}

api::Error corpus_tokens(const api::Model &m, std::vector<geist_token> *out) {
  out->clear();
  if (api::Error e = m.tokenize(bench_corpus(), false, false, out)) return e;
  if (out->empty()) return api::Error{GEIST_E_INTERNAL, "the built-in corpus tokenized to nothing"};
  return {};
}

std::vector<geist_token> corpus_slice(const std::vector<geist_token> &corpus, size_t offset,
                                      size_t n) {
  std::vector<geist_token> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) out.push_back(corpus[(offset + i) % corpus.size()]);
  return out;
}

bool write_file(const std::string &path, const std::string &text) {
  // O_NOFOLLOW: a symlink put in place since outputs_writable is not followed.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0666);
  bool ok = fd >= 0;
  for (size_t off = 0; ok && off < text.size();) {
    const ssize_t w = ::write(fd, text.data() + off, text.size() - off);
    if (w < 0 && errno == EINTR) continue;
    ok = w > 0;
    if (ok) off += size_t(w);
  }
  const int err = errno;
  if (fd >= 0 && ::close(fd) != 0) ok = false;
  if (!ok) {
    std::fprintf(stderr, "geist: error: cannot write '%s': %s\n", path.c_str(), std::strerror(err));
    return false;
  }
  return true;
}

namespace {

// Whether path may receive a bench output: absent, empty, or a regular file that holds
// `marker` (a JSON document or plot geist wrote). Anything else is refused with one line.
bool output_replaceable(const std::string &flag, const std::string &path, const std::string &marker) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return true;  // absent (or unreachable: the write will say)
  const char *why = nullptr;
  if (S_ISLNK(st.st_mode)) {
    why = "it is a symbolic link";
  } else if (!S_ISREG(st.st_mode)) {
    why = S_ISDIR(st.st_mode) ? "it is a directory" : "it is not a regular file";
  } else if (st.st_size > 0) {
    std::string text;
    const bool ours = read_file_limited(path, size_t(64) << 20, &text).is_ok() && text.find(marker) != std::string::npos;
    if (!ours) why = "it exists and is not a geist bench output (remove it or choose another path)";
  }
  if (why) std::fprintf(stderr, "geist: error: %s: refusing to write '%s': %s\n", flag.c_str(), path.c_str(), why);
  return why == nullptr;
}

}  // namespace

bool outputs_writable(const BenchCommon &o) {
  if (!o.json.empty() && !output_replaceable("--json", o.json, "\"schema\": \"geist-bench/")) return false;
  if (!o.plot.empty() && !output_replaceable("--plot", o.plot, kSvgPlotMarker)) return false;
  for (const std::string &path : {o.json, o.plot}) {
    if (path.empty()) continue;
    std::filesystem::path dir = std::filesystem::path(path).parent_path();
    if (dir.empty()) dir = ".";
    std::error_code ec;
    if (!std::filesystem::is_directory(dir, ec) || access(dir.c_str(), W_OK) != 0) {
      std::fprintf(stderr, "geist: error: cannot write '%s' (no such writable directory)\n",
                   path.c_str());
      return false;
    }
  }
  return true;
}

bool write_outputs(const BenchCommon &o, const nlohmann::json &doc, const std::string &svg) {
  if (!o.json.empty() && !write_file(o.json, doc.dump(2) + "\n")) return false;
  if (!o.plot.empty() && !write_file(o.plot, svg)) return false;
  return true;
}

int bench_threads(int requested) {
  return effective_threads(requested);
}

Runner add_bench(CLI::App &app) {
  CLI::App *b = app.add_subcommand(
      "bench", "Benchmarks: the pinned-prefix workload, llama-bench's pp/tg, the row sweep, batched decode");
  // Not require_subcommand: its error ("A subcommand is required") would hide the name of
  // an unknown one, which CLI11 reports as an unexpected argument instead.
  std::vector<std::pair<CLI::App *, Runner>> subs;
  for (Runner (*add)(CLI::App &) : {add_bench_pinned, add_bench_pptg, add_bench_rows, add_bench_batch}) {
    const size_t before = b->get_subcommands({}).size();
    Runner r = add(*b);
    subs.emplace_back(b->get_subcommands({})[before], std::move(r));
  }
  return [subs] {
    for (const auto &[sub, run] : subs)
      if (sub->parsed()) return run();
    std::fprintf(stderr,
                 "geist: error: bench needs a subcommand: pinned, pp-tg, rows or batch (see 'geist bench "
                 "--help')\n");
    return 2;
  };
}

}  // namespace geist::cli

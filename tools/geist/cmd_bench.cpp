// geist bench: measurements on the public API (geist/geist.hpp). Subcommands:
//   pinned  the pinned-prefix workload (sessions x requests, modes full / pin / snapshot)
//   pp-tg   llama-bench's prompt processing and text generation tests
//   rows    prefill time of one chunk of n rows, for every n, with the aligned-neighbour test
// docs/BENCH.md describes each, the statistics and the JSON schema.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <utility>

#include "api_common.h"
#include "bench_common.h"
#include "corpus.h"

namespace geist::cli {

void add_bench_common(CLI::App *sub, BenchCommon *o) {
  add_model_option(sub, &o->model);
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
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (f) f.write(text.data(), std::streamsize(text.size()));
  if (f) f.close();
  if (!f) {
    std::fprintf(stderr, "geist: error: cannot write '%s'\n", path.c_str());
    return false;
  }
  return true;
}

bool outputs_writable(const BenchCommon &o) {
  for (const std::string &path : {o.json, o.plot}) {
    if (path.empty()) continue;
    std::filesystem::path dir = std::filesystem::path(path).parent_path();
    if (dir.empty()) dir = ".";
    std::error_code ec;
    if (!std::filesystem::is_directory(dir, ec) || access(dir.c_str(), W_OK) != 0 ||
        std::filesystem::is_directory(path, ec)) {
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
      "bench", "Benchmarks: the pinned-prefix workload, llama-bench's pp/tg, the row sweep");
  // Not require_subcommand: its error ("A subcommand is required") would hide the name of
  // an unknown one, which CLI11 reports as an unexpected argument instead.
  std::vector<std::pair<CLI::App *, Runner>> subs;
  for (Runner (*add)(CLI::App &) : {add_bench_pinned, add_bench_pptg, add_bench_rows}) {
    const size_t before = b->get_subcommands({}).size();
    Runner r = add(*b);
    subs.emplace_back(b->get_subcommands({})[before], std::move(r));
  }
  return [subs] {
    for (const auto &[sub, run] : subs)
      if (sub->parsed()) return run();
    std::fprintf(stderr,
                 "geist: error: bench needs a subcommand: pinned, pp-tg or rows (see 'geist bench "
                 "--help')\n");
    return 2;
  };
}

}  // namespace geist::cli

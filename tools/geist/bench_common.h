// What the `geist bench` subcommands share: the options every one takes, the prompt
// tokens from the built-in corpus, writing the --json and --plot files.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench_env.h"
#include "bench_stats.h"
#include "commands.h"
#include "geist/geist.hpp"

namespace geist::cli {

// -m, --json, --plot, --hash, --no-progress (threads differ: pp-tg takes a list).
struct BenchCommon {
  std::string model, json, plot;
  DeviceOptions dev;
  bool hash = false, no_progress = false;
};
void add_bench_common(CLI::App *sub, BenchCommon *o);

// The corpus (bench_corpus()) as token ids, without BOS; fails on an empty result.
api::Error corpus_tokens(const api::Model &m, std::vector<geist_token> *out);

// n tokens of `corpus` from `offset` on, wrapping around at its end (corpus not empty).
std::vector<geist_token> corpus_slice(const std::vector<geist_token> &corpus, size_t offset,
                                      size_t n);

// Write text to path (replacing it); on failure print one error line and return false.
bool write_file(const std::string &path, const std::string &text);

// Before a run: --json and --plot name nothing or a geist output of their kind (never a
// user's file, a symlink or a device), in a writable directory (a long run must not end
// in a write error); false after printing an error.
bool outputs_writable(const BenchCommon &o);

// Write --json and --plot outputs when asked; false after printing an error.
bool write_outputs(const BenchCommon &o, const nlohmann::json &doc, const std::string &svg);

// Threads a session created with `requested` (0: all) runs on.
int bench_threads(int requested);

// The subcommands of `geist bench`, each registered on the bench command.
Runner add_bench_pinned(CLI::App &bench);
Runner add_bench_pptg(CLI::App &bench);
Runner add_bench_rows(CLI::App &bench);
Runner add_bench_batch(CLI::App &bench);

}  // namespace geist::cli

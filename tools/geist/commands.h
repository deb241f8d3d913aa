// Subcommands of the geist CLI. Each registers its options on a CLI11 subcommand and
// returns a callable that runs it (exit code).
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <memory>
#include <string>

#include "base/status.h"
#include "engine/model.h"

namespace geist::cli {

using Runner = std::function<int()>;

Runner add_run(CLI::App &app);
Runner add_chat(CLI::App &app);
Runner add_perplexity(CLI::App &app);
Runner add_inspect(CLI::App &app);
Runner add_bench(CLI::App &app);

// -m/--model with the default model's path as the default.
void add_model_option(CLI::App *sub, std::string *path);
// Load a model or print one line on stderr and return nullptr.
std::unique_ptr<Model> load_model_or_report(const std::string &path);
// One line "geist: error: ..." on stderr; returns the exit code to use.
int report(const Status &s);
// Read a whole file or report.
bool read_text_file(const std::string &path, std::string *out);
// Machine / build line: "geist 0.1.0 (abc123), x86_64, 2 threads".
std::string build_info();

}  // namespace geist::cli

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
Runner add_serve(CLI::App &app);

// -m/--model with the default model's path as the default.
void add_model_option(CLI::App *sub, std::string *path);
// One line "geist: error: ..." on stderr; returns the exit code to use.
int report(const Status &s);
// Read a whole text file (at most kMaxTextFileBytes; FIFOs and /dev/stdin too) or print
// one error line naming the file and the cause and return false.
bool read_text_file(const std::string &path, std::string *out);
// Validators for numeric options. Unlike CLI::Range they reject what is not a number
// ("'abc' is not an integer"), NaN and infinities, and print their bounds as written.
// int_range: an integer in [lo, hi]. real_range: a finite number in [lo, hi].
// real_above: a finite number > lo.
CLI::Validator int_range(long long lo, long long hi);
CLI::Validator real_range(double lo, double hi);
CLI::Validator real_above(double lo);

// The most bytes a prompt or text file may have (-f): far more than any context holds
// (2^24 tokens is the largest context a session takes), and small enough that reading
// an endless stream (/dev/zero) fails fast instead of exhausting memory.
inline constexpr size_t kMaxTextFileBytes = size_t(256) << 20;

// The model file the command loaded, for the SIGBUS message (a mapped file that was
// truncated while in use). Set by the loaders; empty before.
void note_model_path(const std::string &path);
// Installs the SIGBUS handler that names that file (main calls it once).
void install_fault_handlers();

// Machine / build line: "geist 0.1.0 (abc123), x86_64, 2 threads".
std::string build_info();

}  // namespace geist::cli

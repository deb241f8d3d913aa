// geist: run language models locally from GGUF files.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "commands.h"

namespace {

// Output that did not reach stdout (a full disk, /dev/full, a closed pipe) is an error:
// one line on stderr and a non-zero exit, never a silent success.
int check_stdout(int rc) {
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    const int e = errno;
    std::fprintf(stderr, "geist: error: cannot write the output: %s\n", e ? std::strerror(e) : "write error");
    return rc == 0 ? 1 : rc;
  }
  return rc;
}

int run_main(int argc, char **argv) {
  CLI::App app{"geist: run language models locally from GGUF files"};
  app.require_subcommand(1);
  app.set_version_flag("--version", geist::cli::build_info());
  std::map<CLI::App *, geist::cli::Runner> runners;
  auto reg = [&](geist::cli::Runner (*add)(CLI::App &)) {
    size_t before = app.get_subcommands({}).size();
    geist::cli::Runner r = add(app);
    runners[app.get_subcommands({})[before]] = std::move(r);
  };
  reg(geist::cli::add_run);
  reg(geist::cli::add_chat);
  reg(geist::cli::add_perplexity);
  reg(geist::cli::add_inspect);
  reg(geist::cli::add_bench);
  reg(geist::cli::add_serve);
  if (argc > 1 && argv[1][0] != '-') {
    bool known = false;
    for (CLI::App *sub : app.get_subcommands({})) known = known || sub->get_name() == argv[1];
    if (!known) {
      std::fprintf(stderr, "geist: error: unknown command '%s' (commands: run, chat, perplexity, inspect, bench, serve)\n", argv[1]);
      return 2;
    }
  }
  // llama.cpp's multi-letter short flags, which CLI11 cannot declare: -ctk X / -ctk=X.
  std::vector<std::string> args;
  for (int i = argc - 1; i >= 1; --i) {  // CLI11 takes the arguments in reverse order
    std::string a = argv[i];
    for (const auto &[from, to] : {std::pair{"-ctk", "--cache-type-k"}, {"-ctv", "--cache-type-v"}, {"-np", "--parallel"}}) {
      if (a == from || a.rfind(std::string(from) + "=", 0) == 0) a = to + a.substr(std::strlen(from));
    }
    args.push_back(std::move(a));
  }
  try {
    app.parse(args);
  } catch (const CLI::CallForHelp &e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp &e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion &e) {
    return app.exit(e);
  } catch (const CLI::ParseError &e) {
    std::fprintf(stderr, "geist: error: %s (see 'geist --help')\n", e.what());
    return 2;
  }
  for (CLI::App *sub : app.get_subcommands()) {
    auto it = runners.find(sub);
    if (it != runners.end()) return check_stdout(it->second());
  }
  return 2;
}

}  // namespace

int main(int argc, char **argv) {
  geist::cli::install_fault_handlers();
  // No exception leaves main: each becomes one error line and exit status 1.
  try {
    return run_main(argc, argv);
  } catch (const std::bad_alloc &) {
    std::fprintf(stderr, "geist: error: out of memory\n");
  } catch (const std::exception &e) {
    std::fprintf(stderr, "geist: error: internal error: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "geist: error: internal error: unknown exception\n");
  }
  return 1;
}

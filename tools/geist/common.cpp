#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include "base/thread_pool.h"
#include "commands.h"
#include "engine/model_paths.h"

namespace geist::cli {

void add_model_option(CLI::App *sub, std::string *path) {
  *path = default_model_file();
  sub->add_option("-m,--model", *path, "GGUF model file (default: the fetched default model)")
      ->capture_default_str();
}

int report(const Status &s) {
  std::fprintf(stderr, "geist: error: %s\n", s.message().c_str());
  return 1;
}

std::unique_ptr<Model> load_model_or_report(const std::string &path) {
  if (path == default_model_file()) {
    std::ifstream f(path);
    if (!f.good()) {
      std::fprintf(stderr,
                   "geist: error: default model not found at %s; run 'python3 scripts/fetch_model.py' or pass -m\n",
                   path.c_str());
      return nullptr;
    }
  }
  Result<std::unique_ptr<Model>> m = Model::load(path);
  if (!m) {
    report(m.status());
    return nullptr;
  }
  return std::move(m).value();
}

bool read_text_file(const std::string &path, std::string *out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    std::fprintf(stderr, "geist: error: cannot read '%s'\n", path.c_str());
    return false;
  }
  std::stringstream ss;
  ss << f.rdbuf();
  *out = ss.str();
  return true;
}

std::string build_info() {
  char buf[256];
  std::snprintf(buf, sizeof buf, "geist %s, %d hardware threads", geist_version(), ThreadPool::hardware_threads());
  return buf;
}

}  // namespace geist::cli

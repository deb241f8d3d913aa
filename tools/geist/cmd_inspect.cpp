// geist inspect: print a GGUF file's metadata and tensor table.
#include <cinttypes>
#include <cstdio>
#include <map>
#include <string>

#include "commands.h"
#include "engine/model_paths.h"
#include "gguf/gguf_reader.h"

namespace geist::cli {
namespace {

int inspect(const std::string &path, bool all_values) {
  Result<std::unique_ptr<gguf::GgufFile>> fr = gguf::GgufFile::open(path);
  if (!fr) return report(fr.status());
  const gguf::GgufFile &f = **fr;
  std::printf("file: %s\nsize: %zu bytes\nGGUF version %u, alignment %zu, %zu metadata keys, %zu tensors\n\n",
              path.c_str(), f.file_size(), f.version(), f.alignment(), f.metadata().size(), f.tensors().size());
  std::printf("metadata:\n");
  for (const auto &[key, v] : f.metadata()) {
    std::string type = gguf::value_type_name(v.type);
    if (v.is_array()) type = std::string("array[") + gguf::value_type_name(v.elem_type) + "]";
    std::printf("  %-48s %-16s %s\n", key.c_str(), type.c_str(), v.to_string(all_values ? SIZE_MAX : 8).c_str());
  }
  std::printf("\ntensors:\n  %-40s %-8s %-28s %14s %12s\n", "name", "type", "shape (ne)", "offset", "bytes");
  std::map<std::string, std::pair<int, size_t>> by_type;
  int64_t n_elem = 0;
  for (const gguf::TensorInfo &t : f.tensors()) {
    std::string shape = "[";
    for (uint32_t i = 0; i < t.n_dims; ++i) shape += (i ? ", " : "") + std::to_string(t.ne[i]);
    shape += "]";
    const char *tn = quant::type_name(t.type);
    std::printf("  %-40s %-8s %-28s %14" PRIu64 " %12zu\n", t.name.c_str(), tn, shape.c_str(), t.offset, t.n_bytes);
    by_type[tn].first++;
    by_type[tn].second += t.n_bytes;
    n_elem += t.n_elements();
  }
  std::printf("\nsummary: %.1f M elements\n", n_elem / 1e6);
  for (const auto &[tn, cb] : by_type) {
    std::printf("  %-8s %4d tensors %10.2f MiB\n", tn.c_str(), cb.first, cb.second / 1048576.0);
  }
  return 0;
}

}  // namespace

Runner add_inspect(CLI::App &app) {
  auto path = std::make_shared<std::string>(default_model_file());
  auto all = std::make_shared<bool>(false);
  CLI::App *sub = app.add_subcommand("inspect", "Print a GGUF file's metadata and tensor table");
  sub->add_option("model", *path, "GGUF file (default: the fetched default model)")->capture_default_str();
  sub->add_flag("--all", *all, "Print arrays in full");
  return [path, all] { return inspect(*path, *all); };
}

}  // namespace geist::cli

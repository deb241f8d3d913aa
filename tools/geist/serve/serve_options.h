// Options of `geist serve` (tools/geist/cmd_serve.cpp parses them).
#pragma once

#include <string>

#include "../api_common.h"

namespace geist::serve {

struct ServeOptions {
  cli::GenOptions g;  // -m, -t, -c, -b, sampling defaults, --backend, -ctk/-ctv
  std::string host = "127.0.0.1";
  int port = 8080;
  int parallel = 1;
  std::string api_key, api_key_file;
  std::string alias;        // the model's id in /v1/models (default: the file name)
  // The prefix cache's cap in MiB, in the memory the sessions keep their KV rows in (device
  // memory with --backend cuda). 0: no cache; -1: the default, cache_mib_default().
  int cache_ram_mib = -1;
  std::string cache_dir;
  int cache_disk_mib = 2048;  // files geist keeps in cache_dir
  int queue = 16;             // jobs waiting beyond the busy slots
  int max_body_mib = 8;
  int read_timeout_s = 10, write_timeout_s = 30, keep_alive_s = 5;
  int http_threads = 0;          // 0: parallel + queue + 8
  double shutdown_grace_s = 10;  // running requests get this long after SIGTERM
  int min_snapshot_tokens = 16;
  bool quiet = false;  // no per-request log lines
  bool fixed_seed = false;  // -s given: requests without a seed use it (else random)
};

// 256 MiB of host memory on the CPU; 4096 MiB of device memory on a GPU, where a saved state
// of a long prompt is large (E4B's f32 KV: ~80 MiB for ~1300 tokens) and 256 MiB held too few
// of them to keep a workload's shared system prompts (docs/SERVE.md, "On the GPU").
inline int cache_mib_default(const std::string &backend) { return backend == "cuda" ? 4096 : 256; }
inline int cache_mib(const ServeOptions &o) {
  return o.cache_ram_mib >= 0 ? o.cache_ram_mib : cache_mib_default(o.g.dev.backend);
}

// Runs the server until SIGTERM/SIGINT; the exit code.
int run_server(const ServeOptions &o);

}  // namespace geist::serve

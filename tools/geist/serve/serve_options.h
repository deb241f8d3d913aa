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
  int cache_ram_mib = 256;  // 0: no snapshot cache
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

// Runs the server until SIGTERM/SIGINT; the exit code.
int run_server(const ServeOptions &o);

}  // namespace geist::serve

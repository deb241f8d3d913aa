// geist serve: an OpenAI-compatible HTTP server (docs/SERVE.md). The options live here so
// a build without cpp-httplib still knows the command and says why it cannot run it.
#include <cstdio>

#include "commands.h"
#include "serve/serve_options.h"

namespace geist::cli {

Runner add_serve(CLI::App &app) {
  auto o = std::make_shared<serve::ServeOptions>();
  CLI::App *sub = app.add_subcommand(
      "serve", "An OpenAI-compatible HTTP server (chat, completions, streaming)");
  add_gen_options(sub, &o->g);
  sub->add_option("--host", o->host, "Address to listen on (127.0.0.1: this machine only)")
      ->capture_default_str();
  sub->add_option("--port", o->port, "TCP port")->capture_default_str()->check(int_range(1, 65535));
  sub->add_option("--parallel", o->parallel,
                  "Requests generated at once (sessions over one model; also -np)")
      ->capture_default_str()
      ->check(int_range(1, 256));
  sub->add_option("--api-key", o->api_key,
                  "Require 'Authorization: Bearer KEY' on every endpoint but /health and /");
  sub->add_option("--api-key-file", o->api_key_file,
                  "Read the API key from this file (first line)");
  sub->add_option("--alias", o->alias,
                  "The model's id in /v1/models and responses (default: the file name)");
  sub->add_option("--cache-ram", o->cache_ram_mib,
                  "Prefix cache, MiB: a hard cap on the saved states it keeps, in the memory the "
                  "KV cache is in (0: off; default 256, or 4096 of device memory with --backend cuda)")
      ->check(int_range(0, 1 << 20));
  sub->add_option("--cache-dir", o->cache_dir,
                  "Keep prefix cache entries in this directory across restarts");
  sub->add_option("--cache-disk", o->cache_disk_mib, "Most MiB of entries kept in --cache-dir")
      ->capture_default_str()
      ->check(int_range(1, 1 << 24));
  sub->add_option("--queue", o->queue,
                  "Requests that may wait for a slot (more: 503 with Retry-After)")
      ->capture_default_str()
      ->check(int_range(0, 4096));
  sub->add_option("--max-body", o->max_body_mib, "Largest request body, MiB (larger: 413)")
      ->capture_default_str()
      ->check(int_range(1, 1024));
  sub->add_option("--timeout", o->read_timeout_s,
                  "Seconds a client may stay silent while sending a request")
      ->capture_default_str()
      ->check(int_range(1, 3600));
  sub->add_option("--write-timeout", o->write_timeout_s, "Seconds a write to a client may block")
      ->capture_default_str()
      ->check(int_range(1, 3600));
  sub->add_option("--keep-alive", o->keep_alive_s,
                  "Seconds an idle keep-alive connection stays open")
      ->capture_default_str()
      ->check(int_range(0, 3600));
  sub->add_option("--http-threads", o->http_threads, "Connection threads (0: parallel + queue + 8)")
      ->capture_default_str()
      ->check(int_range(0, 4096));
  sub->add_option(
         "--shutdown-grace", o->shutdown_grace_s,
         "Seconds running requests may finish after SIGTERM/SIGINT before they are cancelled")
      ->capture_default_str()
      ->check(real_range(0, 3600));
  sub->add_option("--cache-min-tokens", o->min_snapshot_tokens,
                  "Shortest prefix worth a cache entry")
      ->capture_default_str()
      ->check(int_range(1, 1 << 24));
  sub->add_flag("-q,--quiet", o->quiet, "No log line per request");
  sub->footer(
      "Endpoints: /v1/chat/completions, /v1/completions, /v1/models, /health, /metrics, /tokenize, "
      "/detokenize, / (a chat page). See docs/SERVE.md.");
  return [o, sub] {
    o->fixed_seed = sub->count("--seed") > 0 && !o->g.random_seed;
#ifdef GEIST_HAVE_HTTPLIB
    return serve::run_server(*o);
#else
    std::fprintf(stderr,
                 "geist: error: this build of geist has no HTTP server: 'geist serve' needs "
                 "cpp-httplib when geist is "
                 "built (Debian/Ubuntu: apt-get install libcpp-httplib-dev, then configure and "
                 "build again)\n");
    return 1;
#endif
  };
}

}  // namespace geist::cli

#!/usr/bin/env bash
# The pinned-prefix workload (scripts/serve_load.py workload: 3 system texts x 20 requests,
# ~240 + ~385 tokens, 16 generated, greedy, non-streaming) against geist serve and
# llama.cpp's llama-server on the same model and threads, one server at a time on
# 127.0.0.1. Each timed run holds /tmp/geist-bench.lock (the machine's benchmark lock).
#   LLAMA_SERVER=/path/to/llama-server scripts/serve_vs_llama.sh [MODEL] [THREADS]
# Runs: geist with the cache and without it (each request both ways, interleaved), geist
# with the cache alone, llama-server with its default flags, and with --swa-full. Prints
# each run's P50/P95 and the server's RSS at the end. llama-server is built outside this
# repository (docs/SERVE.md says how); without LLAMA_SERVER only geist runs.
set -euo pipefail
cd "$(dirname "$0")/.."
model="${1:-$HOME/.cache/geist/models/gemma-3-270m-q4_k_m.gguf}"
threads="${2:-2}"
geist="${GEIST_BIN:-build/release/tools/geist}"
lock=/tmp/geist-bench.lock
out="${GEIST_VS_OUT:-build/serve-vs-llama}"
mkdir -p "$out"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# run NAME CACHE_MODE CMD...: start the server, wait for /health, run the workload, stop it.
run() {
  local name="$1" mode="$2"
  shift 2
  local port
  port="$(free_port)"
  "$@" --host 127.0.0.1 --port "$port" >"$out/$name.log" 2>&1 &
  local pid=$!
  for _ in $(seq 600); do
    if curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; then break; fi
    if ! kill -0 "$pid" 2>/dev/null; then echo "$name: the server exited: $(tail -3 "$out/$name.log")"; return 1; fi
    sleep 0.2
  done
  echo "== $name: $*"
  python3 scripts/serve_load.py workload --url "http://127.0.0.1:$port" --cache "$mode" \
    --outputs "$out/$name.json" | tee "$out/$name.txt"
  echo "RSS at the end: $(awk '/VmRSS/ {printf "%.0f MiB", $2 / 1024}' "/proc/$pid/status")" | tee -a "$out/$name.txt"
  kill "$pid"
  wait "$pid" || true
}
export -f run free_port
export out

flock "$lock" bash -c 'run "$@"' _ geist_both both "$geist" serve -m "$model" -t "$threads" -c 4096 --parallel 1 -q
flock "$lock" bash -c 'run "$@"' _ geist_on on "$geist" serve -m "$model" -t "$threads" -c 4096 --parallel 1 -q
if [ -n "${LLAMA_SERVER:-}" ]; then
  "$LLAMA_SERVER" --version 2>&1 | head -2
  # The GGUF carries no chat template, so llama-server would fall back to ChatML; its
  # built-in Gemma template (legacy, hence --no-jinja) gives the prompts geist builds, token
  # for token. Nothing else is changed from its defaults.
  tmpl=(--no-jinja --chat-template gemma)
  flock "$lock" bash -c 'run "$@"' _ llama_default on "$LLAMA_SERVER" -m "$model" -t "$threads" "${tmpl[@]}"
  flock "$lock" bash -c 'run "$@"' _ llama_swa_full on "$LLAMA_SERVER" -m "$model" -t "$threads" "${tmpl[@]}" --swa-full
else
  echo "serve_vs_llama: SKIP llama-server runs (set LLAMA_SERVER to its binary)"
fi

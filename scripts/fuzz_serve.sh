#!/usr/bin/env bash
# Fuzzes geist serve's request parsers and stop-string matcher (fuzz/serve_request_fuzz.cpp)
# with libFuzzer under ASan+UBSan for SECONDS (default 60): fuzz/run.sh serve_request_fuzz,
# which builds it in the `fuzz` preset's tree (clang with its runtime: Debian clang and
# libclang-rt-dev) and keeps the corpus in build/fuzz/serve_request_fuzz_run.
#   scripts/fuzz_serve.sh [seconds|replay]
set -euo pipefail
cd "$(dirname "$0")/.."
exec fuzz/run.sh serve_request_fuzz "${1:-60}"

#!/usr/bin/env bash
# Fuzz the GGUF reader (fuzz/gguf_fuzz.cpp) for [seconds] (default 600); fuzz/run.sh does
# the work and says where the output goes. Seeds: tests/data/tiny.gguf plus the corrupt
# variants gguf_corrupt_int writes to ${TMPDIR:-/tmp}/geist_gguf_corrupt_corpus.
set -euo pipefail
exec "$(dirname "${BASH_SOURCE[0]}")/../fuzz/run.sh" gguf_fuzz "${1:-600}"

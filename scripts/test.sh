#!/usr/bin/env bash
# The whole test suite from a fresh clone: dependencies, the default model, a release
# build with every test (unit, int, e2e) and the HTTP server's tests (pytest), then the
# unit and int tests again under AddressSanitizer + UndefinedBehaviorSanitizer, and the
# threaded tests under ThreadSanitizer.  GEIST_SKIP_SANITIZERS=1 skips the sanitizer runs.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="$(nproc)"
scripts/install_deps.sh
python3 scripts/fetch_model.py >/dev/null

# Warnings are errors here (GEIST_WERROR=OFF to build anyway with a compiler that warns
# where GCC 12/13 and clang 14 do not).
cmake --preset release -DGEIST_WERROR="${GEIST_WERROR:-ON}" >/dev/null
cmake --build --preset release -j"$jobs"
ctest --preset release -j"$jobs"
# geist serve through the `openai` client (tests/serve, pytest): the packages go into
# build/pydeps (pip --target: no system or externally-managed Python is touched).
if [ "${GEIST_SKIP_SERVE:-0}" = 1 ]; then
  echo "test.sh: SKIP geist serve tests (GEIST_SKIP_SERVE=1)"
else
  # selenium drives Debian's chromium for the chat page's test (test_chat_page_browser.py).
  pydeps="$PWD/build/pydeps"
  if ! PYTHONPATH="$pydeps" python3 -c 'import openai, pytest, selenium' 2>/dev/null; then
    python3 -m pip install -q --disable-pip-version-check --target "$pydeps" openai pytest selenium
  fi
  # Where the packages are installed the tests must run: the flags turn their SKIPs (no
  # server in the binary, no model, no Chromium) into failures, so that CI cannot pass
  # without testing the server or the chat page. A build configured -DGEIST_SERVE=OFF has
  # no server on purpose.
  # (No `| grep -q` under pipefail: grep's early exit can fail the pipe; install_deps.sh.)
  installed() { [[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)" == *"install ok installed"* ]]; }
  serve_required=0
  if installed libcpp-httplib-dev && grep -q '^GEIST_SERVE:BOOL=ON$' build/release/CMakeCache.txt; then
    serve_required=1
  fi
  browser_required=0
  if [ "$serve_required" = 1 ] && installed chromium && installed chromium-driver; then browser_required=1; fi
  echo "test.sh: geist serve (pytest; GEIST_SERVE_REQUIRED=$serve_required GEIST_BROWSER_REQUIRED=$browser_required)"
  rm -f build/serve-browser/*.png
  PYTHONPATH="$pydeps" GEIST_BIN="$PWD/build/release/tools/geist" GEIST_SERVE_REQUIRED="$serve_required" \
    GEIST_BROWSER_REQUIRED="$browser_required" python3 -m pytest -q -rs -p no:cacheprovider tests/serve
  for shot in build/serve-browser/*.png; do
    if [ -e "$shot" ]; then echo "test.sh: artifact: chat page screenshot $PWD/$shot"; fi
  done
fi
# The lower ISA tiers end to end (the release run above used the best one this CPU has):
# batch invariance of sessions, the C ABI and the kernels' own tests on each.
isas="generic avx2"
# The avx2vnni tier where the CPU has AVX-VNNI (GEIST_ISA would fall back to the best tier).
if grep -qw avx_vnni /proc/cpuinfo 2>/dev/null; then isas="$isas avx2vnni"; fi
for isa in $isas; do
  echo "test.sh: GEIST_ISA=$isa"
  GEIST_ISA=$isa ctest --test-dir build/release -R '^(SessionPinInt|Snapshot|CApi|Tiers/|CpuIsa|CpuElementwise|CpuOps|Tiny/Gemma4Logits)' \
    -j"$jobs" --output-on-failure
done

# clang + libc++ (catches includes libstdc++ provides by accident): everything compiles
# warning-free with -Werror; the library, CLI and examples link. Test and benchmark
# objects are compiled only (GoogleTest and Google Benchmark are built for libstdc++).
if [ "${GEIST_SKIP_LIBCXX:-0}" != 1 ] && ! { command -v clang++ >/dev/null && echo '#include <vector>' |
    clang++ -stdlib=libc++ -x c++ -fsyntax-only - 2>/dev/null; }; then
  echo "test.sh: SKIP clang + libc++ compile check: no clang++ with libc++ here"
elif [ "${GEIST_SKIP_LIBCXX:-0}" != 1 ]; then
  echo "test.sh: clang + libc++ compile check"
  # Without the server: Debian's cpp-httplib is a compiled library for libstdc++ (the build
  # then checks the fallback that says so).
  CC=clang CXX=clang++ cmake -S . -B build/libcxx -DCMAKE_BUILD_TYPE=Release -DGEIST_WERROR=ON -DGEIST_SERVE=OFF \
    -DCMAKE_CXX_FLAGS="-stdlib=libc++" -DCMAKE_EXE_LINKER_FLAGS="-stdlib=libc++" \
    -DCMAKE_SHARED_LINKER_FLAGS="-stdlib=libc++" >/dev/null
  cmake --build build/libcxx -j"$jobs" --target geist geist_shared pinned_prefix session_costs
  objs=$(make -C build/libcxx/tests help | sed -n 's/^\.\.\. \([a-z0-9_]*\.o\)$/\1/p')
  make -C build/libcxx/tests -j"$jobs" $objs >/dev/null
  make -C build/libcxx/bench -j"$jobs" kernels_bench.o >/dev/null
fi

# CUDA (-DGEIST_CUDA=ON) with nvcc, for every architecture geist ships (sm_80/86/89/90):
# the library, CLI and the CUDA tests compile warning-free and link; without a GPU the
# tests run and SKIP, saying why. The GPU runs themselves are on the device machine
# (docs/CUDA.md).
nvcc_bin="$(command -v nvcc || true)"
[ -z "$nvcc_bin" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc_bin=/usr/local/cuda/bin/nvcc
if [ "${GEIST_SKIP_CUDA:-0}" = 1 ]; then
  echo "test.sh: SKIP CUDA build (GEIST_SKIP_CUDA=1)"
elif [ -z "$nvcc_bin" ]; then
  echo "test.sh: SKIP CUDA build: no nvcc here (install the CUDA toolkit to build -DGEIST_CUDA=ON)"
else
  echo "test.sh: CUDA build ($nvcc_bin)"
  cmake -S . -B build/cuda -DCMAKE_BUILD_TYPE=Release -DGEIST_CUDA=ON -DGEIST_WERROR=ON \
    -DCMAKE_CUDA_COMPILER="$nvcc_bin" >/dev/null
  cmake --build build/cuda -j"$jobs" --target geist geist_shared cuda_ops_int cuda_model_int
  ctest --test-dir build/cuda -R '^(CudaOps|CudaModel)\.' -j"$jobs" --output-on-failure
fi

if [ "${GEIST_SKIP_SANITIZERS:-0}" != 1 ]; then
  cmake -S . -B build/asan-ubsan -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" \
    -DCMAKE_C_FLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
    -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
  cmake --build build/asan-ubsan -j"$jobs"
  ctest --test-dir build/asan-ubsan -L 'unit|int' -j"$jobs" --output-on-failure

  # ThreadSanitizer: the tests that run threads (pools, sessions on 4 threads at once, the
  # samplers of a multi-session step drawing on the pool, the CUDA draw's block-wide select
  # with its threads emulated on the host: a barrier it lacks is a race here).
  cmake --preset tsan >/dev/null
  cmake --build --preset tsan -j"$jobs" --target thread_pool_unit concurrency_int c_api_int decode_batch_int draw_select_int
  ctest --test-dir build/tsan -R '^(ThreadPoolUnit|ConcurrencyInt)\.|^CApi\.(SecondThreadOnASessionIsRefused|SavedStateSharedBetweenThreads)$|^DecodeBatch\.(EqualsDecodingAlone|StepBatchPrefillAndDecodeEqualAlone)$|^DrawSelect\.(KeysOrderAsTheHostSort|FewBlocksForTheRaceChecker)$' \
    -j"$jobs" --output-on-failure
fi

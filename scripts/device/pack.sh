#!/usr/bin/env bash
# Packs a CUDA build's binaries (stripped copies) with every ctest file they need into
# .gpu-carry/bins.tar.xz, for a run on the lent GPU machine (docs/CUDA.md, "On the lent GPU
# machine"). Run here, from the checkout, after building build/cuda90:
#   cmake -S . -B build/cuda90 -DGEIST_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release
#   cmake --build build/cuda90 -j2 --target geist cuda_ops_int cuda_model_int
# The discovered gtest lists (tests/*_tests.cmake) must travel with their *_include.cmake:
# without them ctest runs a `<binary>_NOT_BUILT` placeholder instead of the binary's tests.
set -euo pipefail
cd "$(dirname "$0")/../.."
B=build/cuda90
for f in $B/tools/geist $B/tests/cuda_ops_int $B/tests/cuda_model_int; do
  [ -x "$f" ] || { echo "pack.sh: $f is not built" >&2; exit 1; }
done
st=$(mktemp -d)
trap 'rm -rf "$st"' EXIT
for f in $B/tools/geist $B/tests/cuda_ops_int $B/tests/cuda_model_int \
  $(find $B -name CTestTestfile.cmake) $(find $B/tests -name '*_include.cmake' -o -name '*_tests.cmake'); do
  mkdir -p "$st/$(dirname "$f")"
  cp "$f" "$st/$f"
done
strip "$st/$B/tools/geist" "$st/$B/tests/cuda_ops_int" "$st/$B/tests/cuda_model_int"
mkdir -p .gpu-carry
# A 64 MiB dictionary stores the three binaries' shared kernel code once (~8 MB in all).
XZ_OPT=-9 tar -C "$st" -cJf .gpu-carry/bins.tar.xz build
ls -la .gpu-carry/bins.tar.xz

#!/usr/bin/env bash
# Build the GGUF reader's libFuzzer target (preset `fuzz`: clang, ASan+UBSan) and fuzz it.
# Usage: scripts/fuzz_gguf.sh [seconds]   (default 600)
# Seeds: tests/data/tiny.gguf plus the corrupt variants gguf_corrupt_int writes to
# ${TMPDIR:-/tmp}/geist_gguf_corrupt_corpus (run that test first to get them).
# Output: build/fuzz/gguf_run/{corpus,artifacts,fuzz-0.log}; crashes land in artifacts/.
# One worker (-jobs=1); prints the final execution count, exec/s and coverage.
set -euo pipefail
secs="${1:-600}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
cmake --preset fuzz >/dev/null
cmake --build build/fuzz --target gguf_fuzz -j2

run="$root/build/fuzz/gguf_run"
mkdir -p "$run/corpus" "$run/artifacts"
cp -f tests/data/tiny.gguf "$run/corpus/seed_tiny.gguf"
seed_dir="${TMPDIR:-/tmp}/geist_gguf_corrupt_corpus"
if [ -d "$seed_dir" ]; then
  cp -f "$seed_dir"/* "$run/corpus/" 2>/dev/null || true
fi
echo "fuzzing for ${secs}s with $(ls "$run/corpus" | wc -l) corpus files; log: $run/fuzz-0.log"

cd "$run"
rc=0
"$root/build/fuzz/fuzz/gguf_fuzz" corpus -dict="$root/fuzz/gguf.dict" \
  -artifact_prefix="$run/artifacts/" -max_len=8192 -timeout=10 -rss_limit_mb=2048 \
  -max_total_time="$secs" -print_final_stats=1 -jobs=1 -workers=1 || rc=$?

log="$run/fuzz-0.log"
grep -E "^#[0-9]+" "$log" | tail -1 || true
grep -E "stat::number_of_executed_units|stat::average_exec_per_sec|stat::peak_rss_mb" "$log" || true
if ls "$run/artifacts"/* >/dev/null 2>&1; then
  echo "FINDINGS in $run/artifacts:"; ls -l "$run/artifacts"
  rc=1
fi
exit "$rc"

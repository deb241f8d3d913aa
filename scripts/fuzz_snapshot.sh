#!/usr/bin/env bash
# Build the session-snapshot libFuzzer target (preset `fuzz`: clang, ASan+UBSan) and fuzz
# Session::restore with it (fuzz/snapshot_fuzz.cpp says what each input is and checks).
# Usage: scripts/fuzz_snapshot.sh [seconds] [jobs]   (defaults 600, 1)
# Build dir: $GEIST_FUZZ_BUILD (default build/fuzz, the preset's).
# Seeds: valid images of several shapes, written by the target itself
# (GEIST_FUZZ_WRITE_SEEDS) into the corpus on every run; nothing is committed.
# Activations are f32 in the target unless GEIST_ACT is set (fuzz/snapshot_fuzz.cpp says
# why); GEIST_FUZZ_STATS=0 turns off the per-check outcome counts printed at the end.
# Output: $GEIST_FUZZ_BUILD/snapshot_run/{corpus,artifacts,fuzz-*.log}; crashes land in
# artifacts/. Prints the final execution count, exec/s, coverage and any findings.
set -euo pipefail
secs="${1:-600}"
jobs="${2:-1}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
build="${GEIST_FUZZ_BUILD:-$root/build/fuzz}"
case "$build" in /*) ;; *) build="$root/$build" ;; esac
cmake --preset fuzz -B "$build" >/dev/null
cmake --build "$build" --target snapshot_fuzz -j2
bin="$build/fuzz/snapshot_fuzz"
export GEIST_FUZZ_MODEL="${GEIST_FUZZ_MODEL:-$root/tests/data/tiny_gemma3.gguf}"
export GEIST_FUZZ_STATS="${GEIST_FUZZ_STATS:-1}"

run="$build/snapshot_run"
mkdir -p "$run/corpus" "$run/artifacts"
GEIST_FUZZ_WRITE_SEEDS="$run/corpus" "$bin"
echo "fuzzing for ${secs}s, ${jobs} job(s), $(ls "$run/corpus" | wc -l) corpus files; logs: $run/fuzz-*.log"

cd "$run"
rc=0
"$bin" corpus -artifact_prefix="$run/artifacts/" -max_len=65536 -timeout=20 -rss_limit_mb=4096 \
  -max_total_time="$secs" -print_final_stats=1 -jobs="$jobs" -workers="$jobs" || rc=$?

for log in "$run"/fuzz-*.log; do
  echo "== $log"
  grep -E "^#[0-9]+" "$log" | tail -1 || true
  grep -E "stat::number_of_executed_units|stat::average_exec_per_sec|stat::peak_rss_mb" "$log" || true
  sed -n '/^snapshot_fuzz outcomes:/,$p' "$log" | grep -E "^snapshot_fuzz outcomes:|^ +[0-9]+  " || true
done
if ls "$run/artifacts"/* >/dev/null 2>&1; then
  echo "FINDINGS in $run/artifacts:"; ls -l "$run/artifacts"
  rc=1
fi
exit "$rc"

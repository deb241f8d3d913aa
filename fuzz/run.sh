#!/usr/bin/env bash
# Build one libFuzzer target of the `fuzz` preset (clang, ASan+UBSan) and fuzz it with one
# worker; docs/FUZZING.md describes the targets.
# Usage: fuzz/run.sh TARGET [seconds]   fuzz for that long (default 600)
#        fuzz/run.sh TARGET replay      run the saved inputs of fuzz/regressions/TARGET once
# TARGET: tokenizer_spm_fuzz, tokenizer_gemma4_fuzz, session_load_fuzz, gguf_fuzz,
#         snapshot_fuzz, serve_request_fuzz
# Environment:
#   GEIST_FUZZ_BUILD   build tree (default build/fuzz, the preset's)
#   GEIST_FUZZ_JOBS    build parallelism (default 1)
#   GEIST_FUZZ_MODEL   the GGUF the target loads (default: the tiny model of the target;
#                      e.g. ~/.cache/geist/models/gemma-3-270m-q4_k_m.gguf gives
#                      tokenizer_spm_fuzz the real Gemma 3 vocabulary)
#   GEIST_FUZZ_RUN     output folder (default $GEIST_FUZZ_BUILD/TARGET_run)
#   GEIST_FUZZ_STATS   0 turns off the per-check counts the targets print at exit
#   GEIST_FUZZ_WORKERS fuzzing processes (default 1; logs fuzz-0.log, fuzz-1.log, ...)
# Seeds: tokenizers fuzz/corpus/tokenizer; session_load_fuzz and snapshot_fuzz write valid
# session files of several shapes with the engine at every run; gguf_fuzz
# tests/data/tiny.gguf; serve_request_fuzz fuzz/corpus/serve. Dictionaries: fuzz/*.dict.
# Output: $GEIST_FUZZ_RUN/{corpus,artifacts,fuzz-0.log}; crashes land in artifacts/.
# Prints the final execution count, exec/s, coverage and any findings.
set -euo pipefail
target="${1:?usage: fuzz/run.sh TARGET [seconds|replay]}"
arg="${2:-600}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
build="${GEIST_FUZZ_BUILD:-$root/build/fuzz}"
case "$build" in /*) ;; *) build="$root/$build" ;; esac

case "$target" in
  tokenizer_spm_fuzz | tokenizer_gemma4_fuzz)
    dict="$root/fuzz/tokenizer.dict" max_len=4096 timeout=10 rss=2048 ;;
  session_load_fuzz | snapshot_fuzz)
    dict="" max_len=65536 timeout=20 rss=4096
    [ "$target" = session_load_fuzz ] && dict="$root/fuzz/snapshot.dict" ;;
  gguf_fuzz)
    dict="$root/fuzz/gguf.dict" max_len=8192 timeout=10 rss=2048 ;;
  serve_request_fuzz)
    dict="$root/fuzz/serve.dict" max_len=4096 timeout=10 rss=2048 ;;
  *) echo "fuzz/run.sh: unknown target '$target'" >&2; exit 2 ;;
esac

cmake --preset fuzz -B "$build" >/dev/null
cmake --build "$build" --target "$target" -j"${GEIST_FUZZ_JOBS:-1}"
bin="$build/fuzz/$target"
export GEIST_FUZZ_STATS="${GEIST_FUZZ_STATS:-1}"

if [ "$arg" = replay ]; then
  regs="$root/fuzz/regressions/$target"
  if ! ls "$regs"/* >/dev/null 2>&1; then echo "no saved inputs in $regs"; exit 0; fi
  exec "$bin" -runs=1 "$regs"/*
fi
secs="$arg"

run="${GEIST_FUZZ_RUN:-$build/${target}_run}"
mkdir -p "$run/corpus" "$run/artifacts"
case "$target" in
  tokenizer_*) cp -f "$root"/fuzz/corpus/tokenizer/* "$run/corpus/" ;;
  serve_request_fuzz) cp -f "$root"/fuzz/corpus/serve/* "$run/corpus/" ;;
  session_load_fuzz | snapshot_fuzz) GEIST_FUZZ_WRITE_SEEDS="$run/corpus" "$bin" ;;
  gguf_fuzz)
    cp -f tests/data/tiny.gguf "$run/corpus/seed_tiny.gguf"
    # The corrupt variants gguf_corrupt_int writes, when that test has run.
    seed_dir="${TMPDIR:-/tmp}/geist_gguf_corrupt_corpus"
    if [ -d "$seed_dir" ]; then cp -f "$seed_dir"/* "$run/corpus/" 2>/dev/null || true; fi ;;
esac
echo "fuzzing $target for ${secs}s with $(ls "$run/corpus" | wc -l) corpus files; logs: $run/fuzz-*.log"

cd "$run"
rc=0
"$bin" corpus ${dict:+-dict="$dict"} -artifact_prefix="$run/artifacts/" -max_len="$max_len" \
  -timeout="$timeout" -rss_limit_mb="$rss" -max_total_time="$secs" -print_final_stats=1 \
  -jobs="${GEIST_FUZZ_WORKERS:-1}" -workers="${GEIST_FUZZ_WORKERS:-1}" || rc=$?

for log in "$run"/fuzz-*.log; do
  echo "== $log"
  grep -E "^#[0-9]+" "$log" | tail -1 || true
  grep -E "stat::number_of_executed_units|stat::average_exec_per_sec|stat::peak_rss_mb" "$log" || true
  grep -E "^(tokenizer_fuzz|session_load_fuzz|snapshot_fuzz)( stats| outcomes|:)|^ +[0-9]+  " "$log" || true
done
if ls "$run/artifacts"/* >/dev/null 2>&1; then
  echo "FINDINGS in $run/artifacts:"; ls -l "$run/artifacts"
  rc=1
fi
exit "$rc"

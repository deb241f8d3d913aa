#!/usr/bin/env bash
# One device call: the changed kernels' tests, then geist against a base build alternated
# round by round (tg128 and pp512 medians per round, `geist bench pp-tg`), optionally with
# environment variants of the new build, and GEIST_PROFILE op tables at chosen prefill row
# counts. The base is .gpu-carry/bins_base.tar.xz, packed the same way as bins.tar.xz (copy
# the old bins.tar.xz there before packing the new build). Run here:
#   cp .gpu-carry/bins.tar.xz .gpu-carry/bins_base.tar.xz   # before rebuilding
#   bash scripts/device/pack.sh
#   run(command="OPS_FILTER='CudaOps.RmsNorm*' bash scripts/device/ab.sh", carry=[".device", ".gpu-carry"])
# Knobs: OPS_FILTER / MOD_FILTER (gtest filters; empty skips), ROUNDS (3), VARIANTS (space-
# separated VAR=value settings of the new build, each its own arm), PROFILE_ROWS (E4B prefill
# row counts for GEIST_PROFILE tables; their first calls include lazy module loading, so
# compare them only with -r above 1), PPTG_EXTRA (more `bench pp-tg` options, e.g. "-d 1024"),
# PINNED (set: `bench pinned` E4B -c 2048 of both builds, twice, alternated), MOD_ENV
# (environment settings for the model tests, e.g. "GEIST_CUDA_LAZY_LOGITS=1"), OPS_ENV (the
# same for the op tests), HOST_TIMES
# (set: GEIST_CUDA_HOST_TIMES=1 tg128 of the new build, defaults and each variant). Both builds' greedy text on both models is compared by
# its md5sum (the same bits give the same text).
. scripts/device/common.sh
models
mkdir -p /tmp/base && tar -xJf .gpu-carry/bins_base.tar.xz -C /tmp/base
GB=/tmp/base/build/cuda90/tools/geist
if [ -n "${OPS_FILTER:-}" ]; then
  step "op tests: $OPS_FILTER"
  # shellcheck disable=SC2086
  env ${OPS_ENV:-} timeout 200 "$OPS" --gtest_filter="$OPS_FILTER" 2>&1 | grep "^\[  PASSED\|^\[  FAILED\|Failure\|FAILED\|tests ran" | head -20
fi
waitmodels
if [ -n "${MOD_FILTER:-}" ]; then
  step "model tests: $MOD_FILTER (left $(left))"
  # shellcheck disable=SC2086
  env ${MOD_ENV:-} GEIST_CUDA_TEST_MODELS=/tmp/e4b.gguf:/tmp/g3.gguf timeout 240 "$MOD" --gtest_filter="$MOD_FILTER" 2>&1 |
    grep "^\[  PASSED\|^\[  FAILED\|Failure\|FAILED\|tests ran\|^\[       OK" | head -30
fi
tg() {  # binary model [env...]: "pp512 <t/s> tg128 <t/s>" (and pp512@d<depth> ...), medians of -r 3
  local bin=$1 m=$2; shift 2
  env "$@" "$bin" bench pp-tg --backend cuda -m /tmp/$m.gguf -p 512 -n 128 -r 3 ${PPTG_EXTRA:-} --json /tmp/pt.json > /dev/null 2>&1
  python3 -c "
import json, statistics
rs = json.load(open('/tmp/pt.json'))['results']
print(' '.join('%s %.1f' % (r['test'].replace(' ', ''), statistics.median(r['samples_ts'])) for r in rs))" 2>/dev/null || echo "?"
}
for m in g3 e4b; do
  step "greedy text of $m, base against new"
  for b in "$GB" "$G"; do
    timeout 30 "$b" run --backend cuda -m /tmp/$m.gguf -p "The quick brown fox" -n 48 --temp 0 --ignore-eos 2>/dev/null | md5sum
  done
  for v in ${VARIANTS:-}; do
    echo -n "$v: "
    # shellcheck disable=SC2086
    env $v timeout 30 "$G" run --backend cuda -m /tmp/$m.gguf -p "The quick brown fox" -n 48 --temp 0 --ignore-eos 2>/dev/null | md5sum
  done
done
for m in g3 e4b; do
  step "A/B $m (left $(left)): base, new${VARIANTS:+, $VARIANTS}"
  for r in $(seq 1 "${ROUNDS:-3}"); do
    [ "$(left)" -gt 40 ] || break
    line="round $r | base $(tg "$GB" $m) | new $(tg "$G" $m)"
    for v in ${VARIANTS:-}; do line="$line | $v $(tg "$G" $m "$v")"; done
    echo "$line"
  done
done
if [ -n "${HOST_TIMES:-}" ]; then
  for m in g3 e4b; do
    for v in "" ${VARIANTS:-}; do
      step "GEIST_CUDA_HOST_TIMES, $m tg128 ${v:-(defaults)} (left $(left))"
      # shellcheck disable=SC2086
      [ "$(left)" -gt 30 ] && env GEIST_CUDA_HOST_TIMES=1 $v timeout 30 "$G" bench pp-tg --backend cuda -m /tmp/$m.gguf \
        -p 0 -n 128 -r 3 2>&1 | grep "GEIST_CUDA_HOST_TIMES"
    done
  done
fi
if [ -n "${PINNED:-}" ]; then
  for b in "$GB" "$G" "$GB" "$G"; do
    step "pinned E4B, $b (left $(left))"
    [ "$(left)" -gt 60 ] && timeout 60 "$b" bench pinned --backend cuda -m /tmp/e4b.gguf -c 2048 2>&1 | grep -A3 "^| mode  *| *P50 ms" | tail -3
  done
fi
for n in ${PROFILE_ROWS:-}; do
  step "GEIST_PROFILE E4B prefill of $n rows (left $(left))"
  [ "$(left)" -gt 30 ] && GEIST_PROFILE=1 timeout 30 "$G" bench pp-tg --backend cuda -m /tmp/e4b.gguf -p "$n" -n 0 -r 3 2>&1 |
    grep -A16 "GEIST_PROFILE" | head -17
done
step "done"

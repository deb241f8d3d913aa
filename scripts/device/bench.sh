#!/usr/bin/env bash
# One device call (~250 s on an H100 with the models made there): CudaOps.DISABLED_PerfBoundary,
# geist against llama.cpp on the E4B and Gemma 3 270M geometries (bench/compare_llamacpp, 3
# alternating rounds), the pinned
# workload, and the E4B row sweep of both engines (geist every n in 1..512, llama-bench the
# counts in ROWS_LLAMA). Needs .gpu-carry/llama-bench.xz (docs/CUDA.md says how to build it)
# for the llama.cpp parts. JSON results land in $OUT. Run from the checkout here:
#   bash scripts/device/pack.sh
#   run(command="bash scripts/device/bench.sh", carry=[".device", ".gpu-carry"], timeout_s=600)
. scripts/device/common.sh
models
step "a kernel boundary against a grid barrier (CUDA.md), PDL on, then off"
timeout 60 "$OPS" --gtest_also_run_disabled_tests --gtest_filter='*PerfBoundary' 2>&1 | grep "PERF\|Failure\|FAILED\|OK \]"
GEIST_CUDA_PDL=0 timeout 60 "$OPS" --gtest_also_run_disabled_tests --gtest_filter='*PerfBoundary' 2>&1 | grep "PERF\|FAILED"
waitmodels
step "geist run (left $(left))"
timeout 30 "$G" run --backend cuda -m /tmp/e4b.gguf -p "hello" -n 16 2>&1 | tail -2
if [ -n "$LB" ]; then
  for m in e4b g3; do
    step "compare $m (left $(left))"
    [ "$(left)" -gt 120 ] && timeout 100 python3 bench/compare_llamacpp --backend cuda --geist "$G" --llama-bench "$LB" \
      -m /tmp/$m.gguf -t 16 --rounds 3 --json "$OUT/cmp_$m.json" 2>&1 | grep -v "^round"
  done
fi
step "pinned E4B (left $(left))"
[ "$(left)" -gt 150 ] && timeout 120 "$G" bench pinned --backend cuda -m /tmp/e4b.gguf -c 2048 --json "$OUT/pinned_e4b.json" 2>&1 | tail -24
ROWS_LLAMA=${ROWS_LLAMA:-1,2,4,8,9,15,16,17,31,32,33,48,63,64,65,96,97,127,128,129,192,255,256,257,384,511,512}
if [ -n "$LB" ]; then
  step "llama.cpp rows (left $(left))"
  [ "$(left)" -gt 100 ] && timeout 60 "$LB" -m /tmp/e4b.gguf -ngl 99 -p "$ROWS_LLAMA" -n 0 -r 3 -o json > "$OUT/rows_llama.json" 2>/tmp/lb.err
fi
step "geist rows 1..512 (left $(left))"
[ "$(left)" -gt 60 ] && timeout $(( $(left) - 5 )) "$G" bench rows --backend cuda -m /tmp/e4b.gguf --from 1 --to 512 -r 3 \
  --align 16 --threshold 0.05 --no-progress --json "$OUT/rows_geist.json" 2>&1 | grep "^flagged"
step "done"

#!/usr/bin/env bash
# One device call after a default changed (2026-12-07: sampled draws on the device and the
# batched steps' rows left on the device, both now on; 2026-12-08: the radix select for the
# sampled draw, GEIST_CUDA_DRAW_SELECT=1, written without a GPU): every CudaModel test by default and
# with both knobs off (the committed models), the draw op tests, the batch and queue tests on
# the synthetic geometries, generation and `bench batch` on both geometries, then the 270M
# side by side with llama.cpp if .gpu-carry/llama-bench.xz was carried. ~300-450 s on an
# H100. Run from the checkout here:
#   bash scripts/device/pack.sh
#   run(command="bash scripts/device/defaults.sh", carry=[".device", ".gpu-carry"], timeout_s=600)
BUDGET=${BUDGET:-560}
. scripts/device/common.sh
models
step "op tests"
timeout 60 "$OPS" --gtest_filter='CudaOps.SampleRows*:CudaOps.GreedyRows*' 2>&1 | grep -E "OK \]|FAILED|Failure"
step "CudaModel.*, committed models, defaults (left $(left))"
timeout 180 "$MOD" 2>&1 | grep -E "OK \]|FAILED|Failure|Expected|Which|PASSED|SKIPPED" | head -40
waitmodels
step "generation, 256 tokens (left $(left))"
for m in g3 e4b; do
  for v in "greedy:0" "sampled:0.8"; do
    IFS=: read -r name t <<< "$v"
    timeout 30 "$G" run --backend cuda -m /tmp/$m.gguf -p "The quick brown fox" -n 256 --temp "$t" -s 42 --ignore-eos > /tmp/out.txt 2>/tmp/err.txt
    echo "$m $name: $(grep -o 'decode [0-9]* tokens.*tokens/s)' /tmp/err.txt)"
  done
done
step "GEIST_PROFILE, 270M, 32 sampled tokens: the draw ops against the rest, tile sort / radix select (left $(left))"
for sel in 0 1; do
  GEIST_CUDA_DRAW_SELECT=$sel GEIST_PROFILE=1 timeout 30 "$G" run --backend cuda -m /tmp/g3.gguf -p "The quick brown fox" -n 32 --temp 0.8 -s 42 --ignore-eos 2>&1 >/dev/null | grep -E "GEIST_PROFILE|sample|greedy|decode [0-9]" | head -8
done
step "sampled generation, GEIST_CUDA_DRAW_SELECT=0 / 1 alternated, md5 of the text (left $(left))"
for round in 1 2; do
  for m in g3 e4b; do
    for sel in 0 1; do
      GEIST_CUDA_DRAW_SELECT=$sel timeout 30 "$G" run --backend cuda -m /tmp/$m.gguf -p "The quick brown fox" -n 256 --temp 0.8 -s 42 --ignore-eos > /tmp/out.txt 2>/tmp/err.txt
      echo "round $round $m select=$sel: $(grep -o 'decode [0-9]* tokens.*tokens/s)' /tmp/err.txt) $(md5sum < /tmp/out.txt | cut -c1-8)"
    done
  done
done
step "CudaModel sampled tests with GEIST_CUDA_DRAW_SELECT=1, committed models (left $(left))"
GEIST_CUDA_DRAW_SELECT=1 timeout 120 "$MOD" --gtest_filter='CudaModel.QueuedDecode*:CudaModel.DecodeBatch*' 2>&1 | grep -E "OK \]|FAILED|Failure|Expected|Which|PASSED" | head -20
step "bench batch, defaults (left $(left))"
for m in g3 e4b; do
  echo "$m: $(timeout 40 "$G" bench batch --backend cuda -m /tmp/$m.gguf -S 1,8 -n 32 -p 32 -r 2 2>&1 | grep -E "^\| +[0-9]" | tr '\n' ' ' | cut -c1-400)"
done
step "batch and queue tests on the geometries (left $(left))"
[ "$(left)" -gt 90 ] && GEIST_CUDA_TEST_MODELS=/tmp/e4b.gguf:/tmp/g3.gguf timeout $(( $(left) - 70 )) "$MOD" \
  --gtest_filter='CudaModel.QueuedDecode*:CudaModel.DecodeBatch*:CudaModel.LogitsMatch*' 2>&1 | grep -E "OK \]|FAILED|Failure|Expected|Which" | head -30
step "compare g3 (left $(left))"
[ -n "$LB" ] && [ "$(left)" -gt 150 ] && timeout 70 python3 bench/compare_llamacpp --backend cuda --geist "$G" --llama-bench "$LB" \
  -m /tmp/g3.gguf -t 16 --rounds 2 --json "$OUT/cmp_g3.json" 2>&1 | grep -v "^round"
step "CudaModel.*, committed models, GEIST_CUDA_SAMPLE=0 GEIST_CUDA_BATCH_LAZY=0 (left $(left))"
[ "$(left)" -gt 40 ] && GEIST_CUDA_SAMPLE=0 GEIST_CUDA_BATCH_LAZY=0 timeout $(( $(left) - 5 )) "$MOD" 2>&1 | grep -E "FAILED|Failure|Expected|Which|PASSED" | head -20
step done

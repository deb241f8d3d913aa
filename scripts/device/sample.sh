#!/usr/bin/env bash
# One device call for the sampled draws on the device (CUDA.md, "Sampled draws on the device,
# queued"; GEIST_CUDA_SAMPLE=1 turns them on for sessions) and the batched steps' rows left on
# the device (CUDA.md, "Batched steps leave their logits rows on the device";
# GEIST_CUDA_BATCH_LAZY=1): the kernels' op test, the CudaModel draw, batch and queue tests
# (they set the knobs themselves), generation with greedy and sampled draws (on the device
# queued, on the host as by default), `bench batch` with and without the batch knob, then
# llama.cpp side by side on E4B if .gpu-carry/llama-bench.xz was carried, and the queue tests
# on the synthetic geometries. Run from the checkout here:
#   bash scripts/device/pack.sh
#   run(command="bash scripts/device/sample.sh", carry=[".device", ".gpu-carry"], timeout_s=600)
BUDGET=${BUDGET:-570}
. scripts/device/common.sh
models
step "op tests"
timeout 100 "$OPS" --gtest_filter='CudaOps.SampleRows*:CudaOps.GreedyRows*' 2>&1 | grep -E "RESULT|OK \]|FAILED|Failure|Expected|Which|width" | head -40
step "model tests, committed models (left $(left))"
timeout 170 "$MOD" --gtest_filter='CudaModel.DecodeBatch*:CudaModel.Queued*:CudaModel.AQueued*:CudaModel.LogitsMatch*' 2>&1 | grep -E "OK \]|FAILED|Failure|Expected|Which|step|after" | head -60
waitmodels
step "generation, 256 tokens (left $(left))"
for r in 1 2; do
  for m in g3 e4b; do
    for v in "greedy:0:" "sampled-device:0.8:GEIST_CUDA_SAMPLE=1" "sampled-host:0.8:GEIST_CUDA_SAMPLE=0"; do
      IFS=: read -r name t envs <<< "$v"
      # shellcheck disable=SC2086
      env $envs timeout 30 "$G" run --backend cuda -m /tmp/$m.gguf -p "The quick brown fox" -n 256 --temp "$t" -s 42 --ignore-eos > /tmp/out.txt 2>/tmp/err.txt
      echo "$m $name: $(grep -o 'decode [0-9]* tokens.*tokens/s)' /tmp/err.txt) md5 $(md5sum < /tmp/out.txt | cut -c1-12)"
    done
  done
done
step "bench batch, rows left on the device off / on (left $(left))"
for r in 1 2; do
  for m in g3 e4b; do
    for bl in 0 1; do
      echo "$m BATCH_LAZY=$bl: $(GEIST_CUDA_BATCH_LAZY=$bl timeout 40 "$G" bench batch --backend cuda -m /tmp/$m.gguf -S 1,8 -n 32 -p 32 -r 2 2>&1 | grep -E "^\| +[0-9]" | tr '\n' ' ' | cut -c1-400)"
    done
  done
done
step "compare e4b (left $(left))"
[ -n "$LB" ] && [ "$(left)" -gt 130 ] && timeout 110 python3 bench/compare_llamacpp --backend cuda --geist "$G" --llama-bench "$LB" \
  -m /tmp/e4b.gguf -t 16 --rounds 2 --json "$OUT/cmp_e4b.json" 2>&1 | grep -v "^round"
step "queue tests on the geometries (left $(left))"
[ "$(left)" -gt 50 ] && GEIST_CUDA_TEST_MODELS=/tmp/e4b.gguf:/tmp/g3.gguf timeout $(( $(left) - 10 )) "$MOD" \
  --gtest_filter='CudaModel.QueuedDecode*:CudaModel.DecodeBatch*' 2>&1 | grep -E "OK \]|FAILED|Failure|Expected|Which" | head -30
step done

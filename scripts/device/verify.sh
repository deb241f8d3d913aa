#!/usr/bin/env bash
# One device call: every CUDA ctest entry in one process (the discovered CudaOps.* / CudaModel.*
# tests and the environment-knob variants; ~420 s on an H100, so the call needs the whole 600 s
# limit), then the device-memory test on the real geometries. Run from the checkout here:
#   bash scripts/device/pack.sh
#   run(command="bash scripts/device/verify.sh", carry=[".device", ".gpu-carry"], timeout_s=600)
# CTEST_ARGS narrows the ctest selection (for example "-I 121,131" to finish a cut-off run).
. scripts/device/common.sh
models
cd "$B" || exit 1
step "ctest, one process (${CTEST_ARGS:--R ^(cuda_|CudaOps\.|CudaModel\.)})"
# shellcheck disable=SC2086
timeout $(( $(left) - 80 )) ctest ${CTEST_ARGS:--R '^(cuda_|CudaOps\.|CudaModel\.)'} --timeout 150 --output-on-failure > /tmp/ct.log 2>&1
echo "ctest rc $?"
grep -B2 -A30 "Failure\|FAILED" /tmp/ct.log | head -60
grep "tests passed\|\*\*\*Failed\|\*\*\*Timeout\|Total Test time" /tmp/ct.log | head -30
echo "last started: $(grep 'Start ' /tmp/ct.log | tail -1)"
cp /tmp/ct.log "$OUT/"
cd /work/main || exit 1
waitmodels
step "device memory on the E4B and 270M geometries (left $(left))"
[ "$(left)" -gt 30 ] && GEIST_CUDA_TEST_MODELS=/tmp/e4b.gguf:/tmp/g3.gguf timeout $(( $(left) - 5 )) "$MOD" --gtest_filter='CudaModel.DeviceMemory*' 2>&1 | grep -i "e4b\|g3\|PASSED\|FAILED"
step "done"

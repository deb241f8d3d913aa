# shellcheck shell=bash disable=SC2034
# Sourced on the lent GPU machine from the checkout root, by a call's script:
#   run(command="bash my_call.sh", carry=[".device", ".gpu-carry"])
# with my_call.sh starting `. scripts/device/common.sh`. It tees the output to $OUT/log,
# unpacks scripts/device/pack.sh's binaries into /work/main/build/cuda90 (the checkout linked
# to /work/main, where the tests look for tests/data), and defines:
#   B, G, OPS, MOD  the build folder, geist, cuda_ops_int, cuda_model_int
#   step TEXT       a timestamped header
#   left            seconds left of BUDGET (default 590) since sourcing
#   models          makes /tmp/e4b.gguf (the E4B geometry) and /tmp/g3.gguf (Gemma 3 270M) in
#                   the background; waitmodels waits for both
#   LB              llama-bench, if .gpu-carry/llama-bench.xz was carried (built outside the
#                   repo; docs/CUDA.md says how)
# In a script that tees its output, wait on each job's pid: a bare `wait` also waits for the
# tee, and the call hangs to its limit.
set +e
export PYTHONUNBUFFERED=1
exec > >(tee "$OUT/log") 2>&1
. .device/env.sh
for d in /usr/lib/x86_64-linux-gnu /usr/local/cuda-13.0/targets/x86_64-linux/lib /usr/local/cuda/lib64; do
  export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d
done
if [ "$PWD" != /work/main ]; then mkdir -p /work; [ -e /work/main ] || ln -s "$PWD" /work/main; fi
tar -xJf .gpu-carry/bins.tar.xz -C /work/main
B=/work/main/build/cuda90; G=$B/tools/geist; OPS=$B/tests/cuda_ops_int; MOD=$B/tests/cuda_model_int
if [ -e .gpu-carry/llama-bench.xz ]; then
  xz -dc .gpu-carry/llama-bench.xz > /tmp/llama-bench && chmod +x /tmp/llama-bench && LB=/tmp/llama-bench
fi
step() { echo; echo "=== $(date +%T) $*"; }
# Seconds left of the call's BUDGET (default 590) since this file was sourced.
TS=$(date +%s)
left() { echo $(( ${BUDGET:-590} - ($(date +%s) - TS) )); }
models() {
  (python3 scripts/make_synth_gemma4.py /tmp/e4b.gguf --variant e4b > /tmp/mk4.log 2>&1; touch /tmp/e4b.done) &
  (python3 scripts/make_synth_gemma3.py /tmp/g3.gguf > /tmp/mk3.log 2>&1; touch /tmp/g3.done) &
}
waitmodels() { while [ ! -e /tmp/e4b.done ] || [ ! -e /tmp/g3.done ]; do sleep 1; done; ls -la /tmp/e4b.gguf /tmp/g3.gguf; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv
$G --version 2>&1 | head -2

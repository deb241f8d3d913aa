#!/usr/bin/env bash
# One device call (~360 s on an H100, most of it the E4B runs under ncu): what each kernel of
# one decode step costs on its own, under Nsight Compute (works on the Firecracker machines,
# KINDS.md). For each model (MODELS, default the E4B and Gemma 3 270M geometries) it profiles
# `geist run` decoding N1 and then N2 tokens and prints (run N2 - run N1) / (N2 - N1) per kernel
# name: launches per token, summed isolated duration, DRAM bytes read and the rate. ncu
# serializes the graph's nodes and flushes the caches before each (--cache-control all): the sum
# is an upper bound of the step, the graph with PDL overlaps launches and prefetches weights;
# compare with tg128. Run here:
#   bash scripts/device/pack.sh
#   run(command="bash scripts/device/profile.sh", carry=[".device", ".gpu-carry"], timeout_s=600)
. scripts/device/common.sh
models
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"
N1=${N1:-2}; N2=${N2:-6}
CACHE=${CACHE:-all}
waitmodels
for m in ${MODELS:-g3 e4b}; do
  for n in $N1 $N2; do
    step "ncu $m, $n tokens (left $(left))"
    timeout $(( $(left) - 10 )) "$NCU" --clock-control none --cache-control "$CACHE" --graph-profiling node \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv --page raw --log-file "$OUT/ncu_${m}_$n.csv" \
      "$G" run --backend cuda -m /tmp/$m.gguf -p "The quick brown fox" -n "$n" --temp 0 --ignore-eos -c 512 \
      > /tmp/ncu_out.log 2>&1
    echo "rc $? ($(wc -l < "$OUT/ncu_${m}_$n.csv") lines)"; tail -3 /tmp/ncu_out.log
  done
  python3 scripts/device/ncu_per_token.py "$OUT/ncu_${m}_$N1.csv" "$OUT/ncu_${m}_$N2.csv" $((N2 - N1))
done
step "done"

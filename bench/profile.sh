#!/usr/bin/env bash
# Nsight Compute summary of the Hopper kernel on fixed_8192 (one sequence of 8192 tokens, H = 64),
# run on the GPU machine after `bash bench/bundle.sh` here. Clocks are left alone.
set -uo pipefail
BUNDLE=${BUNDLE:-target/gpu-bundle}
OUT=${OUT:-/tmp/kda-profile}
mkdir -p "$OUT"
python3 bench/foreign_roundtrip.py make "$OUT/fixed_8192.safetensors" 8192 64
timeout 300 ncu --clock-control none --kernel-name kda_fwd_h_hopper --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
    --section LaunchStats --section SchedulerStats \
    "$BUNDLE/kda" run --inputs "$OUT/fixed_8192.safetensors" --out "$OUT/out.safetensors" --repeat 5 \
    >"$OUT/ncu.txt" 2>&1
echo "ncu rc=$?"
rm -f "$OUT"/*.safetensors
tail -n 120 "$OUT/ncu.txt"

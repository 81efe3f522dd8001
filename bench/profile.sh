#!/usr/bin/env bash
# Nsight Compute profile of the Hopper kernel on fixed_8192 (one sequence of 8192 tokens, H = 64),
# run on the GPU machine after `bash bench/bundle.sh` here. Clocks are left alone.
# Leaves under $OUT: ncu.txt (the summary sections) and source.csv (per-SASS-instruction warp
# stall samples, to find where the serial chain of each chunk waits).
set -uo pipefail
BUNDLE=${BUNDLE:-target/gpu-bundle}
OUT=${OUT:-/tmp/kda-profile}
mkdir -p "$OUT"
python3 bench/foreign_roundtrip.py make "$OUT/fixed_8192.safetensors" 8192 64
timeout 300 ncu --clock-control none --kernel-name kda_fwd_h_hopper --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
    --section LaunchStats --section SchedulerStats --section SourceCounters --import-source no \
    -o "$OUT/profile" \
    "$BUNDLE/kda" run --inputs "$OUT/fixed_8192.safetensors" --out "$OUT/out.safetensors" --repeat 5 \
    >"$OUT/ncu_run.txt" 2>&1
echo "ncu rc=$?"
tail -n 5 "$OUT/ncu_run.txt"
ncu --import "$OUT/profile.ncu-rep" --page details >"$OUT/ncu.txt" 2>&1
ncu --import "$OUT/profile.ncu-rep" --page source --csv --print-source sass >"$OUT/source.csv" 2>&1 \
    || echo "source page export failed: $(head -c 300 "$OUT/source.csv")"
rm -f "$OUT"/*.safetensors
cat "$OUT/ncu.txt"

#!/usr/bin/env bash
# Correctness of candidate `kda` builds on the GPU machine, before timing them: each binary's
# outputs against the f64 reference (`kda run --cpu`, computed once per input with the first
# binary) on fixed_8192 and on a 512-item ragged batch with tails, compared with
# `bench/foreign_roundtrip.py compare`. Every GPU run has a timeout, so a hang is reported
# instead of using up the device time.
# Usage: OUT=dir bash bench/check.sh path/to/kda-a path/to/kda-b ...
set -uo pipefail
OUT=${OUT:-/tmp/kda-check}
mkdir -p "$OUT"
python3 bench/foreign_roundtrip.py make "$OUT/fixed_8192.safetensors" 8192 64 >/dev/null
python3 bench/foreign_roundtrip.py make "$OUT/ragged_many.safetensors" 0,1,63,64,65,129,200,7 32 >/dev/null
for shape in fixed_8192 ragged_many; do
    timeout 120 "$1" run --cpu --inputs "$OUT/$shape.safetensors" --out "$OUT/cpu.safetensors" >/dev/null \
        || echo "reference rc=$?"
    for bin in "$@"; do
        echo "== $shape: $bin"
        timeout 30 "$bin" run --inputs "$OUT/$shape.safetensors" --out "$OUT/gpu.safetensors" >/dev/null \
            || echo "run rc=$?"
        python3 bench/foreign_roundtrip.py compare "$OUT/$shape.safetensors" "$OUT/gpu.safetensors" "$OUT/cpu.safetensors"
        rm -f "$OUT/gpu.safetensors"
    done
done
rm -f "$OUT"/*.safetensors

#!/usr/bin/env bash
# A short GPU check of a candidate `kda` build against the current one, for a device budget too
# small for the whole session: correctness of the candidate against the f64 reference (`--cpu`)
# on fixed_8192 and on a 512-item ragged batch with tails, and both builds' times on fixed_8192
# and mixed_6. Every GPU run has a timeout, so a hang reports instead of eating the budget.
# Usage: OUT=dir bash bench/quick-check.sh CANDIDATE/kda CURRENT/kda
set -uo pipefail
OUT=${OUT:-/tmp/kda-quick}
NEW=$1 OLD=$2
mkdir -p "$OUT"
make() { python3 bench/foreign_roundtrip.py make "$OUT/$1.safetensors" "$2" "$3" >/dev/null; }
make fixed_8192 8192 64
make mixed_6 1300,547,2048,963,271,3063 64
make ragged_many 0,1,63,64,65,129,200,7 32
for shape in fixed_8192 ragged_many; do
    echo "== $shape: candidate vs f64 reference"
    timeout 30 "$NEW" run --inputs "$OUT/$shape.safetensors" --out "$OUT/gpu.safetensors" || echo "candidate rc=$?"
    timeout 60 "$NEW" run --cpu --inputs "$OUT/$shape.safetensors" --out "$OUT/cpu.safetensors" >/dev/null
    python3 bench/foreign_roundtrip.py compare "$OUT/$shape.safetensors" "$OUT/gpu.safetensors" "$OUT/cpu.safetensors"
done
for shape in fixed_8192 mixed_6; do
    for bin in "$NEW" "$OLD" "$NEW" "$OLD"; do
        printf '%-12s %-28s ' "$shape" "$bin"
        timeout 30 "$bin" run --inputs "$OUT/$shape.safetensors" --out "$OUT/gpu.safetensors" --repeat 100 2>&1 | grep median
    done
done
rm -f "$OUT"/*.safetensors

#!/usr/bin/env bash
# A/B timing of kernel builds on the GPU machine: each `kda` binary given (built from an earlier
# commit and carried over) runs the same inputs, fixed_8192 and mixed_6, median of 100 launches.
# Usage: OUT=dir [SHAPES="fixed_8192 ..."] bash bench/ab.sh path/to/kda-a path/to/kda-b ...
set -uo pipefail
OUT=${OUT:-/tmp/kda-ab}
mkdir -p "$OUT"
python3 bench/foreign_roundtrip.py make "$OUT/fixed_8192.safetensors" 8192 64 >/dev/null
python3 bench/foreign_roundtrip.py make "$OUT/mixed_6.safetensors" 1300,547,2048,963,271,3063 64 >/dev/null
python3 bench/foreign_roundtrip.py make "$OUT/fixed_32k.safetensors" 32768 64 >/dev/null
# 256 sequences of 1 to 64 tokens, like the bench's decode_like (other lengths, same law).
decode=$(python3 -c 'import random; random.seed(5); print(",".join(str(random.randint(1, 64)) for _ in range(256)))')
python3 bench/foreign_roundtrip.py make "$OUT/decode_like.safetensors" "$decode" 64 >/dev/null
for shape in ${SHAPES:-fixed_8192 mixed_6 fixed_32k decode_like}; do
    for bin in "$@"; do
        printf '%-12s %-28s ' "$shape" "$bin"
        "$bin" run --inputs "$OUT/$shape.safetensors" --out "$OUT/out.safetensors" --repeat 100 2>&1 | grep median
    done
done
rm -f "$OUT"/*.safetensors

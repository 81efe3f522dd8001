#!/usr/bin/env bash
# A/B timing of kernel builds on the GPU machine: each `kda` binary given (built from an earlier
# commit and carried over) runs the same inputs, median of 100 launches, on fixed_8192, mixed_6,
# fixed_32k and a decode-like batch, or on the shapes `SHAPES` names (any of those, many_short and
# tiny; only those inputs are made).
# Every run has a timeout, so a hang is reported instead of using up the device time.
# Usage: OUT=dir [SHAPES="fixed_8192 ..."] bash bench/ab.sh path/to/kda-a path/to/kda-b ...
set -uo pipefail
OUT=${OUT:-/tmp/kda-ab}
mkdir -p "$OUT"
lengths() {
    case $1 in
        fixed_8192) echo 8192 ;;
        mixed_6) echo 1300,547,2048,963,271,3063 ;;
        fixed_32k) echo 32768 ;;
        many_short) python3 -c 'print(",".join(["128"] * 64))' ;;
        tiny) echo 256 ;;
        # 256 sequences of 1 to 64 tokens, like the bench's decode_like (other lengths, same law).
        decode_like) python3 -c 'import random; random.seed(5); print(",".join(str(random.randint(1, 64)) for _ in range(256)))' ;;
        *) echo "unknown shape $1" >&2; exit 2 ;;
    esac
}
SHAPES=${SHAPES:-fixed_8192 mixed_6 fixed_32k decode_like}
# (A shape named twice, for a second round, is made once.)
for shape in $(printf '%s\n' $SHAPES | sort -u); do
    python3 bench/foreign_roundtrip.py make "$OUT/$shape.safetensors" "$(lengths "$shape")" 64 >/dev/null
done
for shape in $SHAPES; do
    for bin in "$@"; do
        printf '%-12s %-28s ' "$shape" "$bin"
        out=$(timeout 60 "$bin" run --inputs "$OUT/$shape.safetensors" --out "$OUT/out.safetensors" --repeat 100 2>&1)
        rc=$?
        grep median <<<"$out" || echo "no median (rc=$rc): $(tail -n 1 <<<"$out")"
    done
done
rm -f "$OUT"/*.safetensors

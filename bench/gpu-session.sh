#!/usr/bin/env bash
# One GPU session on a machine without Rust: runs prebuilt binaries from $BUNDLE (made here by
# `bash bench/bundle.sh`) and leaves every log under $OUT. Steps: device info, the GPU suite, the
# demo, a PyTorch-written file through `kda run` (GPU and --cpu), the benchmark, and
# compute-sanitizer (memcheck, racecheck, synccheck) on a ragged fixture with tails.
set -uo pipefail
BUNDLE=${BUNDLE:-target/gpu-bundle}
OUT=${OUT:-/tmp/kda-gpu-out}
mkdir -p "$OUT"
export KDA_FIXTURES=$PWD/tests/fixtures
# A failing proptest case is reported after a short shrink, not after minutes of GPU runs.
export PROPTEST_MAX_SHRINK_ITERS=${PROPTEST_MAX_SHRINK_ITERS:-16}
step() { # name, timeout, command...
    local name=$1 limit=$2; shift 2
    echo "== $name: $*" | tee -a "$OUT/steps.txt"
    local t0=$SECONDS
    timeout "$limit" "$@" >"$OUT/$name.txt" 2>&1
    local rc=$?
    echo "   rc=$rc in $((SECONDS - t0)) s" | tee -a "$OUT/steps.txt"
    tail -n 25 "$OUT/$name.txt"
}
# QUICK=1: the suite and the benchmark only (while iterating on the kernel's speed).
QUICK=${QUICK:-0}
step device 30 nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
step gpu_suite 300 "$BUNDLE/gpu" --test-threads=1 --nocapture
if [ "$QUICK" = 1 ]; then
    step bench 240 "$BUNDLE/xtask" bench --repeat 100 --out "$OUT"
    { for f in device gpu_suite bench; do echo "######## $f"; cat "$OUT/$f.txt"; done; } > "$OUT/session.log" 2>&1
    rm -f "$OUT"/*.txt
    exit 0
fi
step demo 60 "$BUNDLE/kda" demo
step foreign_make 60 python3 bench/foreign_roundtrip.py make "$OUT/foreign_in.safetensors"
step foreign_gpu 60 "$BUNDLE/kda" run --inputs "$OUT/foreign_in.safetensors" --out "$OUT/foreign_gpu.safetensors" --repeat 50
step foreign_cpu 60 "$BUNDLE/kda" run --cpu --inputs "$OUT/foreign_in.safetensors" --out "$OUT/foreign_cpu.safetensors"
step foreign_compare 60 python3 bench/foreign_roundtrip.py compare "$OUT/foreign_in.safetensors" "$OUT/foreign_gpu.safetensors" "$OUT/foreign_cpu.safetensors"
step bench 240 "$BUNDLE/xtask" bench --repeat 100 --out "$OUT"
# Two ragged inputs with tails: a golden fixture (one item per CTA) and a batch of 512 items, so
# that CTAs of the persistent grid run several items back to back.
step ragged_many 60 python3 bench/foreign_roundtrip.py make "$OUT/ragged_many.safetensors" 0,1,63,64,65,129,200,7 32
for tool in memcheck racecheck synccheck; do
    step "sanitizer_$tool" 120 compute-sanitizer --tool "$tool" "$BUNDLE/kda" run --inputs tests/fixtures/ragged_h3.safetensors --out "$OUT/sanitized.safetensors"
    step "sanitizer_many_$tool" 120 compute-sanitizer --tool "$tool" "$BUNDLE/kda" run --inputs "$OUT/ragged_many.safetensors" --out "$OUT/sanitized.safetensors"
done
rm -f "$OUT"/*.safetensors
# Two files come back: the whole log and the benchmark's JSON.
{ for f in device gpu_suite demo foreign_make foreign_gpu foreign_cpu foreign_compare bench ragged_many \
        sanitizer_memcheck sanitizer_many_memcheck sanitizer_racecheck sanitizer_many_racecheck \
        sanitizer_synccheck sanitizer_many_synccheck; do
    echo "######## $f"; cat "$OUT/$f.txt"; done; } > "$OUT/session.log" 2>&1
rm -f "$OUT"/*.txt

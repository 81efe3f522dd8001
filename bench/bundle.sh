#!/usr/bin/env bash
# Builds the binaries bench/gpu-session.sh runs into target/gpu-bundle (carried to the GPU
# machine, which has no Rust): the CLI, the xtask benchmark and the GPU suite's test binary.
set -euo pipefail
cd "$(dirname "$0")/.."
# (two commands: `--bin kda` would filter xtask's binary out of a combined build)
cargo build --release -p kda --bin kda
cargo build --release -p xtask
gpu_test=$(cargo test -p kda-tests --release --features gpu --test gpu --no-run --message-format=json \
    | python3 -c 'import json,sys; print([m["executable"] for m in map(json.loads, sys.stdin) if m.get("executable")][-1])')
mkdir -p target/gpu-bundle
cp target/release/kda target/release/xtask "$gpu_test" target/gpu-bundle/
mv "target/gpu-bundle/$(basename "$gpu_test")" target/gpu-bundle/gpu
ls -la target/gpu-bundle

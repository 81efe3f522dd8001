#!/usr/bin/env bash
# The crates as users get them: `cargo package` (each .crate unpacked and built on its own, with
# the shipped PTX) and `cargo publish --dry-run` for kda-kernel, kda and kda-cli; then a user crate
# outside the workspace (.ci/user-crate) builds on the packaged kda and runs its CPU path with the
# stable toolchain's own binaries and no rustup on PATH, so no nightly can be reached.
# ALLOW_DIRTY=1 packages an uncommitted tree (CI packages a clean checkout).
set -euo pipefail
cd "$(dirname "$0")/.."
crates=(-p kda-kernel -p kda -p kda-cli)
dirty=${ALLOW_DIRTY:+--allow-dirty}
# Verification in a target directory of its own, emptied first: cargo treats a registry crate of
# one version as immutable, so a build from an earlier packaging of 0.1.0 would be reused.
verify=target/package-verify
rm -rf "$verify" target/package
# Likewise cargo unpacks each packaged crate of the local registry once per registry path and
# version, so a second run at the same path would build the first run's sources: drop those.
rm -rf "${CARGO_HOME:-$HOME/.cargo}"/registry/src/-*/kda-0.1.0 \
    "${CARGO_HOME:-$HOME/.cargo}"/registry/src/-*/kda-kernel-0.1.0 \
    "${CARGO_HOME:-$HOME/.cargo}"/registry/src/-*/kda-cli-0.1.0
cargo package "${crates[@]}" $dirty --target-dir "$verify"
cargo publish --dry-run "${crates[@]}" $dirty --target-dir "$verify"

stable_bin=$(dirname "$(rustup which --toolchain stable cargo)")
shim=$(mktemp -d)
trap 'rm -rf "$shim"' EXIT
printf '#!/bin/sh\necho "the user build called rustup ($*): it must need no other toolchain" >&2\nexit 97\n' >"$shim/rustup"
chmod +x "$shim/rustup"
env -u RUSTUP_TOOLCHAIN -u RUSTC -u CARGO PATH="$shim:$stable_bin:/usr/bin:/bin" CARGO_TARGET_DIR=target/user-crate \
    "$stable_bin/cargo" run --quiet --manifest-path .ci/user-crate/Cargo.toml

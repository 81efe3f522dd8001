//! PTX builder (the role `cuda_builder` plays in Rust-CUDA): compiles the `kda-kernel` device crate
//! with rustc's `nvptx64-nvidia-cuda` target for each architecture in `ARCHS`, checks the PTX and
//! leaves it in `OUT_DIR` for `src/ptx.rs` to embed.
//!
//! The device crate needs the nightly pinned in `kda-kernel/rust-toolchain.toml` with `rust-src`
//! (`core` is built from source with `-Zbuild-std=core`: no prebuilt nvptx `core` is served).
//! When either is missing the build fails with the command that installs it.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The pinned device toolchain; keep in sync with `kda-kernel/rust-toolchain.toml` (checked below).
const TOOLCHAIN: &str = "nightly-2026-05-20";
/// `(file stem, target-cpu)`: the Hopper kernels need sm_90a (wgmma, TMA and mbarrier
/// transaction counts are `a`-only features); sm_80 is the portable target of the baseline.
const ARCHS: [(&str, &str); 2] = [("kda_sm_90a", "sm_90a"), ("kda_sm_80", "sm_80")];

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let device = manifest.join("../kda-kernel");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("set by cargo"));
    for p in ["src", "Cargo.toml", "rust-toolchain.toml"] {
        println!("cargo:rerun-if-changed={}", device.join(p).display());
    }
    check_toolchain_file(&device);
    check_toolchain_installed();

    let target_dir = out.join("device-target");
    for (stem, cpu) in ARCHS {
        let ptx_path = out.join(format!("{stem}.ptx"));
        // rustc writes the raw PTX (and skips the write when nothing changed); the fix-ups below
        // always start from it, so they apply exactly once.
        let raw_path = out.join(format!("{stem}.raw.ptx"));
        build_ptx(&device, &target_dir, cpu, &raw_path);
        std::fs::copy(&raw_path, &ptx_path).unwrap_or_else(|e| fail(&format!("{}: {e}", ptx_path.display())));
        if cpu == "sm_90a" {
            align_tensor_map_params(&ptx_path);
            add_launch_bounds(&ptx_path);
        }
        check_ptx(&ptx_path, cpu);
    }
}

/// The toolchain file and this builder must name the same nightly.
fn check_toolchain_file(device: &Path) {
    let file = device.join("rust-toolchain.toml");
    let text = std::fs::read_to_string(&file).unwrap_or_else(|e| fail(&format!("{}: {e}", file.display())));
    if !text.contains(&format!("\"{TOOLCHAIN}\"")) {
        fail(&format!("{} does not pin {TOOLCHAIN}, which kda/build.rs builds with", file.display()));
    }
}

/// Fails with the fixing command when the pinned nightly or its `rust-src` is missing.
fn check_toolchain_installed() {
    let install = format!(
        "rustup toolchain install {TOOLCHAIN} --profile minimal --component rust-src --component llvm-tools"
    );
    let sysroot = clean_command("rustup")
        .args(["run", TOOLCHAIN, "rustc", "--print", "sysroot"])
        .output();
    let sysroot = match sysroot {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_owned(),
        _ => fail(&format!(
            "the device crate needs the pinned toolchain {TOOLCHAIN}, which is not installed.\n  fix: {install}"
        )),
    };
    let core_src = Path::new(&sysroot).join("lib/rustlib/src/rust/library/core/Cargo.toml");
    if !core_src.exists() {
        fail(&format!(
            "{TOOLCHAIN} lacks the rust-src component (needed by -Zbuild-std=core).\n  fix: rustup component add rust-src --toolchain {TOOLCHAIN}"
        ));
    }
}

/// Runs the pinned cargo on the device crate, writing its PTX to `ptx_path`.
fn build_ptx(device: &Path, target_dir: &Path, cpu: &str, ptx_path: &Path) {
    let status = clean_command("rustup")
        .current_dir(device)
        .args(["run", TOOLCHAIN, "cargo", "rustc", "--quiet", "--release", "--lib"])
        .args(["--target", "nvptx64-nvidia-cuda", "-Zbuild-std=core"])
        .arg("--target-dir")
        .arg(target_dir)
        .args(["--", "-C", &format!("target-cpu={cpu}"), "-C", "codegen-units=1"])
        // Register-resident accumulators: every loop over a fragment must unroll fully, or its
        // array goes to local memory. LLVM's default full-unroll budget is too small for the
        // 64-element wgmma fragments.
        .args(["-C", "llvm-args=-unroll-threshold=3000"])
        .arg(format!("--emit=asm={}", ptx_path.display()))
        .status()
        .unwrap_or_else(|e| fail(&format!("cannot run rustup: {e}")));
    if !status.success() {
        fail(&format!("compiling kda-kernel for {cpu} failed (see the errors above)"));
    }
}

/// The Hopper kernel takes its three TMA tensor maps (`CUtensorMap`, 128 bytes) by value, and TMA
/// needs them 64-byte aligned, but rustc's nvptx ABI declares no parameter above `.align 16`.
/// This raises exactly those three declarations to `.align 64` (what nvcc emits for a
/// `__grid_constant__ CUtensorMap`), so the driver places them on 64-byte boundaries.
fn align_tensor_map_params(ptx_path: &Path) {
    const KERNEL: &str = "kda_fwd_h_hopper";
    const MAPS: usize = 8;
    let ptx = std::fs::read_to_string(ptx_path).unwrap_or_else(|e| fail(&format!("{}: {e}", ptx_path.display())));
    let mut out = ptx.clone();
    for i in 0..MAPS {
        let from = format!(".param .align 16 .b8 {KERNEL}_param_{i}[128]");
        let to = format!(".param .align 64 .b8 {KERNEL}_param_{i}[128]");
        if !out.contains(&from) {
            fail(&format!("{}: no `{from}` to align (did the kernel's signature change?)", ptx_path.display()));
        }
        out = out.replace(&from, &to);
    }
    std::fs::write(ptx_path, out).unwrap_or_else(|e| fail(&format!("{}: {e}", ptx_path.display())));
}

/// Launch bounds of the Hopper kernel, which rustc cannot express: `.maxntid` (its block size) and
/// `.maxnreg 240`, room for the 64 + 32 accumulator registers, both products' A fragments and
/// the item loop without spills (the PTX test checks). One CTA runs per SM (the ring's shared
/// memory allows one), so registers are not what limits occupancy: an SM sub-partition holds
/// 16384 registers, and the 5-warp CTA puts at most 2 warps on one, 2 x 32 x 240 = 15360.
fn add_launch_bounds(ptx_path: &Path) {
    const ENTRY: &str = ".entry kda_fwd_h_hopper(";
    const THREADS: u32 = 160; // kda_kernel::layout::hopper::THREADS (checked by the launcher's tests)
    const MAX_REGISTERS: u32 = 240;
    let ptx = std::fs::read_to_string(ptx_path).unwrap_or_else(|e| fail(&format!("{}: {e}", ptx_path.display())));
    let start = ptx.find(ENTRY).unwrap_or_else(|| fail(&format!("{}: no `{ENTRY}`", ptx_path.display())));
    let close = start + ptx[start..].find("\n)\n").unwrap_or_else(|| fail("hopper kernel: parameter list not closed")) + 3;
    let bounds = format!(".maxntid {THREADS}, 1, 1\n.maxnreg {MAX_REGISTERS}\n");
    let out = format!("{}{bounds}{}", &ptx[..close], &ptx[close..]);
    std::fs::write(ptx_path, out).unwrap_or_else(|e| fail(&format!("{}: {e}", ptx_path.display())));
}

/// Rejects PTX the driver could not load: calls into functions that were not inlined (typically a
/// `core` panic path) stay as `.extern .func` declarations with no body.
fn check_ptx(ptx_path: &Path, cpu: &str) {
    let ptx = std::fs::read_to_string(ptx_path)
        .unwrap_or_else(|e| fail(&format!("{}: {e}", ptx_path.display())));
    if !ptx.contains(&format!(".target {cpu}")) {
        fail(&format!("{}: not PTX for {cpu}", ptx_path.display()));
    }
    let externs: Vec<&str> = ptx.lines().filter(|l| l.contains(".extern .func")).collect();
    if !externs.is_empty() {
        fail(&format!(
            "{} references external functions (a panic path or a non-inlined call in the device code):\n  {}",
            ptx_path.display(),
            externs.join("\n  ")
        ));
    }
}

/// A command with the outer cargo's toolchain and flag overrides removed, so the child cargo uses
/// the pinned nightly and its own flags.
fn clean_command(program: &str) -> Command {
    let mut cmd = Command::new(program);
    for var in [
        "RUSTUP_TOOLCHAIN",
        "RUSTC",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "CARGO",
    ] {
        cmd.env_remove(var);
    }
    cmd
}

fn fail(msg: &str) -> ! {
    eprintln!("error: {msg}");
    panic!("kda build failed: {msg}");
}

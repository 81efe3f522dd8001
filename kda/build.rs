//! PTX builder (the role `cuda_builder` plays in Rust-CUDA): compiles the `kda-kernel` device crate
//! with rustc's `nvptx64-nvidia-cuda` target for each target in `kda_kernel::abi::TARGETS`, applies
//! what rustc cannot express (parameter alignment, launch bounds; both read from the same
//! `kda_kernel::abi` the launcher uses), checks the PTX and leaves it in `OUT_DIR` for
//! `src/ptx.rs` to embed.
//!
//! The device crate needs the nightly pinned in `kda-kernel/rust-toolchain.toml` with `rust-src`
//! (`core` is built from source with `-Zbuild-std=core`: no prebuilt nvptx `core` is served).
//! When either is missing the build fails with the command that installs it.

use kda_kernel::abi::{KERNELS, KernelAbi, TARGETS};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The pinned device toolchain; keep in sync with `kda-kernel/rust-toolchain.toml` (checked below).
const TOOLCHAIN: &str = "nightly-2026-05-20";
/// rustc's nvptx kernel ABI declares no parameter above this alignment.
const RUSTC_PARAM_ALIGN: usize = 16;

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
    for cpu in TARGETS {
        let stem = format!("kda_{cpu}");
        let ptx_path = out.join(format!("{stem}.ptx"));
        // rustc writes the raw PTX (and skips the write when nothing changed); the fix-ups below
        // always start from it, so they apply exactly once.
        let raw_path = out.join(format!("{stem}.raw.ptx"));
        build_ptx(&device, &target_dir, cpu, &raw_path);
        let mut ptx = read(&raw_path);
        for kernel in KERNELS.iter().filter(|k| k.targets.contains(&cpu)) {
            ptx = align_params(ptx, kernel);
            ptx = add_launch_bounds(ptx, kernel);
        }
        std::fs::write(&ptx_path, &ptx).unwrap_or_else(|e| fail(&format!("{}: {e}", ptx_path.display())));
        check_ptx(&ptx_path, &ptx, cpu);
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
    let install =
        format!("rustup toolchain install {TOOLCHAIN} --profile minimal --component rust-src --component llvm-tools");
    let sysroot = clean_command("rustup").args(["run", TOOLCHAIN, "rustc", "--print", "sysroot"]).output();
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

/// Raises the declared alignment of each of `kernel`'s parameters that needs more than rustc's
/// 16 ([`kda_kernel::abi::Param::align`]: 64 for the tensor maps, as TMA requires and as nvcc
/// declares a `__grid_constant__ CUtensorMap`), so the driver places it on such a boundary.
fn align_params(mut ptx: String, kernel: &KernelAbi) -> String {
    for (i, param) in kernel.params.iter().enumerate().filter(|(_, p)| p.align() > RUSTC_PARAM_ALIGN) {
        let (entry, bytes) = (kernel.entry, param.bytes());
        let from = format!(".param .align {RUSTC_PARAM_ALIGN} .b8 {entry}_param_{i}[{bytes}]");
        let to = format!(".param .align {} .b8 {entry}_param_{i}[{bytes}]", param.align());
        if ptx.matches(&from).count() != 1 {
            fail(&format!("no single `{from}` to align: does `{entry}` still take `{}` there?", param.name));
        }
        ptx = ptx.replace(&from, &to);
    }
    ptx
}

/// Launch bounds rustc cannot express: `.maxntid` (the block size) and `.maxnreg` (the register
/// budget, `kernel.max_registers`), written after the entry's parameter list.
fn add_launch_bounds(ptx: String, kernel: &KernelAbi) -> String {
    let Some(max_registers) = kernel.max_registers else {
        return ptx;
    };
    let head = format!(".entry {}(", kernel.entry);
    let start = ptx.find(&head).unwrap_or_else(|| fail(&format!("no `{head}` in the PTX")));
    let close =
        ptx[start..].find("\n)\n").unwrap_or_else(|| fail(&format!("{}: parameter list not closed", kernel.entry)));
    let close = start + close + 3;
    let bounds = format!(".maxntid {}, 1, 1\n.maxnreg {max_registers}\n", kernel.threads);
    format!("{}{bounds}{}", &ptx[..close], &ptx[close..])
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| fail(&format!("{}: {e}", path.display())))
}

/// Rejects PTX the driver could not load: calls into functions that were not inlined (typically a
/// `core` panic path) stay as `.extern .func` declarations with no body.
fn check_ptx(ptx_path: &Path, ptx: &str, cpu: &str) {
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

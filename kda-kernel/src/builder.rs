//! How this crate becomes PTX (host only): rustc's `nvptx64-nvidia-cuda` target with the pinned
//! nightly, then what rustc cannot express (parameter alignment above 16 bytes, launch bounds),
//! both read from [`crate::abi`], then checks that the driver could load the result.
//!
//! The `kda` crate ships this PTX prebuilt (`kda/ptx/`, so users build on stable Rust with no
//! CUDA toolkit and no nightly). Each file starts with a [`DIGEST_PREFIX`] line naming the
//! [`source_digest`] of the sources it was built from: `kda/build.rs` rebuilds from source when
//! the sources beside it no longer match, and `cargo xtask ptx --check` rebuilds and compares
//! byte for byte. One builder serves both, so the shipped PTX and a local rebuild cannot differ
//! in how they were made.

extern crate std;

use crate::abi::{KERNELS, KernelAbi, SM80, SM90A, TARGETS};
use std::format;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::string::{String, ToString};
use std::vec::Vec;

/// The pinned device toolchain; `rust-toolchain.toml` must name the same (checked).
pub const TOOLCHAIN: &str = "nightly-2026-05-20";

/// rustc's nvptx kernel ABI declares no parameter above this alignment.
const RUSTC_PARAM_ALIGN: usize = 16;

/// rustc flags of the device build, beside `-C target-cpu`. `codegen-units=1`: one module, so
/// every `#[inline(always)]` wrapper inlines into its kernel. The unroll threshold: the
/// register-resident accumulators need every loop over a fragment unrolled fully, or the array
/// goes to local memory, and LLVM's default budget is too small for the 64-element wgmma
/// fragments.
const RUSTC_FLAGS: [&str; 4] = ["-C", "codegen-units=1", "-C", "llvm-args=-unroll-threshold=3000"];

/// The machine code shipped beside each PTX module: the module's target and the architectures
/// ptxas assembles it for. A cubin for `sm_XY` runs on compute capability X.y for every y >= Y; an
/// arch-specific one (`sm_90a`) only on X.Y. Other GPUs take the PTX, which the driver compiles.
pub const CUBINS: [(&str, &[&str]); 2] = [(SM90A, &["sm_90a"]), (SM80, &["sm_80", "sm_100", "sm_120"])];

/// The file name of module `module`'s cubin for architecture `arch`.
pub fn cubin_name(module: &str, arch: &str) -> String {
    format!("kda_{module}.{arch}.cubin")
}

/// Assembles every [`CUBINS`] entry from the PTX modules in `dir` into cubins beside them, with
/// `ptxas` (the CUDA toolkit's, at the version CI pins: its output is what ships).
pub fn assemble_cubins(ptxas: &Path, dir: &Path) -> Result<(), String> {
    for (module, archs) in CUBINS {
        let ptx = dir.join(file_name(module));
        for arch in archs {
            replace_atomically(&dir.join(cubin_name(module, arch)), |temp| {
                let status = Command::new(ptxas)
                    .arg(format!("-arch={arch}"))
                    .arg("-o")
                    .arg(temp)
                    .arg(&ptx)
                    .status()
                    .map_err(|e| format!("cannot run {}: {e}", ptxas.display()))?;
                if status.success() { Ok(()) } else { Err(format!("ptxas -arch={arch} failed on {}", ptx.display())) }
            })?;
        }
    }
    Ok(())
}

/// The first line of every built PTX file, followed by the source digest in hex.
pub const DIGEST_PREFIX: &str = "// kda-kernel source digest: ";

/// The file name of target `cpu`'s PTX module.
pub fn file_name(cpu: &str) -> String {
    format!("kda_{cpu}.ptx")
}

/// The digest of everything the PTX is built from: each file under `device/src`, the device
/// crate's `Cargo.toml` and `rust-toolchain.toml` (path and bytes, in path order), and the
/// flags. FNV-1a (64-bit): it detects stale PTX, it does not authenticate it.
pub fn source_digest(device: &Path) -> Result<u64, String> {
    let mut files = Vec::new();
    collect_files(&device.join("src"), &mut files)?;
    files.push(device.join("Cargo.toml"));
    files.push(device.join("rust-toolchain.toml"));
    files.sort();
    let mut digest = Fnv1a::new();
    for file in &files {
        let relative = file.strip_prefix(device).unwrap_or(file);
        let name: Vec<String> = relative.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
        digest.write(name.join("/").as_bytes());
        digest.write(&[0]);
        digest.write(&std::fs::read(file).map_err(|e| format!("{}: {e}", file.display()))?);
        digest.write(&[0]);
    }
    for flag in RUSTC_FLAGS {
        digest.write(flag.as_bytes());
    }
    digest.write(TOOLCHAIN.as_bytes());
    Ok(digest.finish())
}

/// The digest a built PTX file names in its first line, if it has one.
pub fn recorded_digest(ptx: &str) -> Option<u64> {
    let hex = ptx.lines().next()?.strip_prefix(DIGEST_PREFIX)?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

/// Builds every target's PTX from the device crate at `device` into `out_dir` (one
/// [`file_name`] each), compiling in `target_dir`. Fails with the fixing command when the pinned
/// nightly or its `rust-src` is missing.
pub fn build_all(device: &Path, target_dir: &Path, out_dir: &Path) -> Result<(), String> {
    check_toolchain_file(device)?;
    check_toolchain_installed()?;
    let digest = source_digest(device)?;
    std::fs::create_dir_all(out_dir).map_err(|e| format!("{}: {e}", out_dir.display()))?;
    for cpu in TARGETS {
        // rustc writes the raw PTX (and skips the write when nothing changed); the fix-ups
        // always start from it, so they apply exactly once.
        let raw_path = target_dir.join(format!("kda_{cpu}.raw.ptx"));
        build_raw(device, target_dir, cpu, &raw_path)?;
        let raw = std::fs::read_to_string(&raw_path).map_err(|e| format!("{}: {e}", raw_path.display()))?;
        let ptx = finish(raw, cpu, digest)?;
        let path = out_dir.join(file_name(cpu));
        replace_atomically(&path, |temp| std::fs::write(temp, &ptx).map_err(|e| format!("{}: {e}", temp.display())))?;
    }
    Ok(())
}

/// Applies the ABI's fix-ups to rustc's PTX for `cpu`, heads it with the digest line and checks
/// it.
pub fn finish(raw: String, cpu: &str, digest: u64) -> Result<String, String> {
    let mut ptx = raw;
    for kernel in KERNELS.iter().filter(|k| k.targets.contains(&cpu)) {
        ptx = align_params(ptx, kernel)?;
        ptx = add_launch_bounds(ptx, kernel)?;
    }
    check(&ptx, cpu)?;
    Ok(format!("{DIGEST_PREFIX}{digest:016x}\n{ptx}"))
}

/// Rejects PTX the driver could not load: the wrong target, or calls into functions that were
/// not inlined (typically a `core` panic path), which stay as `.extern .func` declarations.
pub fn check(ptx: &str, cpu: &str) -> Result<(), String> {
    if !ptx.contains(&format!(".target {cpu}")) {
        return Err(format!("not PTX for {cpu}"));
    }
    let externs: Vec<&str> = ptx.lines().filter(|l| l.contains(".extern .func")).collect();
    if !externs.is_empty() {
        return Err(format!(
            "the {cpu} PTX references external functions (a panic path or a non-inlined call in the device code):\n  {}",
            externs.join("\n  ")
        ));
    }
    Ok(())
}

fn collect_files(dir: &Path, files: &mut Vec<PathBuf>) -> Result<(), String> {
    for entry in std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))? {
        let path = entry.map_err(|e| format!("{}: {e}", dir.display()))?.path();
        if path.is_dir() {
            collect_files(&path, files)?;
        } else {
            files.push(path);
        }
    }
    Ok(())
}

/// The toolchain file and this builder must name the same nightly.
fn check_toolchain_file(device: &Path) -> Result<(), String> {
    let file = device.join("rust-toolchain.toml");
    let text = std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
    if !text.contains(&format!("\"{TOOLCHAIN}\"")) {
        return Err(format!("{} does not pin {TOOLCHAIN}, which the PTX builder uses", file.display()));
    }
    Ok(())
}

/// Fails with the fixing command when the pinned nightly or its `rust-src` is missing.
fn check_toolchain_installed() -> Result<(), String> {
    let install =
        format!("rustup toolchain install {TOOLCHAIN} --profile minimal --component rust-src --component llvm-tools");
    let sysroot = clean_command("rustup").args(["run", TOOLCHAIN, "rustc", "--print", "sysroot"]).output();
    let sysroot = match sysroot {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_string(),
        _ => {
            return Err(format!(
                "building the PTX from source needs the pinned toolchain {TOOLCHAIN}, which is not installed.\n  fix: {install}"
            ));
        }
    };
    let core_src = Path::new(&sysroot).join("lib/rustlib/src/rust/library/core/Cargo.toml");
    if !core_src.exists() {
        return Err(format!(
            "{TOOLCHAIN} lacks the rust-src component (needed by -Zbuild-std=core).\n  fix: rustup component add rust-src --toolchain {TOOLCHAIN}"
        ));
    }
    Ok(())
}

/// Runs the pinned cargo on the device crate, writing its PTX for `cpu` to `ptx_path`.
fn build_raw(device: &Path, target_dir: &Path, cpu: &str, ptx_path: &Path) -> Result<(), String> {
    let status = clean_command("rustup")
        .current_dir(device)
        .args(["run", TOOLCHAIN, "cargo", "rustc", "--quiet", "--release", "--lib"])
        .args(["--target", "nvptx64-nvidia-cuda", "-Zbuild-std=core"])
        .arg("--target-dir")
        .arg(target_dir)
        .args(["--", "-C", &format!("target-cpu={cpu}")])
        .args(RUSTC_FLAGS)
        .arg(format!("--emit=asm={}", ptx_path.display()))
        .status()
        .map_err(|e| format!("cannot run rustup: {e}"))?;
    if !status.success() {
        return Err(format!("compiling kda-kernel for {cpu} failed (see the errors above)"));
    }
    Ok(())
}

/// Raises the declared alignment of each of `kernel`'s parameters that needs more than rustc's
/// 16 ([`crate::abi::Param::align`]: 64 for the tensor maps, as TMA requires and as nvcc
/// declares a `__grid_constant__ CUtensorMap`), so the driver places it on such a boundary.
fn align_params(mut ptx: String, kernel: &KernelAbi) -> Result<String, String> {
    for (i, param) in kernel.params.iter().enumerate().filter(|(_, p)| p.align() > RUSTC_PARAM_ALIGN) {
        let (entry, bytes) = (kernel.entry, param.bytes());
        let from = format!(".param .align {RUSTC_PARAM_ALIGN} .b8 {entry}_param_{i}[{bytes}]");
        let to = format!(".param .align {} .b8 {entry}_param_{i}[{bytes}]", param.align());
        if ptx.matches(&from).count() != 1 {
            return Err(format!("no single `{from}` to align: does `{entry}` still take `{}` there?", param.name));
        }
        ptx = ptx.replace(&from, &to);
    }
    Ok(ptx)
}

/// Launch bounds rustc cannot express: `.maxntid` (the block size) and `.maxnreg` (the register
/// budget, `kernel.max_registers`), written after the entry's parameter list.
fn add_launch_bounds(ptx: String, kernel: &KernelAbi) -> Result<String, String> {
    let Some(max_registers) = kernel.max_registers else {
        return Ok(ptx);
    };
    let head = format!(".entry {}(", kernel.entry);
    let start = ptx.find(&head).ok_or_else(|| format!("no `{head}` in the PTX"))?;
    let close = ptx[start..].find("\n)\n").ok_or_else(|| format!("{}: parameter list not closed", kernel.entry))?;
    let close = start + close + 3;
    let bounds = format!(".maxntid {}, 1, 1\n.maxnreg {max_registers}\n", kernel.threads);
    Ok(format!("{}{bounds}{}", &ptx[..close], &ptx[close..]))
}

/// Replaces `path` by what `write` puts into a temporary file beside it, renamed over `path` only
/// once `write` succeeded, so a failed or interrupted build never leaves a truncated file where a
/// good one was (the temporary file is removed on error).
pub fn replace_atomically(path: &Path, write: impl FnOnce(&Path) -> Result<(), String>) -> Result<(), String> {
    let mut temp = std::ffi::OsString::from(path.as_os_str());
    temp.push(format!(".tmp{}", std::process::id()));
    let temp = PathBuf::from(temp);
    let result =
        write(&temp).and_then(|()| std::fs::rename(&temp, path).map_err(|e| format!("{}: {e}", path.display())));
    if result.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    result
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

/// 64-bit FNV-1a.
struct Fnv1a(u64);

impl Fnv1a {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;

    fn new() -> Self {
        Self(Self::OFFSET)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(Self::PRIME);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_matches_the_published_vectors() {
        let hash = |s: &str| {
            let mut h = Fnv1a::new();
            h.write(s.as_bytes());
            h.finish()
        };
        assert_eq!(hash(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(hash("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(hash("foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn the_digest_line_round_trips() {
        let ptx = format!("{DIGEST_PREFIX}{:016x}\n//\n.version 8.0\n", 0x0123_4567_89ab_cdefu64);
        assert_eq!(recorded_digest(&ptx), Some(0x0123_4567_89ab_cdef));
        assert_eq!(recorded_digest("//\n.version 8.0\n"), None);
    }

    #[test]
    fn the_digest_follows_the_sources() {
        let device = Path::new(env!("CARGO_MANIFEST_DIR"));
        let digest = source_digest(device).unwrap();
        assert_eq!(digest, source_digest(device).unwrap(), "the digest must not depend on directory order");
        let copy = std::env::temp_dir().join(format!("kda-builder-digest-{}", std::process::id()));
        copy_tree(device, &copy, &["src", "Cargo.toml", "rust-toolchain.toml"]);
        assert_eq!(source_digest(&copy).unwrap(), digest, "the digest names paths relative to the crate");
        std::fs::write(copy.join("src/lib.rs"), "// changed\n").unwrap();
        assert_ne!(source_digest(&copy).unwrap(), digest, "an edited source must change the digest");
        std::fs::remove_dir_all(&copy).unwrap();
    }

    #[test]
    fn finish_aligns_bounds_and_heads_the_module() {
        // rustc's shape of each sm_90a entry: parameters at most 16-byte aligned, no bounds.
        let entry = |kernel: &KernelAbi| {
            let params: Vec<String> = (kernel.params.iter().enumerate())
                .map(|(i, p)| {
                    format!("\t.param .align {} .b8 {}_param_{i}[{}]", p.align().min(16), kernel.entry, p.bytes())
                })
                .collect();
            format!(".visible .entry {}(\n{}\n)\n{{\n\tret;\n}}\n", kernel.entry, params.join(",\n"))
        };
        let hopper: Vec<&KernelAbi> = KERNELS.iter().filter(|k| k.targets.contains(&crate::abi::SM90A)).collect();
        let raw = format!(".target sm_90a\n{}", hopper.iter().map(|k| entry(k)).collect::<String>());
        let ptx = finish(raw.clone(), crate::abi::SM90A, 7).unwrap();
        assert_eq!(recorded_digest(&ptx), Some(7));
        for kernel in hopper.iter().filter(|k| k.max_registers.is_some()) {
            let bounds = format!(".maxntid {}, 1, 1\n.maxnreg {}\n{{", kernel.threads, kernel.max_registers.unwrap());
            assert!(
                ptx.contains(&format!("{}_param_{}", kernel.entry, kernel.params.len() - 1)) && ptx.contains(&bounds)
            );
        }
        assert!(ptx.contains(".param .align 64 .b8"), "the tensor maps' alignment is raised");
        assert!(finish(raw.replace(".target sm_90a", ".target sm_80"), crate::abi::SM90A, 7).is_err());
        let with_extern = format!("{raw}.extern .func panic_fmt();\n");
        assert!(finish(with_extern, crate::abi::SM90A, 7).unwrap_err().contains("external functions"));
    }

    fn copy_tree(from: &Path, to: &Path, names: &[&str]) {
        std::fs::create_dir_all(to).unwrap();
        for name in names {
            let (src, dst) = (from.join(name), to.join(name));
            if src.is_dir() {
                let children: Vec<String> = std::fs::read_dir(&src)
                    .unwrap()
                    .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .collect();
                let children: Vec<&str> = children.iter().map(String::as_str).collect();
                copy_tree(&src, &dst, &children);
            } else {
                std::fs::copy(&src, &dst).unwrap();
            }
        }
    }
}

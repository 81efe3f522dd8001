//! Chooses the PTX that `src/ptx.rs` embeds, one module per target of
//! `kda_kernel::abi::TARGETS`:
//!
//! - **the shipped PTX** in `ptx/` (built by `cargo xtask ptx --write` and committed), so the crate
//!   builds on stable Rust with no CUDA toolkit and no nightly, with the cubins ptxas assembled
//!   from it (`kda_kernel::builder::CUBINS`). This is the only choice in the packaged crate, which
//!   has no device sources beside it.
//! - **a build from source** (`kda_kernel::builder`, the pinned nightly with `rust-src`) into
//!   `OUT_DIR`, when the device crate's sources sit beside this crate (a checkout of the
//!   repository) and either `KDA_PTX_FROM_SOURCE=1` or the shipped PTX names another source
//!   digest than theirs (the sources were edited since the last `cargo xtask ptx --write`; a
//!   warning says so). A kernel edit therefore never runs stale PTX.

use kda_kernel::abi::TARGETS;
use kda_kernel::builder;
use std::path::{Path, PathBuf};

/// The cfg `src/ptx.rs` embeds the shipped cubins under (only with the shipped PTX they were
/// assembled from; a build from source embeds PTX alone).
const CUBINS_CFG: &str = "kda_cubins";

/// Set to `1` to build the PTX from source even when the shipped PTX is current.
const FROM_SOURCE_VAR: &str = "KDA_PTX_FROM_SOURCE";

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("set by cargo"));
    let shipped = manifest.join("ptx");
    let device = manifest.join("../kda-kernel");
    println!("cargo:rerun-if-env-changed={FROM_SOURCE_VAR}");
    println!("cargo::rustc-check-cfg=cfg({CUBINS_CFG})");
    for cpu in TARGETS {
        println!("cargo:rerun-if-changed={}", shipped.join(builder::file_name(cpu)).display());
    }
    for (module, archs) in builder::CUBINS {
        for arch in archs {
            println!("cargo:rerun-if-changed={}", shipped.join(builder::cubin_name(module, arch)).display());
        }
    }
    let forced = std::env::var(FROM_SOURCE_VAR).is_ok_and(|v| v == "1");
    let has_sources = device.join("src").is_dir();
    if has_sources {
        for p in ["src", "Cargo.toml", "rust-toolchain.toml"] {
            println!("cargo:rerun-if-changed={}", device.join(p).display());
        }
    } else if forced {
        fail(&format!(
            "{FROM_SOURCE_VAR}=1 builds the PTX from the device crate's sources, which are not at {} (a checkout of the repository has them)",
            device.display()
        ));
    }
    let stale = if has_sources { stale_targets(&shipped, &device) } else { Vec::new() };
    let dir = if forced || !stale.is_empty() {
        if !forced {
            println!(
                "cargo:warning=the shipped PTX ({}) was built from other kda-kernel sources; building it from source. Run `cargo xtask ptx --write` to update it",
                stale.join(", ")
            );
        }
        builder::build_all(&device, &out.join("device-target"), &out).unwrap_or_else(|e| fail(&e));
        out
    } else {
        check_shipped(&shipped);
        println!("cargo:rustc-cfg={CUBINS_CFG}");
        shipped
    };
    println!("cargo:rustc-env=KDA_PTX_DIR={}", dir.display());
}

/// The shipped modules whose recorded digest differs from the sources' (or that are missing).
fn stale_targets(shipped: &Path, device: &Path) -> Vec<String> {
    let digest = builder::source_digest(device).unwrap_or_else(|e| fail(&e));
    let recorded = |cpu: &str| {
        let text = std::fs::read_to_string(shipped.join(builder::file_name(cpu))).ok()?;
        builder::recorded_digest(&text)
    };
    TARGETS.iter().filter(|cpu| recorded(cpu) != Some(digest)).map(|cpu| builder::file_name(cpu)).collect()
}

/// The shipped modules exist and pass the builder's checks, and their cubins are ELF files.
fn check_shipped(shipped: &Path) {
    for cpu in TARGETS {
        let path = shipped.join(builder::file_name(cpu));
        let ptx = std::fs::read_to_string(&path).unwrap_or_else(|e| fail(&format!("{}: {e}", path.display())));
        builder::check(&ptx, cpu).unwrap_or_else(|e| fail(&format!("{}: {e}", path.display())));
    }
    for (module, archs) in builder::CUBINS {
        for arch in archs {
            let path = shipped.join(builder::cubin_name(module, arch));
            let bytes = std::fs::read(&path).unwrap_or_else(|e| fail(&format!("{}: {e}", path.display())));
            if !bytes.starts_with(b"\x7fELF") {
                fail(&format!("{}: not a cubin (no ELF header)", path.display()));
            }
        }
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("error: {msg}");
    panic!("kda build failed: {msg}");
}

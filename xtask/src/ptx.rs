//! `cargo xtask ptx`: assemble the embedded PTX with ptxas and print its resource report;
//! `--write` rebuilds the shipped PTX and its cubins (`kda/ptx/`) from the device crate's sources,
//! `--check` rebuilds them aside and fails unless they equal the shipped files byte for byte.

use crate::args::Args;
use kda_kernel::abi::TARGETS;
use kda_kernel::builder;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `ptxas` as `.ci/setup` installs it (see [`crate::harness::cuda_tool`]).
pub fn ptxas() -> PathBuf {
    crate::harness::cuda_tool(&workspace_root(), "ptxas")
}

/// The workspace root (the parent of this crate).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

pub fn run(args: &[String]) -> Result<(), String> {
    let args = Args::parse("ptx", args, &[], &["--write", "--check"])?;
    args.no_positional("ptx")?;
    match (args.has("--write"), args.has("--check")) {
        (true, true) => Err("ptx: --write or --check, not both".into()),
        (true, false) => write(),
        (false, true) => check(),
        (false, false) => report(),
    }
}

/// The device crate's sources and the shipped PTX's directory.
fn device_and_shipped() -> (PathBuf, PathBuf) {
    let root = workspace_root();
    (root.join("kda-kernel"), root.join("kda/ptx"))
}

/// Rebuilds the shipped PTX from source and assembles its cubins, in place (each file renamed
/// over the old one when complete).
fn write() -> Result<(), String> {
    let (device, shipped) = device_and_shipped();
    builder::build_all(&device, &workspace_root().join("target/device-ptx"), &shipped)?;
    builder::assemble_cubins(&ptxas(), &shipped)?;
    let digest = builder::source_digest(&device)?;
    for name in shipped_files() {
        let bytes = std::fs::metadata(shipped.join(&name)).map_err(|e| format!("{name}: {e}"))?.len();
        println!("wrote kda/ptx/{name} ({bytes} bytes, source digest {digest:016x})");
    }
    Ok(())
}

/// Every shipped file: each target's PTX, then each cubin.
fn shipped_files() -> Vec<String> {
    let ptx = TARGETS.iter().map(|cpu| builder::file_name(cpu));
    let cubins = builder::CUBINS.iter().flat_map(|(m, archs)| archs.iter().map(move |a| builder::cubin_name(m, a)));
    ptx.chain(cubins).collect()
}

/// Rebuilds the PTX and its cubins from source aside and compares them with the shipped files
/// byte for byte.
fn check() -> Result<(), String> {
    let (device, shipped) = device_and_shipped();
    let target = workspace_root().join("target/device-ptx-check");
    let built = target.join("out");
    builder::build_all(&device, &target, &built)?;
    builder::assemble_cubins(&ptxas(), &built)?;
    for name in shipped_files() {
        let (fresh, old) = (read_bytes(&built.join(&name))?, read_bytes(&shipped.join(&name))?);
        if fresh != old {
            let diff = match (String::from_utf8(fresh.clone()), String::from_utf8(old)) {
                (Ok(a), Ok(b)) => first_difference(&a, &b).unwrap_or_default(),
                _ => format!("{} bytes built, the shipped file differs", fresh.len()),
            };
            return Err(format!(
                "kda/ptx/{name} differs from a build from source ({diff}): run `cargo xtask ptx --write` and commit it"
            ));
        }
        println!("kda/ptx/{name}: equal to a build from source ({} bytes)", fresh.len());
    }
    Ok(())
}

fn read_bytes(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// Where `built` and `shipped` first differ: the line, both versions of it.
fn first_difference(built: &str, shipped: &str) -> Option<String> {
    if built == shipped {
        return None;
    }
    let (mut a, mut b) = (built.lines(), shipped.lines());
    for line in 1.. {
        match (a.next(), b.next()) {
            (Some(x), Some(y)) if x == y => continue,
            (None, None) => break,
            (x, y) => {
                return Some(format!(
                    "line {line}: built `{}`, shipped `{}`",
                    x.unwrap_or("<end>"),
                    y.unwrap_or("<end>")
                ));
            }
        }
    }
    Some("line endings only".into())
}

/// The ptxas resource report of the embedded PTX.
fn report() -> Result<(), String> {
    let tmp = std::env::temp_dir().join(format!("kda-xtask-ptx-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).map_err(|e| e.to_string())?;
    for (arch, ptx) in [("sm_90a", kda::ptx::SM90A), ("sm_80", kda::ptx::SM80)] {
        let src = tmp.join(format!("kda_{arch}.ptx"));
        std::fs::write(&src, ptx).map_err(|e| e.to_string())?;
        let out = Command::new(ptxas())
            .args(["-v", &format!("-arch={arch}"), "-o"])
            .arg(tmp.join(format!("kda_{arch}.cubin")))
            .arg(&src)
            .output()
            .map_err(|e| format!("cannot run {}: {e} (install it with .ci/setup)", ptxas().display()))?;
        if !out.status.success() {
            return Err(format!("ptxas failed for {arch}:\n{}", String::from_utf8_lossy(&out.stderr)));
        }
        println!("== {arch} ==");
        print!("{}", String::from_utf8_lossy(&out.stderr));
    }
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_difference_names_the_line() {
        assert_eq!(first_difference("a\nb\n", "a\nb\n"), None);
        assert_eq!(first_difference("a\nb\n", "a\nc\n").unwrap(), "line 2: built `b`, shipped `c`");
        assert_eq!(first_difference("a\n", "a\nc\n").unwrap(), "line 2: built `<end>`, shipped `c`");
        assert_eq!(first_difference("a\n", "a\r\n").unwrap(), "line endings only");
    }
}

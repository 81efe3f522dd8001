//! `cargo xtask ptx`: assemble the embedded PTX with ptxas and print its resource report.

use std::path::PathBuf;
use std::process::Command;

/// `ptxas` as `.ci/setup` installs it (see [`crate::harness::cuda_tool`]).
pub fn ptxas() -> PathBuf {
    crate::harness::cuda_tool(&workspace_root(), "ptxas")
}

/// The workspace root (the parent of this crate).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

pub fn run() -> Result<(), String> {
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

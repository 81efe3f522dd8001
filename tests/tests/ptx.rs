//! PTX checks that run without a GPU: ptxas assembles every embedded module, no kernel spills,
//! and the SASS holds the instructions the design claims.
//!
//! Needs `ptxas` and `cuobjdump` (installed by `.ci/setup`); fails with the install command when
//! they are missing.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn tool(name: &str) -> PathBuf {
    let path = kda::ptx::cuda_tool(&root(), name);
    let found = Command::new(&path).arg("--version").output().is_ok_and(|o| o.status.success());
    assert!(found, "{name} not found ({}): run `bash .ci/setup` to install NVIDIA's PTX tools", path.display());
    path
}

/// Assembles `ptx` for `arch`; returns (ptxas -v report, cubin path).
fn assemble(ptx: &str, arch: &str) -> (String, PathBuf) {
    let dir = std::env::temp_dir().join(format!("kda-ptx-test-{}-{arch}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (src, cubin) = (dir.join("k.ptx"), dir.join("k.cubin"));
    std::fs::write(&src, ptx).unwrap();
    let out = Command::new(tool("ptxas")).arg("-v").arg(format!("-arch={arch}")).arg("-o").arg(&cubin).arg(&src).output().unwrap();
    let report = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "ptxas failed for {arch}:\n{report}");
    (report, cubin)
}

/// Per entry function of a ptxas -v report: (name, spill store bytes + spill load bytes).
fn spills(report: &str) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let mut current = None;
    for line in report.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            current = rest.split('\'').next().map(str::to_owned);
        }
        if line.contains("spill stores") {
            let nums: Vec<u64> = line.split_whitespace().filter_map(|w| w.parse().ok()).collect();
            // "N bytes stack frame, S bytes spill stores, L bytes spill loads"
            let total = nums.get(1).copied().unwrap_or(u64::MAX) + nums.get(2).copied().unwrap_or(u64::MAX);
            out.push((current.clone().unwrap_or_default(), total));
        }
    }
    out
}

#[test]
fn every_kernel_assembles_without_spills() {
    for (arch, ptx) in [("sm_90a", kda::ptx::SM90A), ("sm_80", kda::ptx::SM80)] {
        let (report, _) = assemble(ptx, arch);
        println!("== {arch} ==\n{report}");
        let per_kernel = spills(&report);
        for (name, _) in kda::ptx::KERNELS {
            assert!(per_kernel.iter().any(|(n, _)| n == name), "{arch}: no report for {name}:\n{report}");
        }
        for (name, bytes) in per_kernel {
            assert_eq!(bytes, 0, "{arch}: {name} spills {bytes} bytes:\n{report}");
        }
    }
}

#[test]
fn baseline_sass_uses_no_local_memory() {
    let (_, cubin) = assemble(kda::ptx::SM80, "sm_80");
    let out = Command::new(tool("cuobjdump")).arg("-sass").arg(&cubin)
        .env("PATH", format!("{}:{}", tool("nvdisasm").parent().unwrap().display(), std::env::var("PATH").unwrap_or_default()))
        .output().unwrap();
    let sass = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && sass.contains("kda_fwd_h_baseline"), "cuobjdump failed: {}", String::from_utf8_lossy(&out.stderr));
    assert!(!sass.contains("STL") && !sass.contains("LDL"), "baseline SASS touches local memory");
    assert!(sass.contains("BAR.SYNC"), "baseline SASS lacks its CTA barriers");
}

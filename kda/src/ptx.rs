//! The embedded PTX of the device crate, built by `build.rs` with the pinned nightly.

/// PTX for sm_90a (Hopper): all kernels, the warp-specialized one included.
pub const SM90A: &str = include_str!(concat!(env!("OUT_DIR"), "/kda_sm_90a.ptx"));
/// PTX for sm_80: the portable baseline kernel, JIT-compiled by the driver on sm_80 and newer.
pub const SM80: &str = include_str!(concat!(env!("OUT_DIR"), "/kda_sm_80.ptx"));

/// Entry point of the baseline kernel (`kda-kernel/src/baseline.rs`).
pub const BASELINE_KERNEL: &str = "kda_fwd_h_baseline";

/// Entry point of the warp-specialized Hopper kernel (`kda-kernel/src/hopper.rs`), sm_90a only.
pub const HOPPER_KERNEL: &str = "kda_fwd_h_hopper";

/// Every kernel entry the launcher looks up, with the PTX modules that must contain it.
pub const KERNELS: &[(&str, &[&str])] = &[(BASELINE_KERNEL, &[SM90A, SM80]), (HOPPER_KERNEL, &[SM90A])];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_the_launcher_uses_is_in_its_ptx() {
        for (name, modules) in KERNELS {
            for ptx in *modules {
                assert!(ptx.contains(&format!(".entry {name}(")), "{name} missing from PTX");
            }
        }
    }

    #[test]
    fn ptx_targets_the_right_architectures() {
        assert!(SM90A.contains(".target sm_90a"));
        assert!(SM80.contains(".target sm_80"));
        assert!(!SM90A.contains(".extern .func") && !SM80.contains(".extern .func"));
    }
}

/// Where `.ci/setup` installs NVIDIA's PTX tools (`ptxas`, `cuobjdump`, `nvdisasm`) from PyPI,
/// relative to the workspace root: `.venv-cuda/lib/python3.*/site-packages/nvidia/cu13/bin`.
pub const TOOLS_VENV: &str = ".venv-cuda";

/// Path of a CUDA tool (`ptxas`, `cuobjdump`, `nvdisasm`) for checking the PTX without a GPU:
/// `$PTXAS`-style override `$KDA_CUDA_BIN/<tool>`, else the project's virtual environment under
/// `workspace_root`, else the bare name (found on `PATH`).
pub fn cuda_tool(workspace_root: &std::path::Path, tool: &str) -> std::path::PathBuf {
    if let Some(dir) = std::env::var_os("KDA_CUDA_BIN") {
        return std::path::Path::new(&dir).join(tool);
    }
    let lib = workspace_root.join(TOOLS_VENV).join("lib");
    let venv_bin = std::fs::read_dir(&lib).into_iter().flatten().flatten().find_map(|e| {
        let bin = e.path().join("site-packages/nvidia/cu13/bin").join(tool);
        bin.exists().then_some(bin)
    });
    venv_bin.unwrap_or_else(|| tool.into())
}

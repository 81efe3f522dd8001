//! NVIDIA's PTX tools for checking the PTX without a GPU.

use std::path::{Path, PathBuf};

/// Where `.ci/setup` installs NVIDIA's PTX tools (`ptxas`, `cuobjdump`, `nvdisasm`) from PyPI,
/// relative to the workspace root: `.venv-cuda/lib/python3.*/site-packages/nvidia/cu13/bin`.
pub const TOOLS_VENV: &str = ".venv-cuda";

/// Path of a CUDA tool (`ptxas`, `cuobjdump`, `nvdisasm`) for checking the PTX without a GPU:
/// `$PTXAS`-style override `$KDA_CUDA_BIN/<tool>`, else the project's virtual environment under
/// `workspace_root`, else the bare name (found on `PATH`).
pub fn cuda_tool(workspace_root: &Path, tool: &str) -> PathBuf {
    if let Some(dir) = std::env::var_os("KDA_CUDA_BIN") {
        return Path::new(&dir).join(tool);
    }
    let lib = workspace_root.join(TOOLS_VENV).join("lib");
    let venv_bin = std::fs::read_dir(&lib).into_iter().flatten().flatten().find_map(|e| {
        let bin = e.path().join("site-packages/nvidia/cu13/bin").join(tool);
        bin.exists().then_some(bin)
    });
    venv_bin.unwrap_or_else(|| tool.into())
}

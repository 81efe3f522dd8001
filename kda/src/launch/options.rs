//! How a [`Kda`](super::Kda) loads and picks its kernels: the code (the PTX, which the driver
//! compiles, or the cubin shipped for the device), the module (the device's own, or the portable
//! one that every GPU other than 9.x takes, to run here what those GPUs run), and what
//! [`Kernel::Auto`] stands for. Each has an environment variable, read by [`KdaOptions::from_env`]
//! (so [`Kda::new`](super::Kda::new) and [`Kda::open`](super::Kda::open) follow it), for tests and
//! A/B runs of one build.

use super::Kernel;
use crate::{KdaError, ptx};
use cudarc::driver::{CudaContext, CudaModule};
use cudarc::nvrtc::Ptx;
use kda_kernel::abi::{SM80, SM90A};
use std::sync::Arc;

/// `ptx` or `cubin`: [`KdaOptions::code`].
pub const CODE_VAR: &str = "KDA_CODE";
/// `native` or `portable`: [`KdaOptions::module`].
pub const MODULE_VAR: &str = "KDA_MODULE";
/// `auto`, `hopper`, `baseline` or `portable`: [`KdaOptions::auto`].
pub const KERNEL_VAR: &str = "KDA_KERNEL";

/// How a [`Kda`](super::Kda) loads and picks its kernels. The default is what the library ran in
/// every measurement so far: the device's module, from PTX, `Kernel::Auto` as the device decides.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KdaOptions {
    /// The code the module is loaded from.
    pub code: Code,
    /// Which module.
    pub module: Module,
    /// What [`Kernel::Auto`] stands for: [`Kernel::Auto`] lets the device decide (the Hopper
    /// kernel on 9.x, the baseline elsewhere); any other kernel is taken for it.
    pub auto: Kernel,
}

/// The code a module is loaded from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Code {
    /// The PTX, compiled by the driver when loading (and cached by it).
    #[default]
    Ptx,
    /// The shipped cubin for the device where there is one and the driver takes it (nothing is
    /// compiled at load), the PTX otherwise.
    Cubin,
}

/// Which module a device loads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Module {
    /// The device's own: sm_90a (with the Hopper kernel) on 9.x, sm_80 elsewhere.
    #[default]
    Native,
    /// The portable sm_80 module on every device, 9.x included (no Hopper kernel then).
    Portable,
}

/// The code a [`Kda`](super::Kda)'s kernels were loaded from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModuleCode {
    /// A cubin shipped with the crate (ptxas's machine code for this architecture): nothing was
    /// compiled when loading.
    Cubin(&'static str),
    /// The PTX of this target, compiled by the driver when loading (cached by the driver after
    /// the first time).
    Ptx(&'static str),
}

impl std::fmt::Display for ModuleCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ModuleCode::Cubin(arch) => write!(f, "the shipped {arch} cubin"),
            ModuleCode::Ptx(target) => write!(f, "the {target} PTX, compiled by the driver"),
        }
    }
}

impl KdaOptions {
    /// The options `KDA_CODE`, `KDA_MODULE` and `KDA_KERNEL` set (each unset or empty: the
    /// default); a value outside each one's list is an error naming the variable.
    pub fn from_env() -> Result<Self, KdaError> {
        let var = |name| std::env::var(name).ok();
        Self::parse(var(CODE_VAR).as_deref(), var(MODULE_VAR).as_deref(), var(KERNEL_VAR).as_deref())
    }

    fn parse(code: Option<&str>, module: Option<&str>, kernel: Option<&str>) -> Result<Self, KdaError> {
        let bad = |name: &'static str, value: &str, allowed: &str| KdaError::Argument {
            name,
            reason: format!("`{value}`: one of {allowed}"),
        };
        let code = match code.unwrap_or_default() {
            "" | "ptx" => Code::Ptx,
            "cubin" => Code::Cubin,
            other => return Err(bad(CODE_VAR, other, "`ptx`, `cubin`")),
        };
        let module = match module.unwrap_or_default() {
            "" | "native" => Module::Native,
            "portable" => Module::Portable,
            other => return Err(bad(MODULE_VAR, other, "`native`, `portable`")),
        };
        let auto = match kernel.unwrap_or_default() {
            "" | "auto" => Kernel::Auto,
            "hopper" => Kernel::Hopper,
            "baseline" => Kernel::Baseline,
            "portable" => Kernel::Portable,
            other => return Err(bad(KERNEL_VAR, other, "`auto`, `hopper`, `baseline`, `portable`")),
        };
        Ok(Self { code, module, auto })
    }
}

/// The PTX target a device of `compute_capability` loads with `module`.
pub(super) fn target(compute_capability: (i32, i32), module: Module) -> Result<&'static str, KdaError> {
    match (compute_capability, module) {
        ((major, _), _) if major < 8 => Err(KdaError::UnsupportedDevice { compute_capability }),
        ((9, _), Module::Native) => Ok(SM90A),
        _ => Ok(SM80),
    }
}

/// Loads PTX target `target`'s module on `ctx`: with [`Code::Cubin`], the shipped cubin for
/// `compute_capability` if there is one and the driver takes it; the PTX otherwise.
pub(super) fn load_module(
    ctx: &Arc<CudaContext>,
    target: &'static str,
    compute_capability: (i32, i32),
    code: Code,
) -> Result<(Arc<CudaModule>, ModuleCode), KdaError> {
    if code == Code::Cubin
        && let Some((arch, bytes)) = ptx::cubin(target, compute_capability)
        && let Ok(module) = ctx.load_module(Ptx::from_binary(bytes.to_vec()))
    {
        return Ok((module, ModuleCode::Cubin(arch)));
    }
    let text = ptx::module(target).ok_or(KdaError::UnsupportedDevice { compute_capability })?;
    Ok((ctx.load_module(Ptx::from_src(text))?, ModuleCode::Ptx(target)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_names_each_option() {
        assert_eq!(KdaOptions::parse(None, None, None).unwrap(), KdaOptions::default());
        let all = KdaOptions::parse(Some("cubin"), Some("portable"), Some("baseline")).unwrap();
        assert_eq!(all, KdaOptions { code: Code::Cubin, module: Module::Portable, auto: Kernel::Baseline });
        assert_eq!(KdaOptions::parse(Some(""), Some(""), Some("hopper")).unwrap().auto, Kernel::Hopper);
        assert_eq!(KdaOptions::parse(None, None, Some("portable")).unwrap().auto, Kernel::Portable);
        for (args, var) in [
            ((Some("sass"), None, None), CODE_VAR),
            ((None, Some("sm_75"), None), MODULE_VAR),
            ((None, None, Some("fast")), KERNEL_VAR),
        ] {
            let err = KdaOptions::parse(args.0, args.1, args.2).unwrap_err().to_string();
            assert!(err.contains(var), "{err}");
        }
    }

    #[test]
    fn every_device_from_8_0_gets_a_module() {
        assert_eq!(target((9, 0), Module::Native).unwrap(), SM90A);
        assert_eq!(target((9, 0), Module::Portable).unwrap(), SM80);
        for cc in [(8, 0), (8, 6), (8, 9), (10, 0), (12, 0)] {
            for module in [Module::Native, Module::Portable] {
                assert_eq!(target(cc, module).unwrap(), SM80, "{cc:?} {module:?}");
            }
        }
        assert!(matches!(target((7, 5), Module::Native), Err(KdaError::UnsupportedDevice { .. })));
    }
}

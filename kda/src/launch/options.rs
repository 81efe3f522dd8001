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
/// `auto`, `plain` or `prefetch`: [`KdaOptions::decode`].
pub const DECODE_VAR: &str = "KDA_DECODE";

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
    /// Which form of the decode step runs.
    pub decode: DecodeStep,
}

/// The decode step's two forms (the same results, bit for bit).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DecodeStep {
    /// What the library runs unless told otherwise: [`DecodeStep::Plain`] (the prefetching
    /// step measured 1.34x to 1.42x slower on the H100 at four CTAs per SM, bench/RESULTS.md).
    #[default]
    Auto,
    /// One CTA per (sequence, value head, block of columns), each loading its state when it
    /// starts.
    Plain,
    /// Persistent CTAs, at most `ctas_per_sm` per SM (1 to 4), each copying its next item's state
    /// to shared memory while the current item's tokens run (where a CTA gets its shared memory;
    /// else [`DecodeStep::Plain`]). The SM's shared memory is configured for those CTAs only,
    /// the rest left to the L1 cache.
    Prefetch {
        /// The most CTAs resident per SM.
        ctas_per_sm: usize,
    },
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
    /// The options `KDA_CODE`, `KDA_MODULE`, `KDA_KERNEL` and `KDA_DECODE` set (each unset or
    /// empty: the default); a value outside each one's list is an error naming the variable.
    pub fn from_env() -> Result<Self, KdaError> {
        let var = |name| std::env::var(name).ok();
        let mut this = Self::parse(var(CODE_VAR).as_deref(), var(MODULE_VAR).as_deref(), var(KERNEL_VAR).as_deref())?;
        this.decode = parse_decode(var(DECODE_VAR).as_deref())?;
        Ok(this)
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
        Ok(Self { code, module, auto, decode: DecodeStep::Auto })
    }
}

/// The decode step `KDA_DECODE` names: `auto`, `plain`, `prefetch` (four CTAs per SM) or
/// `prefetch=N` (at most `N`, 1 to 4).
fn parse_decode(value: Option<&str>) -> Result<DecodeStep, KdaError> {
    use kda_kernel::layout::decode::CTAS_PER_SM;
    let bad = |other: &str| KdaError::Argument {
        name: DECODE_VAR,
        reason: format!("`{other}`: one of `auto`, `plain`, `prefetch`, `prefetch=N` (N from 1 to {CTAS_PER_SM})"),
    };
    match value.unwrap_or_default() {
        "" | "auto" => Ok(DecodeStep::Auto),
        "plain" => Ok(DecodeStep::Plain),
        "prefetch" => Ok(DecodeStep::Prefetch { ctas_per_sm: CTAS_PER_SM }),
        other => match other.strip_prefix("prefetch=").and_then(|n| n.parse().ok()) {
            Some(ctas_per_sm) if (1..=CTAS_PER_SM).contains(&ctas_per_sm) => Ok(DecodeStep::Prefetch { ctas_per_sm }),
            _ => Err(bad(other)),
        },
    }
}

/// The CTAs per SM of the prefetching decode step that `choice` runs on a device whose SM holds
/// `smem_per_sm` bytes of shared memory and gives a CTA at most `smem_optin` (each CTA taking
/// `layout::decode::PREFETCH_SMEM_BYTES` and the driver's reserve), or `None`: the plain step.
pub(super) fn decode_prefetch_ctas(choice: DecodeStep, smem_per_sm: usize, smem_optin: usize) -> Option<usize> {
    use kda_kernel::layout::{decode::PREFETCH_SMEM_BYTES, portable::RESERVED_SMEM_PER_CTA};
    let DecodeStep::Prefetch { ctas_per_sm } = choice else { return None };
    let fitting = smem_per_sm / (PREFETCH_SMEM_BYTES + RESERVED_SMEM_PER_CTA);
    (PREFETCH_SMEM_BYTES <= smem_optin && fitting > 0).then(|| ctas_per_sm.clamp(1, fitting))
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
        let want =
            KdaOptions { code: Code::Cubin, module: Module::Portable, auto: Kernel::Baseline, ..Default::default() };
        assert_eq!(all, want);
        assert_eq!(parse_decode(None).unwrap(), DecodeStep::Auto);
        assert_eq!(parse_decode(Some("plain")).unwrap(), DecodeStep::Plain);
        assert_eq!(parse_decode(Some("prefetch")).unwrap(), DecodeStep::Prefetch { ctas_per_sm: 4 });
        assert_eq!(parse_decode(Some("prefetch=2")).unwrap(), DecodeStep::Prefetch { ctas_per_sm: 2 });
        for bad in ["fast", "prefetch=0", "prefetch=5", "prefetch=x"] {
            assert!(parse_decode(Some(bad)).unwrap_err().to_string().contains(DECODE_VAR), "{bad}");
        }
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

    /// The prefetching step only when asked, with as many CTAs per SM as asked and as fit
    /// (four on 9.0 and 10.0's 228 KB, two on the A100's 164 KB, one on the 100 KB parts).
    #[test]
    fn the_decode_step_prefetches_only_when_asked_and_where_it_fits() {
        let (hopper, a100, ada) = ((228 << 10, 227 << 10), (164 << 10, 163 << 10), (100 << 10, 99 << 10));
        let four = DecodeStep::Prefetch { ctas_per_sm: 4 };
        assert_eq!(decode_prefetch_ctas(DecodeStep::Auto, hopper.0, hopper.1), None);
        assert_eq!(decode_prefetch_ctas(DecodeStep::Plain, hopper.0, hopper.1), None);
        assert_eq!(decode_prefetch_ctas(four, hopper.0, hopper.1), Some(4));
        assert_eq!(decode_prefetch_ctas(DecodeStep::Prefetch { ctas_per_sm: 2 }, hopper.0, hopper.1), Some(2));
        assert_eq!(decode_prefetch_ctas(four, a100.0, a100.1), Some(2));
        assert_eq!(decode_prefetch_ctas(four, ada.0, ada.1), Some(1));
        assert_eq!(decode_prefetch_ctas(four, 48 << 10, 48 << 10), None);
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

//! The embedded PTX of the device crate, one module per target of `kda_kernel::abi::TARGETS`:
//! the shipped modules in `ptx/`, or a build from source where `build.rs` chose one.

use kda_kernel::abi::{KernelAbi, SM80 as SM80_TARGET, SM90A as SM90A_TARGET};

/// PTX for sm_90a (Hopper): all kernels, the warp-specialized one included.
pub const SM90A: &str = include_str!(concat!(env!("KDA_PTX_DIR"), "/kda_sm_90a.ptx"));
/// PTX for sm_80: the portable baseline kernel, JIT-compiled by the driver on sm_80 and newer.
pub const SM80: &str = include_str!(concat!(env!("KDA_PTX_DIR"), "/kda_sm_80.ptx"));

/// The embedded module of PTX target `target` (one of `kda_kernel::abi::TARGETS`).
pub fn module(target: &str) -> Option<&'static str> {
    match target {
        SM90A_TARGET => Some(SM90A),
        SM80_TARGET => Some(SM80),
        _ => None,
    }
}

/// The modules holding `kernel`.
pub fn modules_of(kernel: &KernelAbi) -> impl Iterator<Item = &'static str> + '_ {
    kernel.targets.iter().filter_map(|t| module(t))
}

#[cfg(test)]
mod tests {
    use super::*;

    use kda_kernel::abi::{KERNELS, TARGETS};

    #[test]
    fn every_kernel_is_in_the_modules_of_its_targets_and_only_there() {
        for target in TARGETS {
            assert!(module(target).is_some(), "no embedded module for {target}");
        }
        for kernel in KERNELS {
            for target in TARGETS {
                let ptx = module(target).unwrap();
                let present = ptx.contains(&format!(".entry {}(", kernel.entry));
                assert_eq!(present, kernel.targets.contains(&target), "{} in {target}", kernel.entry);
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

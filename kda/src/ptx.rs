//! The embedded PTX of the device crate, one module per target of `kda_kernel::abi::TARGETS`:
//! the shipped modules in `ptx/`, or a build from source where `build.rs` chose one.

use kda_kernel::abi::{KernelAbi, SM80 as SM80_TARGET, SM90A as SM90A_TARGET};

/// PTX for sm_90a (Hopper): all kernels, the warp-specialized one included.
pub const SM90A: &str = include_str!(concat!(env!("KDA_PTX_DIR"), "/kda_sm_90a.ptx"));
/// PTX for sm_80: the portable baseline kernel, JIT-compiled by the driver on sm_80 and newer.
pub const SM80: &str = include_str!(concat!(env!("KDA_PTX_DIR"), "/kda_sm_80.ptx"));

/// Machine code assembled by ptxas from the modules above (`kda_kernel::builder::CUBINS`): the
/// module's target, the architecture and the cubin. Empty when `build.rs` built the PTX from
/// source (the shipped cubins belong to the shipped PTX).
#[cfg(kda_cubins)]
pub const CUBINS: &[(&str, &str, &[u8])] = &[
    (SM90A_TARGET, "sm_90a", include_bytes!(concat!(env!("KDA_PTX_DIR"), "/kda_sm_90a.sm_90a.cubin"))),
    (SM80_TARGET, "sm_80", include_bytes!(concat!(env!("KDA_PTX_DIR"), "/kda_sm_80.sm_80.cubin"))),
    (SM80_TARGET, "sm_100", include_bytes!(concat!(env!("KDA_PTX_DIR"), "/kda_sm_80.sm_100.cubin"))),
    (SM80_TARGET, "sm_120", include_bytes!(concat!(env!("KDA_PTX_DIR"), "/kda_sm_80.sm_120.cubin"))),
];
/// No cubins: the PTX was built from source.
#[cfg(not(kda_cubins))]
pub const CUBINS: &[(&str, &str, &[u8])] = &[];

/// The compute capability architecture `arch` (`sm_XY` or `sm_XYa`) names, and whether it is
/// arch-specific (the `a` suffix: that exact GPU only).
pub fn arch_capability(arch: &str) -> Option<((i32, i32), bool)> {
    let digits = arch.strip_prefix("sm_")?;
    let (digits, specific) = match digits.strip_suffix('a') {
        Some(d) => (d, true),
        None => (digits, false),
    };
    let number: i32 = digits.parse().ok()?;
    Some(((number / 10, number % 10), specific))
}

/// The embedded cubin of module `target` that runs on a GPU of `compute_capability`, if any: an
/// arch-specific cubin on exactly its GPU, another on every GPU of its major version at or above
/// its minor one.
pub fn cubin(target: &str, compute_capability: (i32, i32)) -> Option<(&'static str, &'static [u8])> {
    CUBINS.iter().filter(|(module, _, _)| *module == target).find_map(|&(_, arch, bytes)| {
        let ((major, minor), specific) = arch_capability(arch)?;
        let runs = if specific {
            compute_capability == (major, minor)
        } else {
            compute_capability.0 == major && compute_capability.1 >= minor
        };
        runs.then_some((arch, bytes))
    })
}

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
    fn cubins_are_picked_by_compute_capability() {
        assert_eq!(arch_capability("sm_90a"), Some(((9, 0), true)));
        assert_eq!(arch_capability("sm_120"), Some(((12, 0), false)));
        assert_eq!(arch_capability("compute_80"), None);
        if CUBINS.is_empty() {
            println!("the PTX was built from source: no cubins embedded");
            return;
        }
        for (module, archs) in kda_kernel::builder::CUBINS {
            for arch in archs {
                let (_, _, bytes) = CUBINS.iter().find(|c| c.0 == module && c.1 == *arch).expect("embedded");
                assert!(bytes.starts_with(b"\x7fELF"), "{module} {arch}");
            }
        }
        let arch = |target, cc| cubin(target, cc).map(|(a, _)| a);
        assert_eq!(arch(SM90A_TARGET, (9, 0)), Some("sm_90a"));
        assert_eq!(arch(SM80_TARGET, (8, 0)), Some("sm_80"));
        assert_eq!(arch(SM80_TARGET, (8, 9)), Some("sm_80"));
        assert_eq!(arch(SM80_TARGET, (10, 3)), Some("sm_100"));
        assert_eq!(arch(SM80_TARGET, (12, 1)), Some("sm_120"));
        // Compute capability 11.0 has no cubin (the driver compiles the PTX); the Hopper module
        // runs on 9.0 only.
        assert_eq!(arch(SM80_TARGET, (11, 0)), None);
        assert_eq!(arch(SM90A_TARGET, (9, 1)), None);
    }

    #[test]
    fn ptx_targets_the_right_architectures() {
        assert!(SM90A.contains(".target sm_90a"));
        assert!(SM80.contains(".target sm_80"));
        assert!(!SM90A.contains(".extern .func") && !SM80.contains(".extern .func"));
    }
}

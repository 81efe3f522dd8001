//! The embedded PTX of the device crate, built by `build.rs` with the pinned nightly.

/// PTX for sm_90a (Hopper): all kernels, the warp-specialized one included.
pub const SM90A: &str = include_str!(concat!(env!("OUT_DIR"), "/kda_sm_90a.ptx"));
/// PTX for sm_80: the portable baseline kernel, JIT-compiled by the driver on sm_80 and newer.
pub const SM80: &str = include_str!(concat!(env!("OUT_DIR"), "/kda_sm_80.ptx"));

/// Entry point of the baseline kernel (`kda-kernel/src/baseline.rs`).
pub const BASELINE_KERNEL: &str = "kda_fwd_h_baseline";

/// Every kernel entry the launcher looks up, with the PTX modules that must contain it.
pub const KERNELS: &[(&str, &[&str])] = &[(BASELINE_KERNEL, &[SM90A, SM80])];

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

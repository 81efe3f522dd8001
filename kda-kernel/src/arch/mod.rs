//! One wrapper per PTX instruction, by the GPU family that first has it: [`sm80`] for what every
//! sm_80+ GPU runs (the portable kernels' whole instruction set), `sm90` for Hopper's TMA,
//! mbarrier transaction counts and wgmma.

#[cfg(target_arch = "nvptx64")]
pub mod sm80;
/// On the host (feature `sim`): the same instructions as the simulator runs them.
#[cfg(not(target_arch = "nvptx64"))]
#[path = "sim80.rs"]
pub mod sm80;
#[cfg(target_feature = "sm_90a")]
pub mod sm90;

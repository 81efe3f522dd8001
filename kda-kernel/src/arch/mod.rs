//! One wrapper per PTX instruction, by the GPU family that first has it: [`sm80`] for what every
//! sm_80+ GPU runs (the portable kernels' whole instruction set), [`sm90`] for Hopper's TMA,
//! mbarrier transaction counts and wgmma.

pub mod sm80;
#[cfg(target_feature = "sm_90a")]
pub mod sm90;

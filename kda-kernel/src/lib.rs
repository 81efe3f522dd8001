//! Device crate of the KDA inter-chunk state recurrence.
//!
//! Built for `nvptx64-nvidia-cuda` by `kda/build.rs` (pinned nightly, `-Zbuild-std=core`,
//! `--emit=asm`) into PTX that the host crate embeds. On every other target only [`layout`]
//! compiles, so the host shares the tile constants with the kernels.
#![no_std]
#![cfg_attr(
    target_arch = "nvptx64",
    feature(abi_ptx, asm_experimental_arch, stdarch_nvptx)
)]

pub mod layout;

#[cfg(target_arch = "nvptx64")]
pub mod intrinsics;

#[cfg(target_arch = "nvptx64")]
mod baseline;

/// Hopper-only instructions and the warp-specialized kernel: compiled only into the sm_90a PTX
/// (wgmma and TMA do not exist on the portable target).
#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
pub mod sm90;
#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
mod hopper;

/// Device code cannot unwind or print; a panic (only reachable through a bug, since the kernels
/// index with checked-by-construction offsets) traps the kernel, which the host sees as a launch
/// error.
#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    intrinsics::trap()
}

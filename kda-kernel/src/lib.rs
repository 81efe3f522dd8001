//! Device crate of the KDA inter-chunk state recurrence.
//!
//! Built for `nvptx64-nvidia-cuda` by `kda/build.rs` (pinned nightly, `-Zbuild-std=core`,
//! `--emit=asm`) into PTX that the host crate embeds. On every other target only [`abi`] and
//! [`layout`] compile, so the host shares the launch ABI and the tile constants with the kernels.
//!
//! | module | what |
//! |---|---|
//! | [`abi`] | the parameter blocks, entry names and launch bounds the host and the kernels share |
//! | [`layout`] | the contract's sizes, tile shapes, shared-memory layouts, schedule records |
//! | `arch` | one wrapper per PTX instruction (`sm80`: every sm_80+ GPU; `sm90`: Hopper) |
//! | `pipeline` | the producer/consumer ring of mbarriers (`PipelineState`, acquire/commit/wait/release) |
//! | `schedule` | the persistent grid's work lists |
//! | `hopper/` | the warp-specialized TMA + wgmma kernel: entry, producer, consumer, tail |
//! | `baseline` | the portable scalar kernel |
//! | `merge` | the merge of split sequences: segment maps chained into entry states |
//! | `layer` | the layer's token-parallel kernels: gate, norms and the WY solve before the recurrence, the output after it |
//!
//! The math is `docs/CONTRACT.md`.
#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx, asm_experimental_arch, stdarch_nvptx))]

pub mod abi;
pub mod layout;

#[cfg(target_arch = "nvptx64")]
pub mod arch;

#[cfg(target_arch = "nvptx64")]
mod baseline;
#[cfg(target_arch = "nvptx64")]
mod layer;
#[cfg(target_arch = "nvptx64")]
mod merge;

/// The ring, the work lists and the warp-specialized kernel: compiled only into the sm_90a PTX
/// (mbarrier waits, TMA and wgmma do not exist on the portable target).
#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
mod hopper;
#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
mod pipeline;
#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
mod schedule;

/// Device code cannot unwind or print; a panic (only reachable through a bug, since the kernels
/// index with checked-by-construction offsets) traps the kernel, which the host sees as a launch
/// error.
#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    arch::sm80::trap()
}

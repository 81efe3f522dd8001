//! Device intrinsics: indices, barriers, shared memory and the PTX instructions the kernels use,
//! each wrapped in one small documented function (the role `cuda_std` plays in Rust-CUDA).
//!
//! Every wrapper is `#[inline(always)]` so that the PTX keeps no calls; `kda/build.rs` rejects
//! PTX that still references an external function.

use core::arch::{asm, global_asm, nvptx};

// The kernels' dynamic shared memory: one module-scope symbol, sized at launch. 1024-byte
// alignment is what the Hopper TMA/wgmma 128-byte swizzle patterns require of a tile base.
global_asm!(".extern .shared .align 1024 .b8 SMEM[];");

/// `%tid.x`: this thread's index in its CTA.
#[inline(always)]
pub fn thread_idx_x() -> usize {
    // SAFETY: reading a special register has no preconditions.
    unsafe { nvptx::_thread_idx_x() as usize }
}

/// `%ctaid.x`: this CTA's index in the grid.
#[inline(always)]
pub fn block_idx_x() -> usize {
    // SAFETY: reading a special register has no preconditions.
    unsafe { nvptx::_block_idx_x() as usize }
}

/// `%nctaid.x`: CTAs in the grid along x.
#[inline(always)]
pub fn grid_dim_x() -> usize {
    // SAFETY: reading a special register has no preconditions.
    unsafe { nvptx::_grid_dim_x() as usize }
}

/// `bar.sync 0;`: CTA-wide barrier (`__syncthreads`).
///
/// # Safety
/// Every thread of the CTA must reach the same call (no divergent barrier).
#[inline(always)]
pub unsafe fn sync_threads() {
    // SAFETY: the caller guarantees convergence.
    unsafe { nvptx::_syncthreads() }
}

/// `mov.u32 r, SMEM;`: the shared-window (32-bit, `.shared` state space) address of the
/// dynamic shared memory.
#[inline(always)]
pub fn smem_base_shared() -> u32 {
    let addr: u32;
    // SAFETY: reads the address of the module's `.extern .shared` symbol.
    unsafe { asm!("mov.u32 {a}, SMEM;", a = out(reg32) addr, options(pure, nomem, nostack)) };
    addr
}

/// `cvta.shared.u64 g, SMEM;`: a generic pointer to the dynamic shared memory, usable with
/// ordinary Rust loads and stores.
#[inline(always)]
pub fn smem_base_generic() -> *mut u8 {
    let addr: u64;
    // SAFETY: converts the address of the module's `.extern .shared` symbol; no memory access.
    unsafe {
        asm!("cvta.shared.u64 {a}, SMEM;", a = out(reg64) addr, options(pure, nomem, nostack))
    };
    addr as *mut u8
}

/// `cvt.rn.bf16.f32 h, x;` (PTX 7.0, sm_80): round to the nearest bf16, ties to even; returns the
/// bf16 bits.
#[inline(always)]
pub fn f32_to_bf16(x: f32) -> u16 {
    let h: u16;
    // SAFETY: a register-only conversion.
    unsafe {
        asm!("cvt.rn.bf16.f32 {h}, {x};", h = out(reg16) h, x = in(reg32) x,
             options(pure, nomem, nostack))
    };
    h
}

/// The f32 value of bf16 bits (exact: bf16 is the upper half of an f32).
#[inline(always)]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// `bf16(x)` as an f32: `x` rounded to bf16 precision, kept in an f32 register.
#[inline(always)]
pub fn round_bf16(x: f32) -> f32 {
    bf16_to_f32(f32_to_bf16(x))
}

/// `ex2.approx.f32 y, x;`: `2^x` with at most 2 ulp error (the SFU's exp2).
#[inline(always)]
pub fn exp2_approx(x: f32) -> f32 {
    let y: f32;
    // SAFETY: a register-only instruction.
    unsafe {
        asm!("ex2.approx.f32 {y}, {x};", y = out(reg32) y, x = in(reg32) x,
             options(pure, nomem, nostack))
    };
    y
}

/// `trap;`: aborts the kernel; the host sees an illegal-instruction launch error.
#[inline(always)]
pub fn trap() -> ! {
    // SAFETY: `trap` ends the thread; nothing after it runs.
    unsafe { asm!("trap;", options(noreturn, nostack)) }
}

//! The PTX every sm_80+ GPU has: indices, barriers, shared and global memory, conversions, the
//! SFU's exp2, `ldmatrix`; each wrapped in one small documented function (the role `cuda_std`
//! plays in Rust-CUDA). Hopper-only instructions are in [`super::sm90`].
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

/// `mov.u32 r, %ctaid.x;` (PTX 1.0), as read by the warp role `ROLE`: the role's number is in the
/// instruction's comment, so the reads of two roles are different instructions and the compiler
/// cannot hoist them into one above the branch between the roles. Read inside its role, the value
/// is visibly warp-uniform to ptxas, which then keeps what derives from it (a work item's head,
/// the ring's stage addresses) in uniform registers instead of moving them again inside every
/// TMA's lane loop: one read hoisted above the role branch measured 6% slower on batches of
/// one-chunk sequences, whose producer issues a TMA per valid row.
#[inline(always)]
pub fn block_idx_x_in_role<const ROLE: u32>() -> usize {
    let b: u32;
    // SAFETY: reads a special register.
    unsafe { asm!("mov.u32 {b}, %ctaid.x; // role {r}", b = out(reg32) b, r = const ROLE, options(nomem, nostack)) };
    b as usize
}

/// `bar.sync 0;` (PTX 1.0): CTA-wide barrier (`__syncthreads`).
///
/// # Safety
/// Every thread of the CTA must reach the same call (no divergent barrier).
#[inline(always)]
pub unsafe fn sync_threads() {
    // SAFETY: the caller guarantees convergence.
    unsafe { nvptx::_syncthreads() }
}

/// `mov.u32 r, SMEM;` (PTX 1.0): the shared-window (32-bit, `.shared` state space) address of the
/// dynamic shared memory.
#[inline(always)]
pub fn smem_base_shared() -> u32 {
    let addr: u32;
    // SAFETY: reads the address of the module's `.extern .shared` symbol.
    unsafe { asm!("mov.u32 {a}, SMEM;", a = out(reg32) addr, options(pure, nomem, nostack)) };
    addr
}

/// `cvta.shared.u64 g, SMEM;` (PTX 2.0): a generic pointer to the dynamic shared memory, usable with
/// ordinary Rust loads and stores.
#[inline(always)]
pub fn smem_base_generic() -> *mut u8 {
    let addr: u64;
    // SAFETY: converts the address of the module's `.extern .shared` symbol; no memory access.
    unsafe { asm!("cvta.shared.u64 {a}, SMEM;", a = out(reg64) addr, options(pure, nomem, nostack)) };
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

/// `ex2.approx.f32 y, x;` (PTX 1.0): `2^x` with at most 2 ulp error (the SFU's exp2).
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

/// `ex2.approx.ftz.f32 y, x;` (PTX 1.0): [`exp2_approx`] with subnormal inputs and results
/// flushed to zero, one SFU instruction (the form without `.ftz` scales its input and result
/// around the SFU to keep subnormal results: a compare and two multiplies more).
#[inline(always)]
pub fn exp2_approx_ftz(x: f32) -> f32 {
    let y: f32;
    // SAFETY: a register-only instruction.
    unsafe {
        asm!("ex2.approx.ftz.f32 {y}, {x};", y = out(reg32) y, x = in(reg32) x,
             options(pure, nomem, nostack))
    };
    y
}

/// `lg2.approx.f32 y, x;` (PTX 1.0): `log2(x)` with at most 2 ulp error (the SFU's log2).
#[inline(always)]
pub fn log2_approx(x: f32) -> f32 {
    let y: f32;
    // SAFETY: a register-only instruction.
    unsafe {
        asm!("lg2.approx.f32 {y}, {x};", y = out(reg32) y, x = in(reg32) x,
             options(pure, nomem, nostack))
    };
    y
}

/// `rcp.approx.ftz.f32 y, x;` (PTX 1.0): [`rcp_approx`] with subnormal inputs and results
/// flushed to zero, one SFU instruction (the form without `.ftz` scales its input around the SFU
/// to keep subnormal results: two compares, two selects and two multiplies more).
#[inline(always)]
pub fn rcp_approx_ftz(x: f32) -> f32 {
    let y: f32;
    // SAFETY: a register-only instruction.
    unsafe {
        asm!("rcp.approx.ftz.f32 {y}, {x};", y = out(reg32) y, x = in(reg32) x,
             options(pure, nomem, nostack))
    };
    y
}

/// `rsqrt.approx.f32 y, x;` (PTX 1.0): `1 / sqrt(x)` on the SFU (an IEEE square root compiles
/// to a subroutine).
#[inline(always)]
pub fn rsqrt_approx(x: f32) -> f32 {
    let y: f32;
    // SAFETY: a register-only instruction.
    unsafe {
        asm!("rsqrt.approx.f32 {y}, {x};", y = out(reg32) y, x = in(reg32) x,
             options(pure, nomem, nostack))
    };
    y
}

/// `rcp.approx.f32 y, x;` (PTX 1.0): `1 / x` within 1 ulp, without the subroutine an IEEE
/// division compiles to.
#[inline(always)]
pub fn rcp_approx(x: f32) -> f32 {
    let y: f32;
    // SAFETY: a register-only instruction.
    unsafe {
        asm!("rcp.approx.f32 {y}, {x};", y = out(reg32) y, x = in(reg32) x,
             options(pure, nomem, nostack))
    };
    y
}

/// `cvt.rna.tf32.f32 d, x;` (PTX 7.0, sm_80): `x` rounded to TF32 (10-bit mantissa, ties away
/// from zero), as the bits a TF32 `mma` operand takes.
#[inline(always)]
pub fn cvt_tf32(x: f32) -> u32 {
    let d: u32;
    // SAFETY: a register-only conversion.
    unsafe { asm!("cvt.rna.tf32.f32 {d}, {x};", d = out(reg32) d, x = in(reg32) x, options(pure, nomem, nostack)) };
    d
}

/// `mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32` (PTX 7.0, sm_80): the warp's 16 x 8 tile
/// `acc += A B` with A 16 x 8 and B 8 x 8 in TF32, f32 accumulation. Fragments (PTX ISA, "Matrix
/// fragments for mma.m16n8k8", `g = lane / 4`, `t = lane % 4`): `a` holds A at (g, t),
/// (g + 8, t), (g, t + 4), (g + 8, t + 4); `b` holds B at (t, g), (t + 4, g); `acc` holds the
/// tile at (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1).
///
/// # Safety
/// The 32 lanes of the warp call it together (converged), each with its own fragments.
#[inline(always)]
pub unsafe fn mma_m16n8k8_tf32(acc: &mut [f32; 4], a: [u32; 4], b: [u32; 2]) {
    // SAFETY: see the function's contract.
    unsafe {
        asm!(
            "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {{{d0}, {d1}, {d2}, {d3}}}, {{{a0}, {a1}, {a2}, {a3}}}, {{{b0}, {b1}}}, {{{d0}, {d1}, {d2}, {d3}}};",
            d0 = inout(reg32) acc[0], d1 = inout(reg32) acc[1], d2 = inout(reg32) acc[2], d3 = inout(reg32) acc[3],
            a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3],
            b0 = in(reg32) b[0], b1 = in(reg32) b[1],
            options(nostack),
        )
    };
}

/// `vote.sync.any.pred` (PTX 6.0): whether `pred` holds on any lane of the warp.
///
/// # Safety
/// The 32 lanes of the warp call it together (converged).
#[inline(always)]
pub unsafe fn vote_any(pred: bool) -> bool {
    let any: u32;
    // SAFETY: see the function's contract.
    unsafe {
        asm!(
            "{{ .reg .pred p, q; setp.ne.u32 p, {x}, 0; vote.sync.any.pred q, p, 0xffffffff; selp.u32 {r}, 1, 0, q; }}",
            x = in(reg32) pred as u32, r = out(reg32) any, options(nomem, nostack)
        )
    };
    any != 0
}

/// `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32` (PTX 7.0, sm_80): the warp's 16 x 8
/// tile `acc += A B` with A 16 x 16 and B 16 x 8 in bf16, f32 accumulation. Fragments (PTX ISA,
/// "Matrix fragments for mma.m16n8k16", `g = lane / 4`, `t = lane % 4`; each register holds two
/// bf16, the lower column or row in its low half): `a` holds A at rows (g, g + 8, g, g + 8) and
/// columns (2t, 2t, 2t + 8, 2t + 8) and the next column; `b` holds B at rows 2t and 2t + 8 (and
/// the next row), column g; `acc` holds the tile at (g, 2t), (g, 2t + 1), (g + 8, 2t),
/// (g + 8, 2t + 1).
///
/// # Safety
/// The 32 lanes of the warp call it together (converged), each with its own fragments.
#[inline(always)]
pub unsafe fn mma_m16n8k16_bf16(acc: &mut [f32; 4], a: [u32; 4], b: [u32; 2]) {
    // SAFETY: see the function's contract.
    unsafe {
        asm!(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {{{d0}, {d1}, {d2}, {d3}}}, {{{a0}, {a1}, {a2}, {a3}}}, {{{b0}, {b1}}}, {{{d0}, {d1}, {d2}, {d3}}};",
            d0 = inout(reg32) acc[0], d1 = inout(reg32) acc[1], d2 = inout(reg32) acc[2], d3 = inout(reg32) acc[3],
            a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3],
            b0 = in(reg32) b[0], b1 = in(reg32) b[1],
            options(nostack),
        )
    };
}

/// `ld.shared.b32 v, [addr];` (PTX 1.0)
///
/// # Safety
/// `addr` is a 4-byte-aligned shared address inside the CTA's allocation.
#[inline(always)]
pub unsafe fn ld_shared_u32(addr: u32) -> u32 {
    let v: u32;
    // SAFETY: see the function's contract.
    unsafe { asm!("ld.shared.b32 {v}, [{a}];", v = out(reg32) v, a = in(reg32) addr, options(nostack, readonly)) };
    v
}

/// `st.shared.b32 [addr], v;` (PTX 1.0)
///
/// # Safety
/// `addr` is a 4-byte-aligned shared address inside the CTA's allocation.
#[inline(always)]
pub unsafe fn st_shared_u32(addr: u32, v: u32) {
    // SAFETY: see the function's contract.
    unsafe { asm!("st.shared.b32 [{a}], {v};", a = in(reg32) addr, v = in(reg32) v, options(nostack)) }
}

/// `ld.shared.b16 v, [addr];` (PTX 1.0)
///
/// # Safety
/// `addr` is a 2-byte-aligned shared address inside the CTA's allocation.
#[inline(always)]
pub unsafe fn ld_shared_u16(addr: u32) -> u16 {
    let v: u16;
    // SAFETY: see the function's contract.
    unsafe { asm!("ld.shared.b16 {v}, [{a}];", v = out(reg16) v, a = in(reg32) addr, options(nostack, readonly)) };
    v
}

/// `st.shared.b16 [addr], v;` (PTX 1.0)
///
/// # Safety
/// `addr` is a 2-byte-aligned shared address inside the CTA's allocation.
#[inline(always)]
pub unsafe fn st_shared_u16(addr: u32, v: u16) {
    // SAFETY: see the function's contract.
    unsafe { asm!("st.shared.b16 [{a}], {v};", a = in(reg32) addr, v = in(reg16) v, options(nostack)) }
}

/// `trap;` (PTX 1.0): aborts the kernel; the host sees an illegal-instruction launch error.
#[inline(always)]
pub fn trap() -> ! {
    // SAFETY: `trap` ends the thread; nothing after it runs.
    unsafe { asm!("trap;", options(noreturn, nostack)) }
}

/// `bar.sync id, threads;` (PTX 2.0): a named barrier over `threads` threads (a multiple of 32).
///
/// # Safety
/// Exactly `threads` threads, in whole warps, reach barrier `id` with the same count.
#[inline(always)]
pub unsafe fn named_barrier(id: u32, threads: u32) {
    // SAFETY: see the function's contract.
    unsafe { asm!("bar.sync {i}, {n};", i = in(reg32) id, n = in(reg32) threads, options(nostack)) }
}

/// `bar.warp.sync 0xffffffff;` (PTX 6.0, sm_30): converges the warp and orders its lanes' memory accesses.
#[inline(always)]
pub fn sync_warp() {
    // SAFETY: every lane of the warp calls it (the producer warp runs converged).
    unsafe { asm!("bar.warp.sync -1;", options(nostack)) }
}

/// `nanosleep.u32 ns;` (PTX 6.3, sm_70+): suspends the calling thread for about `ns`
/// nanoseconds (the hardware may wake it anywhere in `[0, 2 ns]`).
#[inline(always)]
pub fn nanosleep(ns: u32) {
    // SAFETY: a pause; no memory effect.
    unsafe { asm!("nanosleep.u32 {n};", n = in(reg32) ns, options(nomem, nostack)) }
}

/// `%tid.x` (PTX 1.0), read by a non-pure `asm!` so the compiler cannot hoist what depends on it out of a
/// loop: per-chunk shared addresses are recomputed from it instead of living in registers across
/// the whole chunk loop (there are more of them than registers).
#[inline(always)]
pub fn thread_idx_x_fresh() -> usize {
    let t: u32;
    // SAFETY: reads a special register.
    unsafe { asm!("mov.u32 {t}, %tid.x;", t = out(reg32) t, options(nomem, nostack)) };
    t as usize
}

/// `cvt.rn.bf16x2.f32 d, hi, lo;` (PTX 7.0, sm_80): two f32 rounded to bf16 and packed, `lo` in the low half.
#[inline(always)]
pub fn pack_bf16x2(lo: f32, hi: f32) -> u32 {
    let d: u32;
    // SAFETY: a register-only conversion.
    unsafe {
        asm!("cvt.rn.bf16x2.f32 {d}, {h}, {l};", d = out(reg32) d, h = in(reg32) hi, l = in(reg32) lo,
             options(pure, nomem, nostack))
    };
    d
}

/// `fma.rn.f32 d, a, b, c;` (PTX 1.4): `a * b + c` rounded once (rustc does not contract a
/// multiply and an add into a fused one by itself).
#[inline(always)]
pub fn fma_f32(a: f32, b: f32, c: f32) -> f32 {
    let d: f32;
    // SAFETY: pure arithmetic on registers.
    unsafe {
        asm!("fma.rn.f32 {d}, {a}, {b}, {c};", d = out(reg32) d, a = in(reg32) a, b = in(reg32) b, c = in(reg32) c,
             options(pure, nomem, nostack))
    };
    d
}

/// `ld.shared.f32 v, [addr];` (PTX 1.0)
///
/// # Safety
/// `addr` is a 4-byte-aligned shared address inside the CTA's allocation.
#[inline(always)]
pub unsafe fn ld_shared_f32(addr: u32) -> f32 {
    let v: f32;
    // SAFETY: see the function's contract.
    unsafe { asm!("ld.shared.f32 {v}, [{a}];", v = out(reg32) v, a = in(reg32) addr, options(nostack, readonly)) };
    v
}

/// `st.shared.f32 [addr], v;` (PTX 1.0)
///
/// # Safety
/// `addr` is a 4-byte-aligned shared address inside the CTA's allocation.
#[inline(always)]
pub unsafe fn st_shared_f32(addr: u32, v: f32) {
    // SAFETY: see the function's contract.
    unsafe { asm!("st.shared.f32 [{a}], {v};", a = in(reg32) addr, v = in(reg32) v, options(nostack)) }
}

/// `ld.shared.v4.b32` (PTX 1.0): 16 bytes from shared memory.
///
/// # Safety
/// `addr` is a 16-byte-aligned shared address inside the CTA's allocation.
#[inline(always)]
pub unsafe fn ld_shared_v4(addr: u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: see the function's contract.
    unsafe {
        asm!("ld.shared.v4.b32 {{{x}, {y}, {z}, {w}}}, [{p}];", x = out(reg32) a, y = out(reg32) b,
             z = out(reg32) c, w = out(reg32) d, p = in(reg32) addr, options(nostack, readonly))
    };
    [a, b, c, d]
}

/// `st.shared.v4.b32` (PTX 1.0): 16 bytes to shared memory.
///
/// # Safety
/// `addr` is a 16-byte-aligned shared address inside the CTA's allocation.
#[inline(always)]
pub unsafe fn st_shared_v4(addr: u32, v: [u32; 4]) {
    // SAFETY: see the function's contract.
    unsafe {
        asm!("st.shared.v4.b32 [{p}], {{{x}, {y}, {z}, {w}}};", p = in(reg32) addr, x = in(reg32) v[0],
             y = in(reg32) v[1], z = in(reg32) v[2], w = in(reg32) v[3], options(nostack))
    }
}

/// `ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16` (PTX 6.5, sm_75): the inverse of [`stmatrix_x4_trans`]: lane
/// `8i + j` gives the address of row `j` of stored matrix `i`; register `i` returns the lane's
/// fragment of matrix `i` transposed.
///
/// # Safety
/// All 32 lanes call it together with 16-byte-aligned shared addresses inside the allocation.
#[inline(always)]
pub unsafe fn ldmatrix_x4_trans(addr: u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: see the function's contract.
    unsafe {
        asm!("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {{{x}, {y}, {z}, {w}}}, [{p}];", x = out(reg32) a,
             y = out(reg32) b, z = out(reg32) c, w = out(reg32) d, p = in(reg32) addr, options(nostack, readonly))
    };
    [a, b, c, d]
}

/// `ldmatrix.sync.aligned.m8n8.x4.shared.b16` (PTX 6.5, sm_75): as [`ldmatrix_x4_trans`], each
/// matrix read as it is stored: register `i` returns the lane's fragment of matrix `i` (row
/// `lane / 4`, columns `2 * (lane % 4)` and `+ 1`).
///
/// # Safety
/// All 32 lanes call it together with 16-byte-aligned shared addresses inside the allocation.
#[inline(always)]
pub unsafe fn ldmatrix_x4(addr: u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: see the function's contract.
    unsafe {
        asm!("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{{x}, {y}, {z}, {w}}}, [{p}];", x = out(reg32) a,
             y = out(reg32) b, z = out(reg32) c, w = out(reg32) d, p = in(reg32) addr, options(nostack, readonly))
    };
    [a, b, c, d]
}

/// `ld.shared.v2.f32` (PTX 1.0): two adjacent f32 from shared memory.
///
/// # Safety
/// `addr` is an 8-byte-aligned shared address inside the CTA's allocation.
#[inline(always)]
pub unsafe fn ld_shared_v2_f32(addr: u32) -> [f32; 2] {
    let (a, b): (f32, f32);
    // SAFETY: see the function's contract.
    unsafe {
        asm!("ld.shared.v2.f32 {{{x}, {y}}}, [{p}];", x = out(reg32) a, y = out(reg32) b, p = in(reg32) addr,
             options(nostack, readonly))
    };
    [a, b]
}

/// `st.shared.v2.f32` (PTX 1.0): two adjacent f32 into shared memory.
///
/// # Safety
/// `addr` is an 8-byte-aligned shared address inside the CTA's allocation.
#[inline(always)]
pub unsafe fn st_shared_v2_f32(addr: u32, v: [f32; 2]) {
    // SAFETY: see the function's contract.
    unsafe {
        asm!("st.shared.v2.f32 [{p}], {{{x}, {y}}};", p = in(reg32) addr, x = in(reg32) v[0], y = in(reg32) v[1],
             options(nostack))
    }
}

/// `ld.global.v4.b32` (PTX 1.0): 16 bytes from global memory in one request.
///
/// # Safety
/// `ptr` is 16-byte aligned and addresses 16 readable bytes that no thread writes during the
/// kernel.
#[inline(always)]
pub unsafe fn ld_global_v4(ptr: *const u32) -> [u32; 4] {
    let (x, y, z, w): (u32, u32, u32, u32);
    // SAFETY: see the function's contract.
    unsafe {
        asm!("ld.global.v4.b32 {{{x}, {y}, {z}, {w}}}, [{p}];", x = out(reg32) x, y = out(reg32) y,
             z = out(reg32) z, w = out(reg32) w, p = in(reg64) ptr, options(nostack, readonly))
    };
    [x, y, z, w]
}

/// `ld.global.v2.b32` (PTX 1.0): 8 bytes from global memory in one request.
///
/// # Safety
/// `ptr` is 8-byte aligned and addresses 8 readable bytes that no thread writes during the kernel.
#[inline(always)]
pub unsafe fn ld_global_v2(ptr: *const u32) -> [u32; 2] {
    let (x, y): (u32, u32);
    // SAFETY: see the function's contract.
    unsafe {
        asm!("ld.global.v2.b32 {{{x}, {y}}}, [{p}];", x = out(reg32) x, y = out(reg32) y, p = in(reg64) ptr,
             options(nostack, readonly))
    };
    [x, y]
}

/// `st.global.b32` (PTX 1.0): 4 bytes to global memory (a generic store would resolve its
/// address space at run time).
///
/// # Safety
/// `ptr` is 4-byte aligned and addresses 4 writable bytes.
#[inline(always)]
pub unsafe fn st_global_b32(ptr: *mut u32, v: u32) {
    // SAFETY: see the function's contract.
    unsafe { asm!("st.global.b32 [{p}], {x};", p = in(reg64) ptr, x = in(reg32) v, options(nostack)) }
}

/// `st.global.v2.b32` (PTX 1.0): 8 bytes to global memory.
///
/// # Safety
/// `ptr` is 8-byte aligned and addresses 8 writable bytes.
#[inline(always)]
pub unsafe fn st_global_v2(ptr: *mut u32, v: [u32; 2]) {
    // SAFETY: see the function's contract.
    unsafe {
        asm!("st.global.v2.b32 [{p}], {{{x}, {y}}};", p = in(reg64) ptr, x = in(reg32) v[0], y = in(reg32) v[1], options(nostack))
    }
}

/// `shfl.sync.bfly.b32` (PTX 6.0) over the whole warp: `x` of the lane whose index is this lane's
/// xor `mask`.
///
/// # Safety
/// The 32 lanes of the warp call it together; `mask` is below 32.
#[inline(always)]
pub unsafe fn shfl_xor(x: u32, mask: u32) -> u32 {
    let r: u32;
    // SAFETY: see the function's contract.
    unsafe {
        asm!("shfl.sync.bfly.b32 {r}, {x}, {m}, 0x1f, 0xffffffff;", r = out(reg32) r, x = in(reg32) x,
             m = in(reg32) mask, options(nomem, nostack))
    };
    r
}

/// `st.global.v4.b32` (PTX 1.0): 16 bytes to global memory.
///
/// # Safety
/// `ptr` is 16-byte aligned and addresses 16 writable bytes.
#[inline(always)]
pub unsafe fn st_global_v4(ptr: *mut u16, v: [u32; 4]) {
    // SAFETY: see the function's contract.
    unsafe {
        asm!("st.global.v4.b32 [{p}], {{{x}, {y}, {z}, {w}}};", p = in(reg64) ptr, x = in(reg32) v[0],
             y = in(reg32) v[1], z = in(reg32) v[2], w = in(reg32) v[3], options(nostack))
    }
}

/// `bar.arrive id, threads;` (PTX 2.0): counts this thread's arrival on named barrier `id`
/// without waiting; the threads that `bar.sync` on it wait for all `threads`. Shared-memory
/// writes this thread made before are visible to them once their wait returns. The signal of a
/// one-way handoff (a producer announcing a full stage, consumers an empty one).
///
/// # Safety
/// Exactly `threads` threads, in whole warps, arrive on or wait at barrier `id` with the same
/// count for each of its phases.
#[inline(always)]
pub unsafe fn named_barrier_arrive(id: u32, threads: u32) {
    // SAFETY: see the function's contract.
    unsafe { asm!("bar.arrive {i}, {n};", i = in(reg32) id, n = in(reg32) threads, options(nostack)) }
}

/// `cp.async.cg.shared.global [dst], [src], 16, src_bytes;` (PTX 7.0, sm_80): an asynchronous
/// copy of 16 bytes from global to shared memory, bypassing L1 and the registers; bytes past
/// `src_bytes` (0 or 16) are written as zeros and not read. Complete only after
/// [`cp_async_wait_all`].
///
/// # Safety
/// `dst` is a 16-byte-aligned shared address inside the allocation; `src` is a 16-byte-aligned
/// global address of `src_bytes` readable bytes.
#[inline(always)]
pub unsafe fn cp_async_16(dst: u32, src: *const u8, src_bytes: u32) {
    // SAFETY: see the function's contract.
    unsafe {
        asm!("cp.async.cg.shared.global [{d}], [{s}], 16, {n};", d = in(reg32) dst, s = in(reg64) src,
             n = in(reg32) src_bytes, options(nostack))
    }
}

/// `cp.async.ca.shared.global [dst], [src], 4, src_bytes;` (PTX 7.0, sm_80): as
/// [`cp_async_16`] for 4 bytes (an f32), `src_bytes` 0 or 4.
///
/// # Safety
/// `dst` is a 4-byte-aligned shared address inside the allocation; `src` is a 4-byte-aligned
/// global address of `src_bytes` readable bytes.
#[inline(always)]
pub unsafe fn cp_async_4(dst: u32, src: *const u8, src_bytes: u32) {
    // SAFETY: see the function's contract.
    unsafe {
        asm!("cp.async.ca.shared.global [{d}], [{s}], 4, {n};", d = in(reg32) dst, s = in(reg64) src,
             n = in(reg32) src_bytes, options(nostack))
    }
}

/// `cp.async.wait_all;` (PTX 7.0, sm_80): waits until every asynchronous copy this thread issued
/// has landed in shared memory.
#[inline(always)]
pub fn cp_async_wait_all() {
    // SAFETY: waits on this thread's own copies; a memory clobber for the compiler.
    unsafe { asm!("cp.async.wait_all;", options(nostack)) }
}

/// `cp.async.commit_group;` (PTX 7.0, sm_80): closes this thread's asynchronous copies issued
/// since the last commit into a group, which [`cp_async_wait_group`] waits for as a whole.
#[inline(always)]
pub fn cp_async_commit_group() {
    // SAFETY: bookkeeping of this thread's own copies.
    unsafe { asm!("cp.async.commit_group;", options(nostack)) }
}

/// `cp.async.wait_group N;` (PTX 7.0, sm_80): waits until at most the `N` most recent committed
/// groups of this thread's copies are still in flight; the older ones have landed.
#[inline(always)]
pub fn cp_async_wait_group<const N: u32>() {
    // SAFETY: waits on this thread's own copies; a memory clobber for the compiler.
    unsafe { asm!("cp.async.wait_group {n};", n = const N, options(nostack)) }
}

/// `mbarrier.init.shared.b64 [bar], count;` (PTX 7.0, sm_80): a barrier object whose phases
/// each complete on `count` arrivals.
///
/// # Safety
/// `bar` is an 8-byte-aligned shared address no other thread uses until a CTA barrier follows.
#[inline(always)]
pub unsafe fn mbarrier_init(bar: u32, count: u32) {
    // SAFETY: see the function's contract.
    unsafe { asm!("mbarrier.init.shared.b64 [{b}], {n};", b = in(reg32) bar, n = in(reg32) count, options(nostack)) }
}

/// `mbarrier.arrive.shared.b64 state, [bar];` (PTX 7.0, sm_80): this thread's arrival on the
/// current phase of `bar` (release at CTA scope), returning the phase's token for
/// [`mbarrier_wait_token`].
///
/// # Safety
/// `bar` is an initialised mbarrier whose phase still expects this arrival.
#[inline(always)]
pub unsafe fn mbarrier_arrive_token(bar: u32) -> u64 {
    let state: u64;
    // SAFETY: see the function's contract.
    unsafe {
        asm!("mbarrier.arrive.shared.b64 {s}, [{b}];", s = out(reg64) state, b = in(reg32) bar, options(nostack))
    };
    state
}

/// Waits until the phase of `bar` that `state` came from has completed
/// (`mbarrier.test_wait.shared.b64` in a loop, PTX 7.0, sm_80; acquire at CTA scope): the
/// writes of every arrival on that phase, and the copies [`cp_async_mbarrier_arrive_noinc`]
/// tracked, are visible after it. A Rust loop, not an `asm!` loop (labels duplicate on
/// inlining).
///
/// # Safety
/// `bar` is an initialised mbarrier; `state` is a token [`mbarrier_arrive_token`] returned for it.
#[inline(always)]
pub unsafe fn mbarrier_wait_token(bar: u32, state: u64) {
    loop {
        let done: u32;
        // SAFETY: see the function's contract.
        unsafe {
            asm!(
                "{{ .reg .pred p;",
                "mbarrier.test_wait.shared.b64 p, [{b}], {s};",
                "selp.u32 {d}, 1, 0, p; }}",
                b = in(reg32) bar, s = in(reg64) state, d = out(reg32) done, options(nostack)
            )
        };
        if done != 0 {
            return;
        }
    }
}

/// `cp.async.mbarrier.arrive.noinc.shared.b64 [bar];` (PTX 7.0, sm_80): an arrival on `bar`'s
/// current phase made by the hardware once every `cp.async` this thread issued before has
/// landed, so a waiter sees the copies without this thread waiting for them. `.noinc`: the
/// arrival counts against the phase's expected count, which [`mbarrier_init`] must include.
///
/// # Safety
/// `bar` is an initialised mbarrier whose phase still expects this arrival.
#[inline(always)]
pub unsafe fn cp_async_mbarrier_arrive_noinc(bar: u32) {
    // SAFETY: see the function's contract.
    unsafe { asm!("cp.async.mbarrier.arrive.noinc.shared.b64 [{b}];", b = in(reg32) bar, options(nostack)) }
}

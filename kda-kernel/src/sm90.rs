//! Hopper-only (sm_90a) PTX: mbarriers, TMA bulk tensor loads, async-proxy fences, named
//! barriers and the two warpgroup MMAs of the recurrence. Each wrapper is one instruction or one
//! indivisible instruction sequence.
//!
//! Each product is a start (`wgmma.fence`, its k-steps, `commit_group`, one `asm!` block) and a
//! wait (`wait_group 0`), so independent work runs while the tensor cores do. The accumulator
//! registers are `inout` operands of both blocks; between them the caller leaves the
//! accumulator and the A fragments alone (the functions' safety contracts).

use core::arch::asm;

/// A CUDA tensor map (`CUtensorMap`, 128 opaque bytes) passed to a kernel by value. rustc's
/// nvptx ABI aligns parameters to at most 16 bytes; `kda/build.rs` raises the declared alignment
/// of the Hopper kernel's tensor-map parameters to the 64 bytes TMA requires.
#[repr(C, align(16))]
pub struct TensorMap(pub [u64; 16]);

/// `mbarrier.init.shared::cta.b64 [bar], count;`
///
/// # Safety
/// `bar` is an 8-byte-aligned shared address no other thread uses until a CTA barrier follows.
#[inline(always)]
pub unsafe fn mbarrier_init(bar: u32, count: u32) {
    // SAFETY: see the function's contract.
    unsafe { asm!("mbarrier.init.shared::cta.b64 [{b}], {n};", b = in(reg32) bar, n = in(reg32) count, options(nostack)) }
}

/// `fence.mbarrier_init.release.cluster;`: makes initialised mbarriers visible to the async
/// proxy (TMA) before a CTA barrier publishes them.
#[inline(always)]
pub fn fence_mbarrier_init() {
    // SAFETY: a fence has no operands.
    unsafe { asm!("fence.mbarrier_init.release.cluster;", options(nostack)) }
}

/// `mbarrier.arrive.shared::cta.b64 state, [bar];` (release at CTA scope).
///
/// # Safety
/// `bar` is an initialised mbarrier in shared memory.
#[inline(always)]
pub unsafe fn mbarrier_arrive(bar: u32) {
    // SAFETY: see the function's contract.
    unsafe {
        asm!("mbarrier.arrive.shared::cta.b64 {s}, [{b}];", s = out(reg64) _, b = in(reg32) bar, options(nostack))
    }
}

/// `mbarrier.arrive.expect_tx.shared::cta.b64 state, [bar], bytes;`: arrives and announces the
/// bytes the TMA loads issued next will deliver to this barrier's phase.
///
/// # Safety
/// `bar` is an initialised mbarrier in shared memory.
#[inline(always)]
pub unsafe fn mbarrier_arrive_expect_tx(bar: u32, bytes: u32) {
    // SAFETY: see the function's contract.
    unsafe {
        asm!("mbarrier.arrive.expect_tx.shared::cta.b64 {s}, [{b}], {n};",
             s = out(reg64) _, b = in(reg32) bar, n = in(reg32) bytes, options(nostack))
    }
}

/// Waits until the phase of parity `parity` of `bar` has completed
/// (`mbarrier.try_wait.parity.shared::cta.b64` in a loop; acquire at CTA scope).
///
/// # Safety
/// `bar` is an initialised mbarrier in shared memory.
#[inline(always)]
pub unsafe fn mbarrier_wait(bar: u32, parity: u32) {
    loop {
        let done: u32;
        // SAFETY: see the function's contract.
        unsafe {
            asm!(
                "{{ .reg .pred p;",
                "mbarrier.try_wait.parity.shared::cta.b64 p, [{b}], {ph};",
                "selp.u32 {d}, 1, 0, p; }}",
                b = in(reg32) bar, ph = in(reg32) parity, d = out(reg32) done, options(nostack)
            )
        };
        if done != 0 {
            return;
        }
    }
}

/// `cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes`: a TMA load of
/// the box at coordinates `(c0, c1, c2)` of the tensor map at generic address `map` into shared
/// memory at `dst`, completing `bytes` of transaction count on `bar`.
///
/// # Safety
/// `map` is a valid tensor map in parameter, constant or global memory; `dst` is a shared
/// address aligned as the map's swizzle needs (1024 bytes for the 128-byte swizzle) with room
/// for the box; `bar` expects the bytes.
#[inline(always)]
pub unsafe fn tma_load_3d(dst: u32, map: u64, c0: i32, c1: i32, c2: i32, bar: u32) {
    // SAFETY: see the function's contract.
    unsafe {
        asm!(
            "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [{d}], [{m}, {{{x}, {y}, {z}}}], [{b}];",
            d = in(reg32) dst, m = in(reg64) map, x = in(reg32) c0, y = in(reg32) c1, z = in(reg32) c2,
            b = in(reg32) bar, options(nostack)
        )
    }
}

/// `cp.async.bulk.tensor.3d.global.shared::cta.bulk_group`: a TMA store of the box at shared
/// address `src` to coordinates `(c0, c1, c2)` of the tensor map at generic address `map`, in
/// this thread's current bulk async-group (close it with [`bulk_commit_group`]).
///
/// # Safety
/// `map` is a valid tensor map in parameter, constant or global memory whose box lies inside the
/// tensor; `src` is a shared address aligned as the map's swizzle needs, holding the box; the
/// box's writes to shared memory are ordered before this by [`fence_proxy_async`] and a barrier;
/// `src` is not written again before [`bulk_wait_group_read`] returns.
#[inline(always)]
pub unsafe fn tma_store_3d(map: u64, c0: i32, c1: i32, c2: i32, src: u32) {
    // SAFETY: see the function's contract.
    unsafe {
        asm!(
            "cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [{m}, {{{x}, {y}, {z}}}], [{s}];",
            m = in(reg64) map, x = in(reg32) c0, y = in(reg32) c1, z = in(reg32) c2, s = in(reg32) src,
            options(nostack)
        )
    }
}

/// `cp.async.bulk.commit_group;`: closes this thread's current bulk async-group.
#[inline(always)]
pub fn bulk_commit_group() {
    // SAFETY: no operands; an empty group is allowed.
    unsafe { asm!("cp.async.bulk.commit_group;", options(nostack)) }
}

/// `cp.async.bulk.wait_group.read 0;`: waits until every bulk async-group this thread committed
/// has finished reading its shared-memory source, so the staging tiles may be rewritten.
#[inline(always)]
pub fn bulk_wait_group_read() {
    // SAFETY: no operands.
    unsafe { asm!("cp.async.bulk.wait_group.read 0;", options(nostack)) }
}

/// `cp.async.bulk.wait_group 0;`: waits until every bulk async-group this thread committed has
/// completed, its global writes included.
#[inline(always)]
pub fn bulk_wait_group() {
    // SAFETY: no operands.
    unsafe { asm!("cp.async.bulk.wait_group 0;", options(nostack)) }
}

/// `fence.proxy.async.shared::cta;`: orders this thread's ordinary shared-memory writes before
/// later async-proxy reads (wgmma operands, TMA).
#[inline(always)]
pub fn fence_proxy_async() {
    // SAFETY: a fence has no operands.
    unsafe { asm!("fence.proxy.async.shared::cta;", options(nostack)) }
}

/// `bar.sync id, threads;`: a named barrier over `threads` threads (a multiple of 32).
///
/// # Safety
/// Exactly `threads` threads, in whole warps, reach barrier `id` with the same count.
#[inline(always)]
pub unsafe fn named_barrier(id: u32, threads: u32) {
    // SAFETY: see the function's contract.
    unsafe { asm!("bar.sync {i}, {n};", i = in(reg32) id, n = in(reg32) threads, options(nostack)) }
}

/// `bar.warp.sync 0xffffffff;`: converges the warp and orders its lanes' memory accesses.
#[inline(always)]
pub fn sync_warp() {
    // SAFETY: every lane of the warp calls it (the producer warp runs converged).
    unsafe { asm!("bar.warp.sync -1;", options(nostack)) }
}

/// The generic address of the kernel parameter `$param` (a tensor map passed by value):
/// `mov.b64` of the parameter symbol, then `cvta.param.u64`. The parameter must be declared
/// `.align 64` (the builder raises rustc's 16), as TMA requires of a tensor map.
#[macro_export]
macro_rules! param_address {
    ($param:literal) => {{
        let a: u64;
        // SAFETY: takes the address of a kernel parameter of the enclosing kernel; no access.
        unsafe {
            core::arch::asm!(
                concat!("mov.b64 {a}, ", $param, ";"),
                "cvta.param.u64 {a}, {a};",
                a = out(reg64) a, options(pure, nomem, nostack)
            )
        };
        a
    }};
}

/// `%tid.x`, read by a non-pure `asm!` so the compiler cannot hoist what depends on it out of a
/// loop: per-chunk shared addresses are recomputed from it instead of living in registers across
/// the whole chunk loop (there are more of them than registers).
#[inline(always)]
pub fn thread_idx_x_fresh() -> usize {
    let t: u32;
    // SAFETY: reads a special register.
    unsafe { asm!("mov.u32 {t}, %tid.x;", t = out(reg32) t, options(nomem, nostack)) };
    t as usize
}

/// `cvt.rn.bf16x2.f32 d, hi, lo;`: two f32 rounded to bf16 and packed, `lo` in the low half.
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

/// `st.shared.u16 [addr], v;`
///
/// # Safety
/// `addr` is a 2-byte-aligned shared address inside the CTA's allocation.
#[inline(always)]
pub unsafe fn st_shared_u16(addr: u32, v: u16) {
    // SAFETY: see the function's contract.
    unsafe { asm!("st.shared.u16 [{a}], {v};", a = in(reg32) addr, v = in(reg16) v, options(nostack)) }
}

/// `ld.shared.u16 v, [addr];`
///
/// # Safety
/// `addr` is a 2-byte-aligned shared address inside the CTA's allocation.
#[inline(always)]
pub unsafe fn ld_shared_u16(addr: u32) -> u16 {
    let v: u16;
    // SAFETY: see the function's contract.
    unsafe { asm!("ld.shared.u16 {v}, [{a}];", v = out(reg16) v, a = in(reg32) addr, options(nostack, readonly)) };
    v
}

/// `ld.shared.f32 v, [addr];`
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

/// `st.shared.f32 [addr], v;`
///
/// # Safety
/// `addr` is a 4-byte-aligned shared address inside the CTA's allocation.
#[inline(always)]
pub unsafe fn st_shared_f32(addr: u32, v: f32) {
    // SAFETY: see the function's contract.
    unsafe { asm!("st.shared.f32 [{a}], {v};", a = in(reg32) addr, v = in(reg32) v, options(nostack)) }
}

/// `ld.shared.v4.b32`: 16 bytes from shared memory.
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

/// `st.shared.v4.b32`: 16 bytes to shared memory.
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

/// `stmatrix.sync.aligned.m8n8.x4.trans.shared.b16`: the warp stores four 8x8 bf16 matrices
/// from mma fragments (register `i` of a lane holds row `lane / 4`, columns `2 * (lane % 4)` and
/// `+ 1` of matrix `i`), each transposed: lane `8i + j` gives the shared address of row `j` of
/// stored matrix `i` (16 bytes).
///
/// # Safety
/// All 32 lanes call it together with 16-byte-aligned shared addresses inside the allocation.
#[inline(always)]
pub unsafe fn stmatrix_x4_trans(addr: u32, r: [u32; 4]) {
    // SAFETY: see the function's contract.
    unsafe {
        asm!("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [{p}], {{{x}, {y}, {z}, {w}}};", p = in(reg32) addr,
             x = in(reg32) r[0], y = in(reg32) r[1], z = in(reg32) r[2], w = in(reg32) r[3], options(nostack))
    }
}

/// `ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16`: the inverse of [`stmatrix_x4_trans`]: lane
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

/// `ld.shared.v2.f32`: two adjacent f32 from shared memory.
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

/// `ld.global.nc.v4.b32`: 16 read-only bytes from global memory.
///
/// # Safety
/// `ptr` is 16-byte aligned and addresses 16 readable bytes no kernel writes during the launch.
#[inline(always)]
pub unsafe fn ld_global_nc_v4(ptr: *const u16) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: see the function's contract.
    unsafe {
        asm!("ld.global.nc.v4.b32 {{{x}, {y}, {z}, {w}}}, [{p}];", x = out(reg32) a, y = out(reg32) b,
             z = out(reg32) c, w = out(reg32) d, p = in(reg64) ptr, options(nostack, readonly))
    };
    [a, b, c, d]
}

/// `st.global.v4.b32`: 16 bytes to global memory.
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

/// A wgmma shared-memory matrix descriptor with the 128-byte swizzle: start address, leading
/// and stride byte offsets (all in 16-byte units, 14 bits each), base offset 0 (tiles are
/// 1024-byte aligned) and swizzle mode 1 (128 B) in bits 62-63.
#[inline(always)]
pub const fn sw128_desc(addr: u32, leading_bytes: u32, stride_bytes: u32) -> u64 {
    const FIELD: u64 = (1 << 14) - 1;
    const SWIZZLE_128B: u64 = 1 << 62;
    ((addr as u64 >> 4) & FIELD)
        | (((leading_bytes as u64 >> 4) & FIELD) << 16)
        | (((stride_bytes as u64 >> 4) & FIELD) << 32)
        | SWIZZLE_128B
}

/// Product 1 of a chunk, `acc = acc - A @ B` over K = 128: eight
/// `wgmma.mma_async.m64n64k16.f32.bf16.bf16` with A (`bf16(S^T)`, 64 x 128) from registers and B
/// (the `w` tile, K-major, 128-byte swizzle); `imm-scale-a = -1` negates the product. `desc`
/// addresses the tile's first box; k-step `i` starts `OFFSETS_VN[i]` 16-byte units further (32
/// bytes per step inside a 128-byte row, 8 KB to the second box). Commits the group and
/// returns while the products run: [`wgmma_wait_vn`] completes them.
///
/// # Safety
/// All 128 threads of a warpgroup call this together; `desc` describes the `w` tile's two
/// 128-byte-swizzled K-major `[64][64]` bf16 boxes, back to back in shared memory. Until
/// [`wgmma_wait_vn`] on `acc` returns, nothing reads or writes `acc` or `a` (their registers
/// belong to the tensor cores) and nothing writes the tile.
#[inline(always)]
pub unsafe fn wgmma_vn_start(acc: &mut [f32; 32], a: &[[u32; 4]; 8], desc: u64) {
    // SAFETY: see the function's contract.
    unsafe {
        asm!(
            "wgmma.fence.sync.aligned;",
            "{{ .reg .pred p; .reg .b64 b<8>; setp.ne.b32 p, {one}, 0;",
            "add.s64 b0, {desc}, 0;",
            "add.s64 b1, {desc}, 2;",
            "add.s64 b2, {desc}, 4;",
            "add.s64 b3, {desc}, 6;",
            "add.s64 b4, {desc}, 512;",
            "add.s64 b5, {desc}, 514;",
            "add.s64 b6, {desc}, 516;",
            "add.s64 b7, {desc}, 518;",
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {{{d0}, {d1}, {d2}, {d3}, {d4}, {d5}, {d6}, {d7}, {d8}, {d9}, {d10}, {d11}, {d12}, {d13}, {d14}, {d15}, {d16}, {d17}, {d18}, {d19}, {d20}, {d21}, {d22}, {d23}, {d24}, {d25}, {d26}, {d27}, {d28}, {d29}, {d30}, {d31}}}, {{{a0_0}, {a0_1}, {a0_2}, {a0_3}}}, b0, p, -1, 1, 0;",
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {{{d0}, {d1}, {d2}, {d3}, {d4}, {d5}, {d6}, {d7}, {d8}, {d9}, {d10}, {d11}, {d12}, {d13}, {d14}, {d15}, {d16}, {d17}, {d18}, {d19}, {d20}, {d21}, {d22}, {d23}, {d24}, {d25}, {d26}, {d27}, {d28}, {d29}, {d30}, {d31}}}, {{{a1_0}, {a1_1}, {a1_2}, {a1_3}}}, b1, p, -1, 1, 0;",
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {{{d0}, {d1}, {d2}, {d3}, {d4}, {d5}, {d6}, {d7}, {d8}, {d9}, {d10}, {d11}, {d12}, {d13}, {d14}, {d15}, {d16}, {d17}, {d18}, {d19}, {d20}, {d21}, {d22}, {d23}, {d24}, {d25}, {d26}, {d27}, {d28}, {d29}, {d30}, {d31}}}, {{{a2_0}, {a2_1}, {a2_2}, {a2_3}}}, b2, p, -1, 1, 0;",
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {{{d0}, {d1}, {d2}, {d3}, {d4}, {d5}, {d6}, {d7}, {d8}, {d9}, {d10}, {d11}, {d12}, {d13}, {d14}, {d15}, {d16}, {d17}, {d18}, {d19}, {d20}, {d21}, {d22}, {d23}, {d24}, {d25}, {d26}, {d27}, {d28}, {d29}, {d30}, {d31}}}, {{{a3_0}, {a3_1}, {a3_2}, {a3_3}}}, b3, p, -1, 1, 0;",
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {{{d0}, {d1}, {d2}, {d3}, {d4}, {d5}, {d6}, {d7}, {d8}, {d9}, {d10}, {d11}, {d12}, {d13}, {d14}, {d15}, {d16}, {d17}, {d18}, {d19}, {d20}, {d21}, {d22}, {d23}, {d24}, {d25}, {d26}, {d27}, {d28}, {d29}, {d30}, {d31}}}, {{{a4_0}, {a4_1}, {a4_2}, {a4_3}}}, b4, p, -1, 1, 0;",
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {{{d0}, {d1}, {d2}, {d3}, {d4}, {d5}, {d6}, {d7}, {d8}, {d9}, {d10}, {d11}, {d12}, {d13}, {d14}, {d15}, {d16}, {d17}, {d18}, {d19}, {d20}, {d21}, {d22}, {d23}, {d24}, {d25}, {d26}, {d27}, {d28}, {d29}, {d30}, {d31}}}, {{{a5_0}, {a5_1}, {a5_2}, {a5_3}}}, b5, p, -1, 1, 0;",
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {{{d0}, {d1}, {d2}, {d3}, {d4}, {d5}, {d6}, {d7}, {d8}, {d9}, {d10}, {d11}, {d12}, {d13}, {d14}, {d15}, {d16}, {d17}, {d18}, {d19}, {d20}, {d21}, {d22}, {d23}, {d24}, {d25}, {d26}, {d27}, {d28}, {d29}, {d30}, {d31}}}, {{{a6_0}, {a6_1}, {a6_2}, {a6_3}}}, b6, p, -1, 1, 0;",
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {{{d0}, {d1}, {d2}, {d3}, {d4}, {d5}, {d6}, {d7}, {d8}, {d9}, {d10}, {d11}, {d12}, {d13}, {d14}, {d15}, {d16}, {d17}, {d18}, {d19}, {d20}, {d21}, {d22}, {d23}, {d24}, {d25}, {d26}, {d27}, {d28}, {d29}, {d30}, {d31}}}, {{{a7_0}, {a7_1}, {a7_2}, {a7_3}}}, b7, p, -1, 1, 0;",
            "}}",
            "wgmma.commit_group.sync.aligned;",
            d0 = inout(reg32) acc[0],
            d1 = inout(reg32) acc[1],
            d2 = inout(reg32) acc[2],
            d3 = inout(reg32) acc[3],
            d4 = inout(reg32) acc[4],
            d5 = inout(reg32) acc[5],
            d6 = inout(reg32) acc[6],
            d7 = inout(reg32) acc[7],
            d8 = inout(reg32) acc[8],
            d9 = inout(reg32) acc[9],
            d10 = inout(reg32) acc[10],
            d11 = inout(reg32) acc[11],
            d12 = inout(reg32) acc[12],
            d13 = inout(reg32) acc[13],
            d14 = inout(reg32) acc[14],
            d15 = inout(reg32) acc[15],
            d16 = inout(reg32) acc[16],
            d17 = inout(reg32) acc[17],
            d18 = inout(reg32) acc[18],
            d19 = inout(reg32) acc[19],
            d20 = inout(reg32) acc[20],
            d21 = inout(reg32) acc[21],
            d22 = inout(reg32) acc[22],
            d23 = inout(reg32) acc[23],
            d24 = inout(reg32) acc[24],
            d25 = inout(reg32) acc[25],
            d26 = inout(reg32) acc[26],
            d27 = inout(reg32) acc[27],
            d28 = inout(reg32) acc[28],
            d29 = inout(reg32) acc[29],
            d30 = inout(reg32) acc[30],
            d31 = inout(reg32) acc[31],
            a0_0 = in(reg32) a[0][0],
            a0_1 = in(reg32) a[0][1],
            a0_2 = in(reg32) a[0][2],
            a0_3 = in(reg32) a[0][3],
            a1_0 = in(reg32) a[1][0],
            a1_1 = in(reg32) a[1][1],
            a1_2 = in(reg32) a[1][2],
            a1_3 = in(reg32) a[1][3],
            a2_0 = in(reg32) a[2][0],
            a2_1 = in(reg32) a[2][1],
            a2_2 = in(reg32) a[2][2],
            a2_3 = in(reg32) a[2][3],
            a3_0 = in(reg32) a[3][0],
            a3_1 = in(reg32) a[3][1],
            a3_2 = in(reg32) a[3][2],
            a3_3 = in(reg32) a[3][3],
            a4_0 = in(reg32) a[4][0],
            a4_1 = in(reg32) a[4][1],
            a4_2 = in(reg32) a[4][2],
            a4_3 = in(reg32) a[4][3],
            a5_0 = in(reg32) a[5][0],
            a5_1 = in(reg32) a[5][1],
            a5_2 = in(reg32) a[5][2],
            a5_3 = in(reg32) a[5][3],
            a6_0 = in(reg32) a[6][0],
            a6_1 = in(reg32) a[6][1],
            a6_2 = in(reg32) a[6][2],
            a6_3 = in(reg32) a[6][3],
            a7_0 = in(reg32) a[7][0],
            a7_1 = in(reg32) a[7][1],
            a7_2 = in(reg32) a[7][2],
            a7_3 = in(reg32) a[7][3],
            desc = in(reg64) desc,
            one = in(reg32) 1u32,
            options(nostack),
        );
    }
}

/// Product 2 of a chunk, `acc = acc + A @ B` over K = 64 tokens: four
/// `wgmma.mma_async.m64n128k16.f32.bf16.bf16` with A (`bf16(Vn^T)`, 64 x 64) from registers and
/// B (the `k` tile `[64 t][128 k]`, MN-major, read transposed: `imm-trans-b = 1`). `desc`
/// addresses the tile's first 16 token rows; k-step `i` starts 2 KB (16 rows of 128 bytes)
/// further. Commits the group and returns while the products run: [`wgmma_wait_state`]
/// completes them.
///
/// # Safety
/// All 128 threads of a warpgroup call this together; `desc` describes the `k` tile's two
/// 128-byte-swizzled boxes (leading offset: the box size). Until [`wgmma_wait_state`] on `acc`
/// returns, nothing reads or writes `acc` or `a` and nothing writes the tile.
#[inline(always)]
pub unsafe fn wgmma_state_start(acc: &mut [f32; 64], a: &[[u32; 4]; 4], desc: u64) {
    // SAFETY: see the function's contract.
    unsafe {
        asm!(
            "wgmma.fence.sync.aligned;",
            "{{ .reg .pred p; .reg .b64 b<4>; setp.ne.b32 p, {one}, 0;",
            "add.s64 b0, {desc}, 0;",
            "add.s64 b1, {desc}, 128;",
            "add.s64 b2, {desc}, 256;",
            "add.s64 b3, {desc}, 384;",
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {{{d0}, {d1}, {d2}, {d3}, {d4}, {d5}, {d6}, {d7}, {d8}, {d9}, {d10}, {d11}, {d12}, {d13}, {d14}, {d15}, {d16}, {d17}, {d18}, {d19}, {d20}, {d21}, {d22}, {d23}, {d24}, {d25}, {d26}, {d27}, {d28}, {d29}, {d30}, {d31}, {d32}, {d33}, {d34}, {d35}, {d36}, {d37}, {d38}, {d39}, {d40}, {d41}, {d42}, {d43}, {d44}, {d45}, {d46}, {d47}, {d48}, {d49}, {d50}, {d51}, {d52}, {d53}, {d54}, {d55}, {d56}, {d57}, {d58}, {d59}, {d60}, {d61}, {d62}, {d63}}}, {{{a0_0}, {a0_1}, {a0_2}, {a0_3}}}, b0, p, 1, 1, 1;",
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {{{d0}, {d1}, {d2}, {d3}, {d4}, {d5}, {d6}, {d7}, {d8}, {d9}, {d10}, {d11}, {d12}, {d13}, {d14}, {d15}, {d16}, {d17}, {d18}, {d19}, {d20}, {d21}, {d22}, {d23}, {d24}, {d25}, {d26}, {d27}, {d28}, {d29}, {d30}, {d31}, {d32}, {d33}, {d34}, {d35}, {d36}, {d37}, {d38}, {d39}, {d40}, {d41}, {d42}, {d43}, {d44}, {d45}, {d46}, {d47}, {d48}, {d49}, {d50}, {d51}, {d52}, {d53}, {d54}, {d55}, {d56}, {d57}, {d58}, {d59}, {d60}, {d61}, {d62}, {d63}}}, {{{a1_0}, {a1_1}, {a1_2}, {a1_3}}}, b1, p, 1, 1, 1;",
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {{{d0}, {d1}, {d2}, {d3}, {d4}, {d5}, {d6}, {d7}, {d8}, {d9}, {d10}, {d11}, {d12}, {d13}, {d14}, {d15}, {d16}, {d17}, {d18}, {d19}, {d20}, {d21}, {d22}, {d23}, {d24}, {d25}, {d26}, {d27}, {d28}, {d29}, {d30}, {d31}, {d32}, {d33}, {d34}, {d35}, {d36}, {d37}, {d38}, {d39}, {d40}, {d41}, {d42}, {d43}, {d44}, {d45}, {d46}, {d47}, {d48}, {d49}, {d50}, {d51}, {d52}, {d53}, {d54}, {d55}, {d56}, {d57}, {d58}, {d59}, {d60}, {d61}, {d62}, {d63}}}, {{{a2_0}, {a2_1}, {a2_2}, {a2_3}}}, b2, p, 1, 1, 1;",
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {{{d0}, {d1}, {d2}, {d3}, {d4}, {d5}, {d6}, {d7}, {d8}, {d9}, {d10}, {d11}, {d12}, {d13}, {d14}, {d15}, {d16}, {d17}, {d18}, {d19}, {d20}, {d21}, {d22}, {d23}, {d24}, {d25}, {d26}, {d27}, {d28}, {d29}, {d30}, {d31}, {d32}, {d33}, {d34}, {d35}, {d36}, {d37}, {d38}, {d39}, {d40}, {d41}, {d42}, {d43}, {d44}, {d45}, {d46}, {d47}, {d48}, {d49}, {d50}, {d51}, {d52}, {d53}, {d54}, {d55}, {d56}, {d57}, {d58}, {d59}, {d60}, {d61}, {d62}, {d63}}}, {{{a3_0}, {a3_1}, {a3_2}, {a3_3}}}, b3, p, 1, 1, 1;",
            "}}",
            "wgmma.commit_group.sync.aligned;",
            d0 = inout(reg32) acc[0],
            d1 = inout(reg32) acc[1],
            d2 = inout(reg32) acc[2],
            d3 = inout(reg32) acc[3],
            d4 = inout(reg32) acc[4],
            d5 = inout(reg32) acc[5],
            d6 = inout(reg32) acc[6],
            d7 = inout(reg32) acc[7],
            d8 = inout(reg32) acc[8],
            d9 = inout(reg32) acc[9],
            d10 = inout(reg32) acc[10],
            d11 = inout(reg32) acc[11],
            d12 = inout(reg32) acc[12],
            d13 = inout(reg32) acc[13],
            d14 = inout(reg32) acc[14],
            d15 = inout(reg32) acc[15],
            d16 = inout(reg32) acc[16],
            d17 = inout(reg32) acc[17],
            d18 = inout(reg32) acc[18],
            d19 = inout(reg32) acc[19],
            d20 = inout(reg32) acc[20],
            d21 = inout(reg32) acc[21],
            d22 = inout(reg32) acc[22],
            d23 = inout(reg32) acc[23],
            d24 = inout(reg32) acc[24],
            d25 = inout(reg32) acc[25],
            d26 = inout(reg32) acc[26],
            d27 = inout(reg32) acc[27],
            d28 = inout(reg32) acc[28],
            d29 = inout(reg32) acc[29],
            d30 = inout(reg32) acc[30],
            d31 = inout(reg32) acc[31],
            d32 = inout(reg32) acc[32],
            d33 = inout(reg32) acc[33],
            d34 = inout(reg32) acc[34],
            d35 = inout(reg32) acc[35],
            d36 = inout(reg32) acc[36],
            d37 = inout(reg32) acc[37],
            d38 = inout(reg32) acc[38],
            d39 = inout(reg32) acc[39],
            d40 = inout(reg32) acc[40],
            d41 = inout(reg32) acc[41],
            d42 = inout(reg32) acc[42],
            d43 = inout(reg32) acc[43],
            d44 = inout(reg32) acc[44],
            d45 = inout(reg32) acc[45],
            d46 = inout(reg32) acc[46],
            d47 = inout(reg32) acc[47],
            d48 = inout(reg32) acc[48],
            d49 = inout(reg32) acc[49],
            d50 = inout(reg32) acc[50],
            d51 = inout(reg32) acc[51],
            d52 = inout(reg32) acc[52],
            d53 = inout(reg32) acc[53],
            d54 = inout(reg32) acc[54],
            d55 = inout(reg32) acc[55],
            d56 = inout(reg32) acc[56],
            d57 = inout(reg32) acc[57],
            d58 = inout(reg32) acc[58],
            d59 = inout(reg32) acc[59],
            d60 = inout(reg32) acc[60],
            d61 = inout(reg32) acc[61],
            d62 = inout(reg32) acc[62],
            d63 = inout(reg32) acc[63],
            a0_0 = in(reg32) a[0][0],
            a0_1 = in(reg32) a[0][1],
            a0_2 = in(reg32) a[0][2],
            a0_3 = in(reg32) a[0][3],
            a1_0 = in(reg32) a[1][0],
            a1_1 = in(reg32) a[1][1],
            a1_2 = in(reg32) a[1][2],
            a1_3 = in(reg32) a[1][3],
            a2_0 = in(reg32) a[2][0],
            a2_1 = in(reg32) a[2][1],
            a2_2 = in(reg32) a[2][2],
            a2_3 = in(reg32) a[2][3],
            a3_0 = in(reg32) a[3][0],
            a3_1 = in(reg32) a[3][1],
            a3_2 = in(reg32) a[3][2],
            a3_3 = in(reg32) a[3][3],
            desc = in(reg64) desc,
            one = in(reg32) 1u32,
            options(nostack),
        );
    }
}

/// `wgmma.wait_group.sync.aligned 0;` with the accumulator registers `$acc[$i]` as `inout`
/// operands (named in a PTX comment), so the compiler keeps them untouched between a start and
/// this wait.
macro_rules! wgmma_wait_group_0 {
    ($acc:ident; $($i:literal)*) => {
        asm!(
            "wgmma.wait_group.sync.aligned 0;",
            concat!("// accumulators", $(" {", stringify!($i), "}"),*),
            $(inout(reg32) $acc[$i],)*
            options(nostack),
        )
    };
}

/// Waits for [`wgmma_vn_start`]: returns once its products have written `acc`.
///
/// # Safety
/// The warpgroup's 128 threads call this together, after [`wgmma_vn_start`] on the same `acc`.
#[inline(always)]
pub unsafe fn wgmma_wait_vn(acc: &mut [f32; 32]) {
    // SAFETY: see the function's contract.
    unsafe {
        wgmma_wait_group_0!(acc; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31)
    }
}

/// Waits for [`wgmma_state_start`]: returns once its products have written `acc`.
///
/// # Safety
/// The warpgroup's 128 threads call this together, after [`wgmma_state_start`] on the same `acc`.
#[inline(always)]
pub unsafe fn wgmma_wait_state(acc: &mut [f32; 64]) {
    // SAFETY: see the function's contract.
    unsafe {
        wgmma_wait_group_0!(acc;
            0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31
            32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63)
    }
}

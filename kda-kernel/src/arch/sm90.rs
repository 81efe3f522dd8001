//! Hopper-only (sm_90 / sm_90a) PTX: mbarrier phases and transaction counts, TMA bulk tensor
//! copies, async-proxy fences, `stmatrix`, and the two warpgroup MMAs of the recurrence. Each
//! wrapper is one instruction or one indivisible instruction sequence; the instructions every
//! sm_80+ GPU has are in [`super::sm80`].
//!
//! Each product is a start (`wgmma.fence`, its k-steps, `commit_group`: one `asm!` block, written
//! by the `wgmma_start!` macro from the step list) and a wait (`wait_group 0`), so independent
//! work runs while the tensor cores do. The accumulator registers are `inout` operands of both
//! blocks; between them the caller leaves the accumulator and the A fragments alone (the
//! functions' safety contracts).

use core::arch::asm;

pub use super::sm80::mbarrier_init;

/// `fence.mbarrier_init.release.cluster;` (PTX 8.0, sm_90): makes initialised mbarriers visible to the async
/// proxy (TMA) before a CTA barrier publishes them.
#[inline(always)]
pub fn fence_mbarrier_init() {
    // SAFETY: a fence has no operands.
    unsafe { asm!("fence.mbarrier_init.release.cluster;", options(nostack)) }
}

/// `mbarrier.arrive.shared::cta.b64 state, [bar];` (PTX 7.8, sm_80) (release at CTA scope).
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

/// `mbarrier.arrive.expect_tx.shared::cta.b64 state, [bar], bytes;` (PTX 8.0, sm_90): arrives and announces the
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
/// (`mbarrier.try_wait.parity.shared::cta.b64` in a loop, PTX 7.8, sm_90; acquire at CTA scope).
/// A Rust loop around `try_wait`, not an `asm!` loop with labels (labels duplicate on inlining).
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

/// `cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes` (PTX 8.0, sm_90): a TMA load of
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

/// `cp.async.bulk.tensor.3d.global.shared::cta.bulk_group` (PTX 8.0, sm_90): a TMA store of the box at shared
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

/// `cp.async.bulk.commit_group;` (PTX 8.0, sm_90): closes this thread's current bulk async-group.
#[inline(always)]
pub fn bulk_commit_group() {
    // SAFETY: no operands; an empty group is allowed.
    unsafe { asm!("cp.async.bulk.commit_group;", options(nostack)) }
}

/// `cp.async.bulk.wait_group.read PENDING;` (PTX 8.0, sm_90): waits until all but the newest `PENDING` bulk
/// async-groups this thread committed have finished reading their shared-memory sources, so
/// their staging tiles may be rewritten.
#[inline(always)]
pub fn bulk_wait_group_read<const PENDING: u32>() {
    // SAFETY: no operands.
    unsafe { asm!("cp.async.bulk.wait_group.read {n};", n = const PENDING, options(nostack)) }
}

/// `prefetch.tensormap [map];` (PTX 8.0, sm_90): starts fetching the tensor map at generic address `map` into the
/// TMA unit's descriptor cache, so that the first copy through it does not wait for the fetch.
///
/// # Safety
/// `map` is the generic address of a tensor map in parameter, constant or global memory.
#[inline(always)]
pub unsafe fn prefetch_tensormap(map: u64) {
    // SAFETY: see the function's contract; a prefetch reads nothing the program sees.
    unsafe { asm!("prefetch.tensormap [{m}];", m = in(reg64) map, options(nostack)) }
}

/// `fence.proxy.async.shared::cta;` (PTX 8.0, sm_90): orders this thread's ordinary shared-memory writes before
/// later async-proxy reads (wgmma operands, TMA).
#[inline(always)]
pub fn fence_proxy_async() {
    // SAFETY: a fence has no operands.
    unsafe { asm!("fence.proxy.async.shared::cta;", options(nostack)) }
}

/// `mov.b64 a, PARAM; cvta.param.u64 a, a;`: the generic address of the kernel parameter
/// `$param` (its PTX symbol, e.g. `"kda_fwd_h_hopper_param_0"`), for handing a tensor map held
/// in the parameter block to TMA without copying it. The parameter must be declared aligned as
/// TMA needs (`abi::KernelAbi::param_align`; the PTX builder raises rustc's 16 to 64).
macro_rules! param_address {
    ($param:expr) => {{
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
pub(crate) use param_address;

/// `stmatrix.sync.aligned.m8n8.x4.trans.shared.b16` (PTX 7.8, sm_90): the warp stores four 8x8 bf16 matrices
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

/// `stmatrix.sync.aligned.m8n8.x4.shared.b16` (PTX 7.8, sm_90): as [`stmatrix_x4_trans`], each
/// matrix stored as it is: lane `8i + j` gives the shared address of row `j` of matrix `i`.
///
/// # Safety
/// All 32 lanes call it together with 16-byte-aligned shared addresses inside the allocation.
#[inline(always)]
pub unsafe fn stmatrix_x4(addr: u32, r: [u32; 4]) {
    // SAFETY: see the function's contract.
    unsafe {
        asm!("stmatrix.sync.aligned.m8n8.x4.shared.b16 [{p}], {{{x}, {y}, {z}, {w}}};", p = in(reg32) addr,
             x = in(reg32) r[0], y = in(reg32) r[1], z = in(reg32) r[2], w = in(reg32) r[3], options(nostack))
    }
}

/// A wgmma shared-memory matrix descriptor (sm_90a) with the 128-byte swizzle: start address, leading
/// and stride byte offsets (all in 16-byte units, 14 bits each), base offset 0 (tiles are
/// 1024-byte aligned) and swizzle mode 1 (128 B) in bits 62-63.
#[inline(always)]
pub const fn sw128_desc(addr: u32, leading_bytes: u32, stride_bytes: u32) -> u64 {
    const SWIZZLE_128B: u64 = 1 << 62;
    desc_fields(addr, leading_bytes, stride_bytes) | SWIZZLE_128B
}

/// The address and offset fields of a wgmma matrix descriptor (16-byte units, 14 bits each).
#[inline(always)]
const fn desc_fields(addr: u32, leading_bytes: u32, stride_bytes: u32) -> u64 {
    const FIELD: u64 = (1 << 14) - 1;
    ((addr as u64 >> 4) & FIELD)
        | (((leading_bytes as u64 >> 4) & FIELD) << 16)
        | (((stride_bytes as u64 >> 4) & FIELD) << 32)
}

/// One warpgroup MMA group, started: `wgmma.fence`, one `wgmma.mma_async` per k-step, then
/// `commit_group`. The accumulator `$acc[$i]` is the first positional operands (in order); the
/// A fragments follow, four per step in step order, and each step names its four positional
/// indices and its B descriptor's offset from `$desc` (in 16-byte units).
macro_rules! wgmma_start {
    (
        shape $shape:literal, scale_a $scale_a:literal, trans_b $trans_b:literal,
        acc $acc:ident [$first:literal $($i:literal)*],
        a $a:ident, desc $desc:ident,
        steps [$($s:literal: [$a0:literal $a1:literal $a2:literal $a3:literal] + $off:literal),* $(,)?]
    ) => {{
        macro_rules! accumulators {
            () => { concat!("{{{", stringify!($first), "}" $(, ", {", stringify!($i), "}")*, "}}") };
        }
        asm!(
            "wgmma.fence.sync.aligned;",
            "{{ .reg .pred p; .reg .b64 b<8>; setp.ne.b32 p, {one}, 0;",
            $(concat!("add.s64 b", stringify!($s), ", {desc}, ", stringify!($off), ";"),)*
            $(concat!(
                "wgmma.mma_async.sync.aligned.", $shape, ".f32.bf16.bf16 ", accumulators!(),
                ", {{{", stringify!($a0), "}, {", stringify!($a1), "}, {", stringify!($a2), "}, {", stringify!($a3),
                "}}}, b", stringify!($s), ", p, ", $scale_a, ", 1, ", $trans_b, ";"
            ),)*
            "}}",
            "wgmma.commit_group.sync.aligned;",
            inout(reg32) $acc[$first], $(inout(reg32) $acc[$i],)*
            $(in(reg32) $a[$s][0], in(reg32) $a[$s][1], in(reg32) $a[$s][2], in(reg32) $a[$s][3],)*
            desc = in(reg64) $desc,
            one = in(reg32) 1u32,
            options(nostack),
        )
    }};
}

/// `acc += scale_a * A @ B` of `m64n64k16` steps with A from registers and B K-major
/// (128-byte swizzle): over K = 128 (`x8`: two boxes, the second 8 KB = 512 units further) or
/// K = 64 (`x4`: one box), k-step `i` 32 bytes further inside a 128-byte row. The shared body of
/// the K-major `m64n64` wrappers below.
macro_rules! wgmma_m64n64_kmajor {
    (x8, scale_a $scale_a:literal, $acc:ident, $a:ident, $desc:ident) => {
        wgmma_start!(
            shape "m64n64k16", scale_a $scale_a, trans_b "0",
            acc $acc [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31],
            a $a, desc $desc,
            steps [
                0: [32 33 34 35] + 0,
                1: [36 37 38 39] + 2,
                2: [40 41 42 43] + 4,
                3: [44 45 46 47] + 6,
                4: [48 49 50 51] + 512,
                5: [52 53 54 55] + 514,
                6: [56 57 58 59] + 516,
                7: [60 61 62 63] + 518,
            ]
        )
    };
    (x4, scale_a $scale_a:literal, $acc:ident, $a:ident, $desc:ident) => {
        wgmma_start!(
            shape "m64n64k16", scale_a $scale_a, trans_b "0",
            acc $acc [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31],
            a $a, desc $desc,
            steps [
                0: [32 33 34 35] + 0,
                1: [36 37 38 39] + 2,
                2: [40 41 42 43] + 4,
                3: [44 45 46 47] + 6,
            ]
        )
    };
}

/// `acc = acc - A @ B` over K = 128 (PTX 8.0, sm_90a; the recurrence's product 1): eight
/// `wgmma.mma_async.m64n64k16.f32.bf16.bf16` with A (`bf16(S^T)`, 64 x 128) from registers and B
/// (the `w` tile, K-major, 128-byte swizzle); `imm-scale-a = -1` negates the product. `desc`
/// addresses the tile's first box; k-step `i` starts `OFFSETS_VN[i]` 16-byte units further (32
/// bytes per step inside a 128-byte row, 8 KB to the second box). Commits the group and
/// returns while the products run: [`wgmma_wait_m64n64`] completes them.
///
/// # Safety
/// All 128 threads of a warpgroup call this together; `desc` describes the `w` tile's two
/// 128-byte-swizzled K-major `[64][64]` bf16 boxes, back to back in shared memory. Until
/// [`wgmma_wait_m64n64`] on `acc` returns, nothing reads or writes `acc` or `a` (their registers
/// belong to the tensor cores) and nothing writes the tile.
#[inline(always)]
pub unsafe fn wgmma_m64n64k16x8_sub_start(acc: &mut [f32; 32], a: &[[u32; 4]; 8], desc: u64) {
    // SAFETY: see the function's contract.
    unsafe { wgmma_m64n64_kmajor!(x8, scale_a "-1", acc, a, desc) }
}

/// `acc = acc + A @ B` over K = 64 (PTX 8.0, sm_90a; the recurrence's product 2, K = tokens): four
/// `wgmma.mma_async.m64n128k16.f32.bf16.bf16` with A (`bf16(Vn^T)`, 64 x 64) from registers and
/// B (the `k` tile `[64 t][128 k]`, MN-major, read transposed: `imm-trans-b = 1`). `desc`
/// addresses the tile's first 16 token rows; k-step `i` starts 2 KB (16 rows of 128 bytes)
/// further. Commits the group and returns while the products run: [`wgmma_wait_m64n128`]
/// completes them.
///
/// # Safety
/// All 128 threads of a warpgroup call this together; `desc` describes the `k` tile's two
/// 128-byte-swizzled boxes (leading offset: the box size). Until [`wgmma_wait_m64n128`] on `acc`
/// returns, nothing reads or writes `acc` or `a` and nothing writes the tile.
#[inline(always)]
pub unsafe fn wgmma_m64n128k16x4_add_start(acc: &mut [f32; 64], a: &[[u32; 4]; 4], desc: u64) {
    // SAFETY: see the function's contract.
    unsafe {
        wgmma_start!(
            shape "m64n128k16", scale_a "1", trans_b "1",
            acc acc [
                0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31
                32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63
            ],
            a a, desc desc,
            steps [
                0: [64 65 66 67] + 0,
                1: [68 69 70 71] + 128,
                2: [72 73 74 75] + 256,
                3: [76 77 78 79] + 384,
            ]
        )
    }
}

/// `acc = acc - A @ B` over K = 64 (PTX 8.0, sm_90a; product 1 of the `K = 64` kernel): four
/// `wgmma.mma_async.m64n64k16.f32.bf16.bf16`, as [`wgmma_m64n64k16x8_sub_start`] over the `w`
/// tile's one box (k-step `i` starts 32 bytes further). [`wgmma_wait_m64n64`] completes them.
///
/// # Safety
/// As for [`wgmma_m64n64k16x8_sub_start`], with `desc` describing one `[64][64]` box.
#[inline(always)]
pub unsafe fn wgmma_m64n64k16x4_sub_start(acc: &mut [f32; 32], a: &[[u32; 4]; 4], desc: u64) {
    // SAFETY: see the function's contract.
    unsafe { wgmma_m64n64_kmajor!(x4, scale_a "-1", acc, a, desc) }
}

/// `acc = acc + A @ B` over K = 64 tokens with N = 64 (PTX 8.0, sm_90a; product 2 of the `K = 64`
/// kernel): four `wgmma.mma_async.m64n64k16.f32.bf16.bf16`, as [`wgmma_m64n128k16x4_add_start`]
/// over the `k` tile's one box. [`wgmma_wait_m64n64`] completes them.
///
/// # Safety
/// As for [`wgmma_m64n128k16x4_add_start`], with `desc` describing one `[64][64]` box.
#[inline(always)]
pub unsafe fn wgmma_m64n64k16x4_add_start(acc: &mut [f32; 32], a: &[[u32; 4]; 4], desc: u64) {
    // SAFETY: see the function's contract.
    unsafe {
        wgmma_start!(
            shape "m64n64k16", scale_a "1", trans_b "1",
            acc acc [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31],
            a a, desc desc,
            steps [
                0: [32 33 34 35] + 0,
                1: [36 37 38 39] + 128,
                2: [40 41 42 43] + 256,
                3: [44 45 46 47] + 384,
            ]
        )
    }
}

/// `acc = acc + A @ B` over K = 128 (PTX 8.0, sm_90a; the fused layer's `o^T += bf16(S^T) @ (q Γ)^T`
/// at `K = 128`): as [`wgmma_m64n64k16x8_sub_start`] with `imm-scale-a = 1`, B a K-major tile
/// of two `[64][64]` boxes (the stage's `q Γ`). [`wgmma_wait_m64n64`] or
/// [`wgmma_wait_older_m64n64`] completes them.
///
/// # Safety
/// As for [`wgmma_m64n64k16x8_sub_start`].
#[inline(always)]
pub unsafe fn wgmma_m64n64k16x8_add_start(acc: &mut [f32; 32], a: &[[u32; 4]; 8], desc: u64) {
    // SAFETY: see the function's contract.
    unsafe { wgmma_m64n64_kmajor!(x8, scale_a "1", acc, a, desc) }
}

/// `acc = acc + A @ B` over K = 64 with B K-major (PTX 8.0, sm_90a; the fused layer's
/// `o^T += bf16(Vn^T) @ P^T`, and `o^T += bf16(S^T) @ (q Γ)^T` at `K = 64`): four
/// `wgmma.mma_async.m64n64k16.f32.bf16.bf16` over one `[64][64]` K-major box (k-step `i` starts
/// 32 bytes further). [`wgmma_wait_m64n64`] or [`wgmma_wait_older_m64n64`] completes them.
///
/// # Safety
/// As for [`wgmma_m64n64k16x4_sub_start`].
#[inline(always)]
pub unsafe fn wgmma_m64n64k16x4_add_kmajor_start(acc: &mut [f32; 32], a: &[[u32; 4]; 4], desc: u64) {
    // SAFETY: see the function's contract.
    unsafe { wgmma_m64n64_kmajor!(x4, scale_a "1", acc, a, desc) }
}

/// One warpgroup MMA group of four `m64n32k16` k-steps with both operands from shared memory,
/// started: `wgmma.fence`, the four `wgmma.mma_async`, `commit_group`. Step `i` adds
/// `$a_off[i]` and `$b_off[i]` (16-byte units) to the descriptors `$a` and `$b`; the
/// accumulator (16 f32) is `inout`.
macro_rules! wgmma_ss_m64n32_x4 {
    (
        scale_a $scale_a:literal, trans_a $trans_a:literal, trans_b $trans_b:literal,
        acc $acc:ident, a $a:ident [$($ao:literal)*], b $b:ident [$($bo:literal)*]
    ) => {
        asm!(
            "wgmma.fence.sync.aligned;",
            "{{ .reg .pred p; .reg .b64 a<4>, b<4>; setp.ne.b32 p, {one}, 0;",
            wgmma_ss_m64n32_x4!(@offsets a [0 1 2 3] [$($ao)*]),
            wgmma_ss_m64n32_x4!(@offsets b [0 1 2 3] [$($bo)*]),
            wgmma_ss_m64n32_x4!(@mma $scale_a $trans_a $trans_b [0 1 2 3]),
            "}}",
            "wgmma.commit_group.sync.aligned;",
            inout(reg32) $acc[0], inout(reg32) $acc[1], inout(reg32) $acc[2], inout(reg32) $acc[3],
            inout(reg32) $acc[4], inout(reg32) $acc[5], inout(reg32) $acc[6], inout(reg32) $acc[7],
            inout(reg32) $acc[8], inout(reg32) $acc[9], inout(reg32) $acc[10], inout(reg32) $acc[11],
            inout(reg32) $acc[12], inout(reg32) $acc[13], inout(reg32) $acc[14], inout(reg32) $acc[15],
            adesc = in(reg64) $a,
            bdesc = in(reg64) $b,
            one = in(reg32) 1u32,
            options(nostack),
        )
    };
    (@offsets $x:ident [$($s:literal)*] [$($o:literal)*]) => {
        concat!($("add.s64 ", stringify!($x), stringify!($s), ", {", stringify!($x), "desc}, ", stringify!($o), ";"),*)
    };
    (@mma $scale_a:literal $trans_a:literal $trans_b:literal [$($s:literal)*]) => {
        concat!($(
            "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 ",
            "{{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}, {10}, {11}, {12}, {13}, {14}, {15}}}, a",
            stringify!($s), ", b", stringify!($s), ", p, ", $scale_a, ", 1, ", $trans_a, ", ", $trans_b, ";"
        ),*)
    };
}

/// `acc = acc - A @ B` over 64 keys (PTX 8.0, sm_90a; a narrow block's product 1): four
/// `wgmma.mma_async.m64n32k16.f32.bf16.bf16`, A a `w` box (`[64 t][64 k]`, K-major, 128-byte
/// swizzle), B one box of the staged `bf16(S)^T` (`[32 v][64 k]`, K-major, 128-byte swizzle);
/// k-step `i` starts 32 bytes further in both. Commits the group and returns while
/// the products run: [`wgmma_wait_m64n32`] completes them.
///
/// # Safety
/// All 128 threads of a warpgroup call this together; `a` and `b` describe those boxes, whose
/// writes (by any proxy) are complete and visible to the async proxy. Until
/// [`wgmma_wait_m64n32`] on `acc` returns, nothing reads or writes `acc` and nothing writes the
/// boxes.
#[inline(always)]
pub unsafe fn wgmma_m64n32k16x4_sub_kmajor(acc: &mut [f32; 16], a: u64, b: u64) {
    // SAFETY: see the function's contract.
    unsafe { wgmma_ss_m64n32_x4!(scale_a "-1", trans_a "0", trans_b "0", acc acc, a a [0 2 4 6], b b [0 2 4 6]) }
}

/// `acc = acc + A @ B` over 64 tokens (PTX 8.0, sm_90a; a narrow block's product 2, one 64-key
/// tile of the state): four `wgmma.mma_async.m64n32k16.f32.bf16.bf16`, A a `k` box read
/// transposed (`[64 t][64 k]` as `k^T`, MN-major, 128-byte swizzle; k-step `i` starts 16 rows,
/// 2 KB, further), B the staged `bf16(Vn)^T` (`[32 v][64 t]`, K-major, 128-byte swizzle; 32
/// bytes further).
///
/// # Safety
/// As for [`wgmma_m64n32k16x4_sub_kmajor`], with `a` and `b` describing those tiles.
#[inline(always)]
pub unsafe fn wgmma_m64n32k16x4_add_ta(acc: &mut [f32; 16], a: u64, b: u64) {
    // SAFETY: see the function's contract.
    unsafe { wgmma_ss_m64n32_x4!(scale_a "1", trans_a "1", trans_b "0", acc acc, a a [0 128 256 384], b b [0 2 4 6]) }
}

/// `acc = acc + A @ B` over 64 keys or tokens (PTX 8.0, sm_90a; a narrow block's output
/// products in the fused layer pass): four `wgmma.mma_async.m64n32k16.f32.bf16.bf16`, A a `q Γ`
/// or attention box (`[64 t][64 k]`, K-major, 128-byte swizzle), B a box of a staged operand
/// (`[32 v][64 k]`, K-major, 128-byte swizzle); k-step `i` starts 32 bytes further in both.
/// Commits the group and returns while the products run.
///
/// # Safety
/// As for [`wgmma_m64n32k16x4_sub_kmajor`], with `a` and `b` describing those boxes.
#[inline(always)]
pub unsafe fn wgmma_m64n32k16x4_add_kmajor(acc: &mut [f32; 16], a: u64, b: u64) {
    // SAFETY: see the function's contract.
    unsafe { wgmma_ss_m64n32_x4!(scale_a "1", trans_a "0", trans_b "0", acc acc, a a [0 2 4 6], b b [0 2 4 6]) }
}

/// `wgmma.wait_group.sync.aligned $pending;` with the accumulator registers `$acc[$i]` as `inout`
/// operands (named in a PTX comment), so the compiler keeps them untouched between a start and
/// this wait.
macro_rules! wgmma_wait_group {
    ($pending:literal; $acc:ident; $($i:literal)*) => {
        asm!(
            concat!("wgmma.wait_group.sync.aligned ", stringify!($pending), ";"),
            concat!("// accumulators", $(" {", stringify!($i), "}"),*),
            $(inout(reg32) $acc[$i],)*
            options(nostack),
        )
    };
}

/// `wgmma.wait_group.sync.aligned 1;` (PTX 8.0, sm_90a): returns once every committed group but
/// the newest has completed, `acc` being the accumulator of one of those older groups (named
/// as `inout` operands, as in [`wgmma_wait_m64n64`]); the newest group runs on.
///
/// # Safety
/// The warpgroup's 128 threads call this together; the groups on `acc` were all committed
/// before the newest group.
#[inline(always)]
pub unsafe fn wgmma_wait_older_m64n64(acc: &mut [f32; 32]) {
    // SAFETY: see the function's contract.
    unsafe {
        wgmma_wait_group!(1; acc; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31)
    }
}

/// `wgmma.wait_group.sync.aligned 0;` (PTX 8.0, sm_90a) after any start on a 32-register
/// (`m64n64`) accumulator: returns once its products have written `acc`.
///
/// # Safety
/// The warpgroup's 128 threads call this together, after a start on the same `acc`.
#[inline(always)]
pub unsafe fn wgmma_wait_m64n64(acc: &mut [f32; 32]) {
    // SAFETY: see the function's contract.
    unsafe {
        wgmma_wait_group!(0; acc; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31)
    }
}

/// `wgmma.wait_group.sync.aligned 0;` (PTX 8.0, sm_90a) after any start on a 16-register
/// (`m64n32`) accumulator: returns once every committed group has written its accumulator.
///
/// # Safety
/// The warpgroup's 128 threads call this together, after a start on the same `acc`.
#[inline(always)]
pub unsafe fn wgmma_wait_m64n32(acc: &mut [f32; 16]) {
    // SAFETY: see the function's contract.
    unsafe { wgmma_wait_group!(0; acc; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15) }
}

/// `wgmma.wait_group.sync.aligned NEWER;` (PTX 8.0, sm_90a): returns once every committed group
/// but the newest `NEWER` has completed, `acc` being the 16-register (`m64n32`) accumulator of
/// one of those older groups (named as `inout` operands, as in [`wgmma_wait_m64n32`]); the
/// newest groups run on.
///
/// # Safety
/// The warpgroup's 128 threads call this together; the groups on `acc` were all committed
/// before the newest `NEWER` groups.
#[inline(always)]
pub unsafe fn wgmma_wait_older_m64n32<const NEWER: u32>(acc: &mut [f32; 16]) {
    // SAFETY: see the function's contract.
    unsafe {
        asm!(
            "wgmma.wait_group.sync.aligned {n};",
            "// accumulators {0} {1} {2} {3} {4} {5} {6} {7} {8} {9} {10} {11} {12} {13} {14} {15}",
            inout(reg32) acc[0], inout(reg32) acc[1], inout(reg32) acc[2], inout(reg32) acc[3],
            inout(reg32) acc[4], inout(reg32) acc[5], inout(reg32) acc[6], inout(reg32) acc[7],
            inout(reg32) acc[8], inout(reg32) acc[9], inout(reg32) acc[10], inout(reg32) acc[11],
            inout(reg32) acc[12], inout(reg32) acc[13], inout(reg32) acc[14], inout(reg32) acc[15],
            n = const NEWER,
            options(nostack),
        )
    }
}

/// `wgmma.wait_group.sync.aligned 0;` (PTX 8.0, sm_90a) after [`wgmma_m64n128k16x4_add_start`]:
/// returns once its products have written `acc`.
///
/// # Safety
/// The warpgroup's 128 threads call this together, after [`wgmma_m64n128k16x4_add_start`] on the same `acc`.
#[inline(always)]
pub unsafe fn wgmma_wait_m64n128(acc: &mut [f32; 64]) {
    // SAFETY: see the function's contract.
    unsafe {
        wgmma_wait_group!(0; acc;
            0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31
            32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63)
    }
}

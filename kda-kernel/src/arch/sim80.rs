//! (host only, feature `sim`) The instructions of `arch/sm80.rs` as the simulator
//! runs them: the same functions with the same signatures, each computing what the PTX ISA
//! defines the instruction to compute, on the simulated thread of [`crate::sim`]. The kernels
//! compile against this module on the host unchanged.
//!
//! Precision: the transcendental approximations (`ex2.approx`, `lg2.approx`, `rsqrt.approx`,
//! `rcp.approx`) are computed exactly and rounded once, within the 2 ulp the GPU's give; `mma`
//! products are summed in f64 and rounded once onto the accumulator, where the tensor core
//! rounds its partial sums, which the tests' tolerances cover either way.

extern crate std;

use crate::sim::race::Access;
use crate::sim::{LANE_WORDS, WARP, with_thread};

/// `%tid.x`.
pub fn thread_idx_x() -> usize {
    with_thread(|_, tid| tid)
}

/// `%ctaid.x`.
pub fn block_idx_x() -> usize {
    with_thread(|cta, _| cta.index)
}

/// `%ctaid.x`, read by the warp role `ROLE`.
pub fn block_idx_x_in_role<const ROLE: u32>() -> usize {
    block_idx_x()
}

/// `%tid.x`, read afresh.
pub fn thread_idx_x_fresh() -> usize {
    thread_idx_x()
}

/// `bar.sync 0;`: every thread of the CTA.
///
/// # Safety
/// Every thread of the CTA must reach the same call.
pub unsafe fn sync_threads() {
    with_thread(|cta, _| cta.barrier(0, cta.threads));
}

/// `bar.sync id, threads;`.
///
/// # Safety
/// Exactly `threads` threads, in whole warps, reach barrier `id` with the same count.
pub unsafe fn named_barrier(id: u32, threads: u32) {
    with_thread(|cta, _| cta.barrier(id as usize, threads as usize));
}

/// `bar.warp.sync -1;`.
pub fn sync_warp() {
    with_thread(|cta, tid| cta.warp_barrier(tid));
}

/// The simulator's threads run one at a time: a pause changes nothing.
pub fn nanosleep(_ns: u32) {}

/// The shared-window address of the dynamic shared memory.
pub fn smem_base_shared() -> u32 {
    crate::sim::SHARED_BASE
}

/// A generic pointer to the dynamic shared memory.
pub fn smem_base_generic() -> *mut u8 {
    with_thread(|cta, _| cta.shared_generic())
}

/// `cvt.rn.bf16.f32`: round to nearest, ties to even; NaN becomes the canonical NaN.
pub fn f32_to_bf16(x: f32) -> u16 {
    if x.is_nan() {
        return 0x7fff;
    }
    let b = x.to_bits();
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// The f32 value of bf16 bits.
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// `ex2.approx.f32`.
pub fn exp2_approx(x: f32) -> f32 {
    (x as f64).exp2() as f32
}

/// `ex2.approx.ftz.f32`: subnormal inputs and results flushed to zero.
pub fn exp2_approx_ftz(x: f32) -> f32 {
    let y = exp2_approx(if x.is_subnormal() { 0.0 } else { x });
    if y.is_subnormal() { 0.0 } else { y }
}

/// `lg2.approx.f32`.
pub fn log2_approx(x: f32) -> f32 {
    (x as f64).log2() as f32
}

/// `rcp.approx.ftz.f32`: subnormal inputs and results flushed to zero.
pub fn rcp_approx_ftz(x: f32) -> f32 {
    let y = rcp_approx(if x.is_subnormal() { 0.0f32.copysign(x) } else { x });
    if y.is_subnormal() { 0.0f32.copysign(y) } else { y }
}

/// `rsqrt.approx.f32`.
pub fn rsqrt_approx(x: f32) -> f32 {
    (1.0 / (x as f64).sqrt()) as f32
}

/// `rcp.approx.f32`.
pub fn rcp_approx(x: f32) -> f32 {
    (1.0 / x as f64) as f32
}

/// `cvt.rna.tf32.f32`: 10 mantissa bits, ties away from zero.
pub fn cvt_tf32(x: f32) -> u32 {
    let b = x.to_bits();
    if !x.is_finite() {
        return b;
    }
    (b + 0x1000) & !0x1fff
}

/// `cvt.rn.bf16x2.f32 d, hi, lo;`.
pub fn pack_bf16x2(lo: f32, hi: f32) -> u32 {
    f32_to_bf16(lo) as u32 | (f32_to_bf16(hi) as u32) << 16
}

/// `fma.rn.f32`.
pub fn fma_f32(a: f32, b: f32, c: f32) -> f32 {
    a.mul_add(b, c)
}

/// `trap;`.
pub fn trap() -> ! {
    panic!("trap")
}

/// The bf16 in the low (`hi == false`) or high half of a register.
fn half(reg: u32, hi: bool) -> f64 {
    bf16_to_f32(if hi { (reg >> 16) as u16 } else { reg as u16 }) as f64
}

/// One lane's accumulator, A and B registers, packed for the warp's exchange.
fn mma_operands(acc: &[f32; 4], a: [u32; 4], b: [u32; 2]) -> [u32; LANE_WORDS] {
    let mut w = [0u32; LANE_WORDS];
    for i in 0..4 {
        w[i] = acc[i].to_bits();
        w[4 + i] = a[i];
    }
    w[8] = b[0];
    w[9] = b[1];
    w
}

/// `D = A B + C` of a 16 x 8 tile from the lanes' A (`a(row, k)`) and B (`b(k, col)`) elements,
/// written back into this lane's accumulator fragment: (g, 2t), (g, 2t + 1), (g + 8, 2t),
/// (g + 8, 2t + 1).
fn mma_tile(acc: &mut [f32; 4], depth: usize, a: impl Fn(usize, usize) -> f64, b: impl Fn(usize, usize) -> f64) {
    let lane = with_thread(|_, tid| tid % WARP);
    let (g, t) = (lane / 4, lane % 4);
    for (i, d) in acc.iter_mut().enumerate() {
        let (row, col) = (g + 8 * (i / 2), 2 * t + i % 2);
        let sum: f64 = (0..depth).map(|kk| a(row, kk) * b(kk, col)).sum();
        *d = (sum + *d as f64) as f32;
    }
}

/// `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32`. Lane `(g, t)` holds A at rows
/// (g, g + 8, g, g + 8), columns (2t, 2t, 2t + 8, 2t + 8) and the next column; B at rows 2t and
/// 2t + 8 (and the next row), column g.
///
/// # Safety
/// The 32 lanes of the warp call it together.
pub unsafe fn mma_m16n8k16_bf16(acc: &mut [f32; 4], a: [u32; 4], b: [u32; 2]) {
    let all = with_thread(|cta, tid| cta.warp_exchange(tid, "mma.m16n8k16.bf16", mma_operands(acc, a, b)));
    let a_at = |row: usize, kk: usize| {
        let lane = (row % 8) * 4 + (kk % 8) / 2;
        half(all[lane][4 + row / 8 + 2 * (kk / 8)], kk % 2 == 1)
    };
    let b_at = |kk: usize, col: usize| {
        let lane = col * 4 + (kk % 8) / 2;
        half(all[lane][8 + kk / 8], kk % 2 == 1)
    };
    mma_tile(acc, 16, a_at, b_at);
}

/// `mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32`. Lane `(g, t)` holds A at (g, t),
/// (g + 8, t), (g, t + 4), (g + 8, t + 4); B at (t, g), (t + 4, g). The tensor core reads the
/// top 19 bits of each operand.
///
/// # Safety
/// The 32 lanes of the warp call it together.
pub unsafe fn mma_m16n8k8_tf32(acc: &mut [f32; 4], a: [u32; 4], b: [u32; 2]) {
    let all = with_thread(|cta, tid| cta.warp_exchange(tid, "mma.m16n8k8.tf32", mma_operands(acc, a, b)));
    let tf32 = |bits: u32| f32::from_bits(bits & !0x1fff) as f64;
    let a_at = |row: usize, kk: usize| tf32(all[(row % 8) * 4 + kk % 4][4 + row / 8 + 2 * (kk / 4)]);
    let b_at = |kk: usize, col: usize| tf32(all[col * 4 + kk % 4][8 + kk / 4]);
    mma_tile(acc, 8, a_at, b_at);
}

/// `vote.sync.any.pred`.
///
/// # Safety
/// The 32 lanes of the warp call it together.
pub unsafe fn vote_any(pred: bool) -> bool {
    let mut mine = [0; LANE_WORDS];
    mine[0] = pred as u32;
    with_thread(|cta, tid| cta.warp_exchange(tid, "vote.any", mine)).iter().any(|w| w[0] != 0)
}

/// A shared-memory load of `N` bytes at `addr` (checked: inside the allocation, aligned, and
/// ordered after every other thread's write there).
fn load<T: Copy>(addr: u32) -> T {
    let p = with_thread(|cta, _| cta.shared_access(addr, core::mem::size_of::<T>(), Access::Read("ld.shared")));
    // SAFETY: `shared` checked bounds and alignment.
    unsafe { (p as *const T).read() }
}

/// A shared-memory store at `addr` (checked as [`load`]).
fn store<T: Copy>(addr: u32, v: T) {
    let p = with_thread(|cta, _| cta.shared_access(addr, core::mem::size_of::<T>(), Access::Write("st.shared")));
    // SAFETY: `shared` checked bounds and alignment.
    unsafe { (p as *mut T).write(v) }
}

/// `ld.shared.b32`.
///
/// # Safety
/// None beyond the GPU's: the simulator checks the address.
pub unsafe fn ld_shared_u32(addr: u32) -> u32 {
    load(addr)
}

/// `st.shared.b32`.
///
/// # Safety
/// None beyond the GPU's: the simulator checks the address.
pub unsafe fn st_shared_u32(addr: u32, v: u32) {
    store(addr, v)
}

/// `ld.shared.b16`.
///
/// # Safety
/// None beyond the GPU's: the simulator checks the address.
pub unsafe fn ld_shared_u16(addr: u32) -> u16 {
    load(addr)
}

/// `st.shared.b16`.
///
/// # Safety
/// None beyond the GPU's: the simulator checks the address.
pub unsafe fn st_shared_u16(addr: u32, v: u16) {
    store(addr, v)
}

/// `ld.shared.f32`.
///
/// # Safety
/// None beyond the GPU's: the simulator checks the address.
pub unsafe fn ld_shared_f32(addr: u32) -> f32 {
    load(addr)
}

/// `st.shared.f32`.
///
/// # Safety
/// None beyond the GPU's: the simulator checks the address.
pub unsafe fn st_shared_f32(addr: u32, v: f32) {
    store(addr, v)
}

/// `ld.shared.v4.b32`.
///
/// # Safety
/// None beyond the GPU's: the simulator checks the address.
pub unsafe fn ld_shared_v4(addr: u32) -> [u32; 4] {
    load::<u128>(addr).to_ne_bytes().chunks_exact(4).enumerate().fold([0; 4], |mut v, (i, b)| {
        v[i] = u32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
        v
    })
}

/// `st.shared.v4.b32`.
///
/// # Safety
/// None beyond the GPU's: the simulator checks the address.
pub unsafe fn st_shared_v4(addr: u32, v: [u32; 4]) {
    let mut bytes = [0u8; 16];
    for (i, w) in v.iter().enumerate() {
        bytes[4 * i..4 * i + 4].copy_from_slice(&w.to_ne_bytes());
    }
    store(addr, u128::from_ne_bytes(bytes))
}

/// `ld.shared.v2.f32`.
///
/// # Safety
/// None beyond the GPU's: the simulator checks the address.
pub unsafe fn ld_shared_v2_f32(addr: u32) -> [f32; 2] {
    let v: u64 = load(addr);
    [f32::from_bits(v as u32), f32::from_bits((v >> 32) as u32)]
}

/// `st.shared.v2.f32`.
///
/// # Safety
/// None beyond the GPU's: the simulator checks the address.
pub unsafe fn st_shared_v2_f32(addr: u32, v: [f32; 2]) {
    store(addr, u64::from(v[0].to_bits()) | (u64::from(v[1].to_bits()) << 32))
}

/// The b16 element `col` of the 8 x 8 matrix row that starts at shared address `row`.
fn row_element(row: u32, col: usize) -> u32 {
    load::<u16>(row + 2 * col as u32) as u32
}

/// `ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16`: lane `8i + j` names row `j` of matrix
/// `i` (16 bytes, 16-byte aligned); register `i` returns the lane's fragment of matrix `i`:
/// row `lane / 4`, columns `2 (lane % 4)` and `+ 1`, of the matrix as stored, or of its
/// transpose.
fn ldmatrix(addr: u32, trans: bool) -> [u32; 4] {
    let mut mine = [0; LANE_WORDS];
    mine[0] = addr;
    let op = if trans { "ldmatrix.x4.trans" } else { "ldmatrix.x4" };
    let (all, lane) = with_thread(|cta, tid| (cta.warp_exchange(tid, op, mine), tid % WARP));
    let (r, c) = (lane / 4, 2 * (lane % 4));
    let mut out = [0u32; 4];
    for (i, reg) in out.iter_mut().enumerate() {
        let row = |j: usize| {
            let a = all[8 * i + j][0];
            assert!(a.is_multiple_of(16), "ldmatrix: row address 0x{a:x} is not 16-byte aligned");
            a
        };
        *reg = if trans {
            row_element(row(c), r) | row_element(row(c + 1), r) << 16
        } else {
            row_element(row(r), c) | row_element(row(r), c + 1) << 16
        };
    }
    out
}

/// `ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16`.
///
/// # Safety
/// All 32 lanes call it together.
pub unsafe fn ldmatrix_x4_trans(addr: u32) -> [u32; 4] {
    ldmatrix(addr, true)
}

/// `ldmatrix.sync.aligned.m8n8.x4.shared.b16`.
///
/// # Safety
/// All 32 lanes call it together.
pub unsafe fn ldmatrix_x4(addr: u32) -> [u32; 4] {
    ldmatrix(addr, false)
}

/// `ld.global.v4.b32`.
///
/// # Safety
/// `ptr` is 16-byte aligned and addresses 16 readable bytes.
pub unsafe fn ld_global_v4(ptr: *const u32) -> [u32; 4] {
    assert!((ptr as usize).is_multiple_of(16), "ld.global.v4: {ptr:?} is not 16-byte aligned");
    // SAFETY: the caller's contract.
    unsafe { (ptr as *const [u32; 4]).read() }
}

/// `ld.global.v2.b32`.
///
/// # Safety
/// `ptr` is 8-byte aligned and addresses 8 readable bytes.
pub unsafe fn ld_global_v2(ptr: *const u32) -> [u32; 2] {
    assert!((ptr as usize).is_multiple_of(8), "ld.global.v2: {ptr:?} is not 8-byte aligned");
    // SAFETY: the caller's contract.
    unsafe { (ptr as *const [u32; 2]).read() }
}

/// `st.global.b32`.
///
/// # Safety
/// `ptr` is 4-byte aligned and addresses 4 writable bytes.
pub unsafe fn st_global_b32(ptr: *mut u32, v: u32) {
    assert!((ptr as usize).is_multiple_of(4), "st.global.b32: {ptr:?} is not 4-byte aligned");
    // SAFETY: the caller's contract.
    unsafe { ptr.write(v) }
}

/// `st.global.v2.b32`.
///
/// # Safety
/// `ptr` is 8-byte aligned and addresses 8 writable bytes.
pub unsafe fn st_global_v2(ptr: *mut u32, v: [u32; 2]) {
    assert!((ptr as usize).is_multiple_of(8), "st.global.v2: {ptr:?} is not 8-byte aligned");
    // SAFETY: the caller's contract.
    unsafe { (ptr as *mut [u32; 2]).write(v) }
}

/// `shfl.sync.bfly.b32` over the whole warp.
///
/// # Safety
/// The 32 lanes of the warp call it together; `mask` is below 32.
pub unsafe fn shfl_xor(x: u32, mask: u32) -> u32 {
    let mut mine = [0; LANE_WORDS];
    mine[0] = x;
    let (all, lane) = with_thread(|cta, tid| (cta.warp_exchange(tid, "shfl.bfly", mine), tid % WARP));
    all[lane ^ (mask as usize % WARP)][0]
}

/// `st.global.v4.b32`.
///
/// # Safety
/// `ptr` is 16-byte aligned and addresses 16 writable bytes.
pub unsafe fn st_global_v4(ptr: *mut u16, v: [u32; 4]) {
    assert!((ptr as usize).is_multiple_of(16), "st.global.v4: {ptr:?} is not 16-byte aligned");
    // SAFETY: the caller's contract.
    unsafe { (ptr as *mut [u32; 4]).write(v) }
}

/// `bar.arrive id, threads;`: counts the arrival without waiting.
///
/// # Safety
/// As on the GPU: the barrier's phases see consistent counts.
pub unsafe fn named_barrier_arrive(id: u32, threads: u32) {
    with_thread(|cta, _| cta.arrive(id as usize, threads as usize));
}

/// `cp.async.cg.shared.global`, 16 bytes: lands at this thread's next [`cp_async_wait_all`]
/// (`sim::defer_copy`).
///
/// # Safety
/// `src` addresses `src_bytes` readable bytes (0 or 16) until the copy lands.
pub unsafe fn cp_async_16(dst: u32, src: *const u8, src_bytes: u32) {
    // SAFETY: the caller's contract.
    unsafe { crate::sim::defer_copy(dst, src, 16, src_bytes as usize) }
}

/// `cp.async.ca.shared.global`, 4 bytes (as [`cp_async_16`]).
///
/// # Safety
/// `src` addresses `src_bytes` readable bytes (0 or 4) until the copy lands.
pub unsafe fn cp_async_4(dst: u32, src: *const u8, src_bytes: u32) {
    // SAFETY: the caller's contract.
    unsafe { crate::sim::defer_copy(dst, src, 4, src_bytes as usize) }
}

/// `cp.async.wait_all;`: lands this thread's copies.
pub fn cp_async_wait_all() {
    crate::sim::land_copies();
}

/// `cp.async.commit_group;`: this thread's copies since the last commit become a group.
pub fn cp_async_commit_group() {
    crate::sim::commit_copies();
}

/// `cp.async.wait_group N;`: lands every committed group but the `N` most recent.
pub fn cp_async_wait_group<const N: u32>() {
    crate::sim::land_groups(N as usize);
}

/// `mbarrier.init.shared.b64`: `count` arrivals per phase (`sim::Cta::mbarrier_init`).
///
/// # Safety
/// `bar` is an 8-byte-aligned shared address no other thread uses until a CTA barrier follows.
pub unsafe fn mbarrier_init(bar: u32, count: u32) {
    with_thread(|cta, _| cta.mbarrier_init(bar, count));
}

/// `mbarrier.arrive.shared.b64`: the token is the phase arrived on.
///
/// # Safety
/// `bar` is an initialised mbarrier whose phase still expects this arrival.
pub unsafe fn mbarrier_arrive_token(bar: u32) -> u64 {
    with_thread(|cta, _| cta.mbarrier_arrive(bar))
}

/// `mbarrier.test_wait.shared.b64` until true: blocks until the token's phase has completed.
///
/// # Safety
/// `bar` is an initialised mbarrier; `state` came from [`mbarrier_arrive_token`] on it.
pub unsafe fn mbarrier_wait_token(bar: u32, state: u64) {
    with_thread(|cta, _| cta.mbarrier_wait(bar, state));
}

/// `cp.async.mbarrier.arrive.noinc.shared.b64`: this thread's copies land (as a wait would land
/// them, the earliest the GPU could complete them), then the arrival counts.
///
/// # Safety
/// `bar` is an initialised mbarrier whose phase still expects this arrival.
pub unsafe fn cp_async_mbarrier_arrive_noinc(bar: u32) {
    crate::sim::land_copies();
    with_thread(|cta, _| cta.mbarrier_arrive(bar));
}

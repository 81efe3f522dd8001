//! What the key size `K` changes in the Hopper kernel, behind two traits: [`KeySize`] (the gate
//! columns per producer lane, the narrow state's m64 tiles, the shared-memory layout
//! `layout::hopper::SharedStorage<K, K / 64, ..>` with its ring depth) and, for the key sizes the
//! wide blocks run, [`WideKey`] (the wide state's registers, `K / 2` f32 per consumer thread,
//! product 1's k-steps, product 2's `N`). Everything else is the same code for every `K`.

use super::fragments::a_fragments;
use crate::arch::sm90::{
    wgmma_m64n64k16x4_add_kmajor_start, wgmma_m64n64k16x4_add_start, wgmma_m64n64k16x4_sub_start,
    wgmma_m64n64k16x8_add_start, wgmma_m64n64k16x8_sub_start, wgmma_m64n128k16x4_add_start, wgmma_wait_m64n64,
    wgmma_wait_m64n128,
};
use crate::layout::hopper::{
    Block, CONSUMER_THREADS, FUSED_STAGES, K256_STAGES, K256_STAGING, NARROW_BV, STAGES, STAGING, SharedStorage, Stage,
};
use crate::layout::{CHUNK, K_DIM};
use core::mem::{offset_of, size_of};

/// f32 registers per consumer thread of one m64n32 accumulator (a narrow block's `Vn`, and each
/// 64-key tile of its state).
pub const NARROW_ACC: usize = 64 * NARROW_BV / CONSUMER_THREADS;

/// Lanes of the producer warp that share a chunk's gate row.
const GATE_LANES: usize = 32;

/// Byte offsets of the fields of one key size's [`SharedStorage`].
#[derive(Clone, Copy)]
pub struct Offsets {
    pub stages: u32,
    pub stage_bytes: u32,
    pub decay: u32,
    pub row_scale: u32,
    pub h_staging: u32,
    pub state_tile_bytes: u32,
    pub vn_staging: u32,
    pub value_tile_bytes: u32,
    pub s_operand: u32,
    pub vn_operand: u32,
    pub h0: u32,
    pub full: u32,
    pub empty: u32,
    pub h0_full: u32,
    pub h0_empty: u32,
    /// Ring stages.
    pub ring: u32,
    /// Staging buffers.
    pub staging: u32,
}

/// The offsets of `SharedStorage<K, KB, B, R, G, O>`.
const fn offsets<const K: usize, const KB: usize, B: Block, const R: usize, const G: usize, const O: usize>() -> Offsets
{
    type S<const K: usize, const KB: usize, B, const R: usize, const G: usize, const O: usize> =
        SharedStorage<K, KB, B, R, G, O>;
    Offsets {
        stages: offset_of!(S<K, KB, B, R, G, O>, stages) as u32,
        stage_bytes: size_of::<Stage<KB, O>>() as u32,
        decay: offset_of!(S<K, KB, B, R, G, O>, decay) as u32,
        row_scale: offset_of!(S<K, KB, B, R, G, O>, row_scale) as u32,
        h_staging: offset_of!(S<K, KB, B, R, G, O>, h_staging) as u32,
        state_tile_bytes: size_of::<[B::StateBox; KB]>() as u32,
        vn_staging: offset_of!(S<K, KB, B, R, G, O>, vn_staging) as u32,
        value_tile_bytes: size_of::<B::ValueTile>() as u32,
        s_operand: offset_of!(S<K, KB, B, R, G, O>, s_operand) as u32,
        vn_operand: offset_of!(S<K, KB, B, R, G, O>, vn_operand) as u32,
        h0: offset_of!(S<K, KB, B, R, G, O>, h0) as u32,
        full: offset_of!(S<K, KB, B, R, G, O>, full) as u32,
        empty: offset_of!(S<K, KB, B, R, G, O>, empty) as u32,
        h0_full: offset_of!(S<K, KB, B, R, G, O>, h0_full) as u32,
        h0_empty: offset_of!(S<K, KB, B, R, G, O>, h0_empty) as u32,
        ring: R as u32,
        staging: G as u32,
    }
}

/// One key size of the Hopper kernel: what every block width needs of it.
pub trait KeySize {
    /// `K`.
    const K: usize;
    /// Boxes of `BOX_COLS` key columns per `k` or `w` tile (`K / 64`).
    const KB: usize;
    /// The shared-memory layout in blocks of width `B` (with this key size's ring depth and
    /// staging buffers; for [`crate::layout::hopper::Fused`] blocks, the fused pass's ring depth
    /// and the stages' output tiles).
    fn smem<B: Block>() -> Offsets;
    /// The narrow state `S` as `K / 64` m64n32 accumulators: `K / 4` f32 per thread.
    type NarrowState: Copy + AsRef<[[f32; NARROW_ACC]]> + AsMut<[[f32; NARROW_ACC]]>;
    /// One producer lane's columns of a chunk's `gk` row: `K / 32`.
    type GateLane: Copy + AsRef<[f32]>;

    /// The zero narrow state.
    fn zero_narrow_state() -> Self::NarrowState;
    /// One lane's gate columns, `column(i)` for its `i`-th (column `lane + 32 * i`).
    fn gate_lane(column: impl FnMut(usize) -> f32) -> Self::GateLane;
}

/// A key size the wide blocks run: the state `S^T` as one m64nK accumulator in registers.
pub trait WideKey: KeySize {
    /// The wide state `S^T` as the m64nK accumulator: `K / 2` f32 per thread.
    type State: Copy + AsRef<[f32]> + AsMut<[f32]>;
    /// `bf16(S^T)` as product 1's A fragments: `K / 16` k-steps.
    type StateA: Copy + AsRef<[[u32; 4]]>;

    /// The zero state.
    fn zero_state() -> Self::State;
    /// `bf16(S^T)` as product 1's A fragments.
    fn state_fragments(s: &Self::State) -> Self::StateA;
    /// Starts product 1, `vn -= A @ w^T` over `K`.
    ///
    /// # Safety
    /// As for `arch::sm90::wgmma_m64n64k16x8_sub_start`, with `desc` describing the `w` tile.
    unsafe fn product1_start(vn: &mut [f32; CHUNK / 2], a: &Self::StateA, desc: u64);
    /// Starts the fused pass's first output product, `o += A @ (q Γ)^T` over `K` (`o` the
    /// `[BV][CHUNK]` accumulator of `o^T`).
    ///
    /// # Safety
    /// As for `arch::sm90::wgmma_m64n64k16x8_add_start`, with `desc` describing the `q Γ` tile.
    unsafe fn output_start(o: &mut [f32; CHUNK / 2], a: &Self::StateA, desc: u64);
    /// Starts product 2, `s += A @ k` with `N = K`.
    ///
    /// # Safety
    /// As for `arch::sm90::wgmma_m64n128k16x4_add_start`, with `desc` describing the `k` tile.
    unsafe fn product2_start(s: &mut Self::State, a: &[[u32; 4]; CHUNK / 16], desc: u64);
    /// Waits for product 2.
    ///
    /// # Safety
    /// After [`WideKey::product2_start`] on the same `s`, by the whole warpgroup.
    unsafe fn product2_wait(s: &mut Self::State);
}

/// `K = 64` (KDA variants with small heads).
pub struct K64;
/// `K = 128` (Kimi Linear, Qwen3-Next).
pub struct K128;
/// `K = 256` (Gated DeltaNet research models; narrow blocks only).
pub struct K256;

/// Implements [`KeySize`] for `$key`: `K = $k` in `$kb` boxes, `$ring` ring stages and
/// `$staging` staging buffers.
macro_rules! key_size {
    ($key:ty, k $k:expr, boxes $kb:literal, ring $ring:expr, staging $staging:expr) => {
        impl KeySize for $key {
            const K: usize = $k;
            const KB: usize = $kb;
            #[inline(always)]
            fn smem<B: Block>() -> Offsets {
                if B::OUTPUT {
                    const { offsets::<{ $k }, $kb, B, FUSED_STAGES, STAGING, 1>() }
                } else {
                    const { offsets::<{ $k }, $kb, B, { $ring }, { $staging }, 0>() }
                }
            }
            type NarrowState = [[f32; NARROW_ACC]; $kb];
            type GateLane = [f32; $k / GATE_LANES];

            fn zero_narrow_state() -> Self::NarrowState {
                [[0.0; NARROW_ACC]; $kb]
            }
            fn gate_lane(column: impl FnMut(usize) -> f32) -> Self::GateLane {
                core::array::from_fn(column)
            }
        }
    };
}

/// Implements [`WideKey`] for `$key` with its product wrappers.
macro_rules! wide_key {
    ($key:ty, k $k:expr, product1 $p1:ident, output $o:ident, product2 $p2:ident, wait2 $w2:ident) => {
        impl WideKey for $key {
            type State = [f32; $k / 2];
            type StateA = [[u32; 4]; $k / 16];

            fn zero_state() -> Self::State {
                [0.0; $k / 2]
            }
            fn state_fragments(s: &Self::State) -> Self::StateA {
                a_fragments(s)
            }
            unsafe fn product1_start(vn: &mut [f32; CHUNK / 2], a: &Self::StateA, desc: u64) {
                // SAFETY: the caller's contract.
                unsafe { $p1(vn, a, desc) }
            }
            unsafe fn output_start(o: &mut [f32; CHUNK / 2], a: &Self::StateA, desc: u64) {
                // SAFETY: the caller's contract.
                unsafe { $o(o, a, desc) }
            }
            unsafe fn product2_start(s: &mut Self::State, a: &[[u32; 4]; CHUNK / 16], desc: u64) {
                // SAFETY: the caller's contract.
                unsafe { $p2(s, a, desc) }
            }
            unsafe fn product2_wait(s: &mut Self::State) {
                // SAFETY: the caller's contract.
                unsafe { $w2(s) }
            }
        }
    };
}

key_size!(K64, k 64, boxes 1, ring STAGES, staging STAGING);
key_size!(K128, k K_DIM, boxes 2, ring STAGES, staging STAGING);
key_size!(K256, k 256, boxes 4, ring K256_STAGES, staging K256_STAGING);
wide_key!(K64, k 64,
    product1 wgmma_m64n64k16x4_sub_start, output wgmma_m64n64k16x4_add_kmajor_start,
    product2 wgmma_m64n64k16x4_add_start, wait2 wgmma_wait_m64n64);
wide_key!(K128, k K_DIM,
    product1 wgmma_m64n64k16x8_sub_start, output wgmma_m64n64k16x8_add_start,
    product2 wgmma_m64n128k16x4_add_start, wait2 wgmma_wait_m64n128);

const _: () = {
    assert!(K64::K / GATE_LANES == 2 && K128::K / GATE_LANES == 4 && K256::K / GATE_LANES == 8);
    assert!(K64::K == 64 * K64::KB && K128::K == 64 * K128::KB && K256::K == 64 * K256::KB);
};

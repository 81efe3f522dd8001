//! The portable tensor-core kernel (sm_80+): a persistent grid whose CTAs walk the launcher's
//! longest-first work records (`crate::schedule`, as the Hopper kernel's), each item a block of
//! `G * BV` value columns of one value head of a sequence (or of a segment of a split one: the
//! pre-scan and the main pass are passes of this kernel too, `PassCode`), its chunks in order,
//! both products of a chunk on `mma.sync.m16n8k16` in bf16 with f32 accumulation. It runs the whole generalized contract
//! (docs/CONTRACT.md#the-generalized-recurrence): the scalar gate `g`, the per-key gate `gk`,
//! both or neither; grouped value heads; `K` in 64, 128, 256 and any `V` that is a multiple of
//! the block; key-first or value-first states; a token and a head stride per tensor. One entry
//! per variant `(K, G)` (`layout::portable::VARIANTS`): `G = 1` consumer group of 32 columns for
//! every sm_80+ GPU, `G = 2` (64 columns, sharing each chunk's `w` and `k` tiles) where the GPU
//! gives a CTA the shared memory.
//!
//! Two warp roles share a ring of `Tiles::STAGES` stages (`layout::portable` has the tiles and
//! the barriers):
//!
//! - the **producer** warp (`produce`) copies each chunk's `w`, `k` and `u` rows, `gk` of its
//!   last token and `g` per token into the next free stage with `cp.async` (rows past the
//!   sequence's end zero-filled by the copy itself); the hardware announces the stage full once
//!   they land; it runs up to `STAGES` chunks ahead of the consumers;
//! - each group of four **consumer** warps (`consume`) keeps `K / 4` rows of its `[K][BV]`
//!   state per warp as accumulator fragments and per chunk:
//!   1. `publish_state`, `store_h`: `bf16(S)` to the group's `st` tile, then from it to `h`;
//!   2. `corrected_values`, `store_v_new`: `Vn = u - w @ bf16(S)`, each warp 16 token rows;
//!      `bf16(Vn)` over the stage's `u` rows, then from them to `v_new` (valid rows), and,
//!      scaled by `exp2(g[last] - g[t])` when there is a scalar gate, to the `vn` tile;
//!   3. `update_state`: `S = decay * S + k^T @ bf16(Vn)`, the decay `exp2(g[last] + gk[last])`
//!      per key row; then the stage goes back to the producer.
//!
//! The tail epilogue of a partial last chunk is the zero fill: `w`, `k` and `u` rows past the end
//! are zeros, so their `Vn` rows are zero and add nothing to `S`, and only valid rows are written.
//! All offsets are 64-bit.

use crate::abi::{PassCode, StateLayoutCode};
use crate::schedule::{Item, RowStrides, Work};
use crate::arch::sm80::{
    bf16_to_f32, cp_async_4, cp_async_16, cp_async_mbarrier_arrive_noinc, cp_async_wait_all, exp2_approx, ld_shared_f32,
    ld_shared_u16, ld_shared_u32, ld_shared_v4, ldmatrix_x4, ldmatrix_x4_trans, mbarrier_arrive_token, mbarrier_init,
    mbarrier_wait_token, mma_m16n8k16_bf16, named_barrier, named_barrier_arrive, pack_bf16x2, smem_base_shared,
    st_global_b32, st_global_v4, st_shared_u32, sync_threads, thread_idx_x, thread_idx_x_fresh,
};
use crate::layout::portable::{
    BV, BV_STRIDE, MBARRIER_BYTES, MMA_K, MMA_M, MMA_N, N_TILES, N_TILES_PER_LOAD, Place, STATE_K_STEPS, Tiles, VECTOR,
    VN_ROWS_PER_WARP, consumer_barrier, empty_barrier, full_arrivals, producer_warp,
};
use crate::layout::CHUNK;

/// The state fragments of one warp: `[m16 tile][n8 tile][4]` (`mma_m16n8k16_bf16`'s `acc`).
type State<const MT: usize> = [[[f32; 4]; N_TILES]; MT];

/// A launch's arguments (`abi::PORTABLE_PARAMS`).
struct Args {
    k: *const u16,
    w: *const u16,
    u: *const u16,
    g: *const f32,
    gk: *const f32,
    h0: *const f32,
    h: *mut u16,
    v_new: *mut u16,
    ht: *mut f32,
    work: Work,
    /// Columns of the pass's states: `V`, or `K + V` in the pre-scan.
    value_dim: usize,
    /// Whether the pass's states (`h`, `ht`) are value-first: never in the pre-scan, whose maps
    /// are key-first.
    value_first: bool,
    /// Whether `h0` is value-first.
    h0_value_first: bool,
    prescan: bool,
    k_rows: RowStrides,
    w_rows: RowStrides,
    u_rows: RowStrides,
    g_rows: RowStrides,
    gk_rows: RowStrides,
    v_new_rows: RowStrides,
    /// The fused layer pass's operands (null and unused outside it).
    fused: FusedArgs,
}

/// The fused layer pass's operands: `q Γ` (`[T][HV][K]` bf16) and the causal attention `P`
/// (`[T][HV][CHUNK]` bf16, each token's row of its chunk), packed, as the fused prepare kernel
/// writes them, and the output scale. `o` goes where `v_new` would, at its strides.
#[derive(Clone, Copy)]
struct FusedArgs {
    qg: *const u16,
    attention: *const u16,
    scale: f32,
}

impl FusedArgs {
    /// Outside the fused pass.
    const NONE: Self = Self { qg: core::ptr::null(), attention: core::ptr::null(), scale: 1.0 };
}

/// The fused operands of an entry: none for the recurrence's, the trailing parameters for the
/// fused pass's.
macro_rules! fused_args {
    () => {
        FusedArgs::NONE
    };
    ($qg:ident, $attention:ident, $scale_bits:ident) => {
        FusedArgs { qg: $qg, attention: $attention, scale: f32::from_bits($scale_bits) }
    };
}

/// Declares the portable kernel's entry for one key size (`abi::PORTABLE_ENTRIES`).
macro_rules! portable_entry {
    ($(#[$doc:meta])* $name:ident, $key:literal, $tiles:literal, $groups:literal, $fused:literal $(, $extra:ident: $ty:ty)*) => {
        kernel_entry! {
            $(#[$doc])*
            ///
            /// Grid: one CTA per worker of the pass's schedule (`work`: worker `b`'s first record
            /// is record `b`); `layout::portable::threads(G)` threads;
            /// `layout::portable::smem_bytes(K, G)` of dynamic shared memory.
            ///
            /// # Safety
            /// Every pointer addresses a buffer of the contract's size for the batch the records
            /// describe, `heads` value heads and states of `value_dim` columns (`h0` and `ht` with
            /// every row the records name), rows at the given strides, 16-byte aligned rows of
            /// `k`, `w`, `u` and `v_new`; the records name each item of the pass once, in blocks
            /// of `G * BV` columns, and are 16-byte aligned; a gate pointer is null exactly when that
            /// gate is absent; in the pre-scan (`pass`) the maps (`ht`) are key-first and `h0`
            /// (when not null: `[rows][K][value_dim - K]` in `state_layout`) is read only by the
            /// items whose records name a row of it, blocks of the map's `B` columns;
            /// the launch has the grid, block and shared memory above; the outputs overlap nothing.
            pub unsafe fn $name(
                k: *const u16,
                w: *const u16,
                u: *const u16,
                g: *const f32,
                gk: *const f32,
                h0: *const f32,
                h: *mut u16,
                v_new: *mut u16,
                ht: *mut f32,
                work: *const u32,
                heads: u32,
                value_dim: u32,
                state_layout: u32,
                pass: u32,
                k_token_stride: u32,
                k_head_stride: u32,
                w_token_stride: u32,
                w_head_stride: u32,
                u_token_stride: u32,
                u_head_stride: u32,
                g_token_stride: u32,
                g_head_stride: u32,
                gk_token_stride: u32,
                gk_head_stride: u32,
                v_new_token_stride: u32,
                v_new_head_stride: u32,
                $($extra: $ty,)*
            ) {
                let args = Args {
                    k,
                    w,
                    u,
                    g,
                    gk,
                    h0,
                    h,
                    v_new,
                    ht,
                    // SAFETY: the entry's contract on `work`.
                    work: unsafe { Work::new(work, heads as usize) },
                    value_dim: value_dim as usize,
                    value_first: state_layout == StateLayoutCode::ValueFirst as u32
                        && pass != PassCode::Prescan as u32,
                    h0_value_first: state_layout == StateLayoutCode::ValueFirst as u32,
                    prescan: pass == PassCode::Prescan as u32,
                    k_rows: RowStrides::new(k_token_stride, k_head_stride),
                    w_rows: RowStrides::new(w_token_stride, w_head_stride),
                    u_rows: RowStrides::new(u_token_stride, u_head_stride),
                    g_rows: RowStrides::new(g_token_stride, g_head_stride),
                    gk_rows: RowStrides::new(gk_token_stride, gk_head_stride),
                    v_new_rows: RowStrides::new(v_new_token_stride, v_new_head_stride),
                    fused: fused_args!($($extra),*),
                };
                // SAFETY: the entry's contract is `recurrence`'s.
                unsafe { recurrence::<$key, $tiles, $groups, $fused>(&args) }
            }
        }
    };
}

portable_entry!(
    /// The portable tensor-core recurrence at `K = 64`, one consumer group (`abi::PORTABLE_K64`).
    kda_fwd_h_portable_k64,
    64,
    1,
    1,
    false
);
portable_entry!(
    /// The portable tensor-core recurrence at `K = 128`, one consumer group (`abi::PORTABLE`).
    kda_fwd_h_portable,
    128,
    2,
    1,
    false
);
portable_entry!(
    /// The portable tensor-core recurrence at `K = 256`, one consumer group (`abi::PORTABLE_K256`).
    kda_fwd_h_portable_k256,
    256,
    4,
    1,
    false
);
portable_entry!(
    /// The portable tensor-core recurrence at `K = 64`, two consumer groups
    /// (`abi::PORTABLE_K64_WIDE`).
    kda_fwd_h_portable_k64_wide,
    64,
    1,
    2,
    false
);
portable_entry!(
    /// The portable tensor-core recurrence at `K = 128`, two consumer groups
    /// (`abi::PORTABLE_WIDE`).
    kda_fwd_h_portable_wide,
    128,
    2,
    2,
    false
);

/// Declares an entry of the fused layer pass on the portable kernel: [`portable_entry`]'s with
/// `O` set and the fused operands (`abi::PORTABLE_FUSED_PARAMS`) after the recurrence's.
macro_rules! portable_fused_entry {
    ($(#[$doc:meta])* $name:ident, $key:literal, $tiles:literal, $groups:literal) => {
        portable_entry!(
            $(#[$doc])* $name, $key, $tiles, $groups, true, qg: *const u16, attention: *const u16, scale_bits: u32
        );
    };
}

portable_fused_entry!(
    /// The fused layer pass on the portable kernel at `K = 64` (`abi::PORTABLE_FUSED_K64`): the
    /// recurrence in one-group blocks whose chunks also give the layer's output `o` (in
    /// `v_new`'s place, at its strides) from the fused prepare kernel's `q Γ` and `P`, and no
    /// `h` or `v_new`. Never a pre-scan (`pass` is the recurrence's or a split's main pass).
    kda_layer_fused_portable_k64, 64, 1, 1
);
portable_fused_entry!(
    /// The fused layer pass on the portable kernel at `K = 128` (`abi::PORTABLE_FUSED`): as
    /// [`kda_layer_fused_portable_k64`].
    kda_layer_fused_portable, 128, 2, 1
);
portable_fused_entry!(
    /// The fused layer pass at `K = 64`, two consumer groups (`abi::PORTABLE_FUSED_K64_WIDE`).
    kda_layer_fused_portable_k64_wide, 64, 1, 2
);
portable_fused_entry!(
    /// The fused layer pass at `K = 128`, two consumer groups (`abi::PORTABLE_FUSED_WIDE`).
    kda_layer_fused_portable_wide, 128, 2, 2
);

/// Shared addresses of the ring (`layout::portable::Tiles`) and of one consumer group's tiles
/// (group 0's for the producer, which uses none of them), with the group's barrier.
#[derive(Clone, Copy)]
struct Smem {
    full: u32,
    st: u32,
    vn: u32,
    ring: u32,
    /// The group's first column in the block (0 .. `G * BV`).
    col: usize,
    /// The group's [`consumer_barrier`].
    barrier: u32,
}

/// Shared addresses of one stage's tiles: `u` the block's, `u_group` the group's first column of
/// it (rows of `Tiles::U_STRIDE` elements).
#[derive(Clone, Copy)]
struct Stage {
    w: u32,
    k: u32,
    u: u32,
    u_group: u32,
    gk_last: u32,
    g: u32,
    /// The fused pass's `q Γ` and `P` tiles.
    q: u32,
    p: u32,
}

impl Smem {
    fn carve<const K: usize, const MT: usize, const G: usize, const O: bool>(group: usize) -> Self {
        let base = smem_base_shared();
        let at = |offset: usize| base + offset as u32;
        let tiles = group * Tiles::<K, MT, G, O>::GROUP_BYTES;
        Self {
            full: at(Tiles::<K, MT, G, O>::FULL_OFFSET),
            st: at(Tiles::<K, MT, G, O>::ST_OFFSET + tiles),
            vn: at(Tiles::<K, MT, G, O>::VN_OFFSET + tiles),
            ring: at(Tiles::<K, MT, G, O>::RING_OFFSET),
            col: group * BV,
            barrier: consumer_barrier(group),
        }
    }

    /// The `full` mbarrier of stage `stage`.
    fn full(self, stage: usize) -> u32 {
        self.full + (stage * MBARRIER_BYTES) as u32
    }

    /// The tiles of stage `stage` of the ring.
    fn stage<const K: usize, const MT: usize, const G: usize, const O: bool>(self, stage: usize) -> Stage {
        let base = self.ring + (stage * Tiles::<K, MT, G, O>::STAGE_BYTES) as u32;
        let at = |offset: usize| base + offset as u32;
        Stage {
            w: at(Tiles::<K, MT, G, O>::W_OFFSET),
            k: at(Tiles::<K, MT, G, O>::K_OFFSET),
            u: at(Tiles::<K, MT, G, O>::U_OFFSET),
            u_group: at(Tiles::<K, MT, G, O>::U_OFFSET + self.col * 2),
            gk_last: at(Tiles::<K, MT, G, O>::GK_LAST_OFFSET),
            g: at(Tiles::<K, MT, G, O>::G_OFFSET),
            q: at(Tiles::<K, MT, G, O>::Q_OFFSET),
            p: at(Tiles::<K, MT, G, O>::P_OFFSET),
        }
    }

    /// The shared address of bf16 element (`row`, `col`) of the tile at `base` with rows of
    /// `stride` elements.
    fn bf16_at(base: u32, stride: usize, (row, col): (usize, usize)) -> u32 {
        base + ((row * stride + col) * 2) as u32
    }

    /// The shared address of f32 element `i` of the vector at `base`.
    fn f32_at(base: u32, i: usize) -> u32 {
        base + (i * 4) as u32
    }
}

/// This thread's place in its warp's fragments (`layout::portable::Place`).
#[derive(Clone, Copy)]
struct Frag {
    place: Place,
}

impl Frag {
    /// The place of consumer thread `tid` (of the CTA) in its group of `consumers` threads.
    fn of(tid: usize, consumers: usize) -> Self {
        Self { place: Place::of(tid % consumers) }
    }

    /// This thread's place in a group of `consumers` threads, from a fresh read of `%tid.x`
    /// (`thread_idx_x_fresh`): each step of a chunk derives its shared addresses from it, so they
    /// are recomputed per chunk instead of living in registers across the chunk loop (there are
    /// more of them than registers).
    fn fresh(consumers: usize) -> Self {
        Self::of(thread_idx_x_fresh(), consumers)
    }

    /// The consumer warp, in its group.
    fn warp(self) -> usize {
        self.place.warp
    }

    /// The first token row of this warp's m16 tile of `Vn` (and of `o`): a warp per row block
    /// (`WARPS_PER_GROUP` = `VN_ROW_BLOCKS`), each in all of the group's columns.
    fn vn_row0(self) -> usize {
        self.warp() * VN_ROWS_PER_WARP
    }
}

/// The element offset of (key row `row`, column `c`) inside one `K x columns` state, value-first
/// (`[columns][K]`) or key-first (`[K][columns]`).
fn in_state<const K: usize>(columns: usize, value_first: bool, row: usize, c: usize) -> usize {
    if value_first { c * K + row } else { row * columns + c }
}

/// The element offset of (key row `row`, block column `col`) of `item`'s block inside one state
/// of the pass (`args.value_dim` columns, in its layout).
fn state_index<const K: usize>(args: &Args, item: &Item, row: usize, col: usize) -> usize {
    in_state::<K>(args.value_dim, args.value_first, row, item.vcol0 + col)
}

/// The element offset of (key row `row`, block column `col`) of `item`'s block in state row
/// `h0_row` of `h0`: the pass's own states in the recurrence; in the pre-scan, where only a first
/// segment's `B` columns `K + c` read `h0`, its state column `c` of `value_dim - K`, in `h0`'s
/// layout.
fn h0_index<const K: usize>(args: &Args, h0_row: usize, item: &Item, row: usize, col: usize) -> usize {
    let (columns, c) = if args.prescan { (args.value_dim - K, item.vcol0 - K + col) } else { (args.value_dim, item.vcol0 + col) };
    h0_row * K * columns + in_state::<K>(columns, args.h0_value_first, row, c)
}

/// The element offset of state row `row` (of `ht`) in the pass's states.
fn state_base<const K: usize>(args: &Args, row: usize) -> usize {
    row * K * args.value_dim
}

/// The ring position after `stage`.
fn next_stage<const K: usize, const MT: usize, const G: usize, const O: bool>(stage: usize) -> usize {
    if stage + 1 == Tiles::<K, MT, G, O>::STAGES { 0 } else { stage + 1 }
}

/// The recurrence of one CTA's work list (see the module): the last warp produces, the others
/// consume; both walk the same records, and the ring runs on from one item to the next.
///
/// # Safety
/// As the entries' contract.
#[inline(always)]
unsafe fn recurrence<const K: usize, const MT: usize, const G: usize, const O: bool>(args: &Args) {
    const PRODUCER: u32 = 1;
    const CONSUMER: u32 = 0;
    // SAFETY: the launcher validated every buffer against the records, heads and strides; the
    // `full` mbarriers lie in their own bytes, published by the CTA barrier before any use; each
    // role keeps its side of the ring's barriers for every chunk of every item.
    unsafe {
        if thread_idx_x() == 0 {
            let smem = Smem::carve::<K, MT, G, O>(0);
            for stage in 0..Tiles::<K, MT, G, O>::STAGES {
                mbarrier_init(smem.full(stage), full_arrivals(Tiles::<K, MT, G, O>::THREADS));
            }
        }
        sync_threads();
        if thread_idx_x() / 32 == producer_warp(G, Tiles::<K, MT, G, O>::WARPS) {
            produce::<K, MT, G, O>(args, args.work.items::<PRODUCER>(), thread_idx_x() % 32);
        } else {
            consume::<K, MT, G, O>(args, args.work.items::<CONSUMER>());
        }
    }
}

/// The stage `back` stages before `stage` in the ring.
fn stage_before<const K: usize, const MT: usize, const G: usize, const O: bool>(stage: usize, back: usize) -> usize {
    (stage + Tiles::<K, MT, G, O>::STAGES - back) % Tiles::<K, MT, G, O>::STAGES
}

/// The producer warp: every chunk of every item of the CTA's list into the ring, each stage once
/// the consumers have released it (the first `STAGES` are free). Each lane ends its share of a
/// chunk's copies with an arrival on the stage's `full` mbarrier that the hardware makes once
/// they have landed, so the warp goes straight on to the next free stage. At the end it takes
/// back the stages still out, so that every release of the consumers has its wait.
///
/// # Safety
/// As [`recurrence`]; every lane of the producer warp calls it.
#[inline(always)]
unsafe fn produce<const K: usize, const MT: usize, const G: usize, const O: bool>(args: &Args, items: impl Iterator<Item = Item>, lane: usize) {
    let smem = Smem::carve::<K, MT, G, O>(0);
    let mut stage = 0;
    // Chunks issued so far, up to `STAGES` (the stages out at the end).
    let mut issued = 0;
    for item in items {
        for c in 0..item.chunks() {
            let (tok0, rows) = (item.first_token(c), item.rows(c));
            let tiles = smem.stage::<K, MT, G, O>(stage);
            // SAFETY: tokens `tok0 .. tok0 + rows` are the sequence's; every copy lands inside
            // the stage, which the consumers released (or never held: the first round); the
            // stage's `full` phase expects this lane's arrival.
            unsafe {
                if issued == Tiles::<K, MT, G, O>::STAGES {
                    named_barrier(empty_barrier(stage), Tiles::<K, MT, G, O>::THREADS as u32);
                }
                let chunk = ChunkRows { tok0, rows, lane };
                let row_stride = Tiles::<K, MT, G, O>::ROW_STRIDE;
                chunk.copy_bf16(K, tiles.w, row_stride, args.w, args.w_rows, item.head, 0);
                chunk.copy_bf16(K, tiles.k, row_stride, args.k, args.k_rows, item.key_head, 0);
                // The pre-scan's key columns have no values: zeros from 0 source bytes.
                let (u_chunk, u_col) = match item.u_col {
                    Some(col) => (chunk, col),
                    None => (ChunkRows { rows: 0, ..chunk }, 0),
                };
                u_chunk.copy_bf16(G * BV, tiles.u, Tiles::<K, MT, G, O>::U_STRIDE, args.u, args.u_rows, item.head, u_col);
                if O {
                    // The fused pass's `q Γ` and `P` rows, packed per value head.
                    let (qg_rows, p_rows) = (RowStrides::packed(item.heads, K), RowStrides::packed(item.heads, CHUNK));
                    chunk.copy_bf16(K, tiles.q, row_stride, args.fused.qg, qg_rows, item.head, 0);
                    let p_stride = Tiles::<K, MT, G, O>::P_STRIDE;
                    chunk.copy_bf16(CHUNK, tiles.p, p_stride, args.fused.attention, p_rows, item.head, 0);
                }
                let last = tok0 + rows - 1;
                if !args.gk.is_null() {
                    let row = args.gk.add(args.gk_rows.row(last, item.head));
                    let mut a = lane;
                    while a < K {
                        cp_async_4(Smem::f32_at(tiles.gk_last, a), row.add(a) as *const u8, 4);
                        a += 32;
                    }
                }
                if !args.g.is_null() {
                    // Rows past the end take the last valid row's `g`: their scale in
                    // `corrected_values` is 1, never an overflow.
                    let mut t = lane;
                    while t < CHUNK {
                        let tok = if t < rows { tok0 + t } else { last };
                        let from = args.g.add(args.g_rows.row(tok, item.head)) as *const u8;
                        cp_async_4(Smem::f32_at(tiles.g, t), from, 4);
                        t += 32;
                    }
                }
                cp_async_mbarrier_arrive_noinc(smem.full(stage));
            }
            issued += (issued < Tiles::<K, MT, G, O>::STAGES) as usize;
            stage = next_stage::<K, MT, G, O>(stage);
        }
    }
    // The last `issued` chunks' stages are still out, the oldest `issued` stages back; once the
    // consumers release them, every copy has landed.
    let mut stage = stage_before::<K, MT, G, O>(stage, issued);
    for _ in 0..issued {
        // SAFETY: the consumers release every chunk's stage once, in ring order.
        unsafe { named_barrier(empty_barrier(stage), Tiles::<K, MT, G, O>::THREADS as u32) };
        stage = next_stage::<K, MT, G, O>(stage);
    }
    cp_async_wait_all();
}

/// One producer lane's share of a chunk's copies.
#[derive(Clone, Copy)]
struct ChunkRows {
    tok0: usize,
    rows: usize,
    lane: usize,
}

impl ChunkRows {
    /// Copies `cols` bf16 (a multiple of `VECTOR`) from column `col0` of `head`'s row of each of the chunk's tokens of
    /// `src` (rows `at`) into the token-major tile at `tile` (rows of `stride` elements), 16
    /// bytes per copy; rows past the chunk's valid ones are zero-filled (a copy of 0 source
    /// bytes, from the chunk's first row so that the address stays valid).
    ///
    /// # Safety
    /// Tokens `tok0 .. tok0 + rows` exist in `src`; their rows are 16-byte aligned at `col0`;
    /// the tile holds `CHUNK` rows.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn copy_bf16(
        self,
        cols: usize,
        tile: u32,
        stride: usize,
        src: *const u16,
        at: RowStrides,
        head: usize,
        col0: usize,
    ) {
        let per_row = (cols / VECTOR) as u32;
        let mut idx = self.lane as u32;
        while idx < CHUNK as u32 * per_row {
            let (t, i) = ((idx / per_row) as usize, (idx % per_row) as usize * VECTOR);
            let (tok, bytes) = if t < self.rows { (self.tok0 + t, 16) } else { (self.tok0, 0) };
            // SAFETY: see the function's contract.
            unsafe {
                let from = src.add(at.row(tok, head) + col0 + i) as *const u8;
                cp_async_16(Smem::bf16_at(tile, stride, (t, i)), from, bytes);
            }
            idx += 32;
        }
    }
}

/// Whether the consumers load the next item's `h0` block while they run the current one: at
/// `K <= 128` (`MT <= 2`), where a second state's registers fit beside the first without spills
/// (`the_portable_ptx_assembles_without_spills_for_every_gpu_it_serves`). A short item then
/// starts from a state already in registers instead of waiting a round trip to memory.
const fn prefetches_h0(mt: usize) -> bool {
    mt <= 2
}

/// The state `item` starts from: its `h0` block when `h0` is given and its record names a row
/// of it, else `[I | 0]`'s block in the pre-scan, or zeros (no `h0`, or no item).
///
/// # Safety
/// As [`recurrence`]: `h0` holds the state rows the records name.
#[inline(always)]
unsafe fn initial_state<const K: usize, const MT: usize, const G: usize, const O: bool>(args: &Args, item: Option<&Item>) -> State<MT> {
    let mut state: State<MT> = [[[0.0; 4]; N_TILES]; MT];
    let frag = Frag::fresh(Tiles::<K, MT, G, O>::CONSUMERS);
    match (item, item.and_then(|item| item.h0_row)) {
        (Some(item), Some(h0_row)) if !args.h0.is_null() => {
            for_each_state::<K, MT, G, O>(&mut state, frag, |row, col, s| {
                // SAFETY: `h0` holds the state rows the records name; the element is this thread's.
                *s = unsafe { *args.h0.add(h0_index::<K>(args, h0_row, item, row, col)) };
            });
        }
        // `[M | B]` starts at `[I | 0]`: ones where the state column is the key row.
        (Some(item), _) if args.prescan => {
            for_each_state::<K, MT, G, O>(&mut state, frag, |row, col, s| *s = (item.vcol0 + col == row) as u32 as f32)
        }
        _ => {}
    }
    state
}

/// The consumer warps: each item's state through every chunk of it, from its initial state
/// (loaded while the item before ran, where [`prefetches_h0`]) to `ht`; every stage released
/// after its chunk.
///
/// Each group walks the same records, as items of its own columns.
///
/// # Safety
/// As [`recurrence`]; every thread of the consumer warps calls it.
#[inline(always)]
unsafe fn consume<const K: usize, const MT: usize, const G: usize, const O: bool>(args: &Args, items: impl Iterator<Item = Item>) {
    let smem = Smem::carve::<K, MT, G, O>(thread_idx_x() / Tiles::<K, MT, G, O>::CONSUMERS);
    let mut stage = 0;
    let mut items = items.map(|item| Item { vcol0: item.vcol0 + smem.col, ..item }).peekable();
    // SAFETY (block): the entries' contract on `h0` and the records.
    let mut ahead: State<MT> =
        if prefetches_h0(MT) { unsafe { initial_state::<K, MT, G, O>(args, items.peek()) } } else { [[[0.0; 4]; N_TILES]; MT] };
    while let Some(item) = items.next() {
        let mut state = if prefetches_h0(MT) {
            // The loads are issued here and land while the item's chunks run.
            core::mem::replace(&mut ahead, unsafe { initial_state::<K, MT, G, O>(args, items.peek()) })
        } else {
            unsafe { initial_state::<K, MT, G, O>(args, Some(&item)) }
        };
        for c in 0..item.chunks() {
            let (tok0, rows) = (item.first_token(c), item.rows(c));
            let tiles = smem.stage::<K, MT, G, O>(stage);
            let h_item = ((item.chunk_start + c) * item.heads + item.head) * K * args.value_dim;
            // SAFETY: the launcher validated every buffer against the records, heads and
            // strides; rows beyond the chunk's valid length are never written to global memory;
            // every consumer thread runs the same steps (the barriers inside are convergent).
            unsafe {
                let full = smem.full(stage);
                mbarrier_wait_token(full, mbarrier_arrive_token(full));
                publish_state::<K, MT, G, O>(smem, Frag::fresh(Tiles::<K, MT, G, O>::CONSUMERS), &state);
                // The fused pass writes neither `h` nor `v_new`, but `o` in `v_new`'s place.
                let stores = !args.prescan && !O;
                if stores {
                    store_h::<K, MT, G, O>(smem, thread_idx_x_fresh() % Tiles::<K, MT, G, O>::CONSUMERS, args, &item, args.h.add(h_item));
                }
                let o = corrected_values::<K, MT, G, O>(smem, tiles, Frag::fresh(Tiles::<K, MT, G, O>::CONSUMERS), args, rows);
                if stores {
                    store_v_new::<K, MT, G, O>(tiles, thread_idx_x_fresh() % Tiles::<K, MT, G, O>::CONSUMERS, args, &item, tok0, rows);
                }
                if O {
                    store_output::<K, MT, G, O>(tiles, Frag::fresh(Tiles::<K, MT, G, O>::CONSUMERS), args, (&item, tok0, rows), o);
                }
                update_state::<K, MT, G, O>(smem, tiles, Frag::fresh(Tiles::<K, MT, G, O>::CONSUMERS), args, rows, &mut state);
                named_barrier_arrive(empty_barrier(stage), Tiles::<K, MT, G, O>::THREADS as u32);
            }
            stage = next_stage::<K, MT, G, O>(stage);
        }
        if let (Some(row), false) = (item.ht_row, args.ht.is_null()) {
            let base = state_base::<K>(args, row);
            for_each_state::<K, MT, G, O>(&mut state, Frag::fresh(Tiles::<K, MT, G, O>::CONSUMERS), |row, col, s| {
                // SAFETY: `ht` holds the state rows the records name; the element is this thread's.
                unsafe { *args.ht.add(base + state_index::<K>(args, &item, row, col)) = *s };
            });
        }
    }
}

/// Calls `f(row, block column, element)` for each state element this thread holds.
#[inline(always)]
fn for_each_state<const K: usize, const MT: usize, const G: usize, const O: bool>(
    state: &mut State<MT>,
    frag: Frag,
    mut f: impl FnMut(usize, usize, &mut f32),
) {
    for (mt, tiles) in state.iter_mut().enumerate() {
        for (nt, acc) in tiles.iter_mut().enumerate() {
            for (e, s) in acc.iter_mut().enumerate() {
                let (row, col) = frag.place.state_at(Tiles::<K, MT, G, O>::STATE_ROWS_PER_WARP, mt, nt, e);
                f(row, col, s);
            }
        }
    }
}

/// Step 1 of a chunk: `bf16(S)` to the `st` tile, two adjacent columns per store; then the
/// consumer barrier, after which the tile is complete and every warp has also finished the
/// previous chunk's `update_state` (so the `vn` tile is free again).
///
/// # Safety
/// Every consumer thread of the group calls it.
#[inline(always)]
unsafe fn publish_state<const K: usize, const MT: usize, const G: usize, const O: bool>(smem: Smem, frag: Frag, state: &State<MT>) {
    // SAFETY: see the function's contract; every shared address is inside the `st` tile.
    unsafe {
        for (mt, acc_row) in state.iter().enumerate() {
            for (nt, acc) in acc_row.iter().enumerate() {
                for half in 0..2 {
                    let (row, col) = frag.place.state_at(Tiles::<K, MT, G, O>::STATE_ROWS_PER_WARP, mt, nt, 2 * half);
                    st_shared_u32(Smem::bf16_at(smem.st, BV_STRIDE, (row, col)), pack_bf16x2(acc[2 * half], acc[2 * half + 1]));
                }
            }
        }
        named_barrier(smem.barrier, Tiles::<K, MT, G, O>::CONSUMERS as u32);
    }
}

/// 16-byte vectors of one column block's rows (of `BV` bf16).
const VECTORS_PER_BLOCK_ROW: usize = BV / VECTOR;

/// `bf16(S)` from the complete `st` tile to `h_item` (this item's chunk state), in 16-byte
/// stores: a key-first row's block is `BV` contiguous columns, a value-first column's `K`
/// contiguous keys, eight of them gathered per store.
///
/// # Safety
/// Every consumer thread of the group calls it (`tid` its index in the group) after [`publish_state`]; `h_item` holds
/// the item's block of the state, 16-byte aligned.
#[inline(always)]
unsafe fn store_h<const K: usize, const MT: usize, const G: usize, const O: bool>(
    smem: Smem,
    tid: usize,
    args: &Args,
    item: &Item,
    h_item: *mut u16,
) {
    // SAFETY (block): see the function's contract; every shared address is inside the `st` tile,
    // every store inside the item's block (the pointer steps past it only after the last one).
    unsafe {
        if args.value_first {
            // Keys `row .. row + VECTOR` of block columns `col0`, `col0 + cols_per_pass`, ...
            let per_col = K / VECTOR;
            let consumers = Tiles::<K, MT, G, O>::CONSUMERS;
            let (col0, row, cols_per_pass) = (tid / per_col, tid % per_col * VECTOR, consumers / per_col);
            let mut to = h_item.add(state_index::<K>(args, item, row, col0));
            let mut col = col0 as u32;
            while col < BV as u32 {
                let key = |i: usize| u32::from(ld_shared_u16(Smem::bf16_at(smem.st, BV_STRIDE, (row + i, col as usize))));
                st_global_v4(to, core::array::from_fn(|p| key(2 * p) | key(2 * p + 1) << 16));
                to = to.wrapping_add(cols_per_pass * K);
                col += cols_per_pass as u32;
            }
        } else {
            // Columns `col .. col + VECTOR` of rows `row0`, `row0 + rows_per_pass`, ...
            let (row0, col) = (tid / VECTORS_PER_BLOCK_ROW, tid % VECTORS_PER_BLOCK_ROW * VECTOR);
            let rows_per_pass = Tiles::<K, MT, G, O>::CONSUMERS / VECTORS_PER_BLOCK_ROW;
            let mut to = h_item.add(state_index::<K>(args, item, row0, col));
            let mut row = row0 as u32;
            while row < K as u32 {
                st_global_v4(to, ld_shared_v4(Smem::bf16_at(smem.st, BV_STRIDE, (row as usize, col))));
                to = to.wrapping_add(rows_per_pass * args.value_dim);
                row += rows_per_pass as u32;
            }
        }
    }
}

/// The B fragments of the two n8 tiles at columns `n0` and `n0 + 8` for the k16 step at row
/// `k0` of a tile whose rows are B's rows (`st`, `vn`: `BV_STRIDE` elements each).
///
/// # Safety
/// Every lane of the warp calls it; the block lies inside the tile.
#[inline(always)]
unsafe fn b_fragments(tile: u32, frag: Frag, k0: usize, n0: usize) -> [[u32; 2]; N_TILES_PER_LOAD] {
    // SAFETY: the function's contract.
    unsafe { b_fragments_at(tile, BV_STRIDE, frag, k0, n0) }
}

/// [`b_fragments`] from a tile of rows of `stride` elements.
///
/// # Safety
/// As [`b_fragments`]; `stride` keeps rows 16-byte aligned.
#[inline(always)]
unsafe fn b_fragments_at(tile: u32, stride: usize, frag: Frag, k0: usize, n0: usize) -> [[u32; 2]; N_TILES_PER_LOAD] {
    // SAFETY: see the function's contract.
    let r = unsafe { ldmatrix_x4_trans(Smem::bf16_at(tile, stride, frag.place.ldmatrix_down_then_right(k0, n0))) };
    [[r[0], r[1]], [r[2], r[3]]]
}

/// Runs `step` on the fragments `load` reads for each k16 step `0 .. steps` in order, with the
/// next step's loaded before the current step's products are issued: the shared-memory latency
/// of one step's `ldmatrix` hides under the tensor-core work of the step before, instead of
/// every `mma` waiting for its own operands.
#[inline(always)]
fn pipelined<F: Copy>(steps: usize, load: impl Fn(usize) -> F, mut step: impl FnMut(F)) {
    let mut current = load(0);
    for ks in 0..steps {
        let next = if ks + 1 < steps { load(ks + 1) } else { current };
        step(current);
        current = next;
    }
}

/// The gate of the chunk's last valid token: `g[last]` when there is a scalar gate, else 0.
///
/// # Safety
/// The stage is full; `rows` is the chunk's valid rows.
#[inline(always)]
unsafe fn g_last(tiles: Stage, args: &Args, rows: usize) -> f32 {
    // SAFETY: see the function's contract; the stage holds `g` when `args.g` is not null.
    if args.g.is_null() { 0.0 } else { unsafe { ld_shared_f32(Smem::f32_at(tiles.g, rows - 1)) } }
}

/// A warp's 16 token rows of the group's `N_TILES` n8 tiles of columns, as `mma_m16n8k16_bf16`
/// accumulators.
type Rows16 = [[f32; 4]; N_TILES];

/// Step 2: `Vn = u - w @ bf16(S)` for this warp's 16 token rows (`Frag::vn_row0`) in all of the
/// group's columns; `bf16(Vn)` over the valid rows
/// of the stage's `u` tile (for [`store_v_new`], and in the fused pass for [`store_output`]),
/// and to the `vn` tile (scaled by the scalar gate's `exp2(g[last] - g[t])` where there is one;
/// zeros past the chunk's end); then the consumer barrier. In the fused pass (`O`) it also
/// forms the output's first product, `o = q Γ @ bf16(S)`, from the same B fragments, and
/// returns it (zeros elsewhere).
///
/// # Safety
/// Every consumer thread calls it after [`publish_state`], with the chunk's stage full.
#[inline(always)]
unsafe fn corrected_values<const K: usize, const MT: usize, const G: usize, const O: bool>(
    smem: Smem,
    tiles: Stage,
    frag: Frag,
    args: &Args,
    rows: usize,
) -> Rows16 {
    let row0 = frag.vn_row0();
    let row_stride = Tiles::<K, MT, G, O>::ROW_STRIDE;
    let mut acc: Rows16 = [[0.0f32; 4]; N_TILES];
    let mut o: Rows16 = [[0.0f32; 4]; N_TILES];
    // SAFETY: see the function's contract; rows past `rows` touch shared memory only.
    unsafe {
        let load = |ks: usize| {
            let at = frag.place.ldmatrix_down_then_right(row0, ks * MMA_K);
            let a = ldmatrix_x4(Smem::bf16_at(tiles.w, row_stride, at));
            let q = if O { ldmatrix_x4(Smem::bf16_at(tiles.q, row_stride, at)) } else { [0; 4] };
            let b: [[[u32; 2]; N_TILES_PER_LOAD]; N_TILES / N_TILES_PER_LOAD] = core::array::from_fn(|pair| {
                b_fragments(smem.st, frag, ks * MMA_K, pair * N_TILES_PER_LOAD * MMA_N)
            });
            (a, q, b)
        };
        pipelined(Tiles::<K, MT, G, O>::VN_K_STEPS, load, |(a, q, b)| {
            // Index loops to a constant bound: fully unrolled, every fragment in registers.
            for nt in 0..N_TILES {
                let b = b[nt / N_TILES_PER_LOAD][nt % N_TILES_PER_LOAD];
                mma_m16n8k16_bf16(&mut acc[nt], a, b);
                if O {
                    mma_m16n8k16_bf16(&mut o[nt], q, b);
                }
            }
        });
        // The two token rows this thread holds, and their scalar-gate factors.
        let t_rows: [usize; 2] = core::array::from_fn(|half| row0 + frag.place.g + 8 * half);
        let g_last = g_last(tiles, args, rows);
        let scales = t_rows.map(|t| {
            if args.g.is_null() { 1.0 } else { exp2_approx(g_last - ld_shared_f32(Smem::f32_at(tiles.g, t))) }
        });
        for (nt, acc) in acc.iter().enumerate() {
            let col = nt * MMA_N + 2 * frag.place.t;
            for (half, (&t, &scale)) in t_rows.iter().zip(&scales).enumerate() {
                // Every row, valid or not: past the chunk's end `u` and `w` are zero-filled, so
                // `Vn` is zero there, and the scale is 1 (`g` holds the last valid row's value).
                // This warp's own rows of `u`, read and overwritten by the same thread.
                let u = Smem::bf16_at(tiles.u_group, Tiles::<K, MT, G, O>::U_STRIDE, (t, col));
                let given = ld_shared_u32(u);
                let lo = bf16_to_f32(given as u16) - acc[2 * half];
                let hi = bf16_to_f32((given >> 16) as u16) - acc[2 * half + 1];
                let rounded = pack_bf16x2(lo, hi);
                st_shared_u32(u, rounded);
                let pair = if args.g.is_null() { rounded } else { pack_bf16x2(lo * scale, hi * scale) };
                st_shared_u32(Smem::bf16_at(smem.vn, BV_STRIDE, (t, col)), pair);
            }
        }
        named_barrier(smem.barrier, Tiles::<K, MT, G, O>::CONSUMERS as u32);
    }
    o
}

/// The fused pass's output of this warp's 16 token rows (in all of the group's columns):
/// `o += P @ bf16(Vn)` over the chunk's
/// tokens (`P` from the stage's tile, `bf16(Vn)` unscaled from the stage's `u` tile, where
/// [`corrected_values`] left it: zeros past the chunk's end in both), then `scale o` rounded to
/// bf16 to `o`'s valid rows (`args.v_new`, at its strides), two adjacent columns per store.
///
/// # Safety
/// Every consumer thread calls it after [`corrected_values`], before the stage is released; `o`
/// holds the tokens `tok0 .. tok0 + rows` of `item`'s head at 4-byte-aligned rows.
#[inline(always)]
unsafe fn store_output<const K: usize, const MT: usize, const G: usize, const O: bool>(
    tiles: Stage,
    frag: Frag,
    args: &Args,
    (item, tok0, rows): (&Item, usize, usize),
    mut o: Rows16,
) {
    let row0 = frag.vn_row0();
    let (p_stride, u_stride) = (Tiles::<K, MT, G, O>::P_STRIDE, Tiles::<K, MT, G, O>::U_STRIDE);
    // SAFETY (block): see the function's contract; every shared address is inside the stage's
    // `P` and `u` tiles, every store inside a valid row of `o`.
    unsafe {
        let load = |ks: usize| {
            let a = ldmatrix_x4(Smem::bf16_at(tiles.p, p_stride, frag.place.ldmatrix_down_then_right(row0, ks * MMA_K)));
            let b: [[[u32; 2]; N_TILES_PER_LOAD]; N_TILES / N_TILES_PER_LOAD] = core::array::from_fn(|pair| {
                b_fragments_at(tiles.u_group, u_stride, frag, ks * MMA_K, pair * N_TILES_PER_LOAD * MMA_N)
            });
            (a, b)
        };
        pipelined(STATE_K_STEPS, load, |(a, b)| {
            for nt in 0..N_TILES {
                mma_m16n8k16_bf16(&mut o[nt], a, b[nt / N_TILES_PER_LOAD][nt % N_TILES_PER_LOAD]);
            }
        });
        let scale = args.fused.scale;
        for half in 0..2 {
            let t = row0 + frag.place.g + 8 * half;
            if t < rows {
                let row = args.v_new.add(args.v_new_rows.row(tok0 + t, item.head) + item.vcol0);
                // An index loop to a constant bound (an iterator's `take` left `o` in local memory).
                #[allow(clippy::needless_range_loop)]
                for nt in 0..N_TILES {
                    let (acc, col) = (o[nt], nt * MMA_N + 2 * frag.place.t);
                    let pair = pack_bf16x2(acc[2 * half] * scale, acc[2 * half + 1] * scale);
                    st_global_b32(row.add(col) as *mut u32, pair);
                }
            }
        }
    }
}

/// `bf16(Vn)` of the chunk's valid rows from the stage's `u` tile, where [`corrected_values`]
/// left it, to `v_new`, one 16-byte store per row segment.
///
/// # Safety
/// Every consumer thread of the group calls it (`tid` its index in the group) after [`corrected_values`], before the
/// stage is released; `v_new` holds the tokens `tok0 .. tok0 + rows` at 16-byte-aligned rows.
#[inline(always)]
unsafe fn store_v_new<const K: usize, const MT: usize, const G: usize, const O: bool>(
    tiles: Stage,
    tid: usize,
    args: &Args,
    item: &Item,
    tok0: usize,
    rows: usize,
) {
    // Columns `col .. col + VECTOR` of the chunk's rows `t0`, `t0 + rows_per_pass`, ...
    let (t0, col) = (tid / VECTORS_PER_BLOCK_ROW, tid % VECTORS_PER_BLOCK_ROW * VECTOR);
    let rows_per_pass = Tiles::<K, MT, G, O>::CONSUMERS / VECTORS_PER_BLOCK_ROW;
    if t0 >= rows {
        return;
    }
    // SAFETY (block): see the function's contract; the shared addresses are inside the `u` tile,
    // the stores in the chunk's valid rows (the pointer steps past them only after the last).
    unsafe {
        let mut to = args.v_new.add(args.v_new_rows.row(tok0 + t0, item.head) + item.vcol0 + col);
        let mut t = t0 as u32;
        while t < rows as u32 {
            st_global_v4(to, ld_shared_v4(Smem::bf16_at(tiles.u_group, Tiles::<K, MT, G, O>::U_STRIDE, (t as usize, col))));
            to = to.wrapping_add(rows_per_pass * args.v_new_rows.token);
            t += rows_per_pass as u32;
        }
    }
}

/// Step 3: `S = decay * S + k^T @ bf16(Vn)` over the chunk's tokens (the rows past its end are
/// zero in both tiles), the decay `exp2(g[last] + gk[last])` per key row.
///
/// # Safety
/// Every consumer thread calls it after [`corrected_values`], with the chunk's stage full.
#[inline(always)]
unsafe fn update_state<const K: usize, const MT: usize, const G: usize, const O: bool>(
    smem: Smem,
    tiles: Stage,
    frag: Frag,
    args: &Args,
    rows: usize,
    state: &mut State<MT>,
) {
    let row_stride = Tiles::<K, MT, G, O>::ROW_STRIDE;
    // SAFETY: see the function's contract; every index is inside its shared tile.
    unsafe {
        let g_last = g_last(tiles, args, rows);
        let has_gk = !args.gk.is_null();
        for (mt, tiles_row) in state.iter_mut().enumerate() {
            for half in 0..2 {
                // Accumulator elements 2 * half and 2 * half + 1 of every n8 tile share a row.
                let (row, _) = frag.place.state_at(Tiles::<K, MT, G, O>::STATE_ROWS_PER_WARP, mt, 0, 2 * half);
                let gk_last = if has_gk { ld_shared_f32(Smem::f32_at(tiles.gk_last, row)) } else { 0.0 };
                let decay = exp2_approx(g_last + gk_last);
                for acc in tiles_row.iter_mut() {
                    acc[2 * half] *= decay;
                    acc[2 * half + 1] *= decay;
                }
            }
        }
        let warp_row0 = frag.warp() * Tiles::<K, MT, G, O>::STATE_ROWS_PER_WARP;
        let load = |ks: usize| {
            let a: [[u32; 4]; MT] = core::array::from_fn(|mt| {
                let at = frag.place.ldmatrix_right_then_down(ks * MMA_K, warp_row0 + mt * MMA_M);
                ldmatrix_x4_trans(Smem::bf16_at(tiles.k, row_stride, at))
            });
            let b: [[[u32; 2]; N_TILES_PER_LOAD]; N_TILES / N_TILES_PER_LOAD] =
                core::array::from_fn(|pair| b_fragments(smem.vn, frag, ks * MMA_K, pair * N_TILES_PER_LOAD * MMA_N));
            (a, b)
        };
        pipelined(STATE_K_STEPS, load, |(a, b)| {
            for (pair, b) in b.iter().enumerate() {
                for (row, a) in state.iter_mut().zip(&a) {
                    for (i, b) in b.iter().enumerate() {
                        mma_m16n8k16_bf16(&mut row[pair * N_TILES_PER_LOAD + i], *a, *b);
                    }
                }
            }
        });
    }
}

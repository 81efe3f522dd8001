//! The warp-specialized Hopper (sm_90a) kernel.
//!
//! A persistent grid: one CTA per SM, `THREADS` = 160 threads, each CTA walking its list of work
//! items (one item = one block of `BV` = 64 value columns of one head of one sequence) from the
//! launcher's longest-first schedule (`kda::schedule`). Both roles walk the same list; the ring
//! position runs on across items, so the next item's first loads overlap the current item's last
//! chunks.
//!
//! * **Producer** (warp 4): per item, loads the item's `h0` block (`[K][BV]` f32) with TMA into
//!   a shared slot (once the consumer has taken the previous one); per chunk, waits until its
//!   ring stage is free (`empty` mbarrier), writes `exp2` of the chunk's last gate row (loaded
//!   one chunk ahead) into the stage, and loads the chunk's
//!   `k` and `w` tiles (`[64][128]`, two 128-byte-swizzled boxes each) and this CTA's `u` tile
//!   (`[64][64]`) with TMA, completing the stage's `full` mbarrier by transaction count. The
//!   sequence's partial last chunk is the **tail epilogue**: a full-tile TMA box there would
//!   read the next sequence's tokens, so the producer warp loads only the valid rows, one-row
//!   TMA boxes spread over its lanes, into the same swizzled layout, and zeroes the `k` rows
//!   past the end.
//! * **Consumer** (warps 0-3, one warpgroup): holds `S^T` (`[64 v][128 k]` f32) as a wgmma
//!   accumulator in registers, starting each item from the `h0` slot (or zeros) and ending it
//!   by storing `ht` from registers; per chunk it waits on `full`, then
//!   1. loads `u^T` into product 1's accumulator and stages `bf16(S)` for `h` (in one of
//!      `STAGING` = 2 buffers, so the previous chunk's stores need not have read theirs yet),
//!   2. decays the state (`S^T *= exp2(gk_last)` per key column) and computes
//!      `Vn^T = u^T - bf16(S^T) @ w^T` (wgmma, A from registers, B = `w` tile),
//!   3. masks `Vn` rows past the chunk's end to zero and stages `bf16(Vn)`,
//!   4. starts `S^T += bf16(Vn^T) @ k` (wgmma, A from registers, B = `k` tile read transposed)
//!      and, while it runs, stores `h` and `v_new` with TMA (one thread issues both; the tail
//!      chunk's valid `v_new` rows go out as coalesced 16-byte stores instead, since a full box
//!      would write into the next sequence),
//!   5. waits for the product and releases the stage (`empty`).
//!
//! The producer runs up to `STAGES` = 3 chunks ahead, so the loads of the next chunk overlap the
//! serially dependent MMAs of the current one. Nothing outside the sequence's rows is read into
//! the math or written.

use crate::intrinsics::{bf16_to_f32, block_idx_x, exp2_approx, smem_base_shared, sync_threads, thread_idx_x};
use crate::layout::hopper::{
    BOX_BYTES, BOX_COLS, BV, CONSUMER_THREADS, KEY_BOXES, SMEM_BARRIERS, SMEM_DECAY, SMEM_H, SMEM_H0,
    SMEM_VN, STAGES, STAGE_BYTES, STAGING, STAGE_K, STAGE_TX_BYTES, STAGE_U, STAGE_W,
};
use crate::layout::{
    CHUNK, ITEM_CHUNK_START, ITEM_HEAD, ITEM_LAST, ITEM_LEN, ITEM_NEXT, ITEM_STATE_ROW, ITEM_TOKEN_START, ITEM_VCOL0,
    ITEM_WORDS, K_DIM, V_DIM,
};
use crate::param_address;
use crate::sm90::{
    fence_mbarrier_init, fence_proxy_async, ld_shared_f32, ld_shared_v2_f32, ld_shared_v4, ldmatrix_x4_trans,
    mbarrier_arrive, mbarrier_arrive_expect_tx, mbarrier_init, mbarrier_wait, named_barrier, pack_bf16x2,
    st_global_v4, st_shared_f32, st_shared_v4, stmatrix_x4_trans, sw128_desc, sync_warp, thread_idx_x_fresh, tma_load_3d,
    tma_store_3d, bulk_commit_group, bulk_wait_group_read, prefetch_tensormap, wgmma_state_start, wgmma_vn_start,
    wgmma_wait_state, wgmma_wait_vn, TensorMap,
};

/// Bytes of one 128-byte swizzle row (64 bf16) and of its 16-byte chunks.
const ROW_BYTES: u32 = 128;
const CHUNK16: u32 = 16;
/// 16-byte chunks per 128-byte row.
const CHUNKS_PER_ROW: usize = 8;
/// Rows of one swizzle atom: the 128-byte swizzle permutes 16-byte chunks within 8-row groups.
const SWIZZLE_ROWS: usize = 8;
/// Bytes between 8-row groups of a 128-byte-swizzled tile (the descriptors' stride offset).
const ATOM_BYTES: u32 = (SWIZZLE_ROWS as u32) * ROW_BYTES;
/// The K-major descriptor's leading offset is unused with swizzling; 16 bytes (one unit) is the
/// conventional value.
const UNUSED_LEADING: u32 = 16;
/// The consumer thread that issues the TMA stores of `h` and `v_new` (bulk async-groups are
/// per thread, so the same thread waits for them).
const STORE_THREAD: usize = 0;
/// Named barrier of the consumer warpgroup (0 is `bar.sync 0`, the CTA barrier).
const CONSUMER_BARRIER: u32 = 1;
/// Element pairs of the wgmma accumulator per 8-column group (`d[4j .. 4j + 4]`).
const ACC_PER_GROUP: usize = 4;
/// Threads per wgmma row quad: a row's 8 columns of a group are spread over 4 lanes, 2 each.
const QUAD: usize = 4;

/// Byte offset of 16-byte chunk `chunk` of row `row` in a tile of 128-byte rows under the
/// 128-byte swizzle (the chunk index XOR the row's position in its 8-row group): the layout TMA
/// writes for the swizzled boxes, and the one the staging tiles use so that the 8 rows one
/// `stmatrix`/`ldmatrix` matrix touches fall in 8 different bank groups.
#[inline(always)]
fn swizzled(row: usize, chunk: usize) -> u32 {
    (row as u32) * ROW_BYTES + ((chunk ^ (row % SWIZZLE_ROWS)) as u32) * CHUNK16
}

/// Row and 16-byte chunk this lane addresses in an `x4` `ldmatrix`/`stmatrix` over the
/// 16-column step `step` of a wgmma fragment, for a tile stored transposed (`[column][row]`):
/// matrix `m = lane / 8` is fragment row half `m % 2` and column group `m / 2`; its stored row
/// `lane % 8` is fragment column `16 * step + 8 * (m / 2) + lane % 8`, and its 8 fragment rows
/// (16 bytes) start at row `16 * warp + 8 * (m % 2)`, i.e. chunk `2 * warp + m % 2`.
#[inline(always)]
fn matrix_row(tid: usize, step: usize) -> (usize, usize) {
    let (warp, lane) = (tid / 32, tid % 32);
    let m = lane / 8;
    (16 * step + 8 * (m / 2) + lane % 8, 2 * warp + m % 2)
}

/// Shared addresses of one CTA's allocation.
#[derive(Clone, Copy)]
struct Smem {
    base: u32,
}

impl Smem {
    fn stage(self, s: usize) -> u32 {
        self.base + (s * STAGE_BYTES) as u32
    }
    fn decay(self, s: usize) -> u32 {
        self.base + (SMEM_DECAY + s * K_DIM * 4) as u32
    }
    fn h(self, buf: usize) -> u32 {
        self.base + (SMEM_H + buf * K_DIM * BV * 2) as u32
    }
    fn vn(self, buf: usize) -> u32 {
        self.base + (SMEM_VN + buf * CHUNK * BV * 2) as u32
    }
    fn full(self, s: usize) -> u32 {
        self.base + (SMEM_BARRIERS + s * 8) as u32
    }
    fn empty(self, s: usize) -> u32 {
        self.base + (SMEM_BARRIERS + (STAGES + s) * 8) as u32
    }
    fn h0(self) -> u32 {
        self.base + SMEM_H0 as u32
    }
    fn h0_full(self) -> u32 {
        self.base + (SMEM_BARRIERS + 2 * STAGES * 8) as u32
    }
    fn h0_empty(self) -> u32 {
        self.base + (SMEM_BARRIERS + (2 * STAGES + 1) * 8) as u32
    }
}

/// The launcher's schedule table: one record per work item, linked per worker (see
/// `layout::ITEM_WORDS`). Both roles walk their CTA's list from record `blockIdx.x` on.
struct Work {
    records: *const Record,
    heads: usize,
}

/// One work-item record, read whole (two 16-byte loads).
#[repr(C, align(32))]
#[derive(Clone, Copy)]
struct Record([u32; ITEM_WORDS]);

impl Work {
    /// This CTA's items, in order.
    fn items(&self) -> Items<'_> {
        Items { work: self, next: block_idx_x() as u32 }
    }
}

/// The iterator of [`Work::items`]: follows the records' next words.
struct Items<'a> {
    work: &'a Work,
    next: u32,
}

impl Iterator for Items<'_> {
    type Item = Item;

    #[inline(always)]
    fn next(&mut self) -> Option<Item> {
        if self.next == ITEM_LAST {
            return None;
        }
        // SAFETY: the kernel's contract: the table holds a record for every worker and every
        // record's next word names a record of the table or is `ITEM_LAST`.
        let Record(r) = unsafe { *self.work.records.add(self.next as usize) };
        self.next = r[ITEM_NEXT];
        Some(Item {
            token_start: r[ITEM_TOKEN_START] as usize,
            len: r[ITEM_LEN] as usize,
            chunk_start: r[ITEM_CHUNK_START] as usize,
            state_row: r[ITEM_STATE_ROW] as usize,
            head: r[ITEM_HEAD] as usize,
            heads: self.work.heads,
            vcol0: r[ITEM_VCOL0] as usize,
        })
    }
}

/// What every role needs to know about its work item.
#[derive(Clone, Copy)]
struct Item {
    token_start: usize,
    len: usize,
    chunk_start: usize,
    /// Row of this item's state in the `[N * H][K][V]` view of `h0` and `ht`.
    state_row: usize,
    head: usize,
    heads: usize,
    /// First value column of this CTA's block.
    vcol0: usize,
}

impl Item {
    fn chunks(&self) -> usize {
        self.len.div_ceil(CHUNK)
    }
    /// Valid rows of chunk `c`.
    fn rows(&self, c: usize) -> usize {
        (self.len - c * CHUNK).min(CHUNK)
    }
    /// Element offset of token `t`'s row of a `[T, H, 128]` tensor for this head.
    fn row(&self, t: usize) -> usize {
        (t * self.heads + self.head) * K_DIM
    }
}

/// Warp-specialized recurrence kernel. Grid: the schedule's workers (at most one CTA per SM) of
/// `layout::hopper::THREADS` threads, `layout::hopper::SMEM_BYTES` of dynamic shared memory.
/// `work` is the schedule's table of work-item records (`layout::ITEM_WORDS` words each, 32-byte
/// aligned); CTA `b` runs the items linked from record `b` on. (`seqs`, the plan's descriptors,
/// is the baseline's argument: the records carry what the descriptors would give.)
///
/// `kmap`, `wmap` are tensor maps of `k` and `w` as 3-D `[T][H][128]` bf16 tensors with
/// `[64 tokens][1][64]` boxes and the 128-byte swizzle; `umap` and `vmap` map `u` and `v_new`
/// the same way. `krowmap`, `wrowmap` and `urowmap` map `k`, `w` and `u` in one-token boxes
/// (`[1][1][64]`) for tail chunks. `hmap` maps `h` as a 3-D `[NT * H][K][V]` bf16 tensor with
/// `[1][128][64]` boxes and the 128-byte swizzle; `h0map` maps `h0` as a 3-D `[N * H][K][V]` f32
/// tensor in unswizzled `[1][128][64]` boxes (unused, and never read, when `h0` is null). The
/// tensors are read and written through the
/// maps; their pointers keep the argument list the baseline kernel's. The other arguments are
/// as for the baseline kernel.
///
/// # Safety
/// As for `kda_fwd_h_baseline`; the tensor maps must describe exactly `k`, `w`, `u`, `h`,
/// `v_new` and (when not null) `h0`; `work` is a schedule of exactly `gridDim.x` workers that
/// names each item of the plan once, its every next word naming a record of the table or being
/// `ITEM_LAST`.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn kda_fwd_h_hopper(
    _kmap: TensorMap,
    _wmap: TensorMap,
    _umap: TensorMap,
    _krowmap: TensorMap,
    _wrowmap: TensorMap,
    _urowmap: TensorMap,
    _hmap: TensorMap,
    _vmap: TensorMap,
    _h0map: TensorMap,
    _k: *const u16,
    _w: *const u16,
    _u: *const u16,
    gk: *const f32,
    h0: *const f32,
    _h: *mut u16,
    v_new: *mut u16,
    ht: *mut f32,
    _seqs: *const i64,
    heads: u32,
    work: *const u32,
) {
    if heads == 0 {
        // Never launched so (the launcher rejects H = 0). The check stays because the measured
        // builds have it: removing it reorders the kernel's PTX, and the chunk loop's speed has
        // shown itself sensitive to instruction order (bench/RESULTS.md, runs 8 and 11).
        return;
    }
    let work = Work { records: work.cast(), heads: heads as usize };
    let smem = Smem { base: smem_base_shared() };
    let tid = thread_idx_x();
    let load_maps = LoadMaps {
        k: param_address!("kda_fwd_h_hopper_param_0"),
        w: param_address!("kda_fwd_h_hopper_param_1"),
        u: param_address!("kda_fwd_h_hopper_param_2"),
        k_row: param_address!("kda_fwd_h_hopper_param_3"),
        w_row: param_address!("kda_fwd_h_hopper_param_4"),
        u_row: param_address!("kda_fwd_h_hopper_param_5"),
        h0: if h0.is_null() { None } else { Some(param_address!("kda_fwd_h_hopper_param_8")) },
    };
    let store_maps = [param_address!("kda_fwd_h_hopper_param_6"), param_address!("kda_fwd_h_hopper_param_7")];
    if tid == CONSUMER_THREADS {
        // The descriptors' fetch overlaps the CTA's setup instead of delaying its first copies.
        // SAFETY: each address is a tensor-map parameter (`h0`'s only when `h0` is given).
        unsafe {
            load_maps.prefetch();
            prefetch_tensormap(store_maps[0]);
            prefetch_tensormap(store_maps[1]);
        }
    }
    if tid == 0 {
        // SAFETY: barrier slots inside the allocation; published by the CTA barrier below.
        unsafe {
            for s in 0..STAGES {
                mbarrier_init(smem.full(s), 1);
                mbarrier_init(smem.empty(s), CONSUMER_THREADS as u32);
            }
            mbarrier_init(smem.h0_full(), 1);
            mbarrier_init(smem.h0_empty(), CONSUMER_THREADS as u32);
        }
        fence_mbarrier_init();
    }
    // SAFETY: every thread of the CTA reaches this barrier.
    unsafe { sync_threads() };

    if tid >= CONSUMER_THREADS {
        // SAFETY: the launcher's validation makes every row the producer touches exist.
        unsafe { produce(&work, smem, tid - CONSUMER_THREADS, load_maps, gk) };
    } else {
        // SAFETY: as above, for the consumer's loads and stores.
        unsafe { consume(&work, smem, tid, store_maps, !h0.is_null(), v_new, ht) };
    }
}

/// The producer warp's loop over this CTA's items and their chunks. The ring position runs on
/// across items, so the next item's initial state and first chunks load while the consumer still
/// works on the current item.
///
/// # Safety
/// Called by the 32 lanes of the producer warp only; tensors as the kernel documents.
#[inline(always)]
unsafe fn produce(work: &Work, smem: Smem, lane: usize, maps: LoadMaps, gk: *const f32) {
    let mut ring = 0usize; // chunks loaded so far: the ring stage and its round
    for (n, item) in work.items().enumerate() {
        if let Some(h0map) = maps.h0 {
            // SAFETY: the slot is free once the consumer read the previous item's state (a
            // fresh barrier counts as having completed the phase before its first).
            unsafe {
                mbarrier_wait(smem.h0_empty(), ((n & 1) ^ 1) as u32);
                if lane == 0 {
                    mbarrier_arrive_expect_tx(smem.h0_full(), H0_TX_BYTES);
                    tma_load_3d(smem.h0(), h0map, item.vcol0 as i32, 0, item.state_row as i32, smem.h0_full());
                }
            }
        }
        // SAFETY: as this function's.
        unsafe { produce_chunks(&item, smem, lane, &maps, gk, &mut ring) };
    }
}

/// The producer's loads of one item's chunks, from ring position `ring` on.
///
/// # Safety
/// As for [`produce`].
#[inline(always)]
unsafe fn produce_chunks(item: &Item, smem: Smem, lane: usize, maps: &LoadMaps, gk: *const f32, ring: &mut usize) {
    // The chunk's last gate row, `GATE_PER_LANE` columns (`lane + 32 i`) per lane.
    // SAFETY: the chunk's last valid row exists (the launcher validated `gk`).
    let gate_row = |c: usize| -> [f32; GATE_PER_LANE] {
        let last = unsafe { gk.add(item.row(item.token_start + c * CHUNK + item.rows(c) - 1)) };
        core::array::from_fn(|i| unsafe { *last.add(lane + 32 * i) })
    };
    let chunks = item.chunks();
    let mut gate = if chunks > 0 { gate_row(0) } else { [0.0; GATE_PER_LANE] };
    let hd = item.head as i32;
    for c in 0..chunks {
        let (s, round) = ring_slot(*ring);
        *ring += 1;
        // The next chunk's gate row is loaded one iteration ahead, so its latency hides behind
        // the wait for a free stage instead of delaying this chunk's TMA loads.
        let next = if c + 1 < chunks { gate_row(c + 1) } else { [0.0; GATE_PER_LANE] };
        // SAFETY (block): barrier and tile addresses are inside the allocation; every box read
        // lies inside the chunk's valid rows of this sequence.
        unsafe {
            // A fresh barrier counts as having completed the phase before its first (parity 1).
            mbarrier_wait(smem.empty(s), (round & 1) ^ 1);
            let tok0 = item.token_start + c * CHUNK;
            let rows = item.rows(c);
            for (i, &g) in gate.iter().enumerate() {
                st_shared_f32(smem.decay(s) + ((lane + 32 * i) * 4) as u32, exp2_approx(g));
            }
            gate = next;
            let stage = smem.stage(s);
            if rows == CHUNK {
                sync_warp();
                if lane == 0 {
                    mbarrier_arrive_expect_tx(smem.full(s), STAGE_TX_BYTES);
                    let t = tok0 as i32;
                    for b in 0..KEY_BOXES {
                        let (col, off) = ((b * BOX_COLS) as i32, (b * BOX_BYTES) as u32);
                        tma_load_3d(stage + STAGE_K as u32 + off, maps.k, col, hd, t, smem.full(s));
                        tma_load_3d(stage + STAGE_W as u32 + off, maps.w, col, hd, t, smem.full(s));
                    }
                    tma_load_3d(stage + STAGE_U as u32, maps.u, item.vcol0 as i32, hd, t, smem.full(s));
                }
            } else {
                // Tail epilogue: one-row boxes for the valid rows only (the 128-byte swizzle
                // follows the shared address, so row `r` at `tile + 128 r` lands exactly where
                // the full box would put it). `k` rows past the end are zeroed: product 2 reads
                // them (times zero columns of Vn^T, which would still turn stale NaNs into NaN);
                // `w` and `u` rows there only reach Vn rows that the consumer masks to zero.
                zero_key_rows(stage + STAGE_K as u32, rows, lane);
                fence_proxy_async();
                sync_warp();
                if lane == 0 {
                    mbarrier_arrive_expect_tx(smem.full(s), rows as u32 * ROW_TX_BYTES);
                }
                sync_warp();
                let mut r = lane;
                while r < rows {
                    let (t, off) = ((tok0 + r) as i32, r as u32 * ROW_BYTES);
                    for b in 0..KEY_BOXES {
                        let (col, bo) = ((b * BOX_COLS) as i32, (b * BOX_BYTES) as u32 + off);
                        tma_load_3d(stage + STAGE_K as u32 + bo, maps.k_row, col, hd, t, smem.full(s));
                        tma_load_3d(stage + STAGE_W as u32 + bo, maps.w_row, col, hd, t, smem.full(s));
                    }
                    tma_load_3d(stage + STAGE_U as u32 + off, maps.u_row, item.vcol0 as i32, hd, t, smem.full(s));
                    r += 32;
                }
            }
        }
    }
}

/// Generic addresses of the producer's tensor maps: `k`, `w`, `u` in full-chunk boxes and in
/// one-row boxes for tail chunks.
#[derive(Clone, Copy)]
struct LoadMaps {
    k: u64,
    w: u64,
    u: u64,
    k_row: u64,
    w_row: u64,
    u_row: u64,
    /// `h0` in `[1][K][BV]` f32 boxes, when the launch has initial states.
    h0: Option<u64>,
}

impl LoadMaps {
    /// Prefetches every map into the TMA unit's descriptor cache.
    ///
    /// # Safety
    /// The addresses are the kernel's tensor-map parameters.
    #[inline(always)]
    unsafe fn prefetch(&self) {
        // (One call per map: a loop over an array of them would put the array on the stack.)
        // SAFETY: see the function's contract.
        unsafe {
            prefetch_tensormap(self.k);
            prefetch_tensormap(self.w);
            prefetch_tensormap(self.u);
            prefetch_tensormap(self.k_row);
            prefetch_tensormap(self.w_row);
            prefetch_tensormap(self.u_row);
            if let Some(h0) = self.h0 {
                prefetch_tensormap(h0);
            }
        }
    }
}

/// Gate columns each producer lane reads and exponentiates per chunk.
const GATE_PER_LANE: usize = K_DIM / 32;
/// Bytes of one item's initial state block (`[K][BV]` f32).
const H0_TX_BYTES: u32 = (K_DIM * BV * 4) as u32;
/// Bytes the one-row boxes of one tail row deliver: `k` and `w` (128 columns each) and `u` (`BV`).
const ROW_TX_BYTES: u32 = ((2 * K_DIM + BV) * 2) as u32;

/// Zeroes rows `rows..CHUNK` of both boxes of a `k` tile.
///
/// # Safety
/// Producer lanes only; `tile` is the `k` tile of a free ring stage.
#[inline(always)]
unsafe fn zero_key_rows(tile: u32, rows: usize, lane: usize) {
    let mut i = rows * CHUNKS_PER_ROW + lane;
    while i < CHUNK * CHUNKS_PER_ROW {
        for b in 0..KEY_BOXES {
            // SAFETY: inside the tile (row < CHUNK); see the function's contract.
            unsafe { st_shared_v4(tile + (b * BOX_BYTES) as u32 + (i as u32) * CHUNK16, [0; 4]) };
        }
        i += 32;
    }
}

/// Row (value column inside the block) and key/token column of accumulator element `e` of a
/// wgmma `m64nN` f32 fragment for thread `tid` of the warpgroup: element `4j + q` is row
/// `16 * warp + lane / 4 + 8 * (q / 2)`, column `8j + 2 * (lane % 4) + q % 2`.
#[inline(always)]
fn acc_coords(tid: usize, e: usize) -> (usize, usize) {
    let (warp, lane) = (tid / 32, tid % 32);
    let (j, q) = (e / ACC_PER_GROUP, e % ACC_PER_GROUP);
    (16 * warp + lane / QUAD + 8 * (q / 2), 8 * j + 2 * (lane % QUAD) + q % 2)
}

/// The consumer warpgroup's loop over this CTA's items: per item, the initial state from the
/// producer's `h0` slot (or zeros), the chunks, and the final state.
///
/// # Safety
/// Called by the 128 consumer threads only; tensors as the kernel documents.
#[inline(always)]
unsafe fn consume(work: &Work, smem: Smem, tid: usize, maps: [u64; 2], has_h0: bool, v_new: *mut u16, ht: *mut f32) {
    let mut ring = 0usize; // chunks consumed so far: the ring stage and its round
    for (n, item) in work.items().enumerate() {
        let mut s = [0f32; STATE_REGS];
        if has_h0 {
            // SAFETY: the slot holds this item's `[K][BV]` f32 block once `h0_full` completes
            // phase `n`; the consumer releases it right after reading.
            unsafe {
                mbarrier_wait(smem.h0_full(), (n & 1) as u32);
                for (e, x) in s.iter_mut().enumerate() {
                    let (v, kk) = acc_coords(tid, e);
                    *x = ld_shared_f32(smem.h0() + ((kk * BV + v) * 4) as u32);
                }
                mbarrier_arrive(smem.h0_empty());
            }
        }
        // SAFETY: as this function's.
        unsafe { consume_chunks(&item, smem, maps, v_new, &mut s, &mut ring) };
        if !ht.is_null() {
            let tid = thread_idx_x_fresh();
            let base = item.state_row * K_DIM * V_DIM + item.vcol0;
            for (e, &x) in s.iter().enumerate() {
                let (v, kk) = acc_coords(tid, e);
                // SAFETY: ht holds [N][H][K][V]; (kk, vcol0 + v) is inside this item's state.
                unsafe { *ht.add(base + kk * V_DIM + v) = x };
            }
        }
    }
    if tid == STORE_THREAD {
        // Shared memory must outlive the stores reading it; their global writes complete before
        // the grid does without waiting here.
        bulk_wait_group_read::<0>();
    }
}

/// The ring stage of the `ring`-th chunk a CTA loads (or consumes), and the round it is in (whose
/// parity the stage's barriers wait on).
#[inline(always)]
fn ring_slot(ring: usize) -> (usize, u32) {
    (ring % STAGES, (ring / STAGES) as u32)
}

/// A wgmma accumulator fragment rounded to bf16 as the A operand of the next product: the
/// accumulator layout of an `m64nN` product is the register-A layout of a k-step, 8 f32 (4 packed
/// pairs) per 16 columns.
#[inline(always)]
fn a_fragments<const STEPS: usize>(acc: &[f32]) -> [[u32; 4]; STEPS] {
    core::array::from_fn(|ks| core::array::from_fn(|p| pack_bf16x2(acc[8 * ks + 2 * p], acc[8 * ks + 2 * p + 1])))
}

/// f32 registers of the state `S^T` per consumer thread (the m64n128 accumulator).
const STATE_REGS: usize = K_DIM / 2;
/// f32 registers of `Vn^T` per consumer thread (the m64n64 accumulator).
const VN_REGS: usize = CHUNK / 2;

/// The consumer's chunks of one item, from ring position `ring` on, updating the state `s`.
///
/// # Safety
/// As for [`consume`].
#[inline(always)]
unsafe fn consume_chunks(
    item: &Item,
    smem: Smem,
    [hmap, vmap]: [u64; 2],
    v_new: *mut u16,
    s: &mut [f32; STATE_REGS],
    ring: &mut usize,
) {
    for c in 0..item.chunks() {
        let (st, round) = ring_slot(*ring);
        // The staging buffers go round robin by chunk, like the ring.
        let buf = *ring % STAGING;
        *ring += 1;
        let stage = smem.stage(st);
        let rows = item.rows(c);
        let tok0 = item.token_start + c * CHUNK;
        let tid = thread_idx_x_fresh();
        // SAFETY (block): shared addresses are inside the allocation's tiles; global stores are
        // this item's rows of `h` and the chunk's valid rows of `v_new`.
        unsafe {
            mbarrier_wait(smem.full(st), round & 1);

            // 1. u^T into product 1's accumulator; bf16(S^T) as its A fragments, also staged for
            //    `h`. The barrier keeps this from overwriting a staging buffer while the TMA store
            //    of the chunk that last used it (`STAGING` chunks back) still reads it.
            let mut vn = [0f32; VN_REGS];
            for step in 0..CHUNK / 16 {
                let (t, chunk) = matrix_row(tid, step);
                let m = ldmatrix_x4_trans(stage + STAGE_U as u32 + swizzled(t, chunk));
                // Matrix `half + 2 * group` holds fragment elements 8 * step + 4 * group + 2 * half.
                for (i, &pair) in m.iter().enumerate() {
                    let e = 8 * step + 4 * (i / 2) + 2 * (i % 2);
                    vn[e] = bf16_to_f32(pair as u16);
                    vn[e + 1] = bf16_to_f32((pair >> 16) as u16);
                }
            }
            let a1: [[u32; 4]; K_DIM / 16] = a_fragments(s);
            if tid == STORE_THREAD {
                // The stores of the chunk that last used this buffer have read it (one bulk
                // group per chunk).
                bulk_wait_group_read::<{ STAGING as u32 - 1 }>();
            }
            named_barrier(CONSUMER_BARRIER, CONSUMER_THREADS as u32);
            for (ks, a) in a1.iter().enumerate() {
                let (kk, chunk) = matrix_row(tid, ks);
                stmatrix_x4_trans(smem.h(buf) + swizzled(kk, chunk), *a);
            }

            // 2. The state's decay per key column, then Vn^T = u^T - bf16(S^T) @ w^T. (The decay
            //    is written before the product starts: ptxas waits for an in-flight wgmma before
            //    any write to registers a wgmma defined, the state's included.)
            for g in 0..STATE_REGS / ACC_PER_GROUP {
                let (_, kk) = acc_coords(tid, ACC_PER_GROUP * g);
                let [d0, d1] = ld_shared_v2_f32(smem.decay(st) + (kk * 4) as u32);
                for (q, x) in s[ACC_PER_GROUP * g..ACC_PER_GROUP * (g + 1)].iter_mut().enumerate() {
                    *x *= if q % 2 == 0 { d0 } else { d1 };
                }
            }
            wgmma_vn_start(&mut vn, &a1, sw128_desc(stage + STAGE_W as u32, UNUSED_LEADING, ATOM_BYTES));
            wgmma_wait_vn(&mut vn);

            // 3. Rows past the chunk's end leave Vn as zeros; bf16(Vn^T) as product 2's A
            //    fragments, also staged for `v_new`.
            for (e, x) in vn.iter_mut().enumerate() {
                if acc_coords(tid, e).1 >= rows {
                    *x = 0.0;
                }
            }
            let a2: [[u32; 4]; CHUNK / 16] = a_fragments(&vn);
            for (step, a) in a2.iter().enumerate() {
                let (t, chunk) = matrix_row(tid, step);
                stmatrix_x4_trans(smem.vn(buf) + swizzled(t, chunk), *a);
            }

            // 4. S^T += bf16(Vn^T) @ k, and meanwhile `h` and `v_new` leave through TMA stores
            //    (one thread issues both). A partial chunk's valid `v_new` rows are copied out
            //    with plain stores instead, since a full box would write past the sequence's end.
            wgmma_state_start(s, &a2, sw128_desc(stage + STAGE_K as u32, BOX_BYTES as u32, ATOM_BYTES));
            fence_proxy_async();
            named_barrier(CONSUMER_BARRIER, CONSUMER_THREADS as u32);
            if tid == STORE_THREAD {
                let (vcol0, head) = (item.vcol0 as i32, item.head as i32);
                let state_row = ((item.chunk_start + c) * item.heads + item.head) as i32;
                tma_store_3d(hmap, vcol0, 0, state_row, smem.h(buf));
                if rows == CHUNK {
                    tma_store_3d(vmap, vcol0, head, tok0 as i32, smem.vn(buf));
                }
                bulk_commit_group();
            }
            if rows < CHUNK {
                let mut i = tid;
                while i < rows * CHUNKS_PER_ROW {
                    let (t, j) = (i / CHUNKS_PER_ROW, i % CHUNKS_PER_ROW);
                    let bits = ld_shared_v4(smem.vn(buf) + swizzled(t, j));
                    st_global_v4(v_new.add(((tok0 + t) * item.heads + item.head) * V_DIM + item.vcol0 + j * 8), bits);
                    i += CONSUMER_THREADS;
                }
            }
            wgmma_wait_state(s);
            mbarrier_arrive(smem.empty(st));
        }
    }
}

//! The portable tensor-core kernel (sm_80+): the baseline's work split (one CTA per sequence,
//! head and block of `BV` value columns, the CTA walking the sequence's chunks in order) with both
//! products of a chunk on `mma.sync.m16n8k16` in bf16 with f32 accumulation.
//!
//! Each of the four warps keeps 32 rows of the `[K][BV]` state as accumulator fragments. Per
//! chunk (`layout::portable` has the shared tiles):
//!
//! 1. `stage_chunk`: `bf16(S)` to `h` and, transposed, to shared memory; the chunk's `w` rows
//!    as they are and its `k` rows transposed (rows past the chunk's end zero-filled); `exp2` of
//!    the last valid `gk` row.
//! 2. `corrected_values`: `Vn = u - w @ bf16(S)`, each warp 16 token rows; `bf16(Vn)` to
//!    `v_new` (valid rows) and, transposed, to shared memory (zeros past the end).
//! 3. `update_state`: `S = d * S + k^T @ bf16(Vn)`; the zero rows past the end add nothing.
//!
//! It takes the baseline's parameters (`abi::BASELINE_PARAMS`) and runs the same slice of the
//! contract (the per-key gate `gk`, K = V = 128, key-first states, packed tensors). All offsets are
//! 64-bit. Every fragment register is one 32-bit shared load (see `layout::portable`).

use crate::arch::sm80::{
    bf16_to_f32, block_idx_x, exp2_approx, ld_shared_f32, ld_shared_u32, mma_m16n8k16_bf16, pack_bf16x2,
    smem_base_shared, st_shared_f32, st_shared_u16, st_shared_u32, sync_threads, thread_idx_x, thread_idx_x_fresh,
};
use crate::layout::portable::{
    BV, COL_BLOCKS, DECAY_OFFSET, KT_OFFSET, KT_STRIDE, MMA_K, MMA_M, MMA_N, N_TILES, Place, ST_OFFSET, ST_STRIDE,
    STATE_K_STEPS, STATE_M_TILES, STATE_ROWS_PER_WARP, THREADS, VECTOR, VN_K_STEPS, VN_ROWS_PER_WARP, VNT_OFFSET,
    VNT_STRIDE, W_OFFSET, W_STRIDE,
};
use crate::layout::{CHUNK, DESC_CHUNK_START, DESC_LEN, DESC_TOKEN_START, K_DIM, SEQ_DESC_WORDS, V_DIM};

/// The state fragments of one warp: `[m16 tile][n8 tile][4]` (`mma_m16n8k16_bf16`'s `acc`).
type State = [[[f32; 4]; N_TILES]; STATE_M_TILES];

/// Shared addresses of the tiles (`layout::portable`).
#[derive(Clone, Copy)]
struct Tiles {
    w: u32,
    kt: u32,
    st: u32,
    vnt: u32,
    decay: u32,
}

impl Tiles {
    fn carve() -> Self {
        let base = smem_base_shared();
        let at = |offset: usize| base + offset as u32;
        Self { w: at(W_OFFSET), kt: at(KT_OFFSET), st: at(ST_OFFSET), vnt: at(VNT_OFFSET), decay: at(DECAY_OFFSET) }
    }

    /// The shared address of bf16 element (`row`, `col`) of the tile at `base` with rows of
    /// `stride` elements.
    fn bf16_at(base: u32, stride: usize, row: usize, col: usize) -> u32 {
        base + ((row * stride + col) * 2) as u32
    }
}

/// This thread's place in its warp's fragments (`layout::portable::Place`) and its index.
#[derive(Clone, Copy)]
struct Frag {
    tid: usize,
    place: Place,
}

impl Frag {
    fn of(tid: usize) -> Self {
        Self { tid, place: Place::of(tid) }
    }

    /// This thread's place, from a fresh read of `%tid.x` (`thread_idx_x_fresh`): each step of a
    /// chunk derives its shared addresses from it, so they are recomputed per chunk instead of
    /// living in registers across the chunk loop (there are more of them than registers).
    fn fresh() -> Self {
        Self::of(thread_idx_x_fresh())
    }

    /// The warp.
    fn warp(self) -> usize {
        self.place.warp
    }

    /// The state row and block column of accumulator element `e` of tile (`mt`, `nt`).
    fn state_at(self, mt: usize, nt: usize, e: usize) -> (usize, usize) {
        self.place.state_at(mt, nt, e)
    }
}

/// The item a CTA runs and where its data lives.
struct Item {
    /// Value head, and the key head it reads.
    head: usize,
    key_head: usize,
    heads: usize,
    key_heads: usize,
    /// First value column of the block.
    col0: usize,
    /// Element offset of the item's `[K][V]` state in `h0` and `ht`.
    state_base: usize,
}

kernel_entry! {
    /// Portable tensor-core recurrence kernel (`abi::PORTABLE`, parameters `abi::BASELINE_PARAMS`).
    /// Grid: `N * HV * COL_BLOCKS` CTAs of `THREADS` threads, `layout::portable::SMEM_BYTES` of
    /// dynamic shared memory.
    ///
    /// Pointers are bf16 bits (`u16`) or f32. `h0` and `ht` may be null (zeros in, no final state out).
    /// `seqs` is the plan's descriptor table (`SEQ_DESC_WORDS` `i64` per sequence).
    ///
    /// # Safety
    /// Every pointer must address a buffer of the contract's size for the plan in `seqs` and `heads`,
    /// 16-byte aligned; the launch must use the grid, block and shared-memory sizes above, and the
    /// outputs must not overlap the inputs.
    pub unsafe fn kda_fwd_h_portable(
        k: *const u16,
        w: *const u16,
        u: *const u16,
        gk: *const f32,
        h0: *const f32,
        h: *mut u16,
        v_new: *mut u16,
        ht: *mut f32,
        seqs: *const i64,
        heads: u32,
        key_heads: u32,
    ) {
        let (heads, key_heads) = (heads as usize, key_heads as usize);
        let group = heads.checked_div(key_heads).unwrap_or(0);
        if heads == 0 || group == 0 {
            return; // the launcher never launches so; this proves the divisions below safe
        }
        let block = block_idx_x();
        let (seq, head) = (block / (COL_BLOCKS * heads), (block / COL_BLOCKS) % heads);
        let item = Item {
            head,
            key_head: head / group,
            heads,
            key_heads,
            col0: (block % COL_BLOCKS) * BV,
            state_base: (seq * heads + head) * K_DIM * V_DIM,
        };
        let frag = Frag::of(thread_idx_x());
        // SAFETY: `seq` is a sequence of the plan (one CTA per item), so its descriptor exists.
        let (token_start, len, chunk_start) = unsafe {
            let desc = seqs.add(seq * SEQ_DESC_WORDS);
            (*desc.add(DESC_TOKEN_START) as usize, *desc.add(DESC_LEN) as usize, *desc.add(DESC_CHUNK_START) as usize)
        };
        let tiles = Tiles::carve();
        let mut state: State = [[[0.0; 4]; N_TILES]; STATE_M_TILES];
        if !h0.is_null() {
            for_each_state(&mut state, frag, |row, col, s| {
                // SAFETY: `h0` holds `[N][H][K][V]`; the element is this thread's of this item's state.
                *s = unsafe { *h0.add(item.state_base + row * V_DIM + item.col0 + col) };
            });
        }
        let chunks = len.div_ceil(CHUNK);
        for c in 0..chunks {
            let tok0 = token_start + c * CHUNK;
            let rows = if c + 1 == chunks { len - c * CHUNK } else { CHUNK };
            let h_item = ((chunk_start + c) * heads + head) * K_DIM * V_DIM;
            // SAFETY: the launcher validated every buffer against the plan and `heads`; rows beyond
            // the chunk's valid length are never read from or written to global memory; every thread
            // of the CTA runs the same steps (the barriers inside are convergent).
            unsafe {
                stage_chunk(tiles, Frag::fresh(), &item, &state, h.add(h_item), k, w, gk, tok0, rows);
                corrected_values(tiles, Frag::fresh(), &item, u, v_new, tok0, rows);
                update_state(tiles, Frag::fresh(), &mut state);
            }
        }
        if !ht.is_null() {
            for_each_state(&mut state, frag, |row, col, s| {
                // SAFETY: `ht` holds `[N][H][K][V]`; the element is this thread's of this item's state.
                unsafe { *ht.add(item.state_base + row * V_DIM + item.col0 + col) = *s };
            });
        }
    }
}

/// Calls `f(row, block column, element)` for each state element this thread holds.
#[inline(always)]
fn for_each_state(state: &mut State, frag: Frag, mut f: impl FnMut(usize, usize, &mut f32)) {
    for (mt, tiles) in state.iter_mut().enumerate() {
        for (nt, acc) in tiles.iter_mut().enumerate() {
            for (e, s) in acc.iter_mut().enumerate() {
                let (row, col) = frag.state_at(mt, nt, e);
                f(row, col, s);
            }
        }
    }
}

/// Step 1 of a chunk: `bf16(S)` to `h` (at `h_item`, this item's chunk state) and to the
/// transposed tile; the chunk's `w` and transposed `k` rows and `exp2` of its last gate row to
/// shared memory.
///
/// # Safety
/// Every thread of the CTA calls it; the chunk's `rows` tokens from `tok0` are the sequence's.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn stage_chunk(
    tiles: Tiles,
    frag: Frag,
    item: &Item,
    state: &State,
    h_item: *mut u16,
    k: *const u16,
    w: *const u16,
    gk: *const f32,
    tok0: usize,
    rows: usize,
) {
    // SAFETY: see the function's contract; every shared address is inside its tile.
    unsafe {
        for (mt, acc_row) in state.iter().enumerate() {
            for (nt, acc) in acc_row.iter().enumerate() {
                for half in 0..2 {
                    let (row, col) = frag.state_at(mt, nt, 2 * half);
                    let pair = pack_bf16x2(acc[2 * half], acc[2 * half + 1]);
                    // Columns `col` and `col + 1` of row `row`: one aligned 32-bit store.
                    *(h_item.add(row * V_DIM + item.col0 + col) as *mut u32) = pair;
                    st_shared_u16(Tiles::bf16_at(tiles.st, ST_STRIDE, col, row), pair as u16);
                    st_shared_u16(Tiles::bf16_at(tiles.st, ST_STRIDE, col + 1, row), (pair >> 16) as u16);
                }
            }
        }
        stage_w(tiles.w, w, tok0, rows, item.head, item.heads, frag.tid);
        stage_k_transposed(tiles.kt, k, tok0, rows, item.key_head, item.key_heads, frag.tid);
        if frag.tid < K_DIM {
            let last = ((tok0 + rows - 1) * item.heads + item.head) * K_DIM + frag.tid;
            st_shared_f32(tiles.decay + (frag.tid * 4) as u32, exp2_approx(*gk.add(last)));
        }
        sync_threads();
    }
}

/// 16 bytes, so that a copy moves eight bf16 with one vector load.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct Vector([u32; 4]);

/// The 16-byte vector `i` of row `t` of a chunk of a `[T, heads, K_DIM]` bf16 tensor, zeros past
/// the chunk's `rows` valid rows.
///
/// # Safety
/// Tokens `tok0 .. tok0 + rows` exist in `src`, whose rows are 16-byte aligned.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn row_vector(
    src: *const u16,
    tok0: usize,
    rows: usize,
    head: usize,
    heads: usize,
    t: usize,
    i: usize,
) -> Vector {
    if t >= rows {
        return Vector([0; 4]);
    }
    // SAFETY: see the function's contract.
    unsafe { *(src.add(((tok0 + t) * heads + head) * K_DIM + i * VECTOR) as *const Vector) }
}

/// The chunk's `w` rows into the token-major tile (`W_STRIDE`), zero past `rows`.
///
/// # Safety
/// As [`row_vector`]; every thread of the CTA calls it with its own `tid`.
#[inline(always)]
unsafe fn stage_w(tile: u32, w: *const u16, tok0: usize, rows: usize, head: usize, heads: usize, tid: usize) {
    const PER_ROW: usize = K_DIM / VECTOR;
    let mut idx = tid;
    while idx < CHUNK * PER_ROW {
        let (t, i) = (idx / PER_ROW, idx % PER_ROW);
        // SAFETY: see the function's contract; the tile row is 16-byte aligned (`W_STRIDE`).
        unsafe {
            let v = row_vector(w, tok0, rows, head, heads, t, i);
            let at = Tiles::bf16_at(tile, W_STRIDE, t, i * VECTOR);
            for (j, word) in v.0.iter().enumerate() {
                st_shared_u32(at + (4 * j) as u32, *word);
            }
        }
        idx += THREADS;
    }
}

/// The chunk's `k` rows into the key-major tile (`KT_STRIDE`): element (`t`, `a`) of the chunk at
/// row `a`, column `t`; zero past `rows`.
///
/// # Safety
/// As [`row_vector`]; every thread of the CTA calls it with its own `tid`.
#[inline(always)]
unsafe fn stage_k_transposed(
    tile: u32,
    k: *const u16,
    tok0: usize,
    rows: usize,
    head: usize,
    heads: usize,
    tid: usize,
) {
    const PER_ROW: usize = K_DIM / VECTOR;
    let mut idx = tid;
    while idx < CHUNK * PER_ROW {
        let (t, i) = (idx / PER_ROW, idx % PER_ROW);
        // SAFETY: see the function's contract; `a` stays below K_DIM and `t` below CHUNK.
        unsafe {
            let v = row_vector(k, tok0, rows, head, heads, t, i);
            for (j, word) in v.0.iter().enumerate() {
                let a = i * VECTOR + 2 * j;
                st_shared_u16(Tiles::bf16_at(tile, KT_STRIDE, a, t), *word as u16);
                st_shared_u16(Tiles::bf16_at(tile, KT_STRIDE, a + 1, t), (*word >> 16) as u16);
            }
        }
        idx += THREADS;
    }
}

/// An A fragment of `mma_m16n8k16_bf16` from a row-major bf16 tile: the 16 x 16 block whose top
/// left element is (`row0`, `col0`).
///
/// # Safety
/// The block lies inside the tile; the address is shared.
#[inline(always)]
unsafe fn a_fragment(tile: u32, stride: usize, frag: Frag, row0: usize, col0: usize) -> [u32; 4] {
    // SAFETY: see the function's contract; each pair is 4-byte aligned (even column, even stride).
    frag.place.a_pairs(row0, col0).map(|(r, c)| unsafe { ld_shared_u32(Tiles::bf16_at(tile, stride, r, c)) })
}

/// A B fragment of `mma_m16n8k16_bf16` from a transposed (column-major) bf16 tile, whose row `n`
/// holds column `n` of B: the 16 x 8 block of B whose top left element is (`k0`, `n0`).
///
/// # Safety
/// The block lies inside the tile; the address is shared.
#[inline(always)]
unsafe fn b_fragment(tile_t: u32, stride: usize, frag: Frag, k0: usize, n0: usize) -> [u32; 2] {
    // SAFETY: see the function's contract.
    frag.place.b_pairs(k0, n0).map(|(n, kk)| unsafe { ld_shared_u32(Tiles::bf16_at(tile_t, stride, n, kk)) })
}

/// Step 2: `Vn = u - w @ bf16(S)` for this warp's 16 token rows; `bf16(Vn)` to the transposed
/// tile (zeros past the chunk's end) and, for the valid rows, to `v_new`.
///
/// # Safety
/// Every thread of the CTA calls it after [`stage_chunk`].
#[inline(always)]
unsafe fn corrected_values(
    tiles: Tiles,
    frag: Frag,
    item: &Item,
    u: *const u16,
    v_new: *mut u16,
    tok0: usize,
    rows: usize,
) {
    let row0 = frag.warp() * VN_ROWS_PER_WARP;
    let mut acc = [[0.0f32; 4]; N_TILES];
    // SAFETY: see the function's contract; rows past `rows` touch shared memory only.
    unsafe {
        for ks in 0..VN_K_STEPS {
            let a = a_fragment(tiles.w, W_STRIDE, frag, row0, ks * MMA_K);
            for (nt, acc) in acc.iter_mut().enumerate() {
                mma_m16n8k16_bf16(acc, a, b_fragment(tiles.st, ST_STRIDE, frag, ks * MMA_K, nt * MMA_N));
            }
        }
        for (nt, acc) in acc.iter().enumerate() {
            let col = nt * MMA_N + 2 * frag.place.t;
            for half in 0..2 {
                let t = row0 + frag.place.g + 8 * half;
                let pair = if t < rows {
                    let idx = ((tok0 + t) * item.heads + item.head) * V_DIM + item.col0 + col;
                    let given = *(u.add(idx) as *const u32);
                    let lo = bf16_to_f32(given as u16) - acc[2 * half];
                    let hi = bf16_to_f32((given >> 16) as u16) - acc[2 * half + 1];
                    let pair = pack_bf16x2(lo, hi);
                    *(v_new.add(idx) as *mut u32) = pair;
                    pair
                } else {
                    0
                };
                st_shared_u16(Tiles::bf16_at(tiles.vnt, VNT_STRIDE, col, t), pair as u16);
                st_shared_u16(Tiles::bf16_at(tiles.vnt, VNT_STRIDE, col + 1, t), (pair >> 16) as u16);
            }
        }
        sync_threads();
    }
}

/// Step 3: `S = d * S + k^T @ bf16(Vn)` over the chunk's tokens (the rows past its end are zero
/// in both tiles); then the CTA barrier before the next chunk overwrites the tiles.
///
/// # Safety
/// Every thread of the CTA calls it after [`corrected_values`].
#[inline(always)]
unsafe fn update_state(tiles: Tiles, frag: Frag, state: &mut State) {
    // SAFETY: see the function's contract; every index is inside its shared tile.
    unsafe {
        for_each_state(state, frag, |row, _, s| *s *= ld_shared_f32(tiles.decay + (row * 4) as u32));
        for ks in 0..STATE_K_STEPS {
            let mut a = [[0u32; 4]; STATE_M_TILES];
            for (mt, a) in a.iter_mut().enumerate() {
                let row0 = frag.warp() * STATE_ROWS_PER_WARP + mt * MMA_M;
                *a = a_fragment(tiles.kt, KT_STRIDE, frag, row0, ks * MMA_K);
            }
            let b: [[u32; 2]; N_TILES] =
                core::array::from_fn(|nt| b_fragment(tiles.vnt, VNT_STRIDE, frag, ks * MMA_K, nt * MMA_N));
            for (row, a) in state.iter_mut().zip(&a) {
                for (acc, b) in row.iter_mut().zip(&b) {
                    mma_m16n8k16_bf16(acc, *a, *b);
                }
            }
        }
        sync_threads();
    }
}

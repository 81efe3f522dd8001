//! The baseline kernel: a straightforward, portable (sm_80+) implementation of the whole contract.
//!
//! One CTA per (sequence, head, column block of `BV` value columns); the CTA walks the sequence's
//! chunks in order. Each thread keeps `STATE_ROWS` rows of one state column in registers. Per
//! chunk:
//!
//! 1. `bf16(S)` goes to shared memory and to `h`; the chunk's `k` and `w` rows (only its `L` valid
//!    rows; the rest are zero-filled) and `exp2` of its last valid `gk` row are staged in shared
//!    memory.
//! 2. `Vn = u - w @ bf16(S)` for the chunk's rows: each thread computes `VN_ROWS` rows of its column
//!    with scalar FMAs; `bf16(Vn)` goes to shared memory and, for the valid rows, to `v_new`.
//! 3. `S = d * S + k^T @ bf16(Vn)` over the `L` valid rows.
//!
//! All offsets are 64-bit, so tensors beyond 2^31 elements index correctly. This kernel is the
//! reference point the warp-specialized Hopper kernel is measured against and the fallback on
//! devices before sm_90.

use crate::arch::sm80::{
    bf16_to_f32, block_idx_x, exp2_approx, f32_to_bf16, smem_base_generic, sync_threads, thread_idx_x,
};
use crate::layout::baseline::{BV, COL_BLOCKS, STATE_ROWS, THREADS, VN_ROWS};
use crate::layout::{CHUNK, DESC_CHUNK_START, DESC_LEN, DESC_SEQ, DESC_TOKEN_START, K_DIM, SEQ_DESC_WORDS, V_DIM};

/// Shared-memory tiles of one CTA, carved from the dynamic shared memory.
struct Tiles {
    /// `k` rows of the chunk, bf16 `[CHUNK][K_DIM]`.
    k: *mut u16,
    /// `w` rows of the chunk, bf16 `[CHUNK][K_DIM]`.
    w: *mut u16,
    /// `bf16(S)` of this CTA's columns, `[K_DIM][BV]`.
    s: *mut u16,
    /// `bf16(Vn)` of this CTA's columns, `[CHUNK][BV]`.
    vn: *mut u16,
    /// `exp2` of the chunk's last valid gate row, f32 `[K_DIM]`.
    decay: *mut f32,
}

impl Tiles {
    /// Lays the tiles out back to back (sizes as in `layout::baseline::SMEM_BYTES`).
    fn carve() -> Self {
        let base = smem_base_generic() as *mut u16;
        // SAFETY: offsets stay inside SMEM_BYTES, which the launcher allocates.
        unsafe {
            let k = base;
            let w = k.add(CHUNK * K_DIM);
            let s = w.add(CHUNK * K_DIM);
            let vn = s.add(K_DIM * BV);
            let decay = vn.add(CHUNK * BV) as *mut f32;
            Self { k, w, s, vn, decay }
        }
    }
}

kernel_entry! {
    /// Baseline recurrence kernel (`abi::BASELINE`, parameters `abi::BASELINE_PARAMS`). Grid: `N * HV * COL_BLOCKS` CTAs of `THREADS`
    /// threads, `layout::baseline::SMEM_BYTES` of dynamic shared memory.
    ///
    /// Pointers are bf16 bits (`u16`) or f32. `h0` and `ht` may be null (zeros in, no final state out).
    /// `seqs` is the plan's descriptor table (`SEQ_DESC_WORDS` `i64` per sequence).
    ///
    /// # Safety
    /// Every pointer must address a buffer of the contract's size for the plan in `seqs` and `heads`,
    /// the launch must use the grid, block and shared-memory sizes above, and the outputs must not
    /// overlap the inputs.
    pub unsafe fn kda_fwd_h_baseline(
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
        let item = block_idx_x();
        // The descriptors are in launch order (longest first), each naming its sequence.
        let (rank, head) = (item / (COL_BLOCKS * heads), (item / COL_BLOCKS) % heads);
        // SAFETY: `rank` is below the plan's sequences (one CTA per item), so its descriptor exists.
        let (token_start, len, chunk_start, seq) = unsafe {
            let desc = seqs.add(rank * SEQ_DESC_WORDS);
            let word = |i: usize| *desc.add(i) as usize;
            (word(DESC_TOKEN_START), word(DESC_LEN), word(DESC_CHUNK_START), word(DESC_SEQ))
        };
        let at = Place::of(thread_idx_x(), item % COL_BLOCKS, seq, head, heads, key_heads);
        let tiles = Tiles::carve();
        let mut state = [0.0f32; STATE_ROWS];
        if !h0.is_null() {
            for (r, s) in state.iter_mut().enumerate() {
                // SAFETY: `h0` holds `[N][H][K][V]`; the element is this thread's of this item's state.
                *s = unsafe { *h0.add(at.state_base + (at.row0 + r) * V_DIM + at.vcol) };
            }
        }
        let chunks = len.div_ceil(CHUNK);
        for c in 0..chunks {
            let tok0 = token_start + c * CHUNK;
            let rows = if c + 1 == chunks { len - c * CHUNK } else { CHUNK };
            let h_base = ((chunk_start + c) * heads + at.head) * K_DIM * V_DIM;
            // SAFETY: the launcher validated every buffer against the plan and `heads`; rows beyond
            // the chunk's valid length are never read from or written to global memory; every thread
            // of the CTA runs the same steps (the barriers inside are convergent).
            unsafe {
                stage_chunk(&tiles, &at, &state, h.add(h_base), k, w, gk, tok0, rows);
                corrected_values(&tiles, &at, u, v_new, tok0, rows);
                update_state(&tiles, &at, &mut state, rows);
            }
        }
        if !ht.is_null() {
            for (r, s) in state.iter().enumerate() {
                // SAFETY: `ht` holds `[N][H][K][V]`; the element is this thread's of this item's state.
                unsafe { *ht.add(at.state_base + (at.row0 + r) * V_DIM + at.vcol) = *s };
            }
        }
    }
}

/// Where this thread works: its value column and its state rows of one item.
struct Place {
    tid: usize,
    /// Column inside the CTA's block.
    col: usize,
    /// Group of threads (one warp): the rows below are warp-uniform.
    group: usize,
    /// Global value column.
    vcol: usize,
    /// First of this thread's `STATE_ROWS` state rows.
    row0: usize,
    /// The value head.
    head: usize,
    /// Value heads of the batch.
    heads: usize,
    /// The head of `k` the value head reads.
    key_head: usize,
    /// Key heads of the batch.
    key_heads: usize,
    /// Element offset of the item's `[K][V]` state in `h0` and `ht`.
    state_base: usize,
}

impl Place {
    #[inline(always)]
    fn of(tid: usize, col_block: usize, seq: usize, head: usize, heads: usize, key_heads: usize) -> Self {
        let (col, group) = (tid % BV, tid / BV);
        // `heads` is a nonzero multiple of `key_heads` (the caller returned otherwise).
        let key_head = head / (heads / key_heads);
        Self {
            tid,
            col,
            group,
            vcol: col_block * BV + col,
            row0: group * STATE_ROWS,
            head,
            heads,
            key_head,
            key_heads,
            state_base: (seq * heads + head) * K_DIM * V_DIM,
        }
    }
}

/// Step 1 of a chunk: `bf16(S)` to shared memory and to `h` (at `h_item`, this item's chunk
/// state), the chunk's `k` and `w` rows and `exp2` of its last gate row to shared memory.
///
/// # Safety
/// Every thread of the CTA calls it; the chunk's `rows` tokens from `tok0` are the sequence's.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn stage_chunk(
    tiles: &Tiles,
    at: &Place,
    state: &[f32; STATE_ROWS],
    h_item: *mut u16,
    k: *const u16,
    w: *const u16,
    gk: *const f32,
    tok0: usize,
    rows: usize,
) {
    // SAFETY: see the function's contract.
    unsafe {
        for (r, s) in state.iter().enumerate() {
            let bits = f32_to_bf16(*s);
            *tiles.s.add((at.row0 + r) * BV + at.col) = bits;
            *h_item.add((at.row0 + r) * V_DIM + at.vcol) = bits;
        }
        stage_rows(tiles.k, k, tok0, rows, at.key_head, at.key_heads, at.tid);
        stage_rows(tiles.w, w, tok0, rows, at.head, at.heads, at.tid);
        if at.tid < K_DIM {
            let last = ((tok0 + rows - 1) * at.heads + at.head) * K_DIM + at.tid;
            *tiles.decay.add(at.tid) = exp2_approx(*gk.add(last));
        }
        sync_threads();
    }
}

/// Step 2: `Vn = u - w @ bf16(S)` for this thread's rows `t = group * VN_ROWS + q`; `bf16(Vn)`
/// to shared memory (zeros past the chunk's end) and, for the valid rows, to `v_new`.
///
/// # Safety
/// Every thread of the CTA calls it after [`stage_chunk`].
#[inline(always)]
unsafe fn corrected_values(tiles: &Tiles, at: &Place, u: *const u16, v_new: *mut u16, tok0: usize, rows: usize) {
    let t0 = at.group * VN_ROWS;
    let mut acc = [0.0f32; VN_ROWS];
    // SAFETY: see the function's contract; rows past `rows` touch shared memory only.
    unsafe {
        for i in 0..K_DIM {
            let s = bf16_to_f32(*tiles.s.add(i * BV + at.col));
            for (q, a) in acc.iter_mut().enumerate() {
                *a += bf16_to_f32(*tiles.w.add((t0 + q) * K_DIM + i)) * s;
            }
        }
        for (q, a) in acc.iter().enumerate() {
            let t = t0 + q;
            let bits = if t < rows {
                let idx = ((tok0 + t) * at.heads + at.head) * V_DIM + at.vcol;
                let bits = f32_to_bf16(bf16_to_f32(*u.add(idx)) - *a);
                *v_new.add(idx) = bits;
                bits
            } else {
                0
            };
            *tiles.vn.add(t * BV + at.col) = bits;
        }
        sync_threads();
    }
}

/// Step 3: `S = d * S + k^T @ bf16(Vn)` over the chunk's valid rows; then the CTA barrier before
/// the next chunk overwrites the tiles.
///
/// # Safety
/// Every thread of the CTA calls it after [`corrected_values`].
#[inline(always)]
unsafe fn update_state(tiles: &Tiles, at: &Place, state: &mut [f32; STATE_ROWS], rows: usize) {
    // SAFETY: see the function's contract; every index is inside its shared tile.
    unsafe {
        for (r, s) in state.iter_mut().enumerate() {
            *s *= *tiles.decay.add(at.row0 + r);
        }
        for t in 0..rows {
            let v = bf16_to_f32(*tiles.vn.add(t * BV + at.col));
            for (r, s) in state.iter_mut().enumerate() {
                *s += bf16_to_f32(*tiles.k.add(t * K_DIM + at.row0 + r)) * v;
            }
        }
        sync_threads();
    }
}

/// Copies the `rows` valid rows of a chunk of a `[T, H, K_DIM]` bf16 tensor into a shared
/// `[CHUNK][K_DIM]` tile, zero-filling the rows past the chunk's end, with 32-bit accesses spread
/// over the CTA.
///
/// # Safety
/// `tile` is a shared tile of `CHUNK * K_DIM` elements; tokens `tok0 .. tok0 + rows` exist in
/// `src`; every thread of the CTA calls this with the same arguments but its own `tid`.
#[inline(always)]
unsafe fn stage_rows(tile: *mut u16, src: *const u16, tok0: usize, rows: usize, head: usize, heads: usize, tid: usize) {
    const PAIRS_PER_ROW: usize = K_DIM / 2;
    let tile = tile as *mut u32;
    let mut idx = tid;
    while idx < CHUNK * PAIRS_PER_ROW {
        let (t, p) = (idx / PAIRS_PER_ROW, idx % PAIRS_PER_ROW);
        // SAFETY: see the function's contract; `src` rows are 4-byte aligned (K_DIM is even and
        // the launcher checks the base alignment).
        unsafe {
            let v = if t < rows { *(src.add(((tok0 + t) * heads + head) * K_DIM) as *const u32).add(p) } else { 0 };
            *tile.add(idx) = v;
        }
        idx += THREADS;
    }
}

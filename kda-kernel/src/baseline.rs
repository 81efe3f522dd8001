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
    bf16_to_f32, block_idx_x, exp2_approx, f32_to_bf16, smem_base_generic, sync_threads,
    thread_idx_x,
};
use crate::layout::baseline::{BV, COL_BLOCKS, STATE_ROWS, THREADS, VN_ROWS};
use crate::layout::{CHUNK, DESC_CHUNK_START, DESC_LEN, DESC_TOKEN_START, K_DIM, SEQ_DESC_WORDS, V_DIM};

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

/// Baseline recurrence kernel (`abi::BASELINE`, parameters `abi::BASELINE_PARAMS`). Grid: `N * H * COL_BLOCKS` CTAs of `THREADS`
/// threads, `layout::baseline::SMEM_BYTES` of dynamic shared memory.
///
/// Pointers are bf16 bits (`u16`) or f32. `h0` and `ht` may be null (zeros in, no final state out).
/// `seqs` is the plan's descriptor table (`SEQ_DESC_WORDS` `i64` per sequence).
///
/// # Safety
/// Every pointer must address a buffer of the contract's size for the plan in `seqs` and `heads`,
/// the launch must use the grid, block and shared-memory sizes above, and the outputs must not
/// overlap the inputs.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn kda_fwd_h_baseline(
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
) {
    if heads == 0 {
        return; // the launcher never launches with no heads; this proves `% heads` below safe
    }
    let heads = heads as usize;
    let item = block_idx_x();
    let col_block = item % COL_BLOCKS;
    let head = (item / COL_BLOCKS) % heads;
    let seq = item / (COL_BLOCKS * heads);

    let tid = thread_idx_x();
    let col = tid % BV; // this thread's column inside the block
    let group = tid / BV; // one warp per group: rows below are warp-uniform
    let vcol = col_block * BV + col; // global value column

    // SAFETY (whole body): indices are derived from the plan and `heads`, which the launcher
    // validated against every buffer's length; rows beyond a chunk's valid length are never read
    // from or written to global memory.
    unsafe {
        let desc = seqs.add(seq * SEQ_DESC_WORDS);
        let token_start = *desc.add(DESC_TOKEN_START) as usize;
        let len = *desc.add(DESC_LEN) as usize;
        let chunk_start = *desc.add(DESC_CHUNK_START) as usize;
        let tiles = Tiles::carve();

        // State rows of this thread: i = group * STATE_ROWS + r.
        let row0 = group * STATE_ROWS;
        let state_base = (seq * heads + head) * K_DIM * V_DIM;
        let mut state = [0.0f32; STATE_ROWS];
        if !h0.is_null() {
            for (r, s) in state.iter_mut().enumerate() {
                *s = *h0.add(state_base + (row0 + r) * V_DIM + vcol);
            }
        }

        let chunks = len.div_ceil(CHUNK);
        for c in 0..chunks {
            let tok0 = token_start + c * CHUNK;
            let rows = if c + 1 == chunks { len - c * CHUNK } else { CHUNK };
            let h_base = ((chunk_start + c) * heads + head) * K_DIM * V_DIM;

            // 1. bf16(S) to shared memory and to h.
            for (r, s) in state.iter().enumerate() {
                let bits = f32_to_bf16(*s);
                *tiles.s.add((row0 + r) * BV + col) = bits;
                *h.add(h_base + (row0 + r) * V_DIM + vcol) = bits;
            }
            stage_rows(tiles.k, k, tok0, rows, head, heads, tid);
            stage_rows(tiles.w, w, tok0, rows, head, heads, tid);
            if tid < K_DIM {
                let last = ((tok0 + rows - 1) * heads + head) * K_DIM + tid;
                *tiles.decay.add(tid) = exp2_approx(*gk.add(last));
            }
            sync_threads();

            // 2. Vn = u - w @ bf16(S) for rows t = group * VN_ROWS + q.
            let t0 = group * VN_ROWS;
            let mut acc = [0.0f32; VN_ROWS];
            for i in 0..K_DIM {
                let s = bf16_to_f32(*tiles.s.add(i * BV + col));
                for (q, a) in acc.iter_mut().enumerate() {
                    *a += bf16_to_f32(*tiles.w.add((t0 + q) * K_DIM + i)) * s;
                }
            }
            for (q, a) in acc.iter().enumerate() {
                let t = t0 + q;
                let bits = if t < rows {
                    let at = ((tok0 + t) * heads + head) * V_DIM + vcol;
                    let bits = f32_to_bf16(bf16_to_f32(*u.add(at)) - *a);
                    *v_new.add(at) = bits;
                    bits
                } else {
                    0
                };
                *tiles.vn.add(t * BV + col) = bits;
            }
            sync_threads();

            // 3. S = d * S + k^T @ bf16(Vn) over the valid rows.
            for (r, s) in state.iter_mut().enumerate() {
                *s *= *tiles.decay.add(row0 + r);
            }
            for t in 0..rows {
                let v = bf16_to_f32(*tiles.vn.add(t * BV + col));
                for (r, s) in state.iter_mut().enumerate() {
                    *s += bf16_to_f32(*tiles.k.add(t * K_DIM + row0 + r)) * v;
                }
            }
            // The next chunk overwrites the tiles.
            sync_threads();
        }

        if !ht.is_null() {
            for (r, s) in state.iter().enumerate() {
                *ht.add(state_base + (row0 + r) * V_DIM + vcol) = *s;
            }
        }
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
unsafe fn stage_rows(
    tile: *mut u16,
    src: *const u16,
    tok0: usize,
    rows: usize,
    head: usize,
    heads: usize,
    tid: usize,
) {
    const PAIRS_PER_ROW: usize = K_DIM / 2;
    let tile = tile as *mut u32;
    let mut idx = tid;
    while idx < CHUNK * PAIRS_PER_ROW {
        let (t, p) = (idx / PAIRS_PER_ROW, idx % PAIRS_PER_ROW);
        // SAFETY: see the function's contract; `src` rows are 4-byte aligned (K_DIM is even and
        // the launcher checks the base alignment).
        unsafe {
            let v = if t < rows {
                *(src.add(((tok0 + t) * heads + head) * K_DIM) as *const u32).add(p)
            } else {
                0
            };
            *tile.add(idx) = v;
        }
        idx += THREADS;
    }
}

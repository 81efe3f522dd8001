//! The tail epilogue: a sequence's partial last chunk (`rows < CHUNK` valid tokens).
//!
//! A full-tile TMA box there would read, and a full `v_new` box would write, the next sequence's
//! tokens. So the producer loads only the valid rows, as one-row TMA boxes spread over its lanes
//! into the same swizzled layout (the 128-byte swizzle follows the shared address, so row `r`
//! at `tile + 128 r` lands exactly where the full box would put it), and zeroes the `k` rows past
//! the end; the consumer zeroes `Vn`'s rows past the end and stores the valid `v_new` rows with
//! plain coalesced stores. `h` needs no tail: it is a whole state per chunk.

use super::fragments::{CHUNK16, CHUNKS_PER_ROW, ROW_BYTES, acc_coords, swizzled};
use super::maps::LoadMaps;
use super::smem::StageTiles;
use crate::arch::sm80::{ld_shared_v4, st_global_v4, st_shared_v4, sync_warp};
use crate::arch::sm90::{fence_proxy_async, tma_load_3d};
use crate::layout::hopper::{BOX_COLS, BV, CONSUMER_THREADS, KEY_BOXES, PRODUCER_THREADS, STAGES};
use crate::layout::{CHUNK, K_DIM, V_DIM};
use crate::pipeline::{Pipeline, PipelineState};
use crate::schedule::Item;

/// bf16 elements in one 16-byte chunk.
const BF16_PER_CHUNK16: usize = CHUNK16 as usize / 2;

/// Bytes the one-row boxes of one tail row deliver: `k` and `w` (K columns each) and `u` (`BV`).
const ROW_TX_BYTES: u32 = ((2 * K_DIM + BV) * 2) as u32;

/// The producer's loads of a partial chunk `c` of `item` into the stage `tiles`.
///
/// `k` rows past the end are zeroed: product 2 reads them (times zero columns of `Vn^T`, which
/// would still turn stale NaNs into NaN); `w` and `u` rows there only reach `Vn` rows that the
/// consumer zeroes ([`zero_rows_past_end`]).
///
/// # Safety
/// Producer warp only; chunk `c` is the item's last and partial; `s` is held by the producer.
#[inline(always)]
pub unsafe fn load_partial_chunk(
    item: &Item,
    c: usize,
    tiles: StageTiles,
    lane: usize,
    maps: &LoadMaps,
    ring: Pipeline<STAGES>,
    s: PipelineState<STAGES>,
) {
    let rows = item.rows(c);
    let (tok0, hd) = (item.first_token(c), item.head as i32);
    // SAFETY: the stage is the producer's; the zeroing is ordered before the consumer's async
    // (wgmma) reads by the proxy fence and the arrival; each one-row box is a valid token of this
    // sequence, and the bytes announced are exactly those boxes'.
    unsafe {
        zero_key_rows(tiles, rows, lane);
        fence_proxy_async();
        sync_warp();
        if lane == 0 {
            ring.producer_commit_tx(s, rows as u32 * ROW_TX_BYTES);
        }
        sync_warp();
        let mut r = lane;
        while r < rows {
            let (t, off) = ((tok0 + r) as i32, r as u32 * ROW_BYTES);
            for b in 0..KEY_BOXES {
                let col = (b * BOX_COLS) as i32;
                tma_load_3d(tiles.k(b) + off, maps.k_row, col, hd, t, ring.full(s));
                tma_load_3d(tiles.w(b) + off, maps.w_row, col, hd, t, ring.full(s));
            }
            tma_load_3d(tiles.u() + off, maps.u_row, item.vcol0 as i32, hd, t, ring.full(s));
            r += PRODUCER_THREADS;
        }
    }
}

/// Zeroes rows `rows..CHUNK` of both boxes of the stage's `k` tile.
///
/// # Safety
/// Producer lanes only; the stage is free.
#[inline(always)]
unsafe fn zero_key_rows(tiles: StageTiles, rows: usize, lane: usize) {
    let mut i = rows * CHUNKS_PER_ROW + lane;
    while i < CHUNK * CHUNKS_PER_ROW {
        for b in 0..KEY_BOXES {
            // SAFETY: inside the tile (row < CHUNK); see the function's contract.
            unsafe { st_shared_v4(tiles.k(b) + (i as u32) * CHUNK16, [0; 4]) };
        }
        i += PRODUCER_THREADS;
    }
}

/// Zeroes the elements of the `Vn^T` accumulator whose token (column) is at or past `rows`, so
/// rows past a chunk's end add nothing to the state. A no-op on full chunks.
#[inline(always)]
pub fn zero_rows_past_end(vn: &mut [f32], rows: usize, tid: usize) {
    for (e, x) in vn.iter_mut().enumerate() {
        if acc_coords(tid, e).1 >= rows {
            *x = 0.0;
        }
    }
}

/// Copies the `rows` valid rows of a chunk's staged `bf16(Vn)` tile to `v_new`, 16 bytes per
/// thread and step, spread over the consumer warpgroup.
///
/// # Safety
/// Consumer threads only, after the staging tile is written and published by the consumer
/// barrier; tokens `tok0 .. tok0 + rows` are this sequence's.
#[inline(always)]
pub unsafe fn store_value_rows(staged: u32, v_new: *mut u16, item: &Item, tok0: usize, rows: usize, tid: usize) {
    let mut i = tid;
    while i < rows * CHUNKS_PER_ROW {
        let (t, j) = (i / CHUNKS_PER_ROW, i % CHUNKS_PER_ROW);
        // SAFETY: row `t < rows` of the tile, and of this item's columns of `v_new`.
        unsafe {
            let bits = ld_shared_v4(staged + swizzled(t, j));
            st_global_v4(
                v_new.add(((tok0 + t) * item.heads + item.head) * V_DIM + item.vcol0 + j * BF16_PER_CHUNK16),
                bits,
            );
        }
        i += CONSUMER_THREADS;
    }
}

//! The tail epilogue: a sequence's partial last chunk (`rows < CHUNK` valid tokens).
//!
//! A full-tile TMA box there would read, and a full `v_new` box would write, the next sequence's
//! tokens. So the producer loads only the valid rows, in boxes of one swizzle atom of rows
//! (`ATOM_ROWS`) and then one-row boxes for the rest, spread over its lanes into the same
//! swizzled layout (the 128-byte swizzle follows the shared address and repeats every atom, so
//! rows `r..r + n` at `tile + 128 r` land exactly where the full box would put them), and zeroes
//! the `k` rows past the end; the consumer zeroes `Vn`'s rows past the end and stores the valid
//! `v_new` rows with plain coalesced stores. `h` needs no tail: it is a whole state per chunk.
//! In the fused layer pass the `q Γ` and attention rows past the end are left as they are: they
//! reach only the `o` columns past the end, which are never stored (the attention's valid rows
//! are zero past their diagonal, so the zeroed `Vn` columns stay out of the valid ones).

use super::fragments::{CHUNK16, CHUNKS_PER_ROW, ROW_BYTES, acc_coords, swizzled_rows};
use super::keys::KeySize;
use super::maps::Outputs;
use super::maps::{ChunkLoad, u_box_column};
use super::smem::StageTiles;
use crate::arch::sm80::{ld_shared_v4, st_global_v4, st_shared_v4, sync_warp};
use crate::arch::sm90::fence_proxy_async;
use crate::layout::CHUNK;
use crate::layout::hopper::{ATOM_ROWS, BOX_COLS, Block, CONSUMER_THREADS, PRODUCER_THREADS, TAIL_BOXES, tail_box};
use crate::schedule::Item;

/// Every box a tail chunk needs has a lane of the producer warp.
const _: () = assert!(TAIL_BOXES <= PRODUCER_THREADS);

/// bf16 elements in one 16-byte chunk.
const BF16_PER_CHUNK16: usize = CHUNK16 as usize / 2;

/// The producer's loads of a partial chunk into its stage.
///
/// `k` rows past the end are zeroed: product 2 reads them (times zero columns of `Vn^T`, which
/// would still turn stale NaNs into NaN); `w` and `u` rows there only reach `Vn` rows that the
/// consumer zeroes ([`zero_rows_past_end`]).
///
/// # Safety
/// Producer warp only; the chunk is the item's last and partial.
#[inline(always)]
pub unsafe fn load_partial_chunk<C: KeySize, B: Block>(load: ChunkLoad<'_>) {
    let (item, tiles, maps, lane) = (load.item, load.tiles, load.maps, load.lane);
    let (rows, tok0) = (item.rows(load.c), item.first_token(load.c));
    // SAFETY: the stage is the producer's; each lane's zeroing is ordered before the consumer's
    // async (wgmma) reads by the proxy fence and the lane's arrival; every row of each box is a
    // valid token of this sequence, and the bytes announced are exactly those boxes' (announced
    // before any is issued: the warp barrier after the commit).
    unsafe {
        zero_key_rows(tiles, C::KB, rows, lane);
        fence_proxy_async();
        sync_warp();
        if lane == 0 {
            // Per row: `k` and `w` (K columns each), the `u` box (`BOX_COLS`, unless the
            // values are zero) and, fused, `q Γ` (K) and the attention row (`CHUNK`), bf16.
            let u_cols = if item.u_col.is_some() { BOX_COLS } else { 0 };
            let output_cols = if B::OUTPUT { C::K + CHUNK } else { 0 };
            let row_bytes = ((2 * C::K + u_cols + output_cols) * 2) as u32;
            load.ring.producer_commit_tx(load.stage, rows as u32 * row_bytes);
        }
        sync_warp();
        // Lane `j` loads box `j` (`tail_box`: whole atoms of rows, then single rows), so the
        // lanes' TMA issues, which the warp serialises, are as few as the boxes.
        if let Some((r, box_rows)) = tail_box(lane, rows) {
            let pick = |atom_map: u64, row_map: u64| if box_rows == ATOM_ROWS { atom_map } else { row_map };
            let off = r as u32 * ROW_BYTES;
            for b in 0..C::KB {
                load.load_key_box(tiles.k(b) + off, pick(maps.k_atom, maps.k_row), b * BOX_COLS, tok0 + r);
                load.load_box(tiles.w(b) + off, pick(maps.w_atom, maps.w_row), b * BOX_COLS, tok0 + r);
            }
            if let Some(col) = item.u_col {
                load.load_box(tiles.u() + off, pick(maps.u_atom, maps.u_row), u_box_column(col), tok0 + r);
            }
            if let (true, Some(o)) = (B::OUTPUT, maps.output) {
                for b in 0..C::KB {
                    load.load_box(tiles.q(b) + off, pick(o.q_atom, o.q_row), b * BOX_COLS, tok0 + r);
                }
                load.load_box(tiles.p() + off, pick(o.p_atom, o.p_row), 0, tok0 + r);
            }
        }
        if lane != 0 {
            load.ring.producer_arrive(load.stage);
        }
    }
}

/// Zeroes rows `rows..CHUNK` of every one of the `boxes` boxes of the stage's `k` tile.
///
/// # Safety
/// Producer lanes only; the stage is free.
#[inline(always)]
unsafe fn zero_key_rows(tiles: StageTiles, boxes: usize, rows: usize, lane: usize) {
    let mut i = rows * CHUNKS_PER_ROW + lane;
    while i < CHUNK * CHUNKS_PER_ROW {
        for b in 0..boxes {
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

/// Copies the `rows` valid rows of a chunk's staged `bf16(Vn)` tile (`[CHUNK][B::BV]`, swizzled
/// over its row) to `out.v_new`, 16 bytes per thread and step, spread over the consumer
/// warpgroup.
///
/// # Safety
/// Consumer threads only, after the staging tile is written and published by the consumer
/// barrier; tokens `tok0 .. tok0 + rows` are this sequence's.
#[inline(always)]
pub unsafe fn store_value_rows<B: Block>(staged: u32, out: Outputs, item: &Item, tok0: usize, rows: usize, tid: usize) {
    let chunks_per_row = B::ROW_BYTES / CHUNK16 as usize;
    let mut i = tid;
    while i < rows * chunks_per_row {
        let (t, j) = (i / chunks_per_row, i % chunks_per_row);
        // SAFETY: row `t < rows` of the tile, and of this item's columns of `v_new`.
        unsafe {
            let bits = ld_shared_v4(staged + swizzled_rows(B::ROW_BYTES, t, j));
            let row = out.v_new_rows.row(tok0 + t, item.head);
            st_global_v4(out.v_new.add(row + item.vcol0 + j * BF16_PER_CHUNK16), bits);
        }
        i += CONSUMER_THREADS;
    }
}

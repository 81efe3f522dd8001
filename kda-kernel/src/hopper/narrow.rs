//! The consumer warpgroup of a narrow block (`layout::hopper::Narrow`: 32 value columns, twice
//! the chains of a wide block). It holds the state `S` (`[K k][32 v]` f32) key-major, as `K / 64`
//! m64n32 accumulators, and takes both operands of both products from shared memory:
//!
//! ```text
//! Vn = u - w @ bf16(S)          m64 n32 k=K         (A = w tile, B = staged bf16(S)^T)
//! S  = d * S + k^T @ bf16(Vn)   K/64 x m64 n32 k64  (A = k tile read transposed, B = staged bf16(Vn)^T)
//! ```
//!
//! Per chunk ([`consume_chunk`]): wait until the stage is full; stage `bf16(S)^T` for product 1
//! and load `u` into its accumulator; publish and run product 1, meanwhile staging `bf16(S)` for
//! the `h` store; decay the state; zero `Vn` rows past the chunk's end, stage `bf16(Vn)`
//! for `v_new` and `bf16(Vn)^T` (scaled by the scalar gate) for product 2; publish and start
//! product 2, and while it runs store `h` and `v_new`; wait for it and release the stage.
//!
//! In the fused layer pass ([`crate::layout::hopper::NarrowFused`]) the chunk also gives the
//! layer's output from the same operands, two more products beside the recurrence's, and
//! `scale o` is stored in place of `h` and `v_new`:
//!
//! ```text
//! o  = (q Γ) @ bf16(S)          m64 n32 k=K    (A = the stage's q Γ tile, B = product 1's B)
//! o += P @ bf16(Vn)             m64 n32 k64    (A = the attention tile, B = bf16(Vn)^T unscaled)
//! ```
//!
//! The operand tiles are K-major with the 128-byte swizzle, the layout the wide products' `w`
//! operand already uses; the store tiles are laid out as the `h` and `v_new` boxes are in
//! memory (`[K][32]` and `[CHUNK][32]`, 64-byte swizzle; value-first `h` as `[32][K]`).

use super::consumer::{
    CONSUMER_BARRIER, ChunkAt, ItemState, Staged, Variant, acquire_staging, for_fused_variant, for_variant,
    stage_transposed, store_output, store_outputs, walk_items,
};
use super::fragments::{
    ACC_PER_GROUP, ATOM_BYTES, UNUSED_LEADING, a_fragments, acc_coords, fragment_row, swizzled, swizzled64,
    unpack_matrices,
};
use super::keys::{KeySize, NARROW_ACC};
use super::maps::Outputs;
use super::smem::Smem;
use super::tail;
use crate::arch::sm80::{ld_shared_f32, ldmatrix_x4, named_barrier, thread_idx_x_fresh};
use crate::arch::sm90::{
    fence_proxy_async, stmatrix_x4, sw128_desc, wgmma_m64n32k16x4_add_kmajor, wgmma_m64n32k16x4_add_ta,
    wgmma_m64n32k16x4_sub_kmajor, wgmma_wait_m64n32, wgmma_wait_older_m64n32,
};
use crate::layout::CHUNK;
use crate::layout::hopper::{BOX_COLS, Block, CONSUMER_THREADS, NARROW_BV, NarrowTile};
use crate::schedule::Work;

/// Keys per m64 tile of the state (and per box of the `k`, `w` and `bf16(S)^T` tiles).
const KEYS_PER_TILE: usize = 64;
/// Bytes of one narrow tile box (`layout::hopper::NarrowTile`).
const TILE_BYTES: u32 = core::mem::size_of::<NarrowTile>() as u32;
/// 16-byte chunks of bf16 per 8 value columns (the `u` box's columns of a narrow block start at
/// `8 * chunk` of its 128-byte rows).
const COLS_PER_CHUNK16: usize = 8;

/// The consumer warpgroup's loop over this CTA's narrow items (blocks `B` of `NARROW_BV`
/// columns: the recurrence's, or the fused layer pass's), specialized for `kind`.
///
/// # Safety
/// Called by the 128 consumer threads only, after the barriers are initialised; `out` holds the
/// launch's outputs.
#[inline(always)]
pub unsafe fn run<C: KeySize, B: Block>(
    work: &Work,
    smem: Smem<C, B>,
    tid: usize,
    out: Outputs,
    has_h0: bool,
    kind: Variant,
) {
    const { assert!(B::BV == NARROW_BV, "a narrow consumer's block") };
    const { assert!(!B::OUTPUT || C::KB <= 2, "the fused pass runs K = 64 or 128") };
    // SAFETY: as this function's.
    unsafe {
        if B::OUTPUT {
            for_fused_variant!(kind, consume::<C, B>(work, smem, tid, out), has_h0)
        } else {
            for_variant!(kind, consume::<C, B>(work, smem, tid, out), has_h0)
        }
    }
}

/// (key row, value column in the block) of element `e` of a narrow state: accumulator
/// `e / NARROW_ACC` holds keys `64 * (e / NARROW_ACC) ..+ 64`, rows of its m64n32 fragment.
#[inline(always)]
fn narrow_coords(tid: usize, e: usize) -> (usize, usize) {
    let (row, col) = acc_coords(tid, e % NARROW_ACC);
    (KEYS_PER_TILE * (e / NARROW_ACC) + row, col)
}

/// The narrow state's registers as f32, tile after tile.
#[inline(always)]
fn narrow_flat<C: KeySize>(s: &mut C::NarrowState) -> &mut [f32] {
    s.as_mut().as_flattened_mut()
}

/// [`run`] for one variant: `consumer::walk_items` with the narrow state and chunk.
///
/// # Safety
/// As for [`run`], with `SCALAR_GATE`, `VALUE_FIRST` and `PRESCAN` the launch's.
#[inline(always)]
unsafe fn consume<C: KeySize, B: Block, const SCALAR_GATE: bool, const VALUE_FIRST: bool, const PRESCAN: bool>(
    work: &Work,
    smem: Smem<C, B>,
    tid: usize,
    out: Outputs,
    has_h0: bool,
) {
    let state = ItemState { zero: C::zero_narrow_state, flat: narrow_flat::<C>, coords: |e| narrow_coords(tid, e) };
    // SAFETY: as this function's; each chunk runs at the consumer's positions.
    unsafe {
        walk_items::<C, B, _, VALUE_FIRST, PRESCAN>(work, smem, tid, out, has_h0, state, |at, s| {
            consume_chunk::<C, B, SCALAR_GATE, VALUE_FIRST, PRESCAN>(at, smem, out, s)
        })
    }
}

/// One chunk, at `at`. In the fused layer pass (`B::OUTPUT`) also the chunk's output: its first
/// product started behind product 1, its second before product 2, and `scale o` stored while
/// product 2 runs.
///
/// # Safety
/// As for [`run`]; `at.stage` is the consumer's position and `at.buf` the chunk's staging buffer.
#[inline(always)]
unsafe fn consume_chunk<C: KeySize, B: Block, const SCALAR_GATE: bool, const VALUE_FIRST: bool, const PRESCAN: bool>(
    at: ChunkAt<'_>,
    smem: Smem<C, B>,
    out: Outputs,
    s: &mut C::NarrowState,
) {
    let (item, c, stage, buf) = (at.item, at.c, at.stage, at.buf);
    let ring = smem.ring();
    let tiles = smem.stage(stage.index());
    let rows = item.rows(c);
    let tid = thread_idx_x_fresh();
    // The recurrence's own outputs: neither in the pre-scan nor in the fused pass.
    let stores = !PRESCAN && !B::OUTPUT;
    let operand = |tile: u32| sw128_desc(tile, UNUSED_LEADING, ATOM_BYTES);
    // SAFETY (block): the stage's tiles are read only between the full wait and the release; each
    // wgmma's accumulator is left alone between its start and its wait; the operand tiles are
    // rewritten only after the products that read them have completed (the previous chunk's
    // waits), the store tiles only after the stores that read them (`acquire_staging`); every
    // tile a wgmma or a TMA store reads is fenced to the async proxy and published by the
    // consumer barrier first.
    unsafe {
        ring.consumer_wait(stage);

        // 1. bf16(S)^T as product 1's B; u into its accumulator (zeros for an item without
        //    values: the pre-scan's key columns).
        for (t, acc) in s.as_ref().iter().enumerate() {
            stage_transposed(smem.s_operand() + t as u32 * TILE_BYTES, &a_fragments::<2>(acc), tid);
        }
        let zero_u = PRESCAN && item.u_col.is_none();
        let mut vn = if zero_u { [0.0; NARROW_ACC] } else { load_u(tiles.u(), item.u_col.unwrap_or(0), rows, tid) };
        publish();

        // 2. Vn = u - w @ bf16(S) (fused: then o = (q Γ) @ bf16(S) behind it), and meanwhile
        //    bf16(S) staged for `h` (neither in the pre-scan nor fused); then the state's decay
        //    per key row.
        for t in 0..C::KB {
            let b = operand(smem.s_operand() + t as u32 * TILE_BYTES);
            wgmma_m64n32k16x4_sub_kmajor(&mut vn, operand(tiles.w(t)), b);
        }
        let mut o = [0.0f32; NARROW_ACC];
        if B::OUTPUT {
            for t in 0..C::KB {
                let b = operand(smem.s_operand() + t as u32 * TILE_BYTES);
                wgmma_m64n32k16x4_add_kmajor(&mut o, operand(tiles.q(t)), b);
            }
            wait_behind_key_tiles::<C>(&mut vn);
        } else {
            if stores {
                acquire_staging(tid, smem.staging_buffers());
                for (t, acc) in s.as_ref().iter().enumerate() {
                    stage_state::<VALUE_FIRST>(smem.h(buf), t, &a_fragments::<2>(acc), tid);
                }
            }
            wgmma_wait_m64n32(&mut vn);
        }
        // (After the wait: ptxas would otherwise wait there for product 1 anyway, as the state's
        // registers were last written by a wgmma.)
        decay_rows(s.as_mut(), smem.decay(stage.index()), tid);

        // 3. Rows past the chunk's end leave Vn as zeros; bf16(Vn) staged for `v_new` (unscaled);
        //    with `g` each token's row scaled by exp2(g_last - g[r]); bf16(Vn)^T as product 2's B
        //    (fused with `g`: the unscaled one too, as the output's).
        zero_token_rows(&mut vn, rows, tid);
        let staged: [[u32; 4]; CHUNK / 32] = a_fragments(&vn);
        if stores {
            stage_rows64(smem.vn(buf), 0, &staged, tid);
        }
        let b2 = if SCALAR_GATE {
            if B::OUTPUT {
                stage_transposed(smem.output_operand(), &staged, tid);
            }
            scale_token_rows(&mut vn, smem.row_scale(stage.index()), tid);
            a_fragments(&vn)
        } else {
            staged
        };
        stage_transposed(smem.vn_operand(), &b2, tid);
        publish();

        // 4. Fused: o += P @ bf16(Vn) (unscaled, as the output takes it). Then S += k^T @
        //    bf16(Vn) per 64-key tile, and meanwhile `h` and `v_new` leave (fused: `o` once its
        //    products are done).
        if B::OUTPUT {
            let vn_unscaled = if SCALAR_GATE { smem.output_operand() } else { smem.vn_operand() };
            wgmma_m64n32k16x4_add_kmajor(&mut o, operand(tiles.p()), operand(vn_unscaled));
        }
        let b = operand(smem.vn_operand());
        for (t, acc) in s.as_mut().iter_mut().enumerate() {
            let a = sw128_desc(tiles.k(t), UNUSED_LEADING, ATOM_BYTES);
            wgmma_m64n32k16x4_add_ta(acc, a, b);
        }
        if B::OUTPUT {
            wait_behind_key_tiles::<C>(&mut o);
            let frags: [[u32; 4]; CHUNK / 32] = a_fragments(&o.map(|x| x * out.scale));
            let tile = smem.vn(buf);
            store_output::<B>(item, c, tile, smem.staging_buffers(), out, tid, || stage_rows64(tile, 0, &frags, tid));
        } else if stores {
            let staged = Staged { h: smem.h(buf), vn: smem.vn(buf), boxes: C::KB, box_bytes: TILE_BYTES as usize };
            store_outputs::<VALUE_FIRST>(item, c, out.maps, staged, tid);
            if rows < CHUNK {
                tail::store_value_rows::<B>(smem.vn(buf), out, item, item.first_token(c), rows, tid);
            }
        }

        // 5. The state is the next chunk's; the stage goes back to the producer.
        for acc in s.as_mut().iter_mut() {
            wgmma_wait_m64n32(acc);
        }
        ring.consumer_release(stage);
    }
}

/// Waits for the wgmma groups committed before the newest `K / 64` (one per 64-key tile: the
/// output's first product behind product 1, or product 2 behind the output's second), `acc`
/// being their accumulator.
///
/// # Safety
/// As for `arch::sm90::wgmma_wait_older_m64n32`, with the newest `C::KB` groups not on `acc`.
#[inline(always)]
unsafe fn wait_behind_key_tiles<C: KeySize>(acc: &mut [f32; NARROW_ACC]) {
    // SAFETY: the caller's contract (`run` allows no other `C::KB` in the fused pass).
    unsafe { if C::KB == 1 { wgmma_wait_older_m64n32::<1>(acc) } else { wgmma_wait_older_m64n32::<2>(acc) } }
}

/// Makes this warpgroup's shared-memory writes visible to the async proxy (wgmma and TMA reads)
/// and waits for every consumer thread's.
///
/// # Safety
/// The warpgroup calls it together.
#[inline(always)]
unsafe fn publish() {
    fence_proxy_async();
    // SAFETY: every consumer thread reaches it.
    unsafe { named_barrier(CONSUMER_BARRIER, CONSUMER_THREADS as u32) };
}

/// The block's `u` columns as f32 in the m64n32 accumulator layout (rows = tokens): the stage's
/// `u` tile, `[CHUNK][32]` with the 64-byte swizzle for a full chunk, for a tail chunk (`rows <
/// CHUNK`) the `[CHUNK][BOX_COLS]` one-row boxes (128-byte swizzle) holding column `u_col`.
///
/// # Safety
/// The warpgroup calls it together; `u` is a full stage's `u` tile.
#[inline(always)]
unsafe fn load_u(u: u32, u_col: usize, rows: usize, tid: usize) -> [f32; NARROW_ACC] {
    let first = (u_col % BOX_COLS) / COLS_PER_CHUNK16;
    let mut vn = [0f32; NARROW_ACC];
    for step in 0..CHUNK / 32 {
        let (t, chunk) = fragment_row(tid, step);
        let at = if rows == CHUNK { swizzled64(t, chunk) } else { swizzled(t, first + chunk) };
        // SAFETY: row `t < CHUNK` and its chunk lie inside the tile.
        let m = unsafe { ldmatrix_x4(u + at) };
        unpack_matrices(m, step, &mut vn);
    }
    vn
}

/// Stages 64-key tile `t` of `bf16(S)` (its A-layout fragments `frags`) for the `h` store:
/// untransposed into the key-first tile (`[K][32]`, 64-byte swizzle), transposed into box `t` of
/// the value-first one (`[32][K]` in boxes of 64 keys, 128-byte swizzle).
///
/// # Safety
/// The warpgroup calls it together; `tile` is a free staging buffer.
#[inline(always)]
unsafe fn stage_state<const VALUE_FIRST: bool>(tile: u32, t: usize, frags: &[[u32; 4]], tid: usize) {
    // SAFETY: see the function's contract.
    unsafe {
        if VALUE_FIRST {
            stage_transposed(tile + t as u32 * TILE_BYTES, frags, tid);
        } else {
            stage_rows64(tile, KEYS_PER_TILE * t, frags, tid);
        }
    }
}

/// Stores A-layout fragments (16 rows per warp, 16 columns per step) untransposed into a tile
/// of 64-byte rows with the 64-byte swizzle, the fragment's rows at `row0` onward.
///
/// # Safety
/// The warpgroup calls it together; the rows lie inside a free tile.
#[inline(always)]
unsafe fn stage_rows64(tile: u32, row0: usize, frags: &[[u32; 4]], tid: usize) {
    for (step, frag) in frags.iter().enumerate() {
        let (row, chunk) = fragment_row(tid, step);
        // SAFETY: see the function's contract.
        unsafe { stmatrix_x4(tile + swizzled64(row0 + row, chunk), *frag) };
    }
}

/// `S *= d` per key row, from the stage's decay row.
///
/// # Safety
/// `decay` is the decay row of the stage the consumer holds.
#[inline(always)]
unsafe fn decay_rows(s: &mut [[f32; NARROW_ACC]], decay: u32, tid: usize) {
    for (t, acc) in s.iter_mut().enumerate() {
        // A thread's rows of a tile are `lane / 4` and `+ 8` of its warp's 16.
        let (row, _) = acc_coords(tid, 0);
        let top = KEYS_PER_TILE * t + row;
        // SAFETY: rows `top` and `top + 8` of the decay row.
        let (d_top, d_bottom) = unsafe { (ld_f32(decay, top), ld_f32(decay, top + 8)) };
        for (e, x) in acc.iter_mut().enumerate() {
            *x *= if (e % ACC_PER_GROUP) / 2 == 0 { d_top } else { d_bottom };
        }
    }
}

/// `Vn`'s rows (tokens) times the stage's row scales.
///
/// # Safety
/// `scale` is the row-scale array of the stage the consumer holds.
#[inline(always)]
unsafe fn scale_token_rows(vn: &mut [f32; NARROW_ACC], scale: u32, tid: usize) {
    let (row, _) = acc_coords(tid, 0);
    // SAFETY: tokens `row` and `row + 8` of the row.
    let (top, bottom) = unsafe { (ld_f32(scale, row), ld_f32(scale, row + 8)) };
    for (e, x) in vn.iter_mut().enumerate() {
        *x *= if (e % ACC_PER_GROUP) / 2 == 0 { top } else { bottom };
    }
}

/// Element `i` of an f32 array in shared memory.
///
/// # Safety
/// Element `i` lies inside the CTA's shared memory.
#[inline(always)]
unsafe fn ld_f32(array: u32, i: usize) -> f32 {
    // SAFETY: see the function's contract.
    unsafe { ld_shared_f32(array + (i * 4) as u32) }
}

/// Zeroes the elements of `Vn` whose token (row) is at or past `rows`, so rows past a chunk's
/// end add nothing to the state. A no-op on full chunks.
#[inline(always)]
fn zero_token_rows(vn: &mut [f32; NARROW_ACC], rows: usize, tid: usize) {
    for (e, x) in vn.iter_mut().enumerate() {
        if acc_coords(tid, e).0 >= rows {
            *x = 0.0;
        }
    }
}

const _: () = {
    assert!(CHUNK / 32 == 2, "a narrow fragment is two 16-column steps");
    assert!(NARROW_ACC == 16);
};

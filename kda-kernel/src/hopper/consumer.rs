//! The consumer warpgroup: holds the transposed state `S^T` (`[BV v][K k]` f32) as a wgmma
//! accumulator in registers and runs the two serially dependent products of every chunk:
//!
//! ```text
//! Vn^T = u^T - bf16(S^T) @ w^T     m64 n64  k128  (A = bf16(S^T) from registers, B = w tile)
//! S^T  = S^T * d + bf16(Vn^T) @ k  m64 n128 k64   (A = bf16(Vn^T) from registers, B = k tile)
//! ```
//!
//! Per chunk ([`consume_chunk`]): wait until the stage is full; load `u^T` into product 1's
//! accumulator and stage `bf16(S)` for `h`; decay the state and run product 1; zero `Vn` rows
//! past the chunk's end and stage `bf16(Vn)`; start product 2 and, while it runs, store `h` and
//! `v_new`; wait for it and release the stage.

use super::fragments::{
    ACC_PER_GROUP, ATOM_BYTES, CHUNKS_PER_ROW, UNUSED_LEADING, a_fragments, acc_coords, fragment_row, matrix_row,
    swizzled, unpack_matrices,
};
use super::keys::{KeySize, WideKey};
use super::maps::{Outputs, StoreMaps};
use super::smem::Smem;
use super::tail;
use crate::arch::sm80::{ld_shared_f32, ld_shared_v2_f32, ldmatrix_x4_trans, named_barrier, thread_idx_x_fresh};
use crate::arch::sm90::{
    bulk_commit_group, bulk_wait_group_read, fence_proxy_async, stmatrix_x4, stmatrix_x4_trans, sw128_desc,
    tma_store_3d, wgmma_m64n64k16x4_add_kmajor_start, wgmma_wait_m64n64, wgmma_wait_older_m64n64,
};
use crate::layout::CHUNK;
use crate::layout::hopper::{BOX_BYTES, BOX_COLS, Block, CONSUMER_THREADS, StateBox};
use crate::pipeline::PipelineState;
use crate::schedule::{Item, Work};

/// f32 registers of `Vn^T` per consumer thread (the m64n64 accumulator).
const VN_REGS: usize = CHUNK / 2;
/// The consumer thread that issues the TMA stores of `h` and `v_new` (bulk async-groups are
/// per thread, so the same thread waits for them).
pub(super) const STORE_THREAD: usize = 0;
/// Named barrier of the consumer warpgroup (0 is `bar.sync 0`, the CTA barrier).
pub(super) const CONSUMER_BARRIER: u32 = 1;
/// Bytes of one 64-key box of a wide block's `bf16(S)` staging tile.
const STATE_BOX_BYTES: usize = core::mem::size_of::<StateBox>();

/// The launch's variant, as the consumer's loop is specialized for it (each is a generic
/// parameter of [`consume`], so the chunk loop carries no branch on them).
#[derive(Clone, Copy)]
pub struct Variant {
    /// The launch has the scalar gate `g`: `Vn`'s rows are scaled before product 2.
    pub scalar_gate: bool,
    /// The states are value-first (`[V, K]`): `h` is staged untransposed.
    pub value_first: bool,
    /// The pre-scan of split sequences (`abi::PassCode::Prescan`): identity key columns, `u`
    /// only in the value columns, no `h` or `v_new` (the states are key-first).
    pub prescan: bool,
}

/// The consumer warpgroup's loop over this CTA's items, specialized for `kind`.
///
/// # Safety
/// Called by the 128 consumer threads only, after the barriers are initialised; `out` holds the
/// launch's outputs.
#[inline(always)]
pub unsafe fn run<C: WideKey, B: Block>(
    work: &Work,
    smem: Smem<C, B>,
    tid: usize,
    out: Outputs,
    has_h0: bool,
    kind: Variant,
) {
    // SAFETY: as this function's.
    unsafe {
        if B::OUTPUT {
            for_fused_variant!(kind, consume::<C, B>(work, smem, tid, out), has_h0)
        } else {
            for_variant!(kind, consume::<C, B>(work, smem, tid, out), has_h0)
        }
    }
}

/// Calls `$consume::<$types.., SCALAR_GATE, VALUE_FIRST, PRESCAN>($args.., has_h0)` for the
/// variant `$kind` (in the pre-scan, whose maps are key-first, `VALUE_FIRST` is the layout of
/// `h0`, which its first segments start from): the one dispatch of a consumer, so that its chunk
/// loop carries no branch on the variant.
macro_rules! for_variant {
    ($kind:expr, $consume:ident::<$($ty:ty),+>($($arg:expr),*), $has_h0:expr) => {
        match ($kind.prescan, $kind.scalar_gate, $kind.value_first) {
            (false, false, false) => $consume::<$($ty),+, false, false, false>($($arg),*, $has_h0),
            (false, false, true) => $consume::<$($ty),+, false, true, false>($($arg),*, $has_h0),
            (false, true, false) => $consume::<$($ty),+, true, false, false>($($arg),*, $has_h0),
            (false, true, true) => $consume::<$($ty),+, true, true, false>($($arg),*, $has_h0),
            (true, false, false) => $consume::<$($ty),+, false, false, true>($($arg),*, $has_h0),
            (true, false, true) => $consume::<$($ty),+, false, true, true>($($arg),*, $has_h0),
            (true, true, false) => $consume::<$($ty),+, true, false, true>($($arg),*, $has_h0),
            (true, true, true) => $consume::<$($ty),+, true, true, true>($($arg),*, $has_h0),
        }
    };
}
pub(super) use for_variant;

/// [`for_variant`] for the fused layer pass, which is never a pre-scan (its entries' contract):
/// `PRESCAN` false, four variants.
macro_rules! for_fused_variant {
    ($kind:expr, $consume:ident::<$($ty:ty),+>($($arg:expr),*), $has_h0:expr) => {
        match ($kind.scalar_gate, $kind.value_first) {
            (false, false) => $consume::<$($ty),+, false, false, false>($($arg),*, $has_h0),
            (false, true) => $consume::<$($ty),+, false, true, false>($($arg),*, $has_h0),
            (true, false) => $consume::<$($ty),+, true, false, false>($($arg),*, $has_h0),
            (true, true) => $consume::<$($ty),+, true, true, false>($($arg),*, $has_h0),
        }
    };
}
pub(super) use for_fused_variant;

/// [`run`] for one variant: [`walk_items`] with the wide state and chunk.
///
/// # Safety
/// As for [`run`], with `SCALAR_GATE`, `VALUE_FIRST` and `PRESCAN` the launch's.
#[inline(always)]
unsafe fn consume<C: WideKey, B: Block, const SCALAR_GATE: bool, const VALUE_FIRST: bool, const PRESCAN: bool>(
    work: &Work,
    smem: Smem<C, B>,
    tid: usize,
    out: Outputs,
    has_h0: bool,
) {
    let state = ItemState { zero: C::zero_state, flat: wide_flat::<C>, coords: |e| wide_coords(tid, e) };
    // SAFETY: as this function's; each chunk runs at the consumer's positions.
    unsafe {
        walk_items::<C, B, _, VALUE_FIRST, PRESCAN>(work, smem, tid, out, has_h0, state, |at, s| {
            consume_chunk::<C, B, SCALAR_GATE, VALUE_FIRST, PRESCAN>(at, smem, out, s)
        })
    }
}

/// The wide state's registers as f32.
#[inline(always)]
fn wide_flat<C: WideKey>(s: &mut C::State) -> &mut [f32] {
    s.as_mut()
}

/// How a consumer holds its state `S`: `zero()` makes one, `flat` views its registers as f32,
/// element `e` of which is `coords(e)`, (key row, value column in the block).
pub(super) struct ItemState<S, Z, P> {
    pub zero: Z,
    pub flat: fn(&mut S) -> &mut [f32],
    pub coords: P,
}

/// The consumer's walk over the CTA's items, the same for both block widths: per item, the
/// initial state (the producer's `h0` slot when `h0` is given and the item's record names a row
/// of it, else zeros or the pre-scan's identity columns), its
/// chunks through `chunk` at the consumer's ring and staging positions, and the final state to
/// `ht`; then the wait for the last stores.
///
/// # Safety
/// The 128 consumer threads call it together, after the barriers are initialised; `out` holds
/// the launch's outputs; `chunk` runs one chunk at the positions it is given.
#[inline(always)]
pub(super) unsafe fn walk_items<C: KeySize, B: Block, S, const VALUE_FIRST: bool, const PRESCAN: bool>(
    work: &Work,
    smem: Smem<C, B>,
    tid: usize,
    out: Outputs,
    has_h0: bool,
    state: ItemState<S, impl Fn() -> S, impl Fn(usize) -> (usize, usize) + Copy>,
    mut chunk: impl FnMut(ChunkAt<'_>, &mut S),
) {
    let coords = state.coords;
    let mut stage = PipelineState::consumer_start(smem.ring().stages());
    let mut slot = PipelineState::consumer_start(1);
    // The staging buffers go round robin by chunk, like the ring (their wait is the stores'
    // bulk-group read, not a barrier).
    let mut staging = PipelineState::consumer_start(smem.staging_buffers());
    for item in work.items::<{ super::CONSUMER_ROLE }>() {
        let mut s = (state.zero)();
        if has_h0 && item.h0_row.is_some() {
            // SAFETY: the producer loads such an item's state into the slot (the same test).
            unsafe { load_initial_state::<C, B, VALUE_FIRST>((state.flat)(&mut s), coords, smem, slot) };
            slot.advance();
        } else if PRESCAN {
            identity_columns((state.flat)(&mut s), coords, item.vcol0);
        }
        for c in 0..item.chunks() {
            chunk(ChunkAt { item: &item, c, stage, buf: staging.index() }, &mut s);
            stage.advance();
            staging.advance();
        }
        if let (false, Some(row)) = (out.ht.is_null(), item.ht_row) {
            // SAFETY: `ht` holds the item's row of `K x value_dim` f32 states.
            unsafe {
                if PRESCAN {
                    // The maps are key-first.
                    store_final_state::<false>((state.flat)(&mut s), coords, C::K, row, item.vcol0, out)
                } else {
                    store_final_state::<VALUE_FIRST>((state.flat)(&mut s), coords, C::K, row, item.vcol0, out)
                }
            };
        }
    }
    finish_stores(tid);
}

/// Waits, at the end of the CTA's work, until the last TMA stores have read their staging
/// tiles: shared memory must outlive them (their global writes complete before the grid does
/// without waiting here).
#[inline(always)]
fn finish_stores(tid: usize) {
    if tid == STORE_THREAD {
        bulk_wait_group_read::<0>();
    }
}

/// (key row, value column in the block) of element `e` of a wide state (the m64nK accumulator
/// of `S^T`: its rows are value columns).
#[inline(always)]
fn wide_coords(tid: usize, e: usize) -> (usize, usize) {
    let (v, kk) = acc_coords(tid, e);
    (kk, v)
}

/// The item's initial state from the `h0` slot (`[K][B::BV]`, or `[B::BV][K]` value-first) into
/// the state's registers (element `e` at `coords(e)`, (key row, value column)), then the slot
/// back to the producer.
///
/// # Safety
/// Consumer threads only; `slot` is the consumer's position on the slot's barriers.
#[inline(always)]
unsafe fn load_initial_state<C: KeySize, B: Block, const VALUE_FIRST: bool>(
    s: &mut [f32],
    coords: impl Fn(usize) -> (usize, usize),
    smem: Smem<C, B>,
    slot: PipelineState,
) {
    let h0_slot = smem.h0_slot();
    // SAFETY: the slot holds this item's block once the wait returns; this thread reads it and
    // releases it right after.
    unsafe {
        h0_slot.consumer_wait(slot);
        for (e, x) in s.iter_mut().enumerate() {
            let (kk, v) = coords(e);
            let at = if VALUE_FIRST { v * C::K + kk } else { kk * B::BV + v };
            *x = ld_shared_f32(smem.h0() + (at * 4) as u32);
        }
        // The producer's next TMA load (async proxy) overwrites the slot once it is released:
        // the reads above (generic proxy) must be complete first. The arrive alone does not wait
        // for them (measured: without this fence, value-first slots, whose reads are slower, were
        // overwritten under the reads of a CTA's later items).
        fence_proxy_async();
        h0_slot.consumer_release(slot);
    }
}

/// The pre-scan's initial state `[I | 0]` at this block's columns: `S[kk][vcol0 + v]` is one
/// where `kk = vcol0 + v` (only in the key columns, `vcol0 < K`); element `e` is at `coords(e)`.
#[inline(always)]
fn identity_columns(s: &mut [f32], coords: impl Fn(usize) -> (usize, usize), vcol0: usize) {
    for (e, x) in s.iter_mut().enumerate() {
        let (kk, v) = coords(e);
        *x = if kk == vcol0 + v { 1.0 } else { 0.0 };
    }
}

/// The item's final state from registers (element `e` at `coords(e)`) to row `row` of `ht`
/// (`key_dim` keys).
///
/// # Safety
/// Consumer threads only; `out.ht` holds states of `K x value_dim` f32 in the launch's layout,
/// row `row` and the block's columns from `vcol0` included.
#[inline(always)]
unsafe fn store_final_state<const VALUE_FIRST: bool>(
    s: &[f32],
    coords: impl Fn(usize) -> (usize, usize),
    key_dim: usize,
    row: usize,
    vcol0: usize,
    out: Outputs,
) {
    let base = row * key_dim * out.value_dim;
    for (e, &x) in s.iter().enumerate() {
        let (kk, v) = coords(e);
        let col = vcol0 + v;
        let at = if VALUE_FIRST { col * key_dim + kk } else { kk * out.value_dim + col };
        // SAFETY: (kk, col) is inside this item's state.
        unsafe { *out.ht.add(base + at) = x };
    }
}

/// Where a chunk is: chunk `c` of `item`, at ring position `stage`, staging its outputs in
/// buffer `buf`.
#[derive(Clone, Copy)]
pub(super) struct ChunkAt<'a> {
    pub item: &'a Item,
    pub c: usize,
    pub stage: PipelineState,
    pub buf: usize,
}

/// One chunk. In the fused layer pass (`B::OUTPUT`) the chunk also gives the layer's output
/// from the same operands, two more products beside the recurrence's:
///
/// ```text
/// o^T  = bf16(S^T) @ (q Γ)^T       m64 n64 kK   (A = product 1's A, B = the stage's q Γ tile)
/// o^T += bf16(Vn^T) @ P^T           m64 n64 k64  (A = v_new's fragments, B = the attention tile)
/// ```
///
/// both started beside products 1 and 2 (wgmma groups complete in order: each wait below lets
/// the newest group run on), and `scale o` is stored in place of `h` and `v_new`.
///
/// # Safety
/// As for [`run`]; `at.stage` is the consumer's position and `at.buf` the chunk's staging buffer.
#[inline(always)]
unsafe fn consume_chunk<C: WideKey, B: Block, const SCALAR_GATE: bool, const VALUE_FIRST: bool, const PRESCAN: bool>(
    at: ChunkAt<'_>,
    smem: Smem<C, B>,
    out: Outputs,
    s: &mut C::State,
) {
    let (item, c, stage, buf) = (at.item, at.c, at.stage, at.buf);
    let ring = smem.ring();
    let tiles = smem.stage(stage.index());
    let rows = item.rows(c);
    let tid = thread_idx_x_fresh();
    // The recurrence's own outputs: neither in the pre-scan nor in the fused pass.
    let stores = !PRESCAN && !B::OUTPUT;
    let operand = |tile: u32| sw128_desc(tile, UNUSED_LEADING, ATOM_BYTES);
    // SAFETY (block): the stage's tiles are read only between the full wait and the release;
    // each wgmma's accumulator and A fragments are left alone between its start and its wait;
    // the staging buffers are rewritten only after the stores that read them (`staging` chunks
    // back) have, and published to the async proxy before the stores are issued.
    unsafe {
        ring.consumer_wait(stage);

        // 1. u^T into product 1's accumulator (zeros for an item without values: the pre-scan's
        //    key columns); bf16(S^T) as its A fragments, also staged for `h` (none in the
        //    pre-scan).
        //    (Only the pre-scan has such items: a runtime test in the recurrence's variants
        //    measured 7% slower at K = 64.)
        let zero_u = PRESCAN && item.u_col.is_none();
        let mut vn = if zero_u { [0.0; VN_REGS] } else { load_u_transposed(tiles.u(), tid) };
        let a1 = C::state_fragments(s);
        if stores {
            stage_state::<VALUE_FIRST>(smem.h(buf), a1.as_ref(), tid, smem.staging_buffers());
        }

        // 2. The state's decay per key column, then Vn^T = u^T - bf16(S^T) @ w^T (and, fused,
        //    o^T = bf16(S^T) @ (q Γ)^T behind it). (The decay is written before the products
        //    start: ptxas waits for an in-flight wgmma before any write to registers a wgmma
        //    defined, the state's included.)
        decay_state(s.as_mut(), smem.decay(stage.index()), tid);
        C::product1_start(&mut vn, &a1, operand(tiles.w(0)));
        let mut o = [0.0f32; VN_REGS];
        if B::OUTPUT {
            C::output_start(&mut o, &a1, operand(tiles.q(0)));
            wgmma_wait_older_m64n64(&mut vn);
        } else {
            wgmma_wait_m64n64(&mut vn);
        }

        // 3. Rows past the chunk's end leave Vn as zeros; bf16(Vn^T) staged for `v_new`; with
        //    `g`, each token's row scaled by exp2(g_last - g[r]) after (v_new is stored
        //    unscaled); bf16 of the result as product 2's A fragments.
        tail::zero_rows_past_end(&mut vn, rows, tid);
        let staged: [[u32; 4]; CHUNK / 16] = a_fragments(&vn);
        if stores {
            stage_transposed(smem.vn(buf), &staged, tid);
        }
        let a2 = if SCALAR_GATE {
            scale_rows(&mut vn, smem.row_scale(stage.index()), tid);
            a_fragments(&vn)
        } else {
            staged
        };

        // 4. Fused: o^T += bf16(Vn^T) @ P^T (v_new unscaled, as the output takes it). Then
        //    S^T += bf16(Vn^T) @ k, and meanwhile `h` and `v_new` leave (fused: `o` once its
        //    products are done).
        if B::OUTPUT {
            wgmma_m64n64k16x4_add_kmajor_start(&mut o, &staged, operand(tiles.p()));
        }
        C::product2_start(s, &a2, sw128_desc(tiles.k(0), BOX_BYTES as u32, ATOM_BYTES));
        if B::OUTPUT {
            wgmma_wait_older_m64n64(&mut o);
            let frags: [[u32; 4]; CHUNK / 16] = a_fragments(&o.map(|x| x * out.scale));
            let tile = smem.vn(buf);
            store_output::<B>(item, c, tile, smem.staging_buffers(), out, tid, || stage_transposed(tile, &frags, tid));
        } else if !PRESCAN {
            fence_proxy_async();
            named_barrier(CONSUMER_BARRIER, CONSUMER_THREADS as u32);
            let staged = Staged { h: smem.h(buf), vn: smem.vn(buf), boxes: C::KB, box_bytes: STATE_BOX_BYTES };
            store_outputs::<VALUE_FIRST>(item, c, out.maps, staged, tid);
            if rows < CHUNK {
                tail::store_value_rows::<B>(smem.vn(buf), out, item, item.first_token(c), rows, tid);
            }
        }

        // 5. The state is the next chunk's; the stage goes back to the producer.
        C::product2_wait(s);
        ring.consumer_release(stage);
    }
}

/// The fused pass's output of chunk `c` of `item`: `stage` writes it (`scale o` rounded to
/// bf16, `[CHUNK][B::BV]` laid out as `v_new`'s staging tile) into `tile` once the stores of
/// `buffers` chunks back have read it, then it goes by TMA (a full chunk) or as the valid rows
/// (a partial one) to `o` (`out.v_new` in the fused pass), as one bulk group.
///
/// # Safety
/// The warpgroup calls it together, `stage` writing only `tile`, this chunk's staging buffer.
#[inline(always)]
pub(super) unsafe fn store_output<B: Block>(
    item: &Item,
    c: usize,
    tile: u32,
    buffers: usize,
    out: Outputs,
    tid: usize,
    stage: impl FnOnce(),
) {
    let (rows, tok0) = (item.rows(c), item.first_token(c));
    // SAFETY: the buffer is free once `acquire_staging` returns; the box lies inside the
    // sequence's rows of `o` (a full chunk), the tail's rows are the sequence's.
    unsafe {
        acquire_staging(tid, buffers);
        stage();
        fence_proxy_async();
        named_barrier(CONSUMER_BARRIER, CONSUMER_THREADS as u32);
        if tid == STORE_THREAD {
            if rows == CHUNK {
                tma_store_3d(out.maps.v_new, item.vcol0 as i32, item.head as i32, tok0 as i32, tile);
            }
            bulk_commit_group();
        }
        if rows < CHUNK {
            tail::store_value_rows::<B>(tile, out, item, tok0, rows, tid);
        }
    }
}

/// `u^T` (this CTA's `[CHUNK][BV]` tile, read transposed) as f32 in the m64n64 accumulator layout.
///
/// # Safety
/// The warpgroup calls it together; `u` is a full stage's `u` tile.
#[inline(always)]
unsafe fn load_u_transposed(u: u32, tid: usize) -> [f32; VN_REGS] {
    let mut vn = [0f32; VN_REGS];
    for step in 0..CHUNK / 16 {
        let (t, chunk) = matrix_row(tid, step);
        // SAFETY: row `t < CHUNK`, chunk < 8 of the tile.
        let m = unsafe { ldmatrix_x4_trans(u + swizzled(t, chunk)) };
        unpack_matrices(m, step, &mut vn);
    }
    vn
}

/// Waits until the staging buffer of this chunk is free: the stores of the chunk that last used
/// it (`buffers` chunks back, `buffers` being 1 or 2) have read it.
///
/// # Safety
/// The warpgroup calls it together.
#[inline(always)]
pub(super) unsafe fn acquire_staging(tid: usize, buffers: usize) {
    if tid == STORE_THREAD {
        // One bulk group per chunk: all but the newest `buffers - 1` have read their sources.
        if buffers >= 2 {
            bulk_wait_group_read::<1>();
        } else {
            bulk_wait_group_read::<0>();
        }
    }
    // SAFETY: the store thread's wait, published by the barrier, frees the buffer.
    unsafe { named_barrier(CONSUMER_BARRIER, CONSUMER_THREADS as u32) };
}

/// Stages `bf16(S)` (product 1's A fragments) for the `h` store, once the buffer is free
/// ([`acquire_staging`]): transposed (`[K][BV]`) for key-first states, as it is (`[BV][K]`, in
/// boxes of `BOX_COLS` key columns) for value-first.
///
/// # Safety
/// The warpgroup calls it together; `tile` is a staging buffer of `K x BV` bf16.
#[inline(always)]
unsafe fn stage_state<const VALUE_FIRST: bool>(tile: u32, a: &[[u32; 4]], tid: usize, buffers: usize) {
    // SAFETY: the buffer is free once the wait returns.
    unsafe {
        acquire_staging(tid, buffers);
        if VALUE_FIRST {
            stage_rows(tile, a, tid);
        } else {
            stage_transposed(tile, a, tid);
        }
    }
}

/// Stores the A fragments `a` (rows = value columns, 16 key columns per step) untransposed into a
/// value-first staging tile (`[BV][K]` as boxes of `BOX_COLS` columns, 128-byte swizzled), one
/// `stmatrix.x4` per step.
///
/// # Safety
/// The warpgroup calls it together; `tile` is a free staging buffer.
#[inline(always)]
unsafe fn stage_rows(tile: u32, a: &[[u32; 4]], tid: usize) {
    for (step, frag) in a.iter().enumerate() {
        let (row, chunk) = fragment_row(tid, step);
        let (bx, chunk) = (chunk / CHUNKS_PER_ROW, chunk % CHUNKS_PER_ROW);
        // SAFETY: row < BV, box < K / BOX_COLS and chunk < 8 address the tile.
        unsafe { stmatrix_x4(tile + (bx * STATE_BOX_BYTES) as u32 + swizzled(row, chunk), *frag) };
    }
}

/// `Vn^T`'s columns (tokens) times the stage's row scales.
///
/// # Safety
/// `scale` is the row-scale array of the stage the consumer holds.
#[inline(always)]
unsafe fn scale_rows(vn: &mut [f32; VN_REGS], scale: u32, tid: usize) {
    for g in 0..VN_REGS / ACC_PER_GROUP {
        let (_, t) = acc_coords(tid, ACC_PER_GROUP * g);
        // SAFETY: token `t` (even) and `t + 1` of the row.
        let [s0, s1] = unsafe { ld_shared_v2_f32(scale + (t * 4) as u32) };
        for (q, x) in vn[ACC_PER_GROUP * g..ACC_PER_GROUP * (g + 1)].iter_mut().enumerate() {
            *x *= if q % 2 == 0 { s0 } else { s1 };
        }
    }
}

/// Stores the A fragments `a` (rows = value columns, 16 columns per step) transposed into a
/// 128-byte-swizzled staging tile, one `stmatrix.x4` per step.
///
/// # Safety
/// The warpgroup calls it together; `tile` is a free staging buffer of `STEPS * 16` rows.
#[inline(always)]
pub(super) unsafe fn stage_transposed(tile: u32, a: &[[u32; 4]], tid: usize) {
    for (step, frag) in a.iter().enumerate() {
        let (row, chunk) = matrix_row(tid, step);
        // SAFETY: row < 16 * STEPS and chunk < 8 address the tile.
        unsafe { stmatrix_x4_trans(tile + swizzled(row, chunk), *frag) };
    }
}

/// `S^T *= exp2(gk_last)` per key column, from the stage's decay row.
///
/// # Safety
/// `decay` is the decay row of the stage the consumer holds.
#[inline(always)]
unsafe fn decay_state(s: &mut [f32], decay: u32, tid: usize) {
    for g in 0..s.len() / ACC_PER_GROUP {
        let (_, kk) = acc_coords(tid, ACC_PER_GROUP * g);
        // SAFETY: key column `kk` (even) and `kk + 1` of the row.
        let [d0, d1] = unsafe { ld_shared_v2_f32(decay + (kk * 4) as u32) };
        for (q, x) in s[ACC_PER_GROUP * g..ACC_PER_GROUP * (g + 1)].iter_mut().enumerate() {
            *x *= if q % 2 == 0 { d0 } else { d1 };
        }
    }
}

/// A chunk's staged outputs: the `bf16(S)` tile (`boxes` boxes of `box_bytes` value-first) and
/// the `bf16(Vn)` tile.
#[derive(Clone, Copy)]
pub(super) struct Staged {
    pub h: u32,
    pub vn: u32,
    pub boxes: usize,
    pub box_bytes: usize,
}

/// One thread stores the chunk's `h` tile (one box, or `boxes` value-first) and, for a full
/// chunk, its `v_new` tile with TMA, as one bulk group.
///
/// # Safety
/// Consumer threads, after the staging tiles are written, fenced to the async proxy and published
/// by the consumer barrier; the boxes lie inside `h` and (full chunk) the sequence's rows of
/// `v_new`.
#[inline(always)]
pub(super) unsafe fn store_outputs<const VALUE_FIRST: bool>(
    item: &Item,
    c: usize,
    maps: StoreMaps,
    staged: Staged,
    tid: usize,
) {
    let Staged { h, vn, boxes, box_bytes } = staged;
    if tid == STORE_THREAD {
        let (vcol0, head) = (item.vcol0 as i32, item.head as i32);
        let state_row = ((item.chunk_start + c) * item.heads + item.head) as i32;
        // SAFETY: see the function's contract.
        unsafe {
            if VALUE_FIRST {
                for b in 0..boxes {
                    let src = h + (b * box_bytes) as u32;
                    tma_store_3d(maps.h, (b * BOX_COLS) as i32, vcol0, state_row, src);
                }
            } else {
                tma_store_3d(maps.h, vcol0, 0, state_row, h);
            }
            if item.rows(c) == CHUNK {
                tma_store_3d(maps.v_new, vcol0, head, item.first_token(c) as i32, vn);
            }
        }
        bulk_commit_group();
    }
}

//! The producer warp: loads each item's initial state into the `h0` slot and each chunk's tiles
//! into the ring, running up to its depth in chunks ahead of the consumer (across item boundaries:
//! the next item's first loads overlap the current item's last chunks).

use super::keys::KeySize;
use super::maps::{ChunkLoad, LoadMaps};
use super::smem::Smem;
use super::tail;
use crate::arch::sm80::{exp2_approx, st_shared_f32};
use crate::arch::sm90::tma_load_3d;
use crate::layout::CHUNK;
use crate::layout::hopper::{BOX_BYTES, BOX_COLS, Block, PRODUCER_THREADS};
use crate::pipeline::PipelineState;
use crate::schedule::{Item, RowStrides, Work};

/// Lanes of the producer warp.
const LANES: usize = PRODUCER_THREADS;
/// `g` rows (tokens) each producer lane reads and exponentiates per chunk.
const ROWS_PER_LANE: usize = CHUNK / LANES;

/// The launch's gates: `g` `[T, HV]` and `gk` `[T, HV, K]` f32 (log2, cumulative inside each
/// chunk), each null when absent, with their strides.
#[derive(Clone, Copy)]
pub struct Gates {
    pub g: *const f32,
    pub gk: *const f32,
    pub g_rows: RowStrides,
    pub gk_rows: RowStrides,
}

/// One chunk's gate values as one producer lane holds them.
struct ChunkGates<C: KeySize> {
    /// `gk` of the chunk's last row at columns `lane + LANES * i` (zeros without `gk`).
    gk_last: C::GateLane,
    /// `g` of rows `lane + LANES * i` (zeros without `g`; past the chunk's valid rows, the last
    /// valid row's).
    g: [f32; ROWS_PER_LANE],
    /// `g` of the chunk's last valid row (zero without `g`).
    g_last: f32,
}

impl<C: KeySize> Clone for ChunkGates<C> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<C: KeySize> Copy for ChunkGates<C> {}

impl<C: KeySize> ChunkGates<C> {
    fn none() -> Self {
        Self { gk_last: C::gate_lane(|_| 0.0), g: [0.0; ROWS_PER_LANE], g_last: 0.0 }
    }
}

impl Gates {
    /// This lane's gate values of chunk `c` of `item`.
    ///
    /// # Safety
    /// The gates given hold the contract's shapes (with their strides) for `item`.
    #[inline(always)]
    unsafe fn read<C: KeySize>(&self, item: &Item, c: usize, lane: usize) -> ChunkGates<C> {
        let (t0, rows) = (item.first_token(c), item.rows(c));
        let last = t0 + rows - 1;
        let mut out = ChunkGates::<C>::none();
        // SAFETY (block): every row read is a valid token of this sequence and head.
        if !self.gk.is_null() {
            let row = unsafe { self.gk.add(self.gk_rows.row(last, item.head)) };
            out.gk_last = C::gate_lane(|i| unsafe { *row.add(lane + LANES * i) });
        }
        if !self.g.is_null() {
            let at = |t: usize| unsafe { *self.g.add(self.g_rows.row(t, item.head)) };
            out.g_last = at(last);
            // Rows past the chunk's end read its last valid row instead: their scale is never
            // used, and a load with no select on its value leaves the lane free until the value
            // is used, an iteration later (a select here made every lane wait for its loads on
            // the spot: about 0.3 us per chunk of every chain with `g`).
            out.g = core::array::from_fn(|i| at(t0 + (lane + LANES * i).min(rows - 1)));
        }
        out
    }
}

/// The producer warp's loop over this CTA's items.
///
/// # Safety
/// Called by the 32 lanes of the producer warp only, after the barriers are initialised; the
/// maps describe the launch's tensors and the gates hold the contract's shapes for the
/// schedule's items.
#[inline(always)]
pub unsafe fn run<C: KeySize, B: Block>(work: &Work, smem: Smem<C, B>, lane: usize, maps: LoadMaps, gates: Gates) {
    let mut stage = PipelineState::producer_start(smem.ring().stages());
    let mut slot = PipelineState::producer_start(1);
    for item in work.items::<{ super::PRODUCER_ROLE }>() {
        if let (Some(h0), Some(row)) = (maps.h0, item.h0_row) {
            // SAFETY: the item's state block exists in `h0` (the map describes it).
            unsafe { load_initial_state(&item, row, smem, lane, h0, maps.value_first, slot) };
            slot.advance();
        }
        // SAFETY: as this function's.
        unsafe { load_chunks(&item, smem, lane, &maps, gates, &mut stage) };
    }
}

/// Loads `item`'s initial state block (state row `row`) into the `h0` slot once the consumer
/// has read the previous one.
///
/// # Safety
/// Producer warp only; `slot` is the producer's position on the slot's barriers.
#[inline(always)]
unsafe fn load_initial_state<C: KeySize, B: Block>(
    item: &Item,
    row: usize,
    smem: Smem<C, B>,
    lane: usize,
    h0: u64,
    value_first: bool,
    slot: PipelineState,
) {
    let h0_slot = smem.h0_slot();
    // SAFETY: the barriers are initialised; one lane announces and issues the one box, which
    // lies inside `h0` (state row `row`, columns `h0_col(item) ..+ BV`: the map's first two
    // coordinates are (value column, key row) for key-first states and (key row, value column)
    // for value-first ones, and its box is the whole `K` x `BV` block either way).
    unsafe {
        h0_slot.producer_acquire(slot);
        if lane == 0 {
            // The item's `K x BV` f32 block.
            h0_slot.producer_commit_tx(slot, (C::K * B::BV * 4) as u32);
            let col = h0_col(item) as i32;
            let (c0, c1) = if value_first { (0, col) } else { (col, 0) };
            tma_load_3d(smem.h0(), h0, c0, c1, row as i32, h0_slot.full(slot));
        }
    }
}

/// The first column of `item`'s block in `h0`: the `u` column it reads (its own first value
/// column in the recurrence; in a first segment's pre-scan, whose blocks are the map's `B`
/// columns `K + c`, the state's column `c`).
#[inline(always)]
fn h0_col(item: &Item) -> usize {
    item.u_col.unwrap_or(item.vcol0)
}

/// The chunks of one item, from ring position `stage` on.
///
/// # Safety
/// As for [`run`].
#[inline(always)]
unsafe fn load_chunks<C: KeySize, B: Block>(
    item: &Item,
    smem: Smem<C, B>,
    lane: usize,
    maps: &LoadMaps,
    gates: Gates,
    stage: &mut PipelineState,
) {
    let ring = smem.ring();
    let chunks = item.chunks();
    // SAFETY (block): `run`'s contract on the gates.
    let mut gate = if chunks > 0 { unsafe { gates.read::<C>(item, 0, lane) } } else { ChunkGates::none() };
    for c in 0..chunks {
        let s = *stage;
        stage.advance();
        // The next chunk's gates are loaded one iteration ahead, so their latency hides behind
        // the wait for a free stage instead of delaying this chunk's TMA loads.
        let next = if c + 1 < chunks { unsafe { gates.read::<C>(item, c + 1, lane) } } else { ChunkGates::none() };
        // SAFETY: the barriers are initialised and `s` is the producer's position; the decay and
        // scale rows and the tiles are the stage's, free once the acquire returns; every box read
        // lies inside the chunk's valid rows of this sequence (a partial chunk takes the tail
        // path).
        unsafe {
            ring.producer_acquire(s);
            let rows = item.rows(c);
            write_gate_rows(smem, s.index(), &gate, !gates.g.is_null(), lane);
            gate = next;
            let load = ChunkLoad { item, c, tiles: smem.stage(s.index()), lane, maps, ring, stage: s };
            if rows == CHUNK {
                load_full_chunk::<C, B>(load);
            } else {
                tail::load_partial_chunk::<C, B>(load);
            }
        }
    }
}

/// The stage's decay row (`exp2(gk_last + g_last)` per key row) and row scales
/// (`exp2(g_last - g[r])` per token) from this lane's gate values. Without `g` the scales are
/// never read, and without gates the decay is one.
///
/// # Safety
/// Producer lanes only; `stage` is a stage the producer holds.
#[inline(always)]
unsafe fn write_gate_rows<C: KeySize, B: Block>(
    smem: Smem<C, B>,
    stage: usize,
    gate: &ChunkGates<C>,
    scalar_gate: bool,
    lane: usize,
) {
    let (decay, scale) = (smem.decay(stage), smem.row_scale(stage));
    // SAFETY: column `lane + LANES * i < K` of the decay row, row `lane + LANES * i < CHUNK` of
    // the scales.
    unsafe {
        for (i, &x) in gate.gk_last.as_ref().iter().enumerate() {
            st_shared_f32(decay + ((lane + LANES * i) * 4) as u32, exp2_approx(x + gate.g_last));
        }
        if scalar_gate {
            for (i, &x) in gate.g.iter().enumerate() {
                let r = lane + LANES * i;
                // Rows past the end hold the last valid row's `g`: their scale is never used (their
                // `Vn` is zero).
                st_shared_f32(scale + (r * 4) as u32, exp2_approx(gate.g_last - x));
            }
        }
    }
}

/// A full chunk: one lane announces the stage's bytes and issues the `k`, `w` and `u` boxes (and
/// in the fused pass the `q Γ` and attention boxes); the others arrive after their decay-row
/// writes.
///
/// # Safety
/// Producer warp only; the chunk has `CHUNK` valid rows.
#[inline(always)]
unsafe fn load_full_chunk<C: KeySize, B: Block>(load: ChunkLoad<'_>) {
    if load.lane != 0 {
        // SAFETY: this lane's one arrival of the round, after its writes to the stage.
        unsafe { load.ring.producer_arrive(load.stage) };
    } else {
        let (tiles, maps, t) = (load.tiles, load.maps, load.item.first_token(load.c));
        // SAFETY: the boxes are the chunk's rows of `k`, `w`, (unless its values are zero) `u`
        // and (fused) `q Γ` and the attention, exactly the bytes announced.
        unsafe {
            let u_bytes = if load.item.u_col.is_some() { B::U_BOX_BYTES } else { 0 };
            let output_bytes = if B::OUTPUT { (C::KB + 1) * BOX_BYTES } else { 0 };
            load.ring.producer_commit_tx(load.stage, (2 * C::KB * BOX_BYTES + u_bytes + output_bytes) as u32);
            for b in 0..C::KB {
                load.load_key_box(tiles.k(b), maps.k, b * BOX_COLS, t);
                load.load_box(tiles.w(b), maps.w, b * BOX_COLS, t);
            }
            if let Some(col) = load.item.u_col {
                load.load_box(tiles.u(), maps.u, col, t);
            }
            if let (true, Some(o)) = (B::OUTPUT, maps.output) {
                for b in 0..C::KB {
                    load.load_box(tiles.q(b), o.q, b * BOX_COLS, t);
                }
                load.load_box(tiles.p(), o.p, 0, t);
            }
        }
    }
}

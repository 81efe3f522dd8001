//! The producer warp: loads each item's initial state into the `h0` slot and each chunk's tiles
//! into the ring, running up to `STAGES` chunks ahead of the consumer (across item boundaries:
//! the next item's first loads overlap the current item's last chunks).

use super::maps::{ChunkLoad, LoadMaps};
use super::smem::Smem;
use super::tail;
use crate::arch::sm80::{exp2_approx, st_shared_f32, sync_warp};
use crate::arch::sm90::tma_load_3d;
use crate::layout::hopper::{BOX_COLS, BV, KEY_BOXES, PRODUCER_THREADS, STAGE_BYTES, STAGES};
use crate::layout::{CHUNK, K_DIM};
use crate::pipeline::PipelineState;
use crate::schedule::{Item, Work};

/// Lanes of the producer warp.
const LANES: usize = PRODUCER_THREADS;
/// Gate columns each producer lane reads and exponentiates per chunk.
const GATE_PER_LANE: usize = K_DIM / LANES;
/// Bytes of one item's initial state block (`[K][BV]` f32).
const H0_TX_BYTES: u32 = (K_DIM * BV * 4) as u32;
/// Bytes a full chunk's TMA loads deliver to its stage.
const STAGE_TX_BYTES: u32 = STAGE_BYTES as u32;

/// The producer warp's loop over this CTA's items.
///
/// # Safety
/// Called by the 32 lanes of the producer warp only, after the barriers are initialised; the
/// maps describe the launch's tensors and `gk` holds `[T][H][K]` f32 for the schedule's items.
#[inline(always)]
pub unsafe fn run(work: &Work, smem: Smem, lane: usize, maps: LoadMaps, gk: *const f32) {
    let mut stage = PipelineState::<STAGES>::producer_start();
    let mut slot = PipelineState::<1>::producer_start();
    for item in work.items::<{ super::PRODUCER_ROLE }>() {
        if let Some(h0) = maps.h0 {
            // SAFETY: the item's state block exists in `h0` (the map describes it).
            unsafe { load_initial_state(&item, smem, lane, h0, slot) };
            slot.advance();
        }
        // SAFETY: as this function's.
        unsafe { load_chunks(&item, smem, lane, &maps, gk, &mut stage) };
    }
}

/// Loads `item`'s initial state block into the `h0` slot once the consumer has read the
/// previous one.
///
/// # Safety
/// Producer warp only; `slot` is the producer's position on the slot's barriers.
#[inline(always)]
unsafe fn load_initial_state(item: &Item, smem: Smem, lane: usize, h0: u64, slot: PipelineState<1>) {
    let h0_slot = smem.h0_slot();
    // SAFETY: the barriers are initialised; one lane announces and issues the one box, which
    // lies inside `h0` (state row `item.state_row`, columns `vcol0 ..+ BV`).
    unsafe {
        h0_slot.producer_acquire(slot);
        if lane == 0 {
            h0_slot.producer_commit_tx(slot, H0_TX_BYTES);
            tma_load_3d(smem.h0(), h0, item.vcol0 as i32, 0, item.state_row as i32, h0_slot.full(slot));
        }
    }
}

/// The chunks of one item, from ring position `stage` on.
///
/// # Safety
/// As for [`run`].
#[inline(always)]
unsafe fn load_chunks(
    item: &Item,
    smem: Smem,
    lane: usize,
    maps: &LoadMaps,
    gk: *const f32,
    stage: &mut PipelineState<STAGES>,
) {
    let ring = smem.ring();
    // The chunk's last gate row, `GATE_PER_LANE` columns (`lane + LANES * i`) per lane.
    // SAFETY: the chunk's last valid row exists (the launcher validated `gk`).
    let gate_row = |c: usize| -> [f32; GATE_PER_LANE] {
        let last = unsafe { gk.add(item.key_row(item.first_token(c) + item.rows(c) - 1)) };
        core::array::from_fn(|i| unsafe { *last.add(lane + LANES * i) })
    };
    let chunks = item.chunks();
    let mut gate = if chunks > 0 { gate_row(0) } else { [0.0; GATE_PER_LANE] };
    for c in 0..chunks {
        let s = *stage;
        stage.advance();
        // The next chunk's gate row is loaded one iteration ahead, so its latency hides behind
        // the wait for a free stage instead of delaying this chunk's TMA loads.
        let next = if c + 1 < chunks { gate_row(c + 1) } else { [0.0; GATE_PER_LANE] };
        // SAFETY: the barriers are initialised and `s` is the producer's position; the decay row
        // and the tiles are the stage's, free once the acquire returns; every box read lies
        // inside the chunk's valid rows of this sequence (a partial chunk takes the tail path).
        unsafe {
            ring.producer_acquire(s);
            let rows = item.rows(c);
            write_decay_row(smem.decay(s.index()), &gate, lane);
            gate = next;
            let load = ChunkLoad { item, c, tiles: smem.stage(s.index()), lane, maps, ring, stage: s };
            if rows == CHUNK {
                load_full_chunk(load);
            } else {
                tail::load_partial_chunk(load);
            }
        }
    }
}

/// `exp2` of this lane's gate columns into the stage's decay row.
///
/// # Safety
/// Producer lanes only; `row` is the decay row of a stage the producer holds.
#[inline(always)]
unsafe fn write_decay_row(row: u32, gate: &[f32; GATE_PER_LANE], lane: usize) {
    for (i, &g) in gate.iter().enumerate() {
        // SAFETY: column `lane + LANES * i < K` of the row.
        unsafe { st_shared_f32(row + ((lane + LANES * i) * 4) as u32, exp2_approx(g)) };
    }
}

/// A full chunk: one lane announces the stage's bytes and issues the `k`, `w` and `u` boxes.
/// The warp barrier first orders every lane's decay-row write before that lane's arrival.
///
/// # Safety
/// Producer warp only; the chunk has `CHUNK` valid rows.
#[inline(always)]
unsafe fn load_full_chunk(load: ChunkLoad<'_>) {
    sync_warp();
    if load.lane == 0 {
        let (tiles, maps, t) = (load.tiles, load.maps, load.item.first_token(load.c));
        // SAFETY: the boxes are the chunk's rows of `k`, `w` and `u`, exactly the bytes announced.
        unsafe {
            load.ring.producer_commit_tx(load.stage, STAGE_TX_BYTES);
            for b in 0..KEY_BOXES {
                load.load_key_box(tiles.k(b), maps.k, b * BOX_COLS, t);
                load.load_box(tiles.w(b), maps.w, b * BOX_COLS, t);
            }
            load.load_box(tiles.u(), maps.u, load.item.vcol0, t);
        }
    }
}

//! The tensor maps each role hands to TMA, by generic address (they stay in the kernel's
//! parameter space), a chunk's load job as the producer and the tail share it, and the outputs
//! the consumers and the tail write.

use super::smem::StageTiles;
use crate::arch::sm90::{prefetch_tensormap, tma_load_3d};
use crate::layout::hopper::BOX_COLS;
use crate::pipeline::{Pipeline, PipelineState};
use crate::schedule::{Item, RowStrides};

/// Generic addresses of the producer's tensor maps: `k`, `w`, `u` in full-chunk boxes, and in
/// boxes of one swizzle atom of rows and of one row for tail chunks.
#[derive(Clone, Copy)]
pub struct LoadMaps {
    /// `k` in `[CHUNK][1][64]` boxes.
    pub k: u64,
    /// `w`, as `k`.
    pub w: u64,
    /// `u` in `[CHUNK][1][BV]` boxes (the block's width).
    pub u: u64,
    /// `k` in one-row boxes.
    pub k_row: u64,
    /// `w` in one-row boxes.
    pub w_row: u64,
    /// `u` in one-row boxes.
    pub u_row: u64,
    /// `k` in boxes of one swizzle atom of rows (`layout::hopper::ATOM_ROWS`).
    pub k_atom: u64,
    /// `w` in boxes of one atom of rows.
    pub w_atom: u64,
    /// `u` in boxes of one atom of rows.
    pub u_atom: u64,
    /// `h0` in f32 boxes of one item's whole state block, when the launch has initial states.
    pub h0: Option<u64>,
    /// Whether the states are value-first (`h0`'s coordinates are then (key, value column)).
    pub value_first: bool,
    /// The fused layer pass's `q Γ` and causal attention, when the pass is fused.
    pub output: Option<OutputLoadMaps>,
}

/// Generic addresses of the fused layer pass's extra tensor maps.
#[derive(Clone, Copy)]
pub struct OutputLoadMaps {
    /// `q Γ` in `[CHUNK][1][64]` boxes, as `w`.
    pub q: u64,
    /// `q Γ` in one-row boxes.
    pub q_row: u64,
    /// The causal attention in `[CHUNK][1][CHUNK]` boxes.
    pub p: u64,
    /// The causal attention in one-row boxes.
    pub p_row: u64,
    /// `q Γ` in boxes of one atom of rows.
    pub q_atom: u64,
    /// The causal attention in boxes of one atom of rows.
    pub p_atom: u64,
}

impl LoadMaps {
    /// Prefetches every map into the TMA unit's descriptor cache.
    ///
    /// # Safety
    /// The addresses are tensor maps in the kernel's parameter block.
    #[inline(always)]
    pub unsafe fn prefetch(&self) {
        // (One call per map: a loop over an array of them would put the array on the stack.)
        // SAFETY: see the function's contract.
        unsafe {
            prefetch_tensormap(self.k);
            prefetch_tensormap(self.w);
            prefetch_tensormap(self.u);
            prefetch_tensormap(self.k_row);
            prefetch_tensormap(self.w_row);
            prefetch_tensormap(self.u_row);
            prefetch_tensormap(self.k_atom);
            prefetch_tensormap(self.w_atom);
            prefetch_tensormap(self.u_atom);
            if let Some(h0) = self.h0 {
                prefetch_tensormap(h0);
            }
            if let Some(o) = self.output {
                prefetch_tensormap(o.q);
                prefetch_tensormap(o.q_row);
                prefetch_tensormap(o.p);
                prefetch_tensormap(o.p_row);
                prefetch_tensormap(o.q_atom);
                prefetch_tensormap(o.p_atom);
            }
        }
    }
}

/// Generic addresses of the consumer's tensor maps: the `h` and `v_new` stores.
#[derive(Clone, Copy)]
pub struct StoreMaps {
    /// `h` in `[1][K][64]` boxes (key-first) or `[1][BV][64]` boxes (value-first).
    pub h: u64,
    /// `v_new` in `[CHUNK][1][64]` boxes.
    pub v_new: u64,
}

/// The first column of the tail chunk's one-row `u` boxes holding column `col`: a wide block's
/// own columns, or the 64 a narrow block's 32 lie in (`layout::hopper::Stage`).
#[inline(always)]
pub fn u_box_column(col: usize) -> usize {
    col - col % BOX_COLS
}

/// The loads of chunk `c` of `item` into the ring stage at `stage`, which the producer holds.
#[derive(Clone, Copy)]
pub struct ChunkLoad<'a> {
    pub item: &'a Item,
    pub c: usize,
    /// The stage's tiles.
    pub tiles: StageTiles,
    /// This producer lane.
    pub lane: usize,
    pub maps: &'a LoadMaps,
    pub ring: Pipeline,
    pub stage: PipelineState,
}

impl ChunkLoad<'_> {
    /// A TMA load of the box at column `col` of token `token` (this item's value head) through
    /// `map` (`w` or `u`) into shared address `dst`, completing on the stage's `full` barrier.
    ///
    /// # Safety
    /// The box lies inside the sequence's valid rows and the tensor; `dst` is inside the stage's
    /// tiles, aligned as the map's swizzle needs; the bytes are announced on the barrier.
    #[inline(always)]
    pub unsafe fn load_box(self, dst: u32, map: u64, col: usize, token: usize) {
        // SAFETY: see the function's contract.
        unsafe { self.load_box_of_head(dst, map, col, self.item.head, token) }
    }

    /// [`Self::load_box`] of `k`, whose head is the item's key head.
    ///
    /// # Safety
    /// As for [`Self::load_box`].
    #[inline(always)]
    pub unsafe fn load_key_box(self, dst: u32, map: u64, col: usize, token: usize) {
        // SAFETY: see the function's contract.
        unsafe { self.load_box_of_head(dst, map, col, self.item.key_head, token) }
    }

    #[inline(always)]
    unsafe fn load_box_of_head(self, dst: u32, map: u64, col: usize, head: usize, token: usize) {
        let full = self.ring.full(self.stage);
        // SAFETY: the callers' contract.
        unsafe { tma_load_3d(dst, map, col as i32, head as i32, token as i32, full) }
    }
}

/// What the consumer writes: the `h` and `v_new` maps, `v_new`'s rows for the tail stores, and
/// `ht` (null when not wanted, packed `[N, HV, K, V]` or `[N, HV, V, K]` f32). In the fused layer
/// pass `v_new`, its rows and its map are the layer's output `o`'s, and `scale` its scale.
#[derive(Clone, Copy)]
pub struct Outputs {
    pub maps: StoreMaps,
    pub v_new: *mut u16,
    pub v_new_rows: RowStrides,
    pub ht: *mut f32,
    /// `V`.
    pub value_dim: usize,
    /// The fused pass's output scale.
    pub scale: f32,
}

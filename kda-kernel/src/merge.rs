//! The merge of split sequences (docs/CONTRACT.md, "Splitting one sequence"): chains each
//! sequence's segment maps into the entry states the main pass starts from,
//!
//! ```text
//! entry(0) = h0 (or zeros),   entry(s + 1) = M_s entry(s) + B_s
//! ```
//!
//! except that where the pre-scan ran a sequence's first segment from `h0` (its record's
//! `MERGE_FIRST_EXIT`), `entry(1)` is that run's exit state, the first map's `B` columns.
//!
//! Serial over a sequence's segments, parallel over sequences, value heads and blocks of
//! `COLS` value columns (one CTA each). The block of the entry state lives in shared memory
//! (double-buffered: step `s` reads one buffer and writes the other); each thread computes one
//! 4-column quad of `K / ROWS_PER_PASS` key rows per step. The maps do not depend on the
//! entries, so they stream ahead of the products: a step is cut into units (one pass's
//! `ROWS_PER_PASS` rows against `KEY_BLOCK` keys of the entry block), and every unit's rows of
//! `M_s` (with, for a pass's first unit, its rows of `B_s`) are copied by `cp.async` into a ring of
//! `STAGES` stages while earlier units are computed, so a step waits on the arithmetic, not on a
//! round trip to the L2 per batch of loads. Each map row is read by the `V / COLS` CTAs of its
//! head, through L2. Plain f32 arithmetic: every target has it.

use crate::abi::StateLayoutCode;
use crate::arch::sm80::{
    block_idx_x, cp_async_16, cp_async_commit_group, cp_async_wait_group, fma_f32, ld_shared_v4, smem_base_shared,
    st_shared_v4, sync_threads, thread_idx_x,
};
use crate::layout::merge::{
    COLS, ENTRY_WORDS, KEY_BLOCK, MAX_K, ROWS_PER_PASS, STAGE_ROW_WORDS, STAGE_WORDS, STAGES, STAGES_AT, THREADS,
};
use crate::layout::{MERGE_FIRST_ENTRY, MERGE_FIRST_EXIT, MERGE_FIRST_MAP, MERGE_SEGMENTS, MERGE_SEQ, MERGE_WORDS};

/// Threads per key row: one per 4-column quad.
const QUADS: usize = COLS / 4;
/// 16-byte copies of a staged row of `M_s` (`KEY_BLOCK` f32).
const ROW_COPIES: usize = KEY_BLOCK / 4;
/// 16-byte copies per thread of a unit's rows of `M_s`, and of a pass's rows of `B_s`.
const M_COPIES_PER_THREAD: usize = ROWS_PER_PASS * ROW_COPIES / THREADS;
const B_COPIES_PER_THREAD: usize = ROWS_PER_PASS * QUADS / THREADS;
const _: () = assert!(
    M_COPIES_PER_THREAD * THREADS == ROWS_PER_PASS * ROW_COPIES && B_COPIES_PER_THREAD * THREADS == ROWS_PER_PASS * QUADS,
    "the threads share a unit's copies evenly"
);
/// Word offset of a stage's rows of `B_s`, after its rows of `M_s`.
const STAGE_B_AT: usize = ROWS_PER_PASS * STAGE_ROW_WORDS;

/// Four adjacent f32, read and written as one 16-byte access.
#[derive(Clone, Copy)]
#[repr(C, align(16))]
struct Quad([f32; 4]);

/// A unit of a record's merge: step `step`, pass `pass` (its rows `pass * ROWS_PER_PASS ..`) and
/// key block `block` (keys `block * KEY_BLOCK ..` of the entry block).
#[derive(Clone, Copy)]
struct Unit {
    step: usize,
    pass: usize,
    block: usize,
}

/// The order of a record's units: steps, then passes, then key blocks; one per pass (its `B`
/// rows alone) in a first exit's step 0, whose `M` columns are not read.
#[derive(Clone, Copy)]
struct Units {
    steps: usize,
    passes: usize,
    blocks: usize,
    first_exit: bool,
}

impl Units {
    /// The first unit.
    const FIRST: Unit = Unit { step: 0, pass: 0, block: 0 };

    /// Key blocks of `M_s` that step `step` reads (0: its `B` columns alone).
    fn key_blocks(self, step: usize) -> usize {
        if step == 0 && self.first_exit { 0 } else { self.blocks }
    }

    /// Whether `u` is a unit of the record (and not past its last).
    fn has(self, u: Unit) -> bool {
        u.step < self.steps
    }

    /// Whether `u` is its pass's last unit (the one that completes its rows of the next entry).
    fn ends_pass(self, u: Unit) -> bool {
        u.block + 1 >= self.key_blocks(u.step)
    }

    /// The unit after `u` (by counters, no division).
    fn next(self, u: Unit) -> Unit {
        if !self.ends_pass(u) {
            Unit { block: u.block + 1, ..u }
        } else if u.pass + 1 < self.passes {
            Unit { pass: u.pass + 1, block: 0, ..u }
        } else {
            Unit { step: u.step + 1, pass: 0, block: 0 }
        }
    }
}

/// The shared address of ring stage `slot`.
fn stage_at(slot: usize) -> u32 {
    smem_base_shared() + ((STAGES_AT + slot * STAGE_WORDS) * 4) as u32
}

kernel_entry! {
    /// The split merge (`abi::MERGE`, parameters `abi::MERGE_PARAMS`). Grid: one CTA per (merge
    /// record, value head, block of `COLS` value columns), record-major; `abi::MERGE.threads`
    /// threads; `abi::MERGE.smem_bytes` of dynamic shared memory.
    ///
    /// # Safety
    /// `table` holds `gridDim.x / (heads * value_dim / COLS)` records of `MERGE_WORDS` words;
    /// `maps` holds every map row the records name (`[rows][key_dim][key_dim + value_dim]` f32,
    /// key-first), `h0` (unless null) and `entries` every state row they name
    /// (`[rows][key_dim][value_dim]` f32 in `state_layout`), all 16-byte aligned; `key_dim` is a
    /// multiple of `ROWS_PER_PASS` and of `KEY_BLOCK` up to `MAX_K`, `value_dim` a multiple of
    /// `COLS`; `entries` overlaps nothing else.
    pub unsafe fn kda_split_merge(
        maps: *const f32,
        h0: *const f32,
        entries: *mut f32,
        table: *const u32,
        heads: u32,
        key_dim: u32,
        value_dim: u32,
        state_layout: u32,
    ) {
        let (heads, kd, vd) = (heads as usize, key_dim as usize, value_dim as usize);
        let blocks = vd / COLS;
        if heads == 0 || blocks == 0 || kd > MAX_K {
            return; // the launcher never launches so; this proves the divisions and buffers safe
        }
        // 32-bit index arithmetic (the grid is below 2^31 CTAs): 64-bit divisions are subroutine
        // calls in SASS.
        let (b, heads32, blocks32) = (block_idx_x() as u32, heads as u32, blocks as u32);
        let per_record = heads32.wrapping_mul(blocks32);
        if heads32 == 0 || blocks32 == 0 || per_record == 0 {
            return; // beyond the launcher's limits; this proves the divisions below safe
        }
        let (record, head) = ((b / per_record) as usize, ((b / blocks32) % heads32) as usize);
        let block = (b % blocks32) as usize;
        let tid = thread_idx_x();
        let (quad, row0) = (tid % QUADS, tid / QUADS);
        let states = States {
            kd,
            vd,
            col: block * COLS + 4 * quad,
            value_first: state_layout == StateLayoutCode::ValueFirst as u32,
        };
        // SAFETY: the record exists (the grid covers the table).
        let [seq, first_entry, segments, first_map, first_exit] = unsafe {
            let r = table.add(record * MERGE_WORDS);
            [MERGE_SEQ, MERGE_FIRST_ENTRY, MERGE_SEGMENTS, MERGE_FIRST_MAP, MERGE_FIRST_EXIT].map(|w| *r.add(w) as usize)
        };
        let entry_row = |s: usize| (first_entry + s) * heads + head;
        // This thread's quad of key row `i` in entry buffer `s % 2`.
        let shared = |s: usize, i: usize| smem_base_shared() + (((s % 2) * ENTRY_WORDS + i * COLS + 4 * quad) * 4) as u32;
        let wide = kd + vd;
        let units = Units {
            steps: segments.saturating_sub(1),
            passes: kd / ROWS_PER_PASS,
            blocks: kd / KEY_BLOCK,
            first_exit: first_exit != 0,
        };
        // Issues unit `u`'s copies into the stage at `stage` (none past the last unit): its rows
        // of `M_s`, packed `STAGE_ROW_WORDS` apart, and for a pass's first unit its rows of the
        // block's `B_s` columns.
        let issue = |u: Unit, stage: u32| {
            if !units.has(u) {
                return;
            }
            // SAFETY (block): the record names map row `(first_map + s) * heads + head` for every
            // segment but the last; the rows lie below `kd`, the keys below `kd` (`kd` a
            // multiple of `KEY_BLOCK`), `B`'s columns inside the row; every copy 16-byte aligned
            // (the map's base, `wide`, `KEY_BLOCK` and `COLS` multiples of 4 f32); the
            // destinations inside the stage.
            unsafe {
                let map = maps.add(((first_map + u.step) * heads + head) * kd * wide);
                let first_row = u.pass * ROWS_PER_PASS;
                if units.key_blocks(u.step) > 0 {
                    for j in 0..M_COPIES_PER_THREAD {
                        let (r, part) = ((tid + j * THREADS) / ROW_COPIES, (tid + j * THREADS) % ROW_COPIES);
                        let src = map.add((first_row + r) * wide + u.block * KEY_BLOCK + 4 * part);
                        cp_async_16(stage + ((r * STAGE_ROW_WORDS + 4 * part) * 4) as u32, src.cast(), 16);
                    }
                }
                if u.block == 0 {
                    for j in 0..B_COPIES_PER_THREAD {
                        let (r, q) = ((tid + j * THREADS) / QUADS, (tid + j * THREADS) % QUADS);
                        let src = map.add((first_row + r) * wide + kd + block * COLS + 4 * q);
                        cp_async_16(stage + ((STAGE_B_AT + r * COLS + 4 * q) * 4) as u32, src.cast(), 16);
                    }
                }
            }
        };

        // entry(0): h0's block, or zeros.
        for i in (row0..kd).step_by(ROWS_PER_PASS) {
            // SAFETY (block): the row and columns are inside the named state rows; the shared
            // address inside buffer 0.
            unsafe {
                let x = if h0.is_null() { Quad([0.0; 4]) } else { states.read(h0, seq * heads + head, i) };
                st_shared_v4(shared(0, i), x.0.map(f32::to_bits));
                states.write(entries, entry_row(0), i, x);
            }
        }
        // The ring's first `STAGES - 1` units in flight, a group each.
        let mut ahead = Units::FIRST;
        for slot in 0..STAGES - 1 {
            issue(ahead, stage_at(slot));
            cp_async_commit_group();
            ahead = units.next(ahead);
        }
        let (mut u, mut slot) = (Units::FIRST, 0);
        let mut acc = Quad([0.0; 4]);
        while units.has(u) {
            // Unit `u`'s copies landed (the `STAGES - 2` later groups may not have), every
            // thread's visible after the barrier, which also closes the previous unit: its stage
            // takes the unit `STAGES - 1` ahead, and the entry rows it wrote are complete.
            cp_async_wait_group::<{ STAGES as u32 - 2 }>();
            // SAFETY: every thread runs the same units.
            unsafe { sync_threads() };
            issue(ahead, stage_at((slot + STAGES - 1) % STAGES));
            cp_async_commit_group();
            ahead = units.next(ahead);

            let stage = stage_at(slot);
            let i = u.pass * ROWS_PER_PASS + row0;
            // SAFETY (block): the stage holds unit `u` (above); its rows and `B` columns, and the
            // entry buffer's rows below `kd`, lie inside their buffers.
            unsafe {
                if u.block == 0 {
                    acc = Quad(ld_shared_v4(stage + ((STAGE_B_AT + row0 * COLS + 4 * quad) * 4) as u32).map(f32::from_bits));
                }
                if units.key_blocks(u.step) > 0 {
                    for part in 0..ROW_COPIES {
                        let m = ld_shared_v4(stage + ((row0 * STAGE_ROW_WORDS + 4 * part) * 4) as u32);
                        for (jj, &mk) in m.iter().enumerate() {
                            let e = ld_shared_v4(shared(u.step, u.block * KEY_BLOCK + 4 * part + jj));
                            for (a, &x) in acc.0.iter_mut().zip(&e) {
                                *a = fma_f32(f32::from_bits(mk), f32::from_bits(x), *a);
                            }
                        }
                    }
                }
                if units.ends_pass(u) {
                    st_shared_v4(shared(u.step + 1, i), acc.0.map(f32::to_bits));
                    states.write(entries, entry_row(u.step + 1), i, acc);
                }
            }
            u = units.next(u);
            slot = (slot + 1) % STAGES;
        }
    }
}

/// One thread's quad of state columns (`col .. col + 4`) in `[rows][K][V]` f32 states of either
/// layout.
#[derive(Clone, Copy)]
struct States {
    kd: usize,
    vd: usize,
    col: usize,
    value_first: bool,
}

impl States {
    /// Offset of element (key `i`, value column `c`) of state row `row`.
    #[inline(always)]
    fn at(self, row: usize, i: usize, c: usize) -> usize {
        row * self.kd * self.vd + if self.value_first { c * self.kd + i } else { i * self.vd + c }
    }

    /// The quad of key row `i` of state row `row`.
    ///
    /// # Safety
    /// The row exists in `states`, which is 16-byte aligned.
    #[inline(always)]
    unsafe fn read(self, states: *const f32, row: usize, i: usize) -> Quad {
        // SAFETY (block): see the function's contract; key-first quads are contiguous and
        // 16-byte aligned (`col` and `vd` are multiples of 4).
        unsafe {
            if self.value_first {
                Quad(core::array::from_fn(|j| *states.add(self.at(row, i, self.col + j))))
            } else {
                *states.add(self.at(row, i, self.col)).cast::<Quad>()
            }
        }
    }

    /// Writes `x` as the quad of key row `i` of state row `row`.
    ///
    /// # Safety
    /// As for [`Self::read`], the row writable.
    #[inline(always)]
    unsafe fn write(self, states: *mut f32, row: usize, i: usize, x: Quad) {
        // SAFETY (block): as in `read`.
        unsafe {
            if self.value_first {
                for (j, &v) in x.0.iter().enumerate() {
                    *states.add(self.at(row, i, self.col + j)) = v;
                }
            } else {
                *states.add(self.at(row, i, self.col)).cast::<Quad>() = x;
            }
        }
    }
}

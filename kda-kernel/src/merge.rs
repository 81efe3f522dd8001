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
//! serial over a sequence's segments, parallel over sequences, value heads and blocks of
//! `COLS` value columns (one CTA each). The block of the entry state lives in shared memory
//! (double-buffered: step `s` reads one buffer and writes the other); each thread computes one
//! 4-column quad of `K / ROWS_PER_PASS` key rows per step, reading its rows of `M_s` straight
//! from global memory (each row is read by the `V / COLS` CTAs of its head, through L2). Plain f32
//! arithmetic: every target has it.

use crate::abi::StateLayoutCode;
use crate::arch::sm80::{
    block_idx_x, fma_f32, ld_shared_v4, smem_base_shared, st_shared_v4, sync_threads, thread_idx_x,
};
use crate::layout::merge::{COLS, MAX_K, ROWS_PER_PASS};
use crate::layout::{MERGE_FIRST_ENTRY, MERGE_FIRST_EXIT, MERGE_FIRST_MAP, MERGE_SEGMENTS, MERGE_SEQ, MERGE_WORDS};

/// Threads per key row: one per 4-column quad.
const QUADS: usize = COLS / 4;
/// Bytes of one buffer of the entry block (`MAX_K x COLS` f32).
const BUFFER_BYTES: usize = MAX_K * COLS * 4;
/// Quads (4 key columns) of a row of `M_s` a thread loads before using them: independent loads
/// in flight hide the latency of the global reads. `4 * LOAD_BATCH` must divide every key size
/// (checked below): a batch past `K` would read `B`'s columns as `M`'s.
const LOAD_BATCH: usize = 16;

const _: () = {
    let mut i = 0;
    while i < crate::layout::hopper::KEY_DIMS.len() {
        assert!(
            crate::layout::hopper::KEY_DIMS[i].is_multiple_of(4 * LOAD_BATCH),
            "a load batch spans key columns only"
        );
        i += 1;
    }
};

/// Four adjacent f32, read and written as one 16-byte access.
#[derive(Clone, Copy)]
#[repr(C, align(16))]
struct Quad([f32; 4]);

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
    /// multiple of `ROWS_PER_PASS` up to `MAX_K`, `value_dim` a multiple of `COLS`; `entries`
    /// overlaps nothing else.
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
        let shared =
            |s: usize, i: usize| (smem_base_shared() as usize + (s % 2) * BUFFER_BYTES + (i * COLS + 4 * quad) * 4) as u32;
        let wide = kd + vd;

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
        // SAFETY: every thread reaches it.
        unsafe { sync_threads() };
        for s in 0..segments.saturating_sub(1) {
            // SAFETY: the record names map row `(first_map + s) * heads + head` for every segment but
            // the last.
            let map = unsafe { maps.add(((first_map + s) * heads + head) * kd * wide) };
            // The key columns `M_s` spans: none for a first exit, whose entry(1) is the map's `B`
            // columns alone (its key columns are not written).
            let depth = if s == 0 && first_exit != 0 { 0 } else { kd };
            for i in (row0..kd).step_by(ROWS_PER_PASS) {
                // SAFETY (block): row `i` of the map, its `B` quad at key column `kd + col`; the
                // entry block's rows in buffer `s % 2`, written by the previous step before the
                // barrier.
                unsafe {
                    let row = map.add(i * wide);
                    let mut acc = *row.add(kd + states.col).cast::<Quad>();
                    for k0 in (0..depth).step_by(4 * LOAD_BATCH) {
                        let m: [Quad; LOAD_BATCH] = core::array::from_fn(|j| *row.add(k0 + 4 * j).cast::<Quad>());
                        for (j, mq) in m.iter().enumerate() {
                            for (jj, &mk) in mq.0.iter().enumerate() {
                                let e = ld_shared_v4(shared(s, k0 + 4 * j + jj));
                                for (a, &x) in acc.0.iter_mut().zip(&e) {
                                    *a = fma_f32(mk, f32::from_bits(x), *a);
                                }
                            }
                        }
                    }
                    st_shared_v4(shared(s + 1, i), acc.0.map(f32::to_bits));
                    states.write(entries, entry_row(s + 1), i, acc);
                }
            }
            // SAFETY: every thread reaches it (the loop bounds are the CTA's).
            unsafe { sync_threads() };
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

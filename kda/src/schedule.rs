//! The persistent Hopper kernel's work schedule: which CTA runs which (sequence, head,
//! column-block) items, in which order.
//!
//! A ragged batch launched one CTA per item runs in launch order: the longest sequences may start
//! last and finish alone, and short items each pay their state load and pipeline fill with nothing
//! to overlap. Instead the kernel runs one CTA per SM (a persistent grid of [`Schedule::workers`]),
//! and each CTA walks its own list of items back to back: its producer warp runs ahead across item
//! boundaries, so the next item's initial state and first chunks load while the current item's
//! last chunks compute.
//!
//! The lists come from longest-processing-time-first list scheduling: items sorted by modelled
//! cost, longest first, each given to the worker with the least work so far. Greedy list
//! scheduling finishes within `total / workers + longest` (Graham's bound), and LPT within
//! `4/3` of the best possible makespan; both are tested. The two column blocks of a (sequence,
//! head) have equal cost and sit next to each other in that order, so they start together on
//! two SMs and share their `k` and `w` tiles through L2.
//!
//! The schedule is a pure function of the lengths, the head count and the worker count, built
//! once per batch layout (in [`crate::DevicePlan`]) and uploaded with it.

use crate::{KdaError, Plan};
use kda_kernel::layout::{
    ITEM_CHUNK_START, ITEM_H0_ROW, ITEM_HEAD, ITEM_HT_ROW, ITEM_KEY_HEAD, ITEM_LAST, ITEM_LEN, ITEM_NEXT, ITEM_NO_ROW,
    ITEM_NO_U, ITEM_TOKEN_START, ITEM_U_COL, ITEM_VCOL0, ITEM_WORDS, hopper::BV,
};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Modelled cost of an item, in units of one chunk's time: its chunks plus a fixed overhead
/// for loading the initial state, storing the final one and filling the pipeline. (An item
/// with no chunks still loads `h0` and stores `ht`.)
pub const ITEM_OVERHEAD: u64 = 2;
/// No item costs nothing, which `Schedule::try_lpt` relies on to place its first items.
const _: () = assert!(ITEM_OVERHEAD > 0);

/// Modelled cost of one item of a sequence of `len` tokens.
pub fn item_cost(len: usize) -> u64 {
    (kda_kernel::layout::chunks_of(len) as u64).saturating_add(ITEM_OVERHEAD)
}

/// One run of the recurrence the schedule places: a whole sequence, or one segment of a split
/// sequence (`kda::split`), with the state rows it starts from and ends in. Its items are its
/// (value head, column block) pairs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unit {
    /// First token.
    pub token_start: usize,
    /// Length in tokens.
    pub len: usize,
    /// First chunk in `h`.
    pub chunk_start: usize,
    /// Its state in `h0` (head `i`'s row is `h0_state * HV + i`), or `None` when it starts from
    /// no state (the pre-scan's maps start from `[I | 0]`).
    pub h0_state: Option<usize>,
    /// Its state in `ht`, or `None` when its final state is not wanted.
    pub ht_state: Option<usize>,
}

impl Unit {
    /// Every sequence of `plan` whole, reading and writing its own state.
    pub fn sequences(plan: &Plan) -> Vec<Unit> {
        let unit = |(n, d): (usize, &crate::plan::SeqDesc)| Unit {
            token_start: d.token_start,
            len: d.len,
            chunk_start: d.chunk_start,
            h0_state: Some(n),
            ht_state: Some(n),
        };
        plan.seqs().iter().enumerate().map(unit).collect()
    }
}

/// Which columns of `u` an item reads, given its first state column.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UColumns {
    /// The recurrence: the state's columns.
    Values,
    /// The pre-scan over the augmented state `[M | B]`: column `key_dim + c` reads `u`'s column
    /// `c`; the key columns read none (their values are zero).
    Prescan {
        /// `K`.
        key_dim: usize,
    },
}

impl UColumns {
    /// The first of the `width`-column blocks `unit` runs: in the pre-scan, a unit that starts
    /// from a state (a sequence's first segment, from `h0`) runs the map's `B` columns alone,
    /// which then hold its exit state rather than a map; every other unit runs all its blocks.
    pub fn first_block(self, unit: &Unit, width: usize) -> usize {
        match self {
            UColumns::Prescan { key_dim } if unit.h0_state.is_some() => key_dim.div_ceil(width.max(1)),
            _ => 0,
        }
    }

    /// The `u`-column word of an item whose first state column is `vcol0` (`None`: the
    /// value does not fit).
    fn word(self, vcol0: usize) -> Option<u32> {
        match self {
            UColumns::Prescan { key_dim } if vcol0 < key_dim => Some(ITEM_NO_U),
            UColumns::Prescan { key_dim } => u32::try_from(vcol0 - key_dim).ok(),
            UColumns::Values => u32::try_from(vcol0).ok().filter(|&c| c != ITEM_NO_U),
        }
    }
}

/// Work lists of a persistent grid: worker `b` runs items `items[offsets[b] .. offsets[b + 1]]`
/// in order. An item is numbered `(seq * heads + head) * col_blocks + block`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    offsets: Vec<u32>,
    items: Vec<u32>,
    heads: usize,
    col_blocks: usize,
    /// Value columns per block (`hopper::BV` unless [`Schedule::with_block_width`] says).
    block_width: usize,
}

impl Schedule {
    /// The LPT schedule of every (sequence, head, column block) item of `plan` over at most
    /// `max_workers` workers (fewer when there are fewer items; none for an empty batch; one if
    /// `max_workers` is 0).
    ///
    /// A column block is `hopper::BV` value columns (`col_blocks` = `V / BV`) unless
    /// [`Schedule::with_block_width`] says otherwise.
    ///
    /// Fails when the item count `N * heads * col_blocks` does not fit in `u32`, or `col_blocks`
    /// is 0.
    pub fn try_lpt(plan: &Plan, heads: usize, col_blocks: usize, max_workers: usize) -> Result<Self, KdaError> {
        Self::try_lpt_lengths(&plan.lengths(), heads, col_blocks, max_workers)
    }

    /// [`Schedule::try_lpt`] of units of the given `lengths` (tokens): sequences, or the segments
    /// of split ones.
    pub fn try_lpt_lengths(
        lengths: &[usize],
        heads: usize,
        col_blocks: usize,
        max_workers: usize,
    ) -> Result<Self, KdaError> {
        Self::lpt(lengths, |_| 0, heads, col_blocks, max_workers)
    }

    /// The LPT schedule of a pass over `units` (sequences, segments, or the pre-scan's
    /// segments), in blocks of `width` value columns, `col_blocks` per head, from each unit's
    /// [`UColumns::first_block`] (the items of the blocks before it are not run). As
    /// [`Schedule::try_lpt_lengths`] otherwise; its table is [`Schedule::table_of`] the same
    /// `units` and `u_columns`.
    pub fn try_lpt_units(
        units: &[Unit],
        u_columns: UColumns,
        heads: usize,
        (col_blocks, width): (usize, usize),
        max_workers: usize,
    ) -> Result<Self, KdaError> {
        let lengths: Vec<usize> = units.iter().map(|u| u.len).collect();
        let first = |n: usize| units.get(n).map_or(0, |u| u_columns.first_block(u, width));
        Ok(Self::lpt(&lengths, first, heads, col_blocks, max_workers)?.with_block_width(width))
    }

    /// The LPT schedule of the items of units of `lengths` whose column block is at least
    /// `first_block(unit)`.
    fn lpt(
        lengths: &[usize],
        first_block: impl Fn(usize) -> usize,
        heads: usize,
        col_blocks: usize,
        max_workers: usize,
    ) -> Result<Self, KdaError> {
        if col_blocks == 0 {
            return Err(KdaError::Argument { name: "col_blocks", reason: "must be at least 1".into() });
        }
        let count = lengths.len().checked_mul(heads).and_then(|n| n.checked_mul(col_blocks));
        if count.and_then(|n| u32::try_from(n).ok()).is_none() {
            return Err(KdaError::Argument {
                name: "heads",
                reason: format!(
                    "N * H * column blocks = {} x {heads} x {col_blocks} work items do not fit in 32 bits",
                    lengths.len()
                ),
            });
        }
        // Items per sequence: at least 1 whenever there is an item.
        let per_seq = heads * col_blocks;
        let cost = |item: u32| item_cost(lengths[item as usize / per_seq]);
        // Longest first; ties in item order, so the column blocks of a head stay adjacent. A
        // sequence's items cost the same and are numbered consecutively, so the units are
        // sorted (by cost, then index) and each one's items follow in order: the same order as
        // sorting the items, at the cost of sorting the units.
        let mut units: Vec<u32> = (0..lengths.len() as u32).collect();
        units.sort_by_key(|&u| (Reverse(item_cost(lengths[u as usize])), u));
        let mut order: Vec<u32> = Vec::with_capacity(count.unwrap_or(0));
        for &u in &units {
            let first = u as usize * per_seq;
            for head in 0..heads {
                let blocks = first + head * col_blocks..first + (head + 1) * col_blocks;
                // Every item number fits in `u32` (checked above).
                order.extend(blocks.skip(first_block(u as usize)).map(|item| item as u32));
            }
        }
        let workers = max_workers.max(1).min(order.len());
        // Each item's worker, in the order they are placed; then the workers' lists laid end to
        // end by a counting pass (two flat buffers, not a list per worker). The first `workers`
        // items go to workers 0, 1, .. in turn (every load is 0 and ties go to the lowest index,
        // and no cost is 0), so the heap starts from them: a batch of no more items than
        // workers (a short prompt) takes no heap step at all.
        let mut owner: Vec<u32> = (0..workers as u32).collect();
        // Min-heap of (load, worker): the least-loaded worker, the lowest index on ties.
        let mut heap: BinaryHeap<Reverse<(u64, u32)>> = if order.len() > workers {
            order[..workers].iter().zip(0u32..).map(|(&item, w)| Reverse((cost(item), w))).collect()
        } else {
            BinaryHeap::new()
        };
        for &item in &order[workers..] {
            // There is a worker whenever there is an item (`workers >= 1` when `order` is not
            // empty).
            let Some(Reverse((load, w))) = heap.pop() else { break };
            owner.push(w);
            heap.push(Reverse((load.saturating_add(cost(item)), w)));
        }
        // Counts fit in `u32`: at most the item count.
        let mut offsets = vec![0u32; workers + 1];
        for &w in &owner {
            offsets[w as usize + 1] += 1;
        }
        for w in 0..workers {
            offsets[w + 1] += offsets[w];
        }
        let mut next = offsets.clone();
        let mut items = vec![0u32; owner.len()];
        for (&item, &w) in order.iter().zip(&owner) {
            items[next[w as usize] as usize] = item;
            next[w as usize] += 1;
        }
        Ok(Self { offsets, items, heads, col_blocks, block_width: BV })
    }

    /// This schedule with column blocks of `width` value columns (the records' columns are
    /// `block * width`): `hopper::NARROW_BV` for the narrow kernel.
    pub fn with_block_width(mut self, width: usize) -> Self {
        self.block_width = width;
        self
    }

    /// Value columns per block.
    pub fn block_width(&self) -> usize {
        self.block_width
    }

    /// Workers (CTAs of the persistent grid).
    pub fn workers(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    /// The items of worker `w`, in the order it runs them (none for `w >= workers()`).
    pub fn items_of(&self, w: usize) -> &[u32] {
        let bounds = self.offsets.get(w).zip(w.checked_add(1).and_then(|next| self.offsets.get(next)));
        bounds.and_then(|(&a, &b)| self.items.get(a as usize..b as usize)).unwrap_or(&[])
    }

    /// The table the Hopper kernel reads for `plan` (the plan this schedule was made for, its
    /// heads the value heads, `group` of them per key head): one
    /// record of `ITEM_WORDS` words per item (see `kda_kernel::layout::ITEM_WORDS`). Worker `w`'s
    /// first item is record `w`, so a CTA reaches its first item's sequence in one read; the rest
    /// of its list follows the records' next words, through the records after the first items.
    /// `None` when a token or chunk offset does not fit in 32 bits (the launcher takes the
    /// baseline kernel for such batches), or when `plan` has fewer sequences than this schedule's
    /// items name.
    pub fn table(&self, plan: &Plan, group: usize) -> Option<Vec<u32>> {
        self.table_of(&Unit::sequences(plan), group, UColumns::Values)
    }

    /// [`Schedule::table`] of the `units` this schedule was made for (by their lengths), their
    /// items reading `u` at `u_columns`. `None` when an offset or row does not fit in 32 bits or
    /// an item names a unit past `units`.
    pub fn table_of(&self, units: &[Unit], group: usize, u_columns: UColumns) -> Option<Vec<u32>> {
        let workers = self.workers();
        // Record of worker `w`'s `n`-th item: the first items, then each worker's others in turn.
        let record = |w: usize, n: usize| if n == 0 { w } else { workers + self.offsets[w] as usize - w + n - 1 };
        let mut table = vec![0u32; self.items.len() * ITEM_WORDS];
        // An item's sequence, head and block in 32-bit divisions (every item number fits in
        // `u32`; 64-bit divisions were most of a short prompt's table).
        let (heads, col_blocks) = (u32::try_from(self.heads).ok()?, u32::try_from(self.col_blocks).ok()?);
        let per_unit = heads.checked_mul(col_blocks)?;
        for w in 0..workers {
            let list = self.items_of(w);
            for (n, &item) in list.iter().enumerate() {
                let (seq, rest) = (item.checked_div(per_unit)?, item.checked_rem(per_unit)?);
                let (seq, head, block) =
                    (seq as usize, rest.checked_div(col_blocks)? as usize, rest.checked_rem(col_blocks)? as usize);
                let unit = units.get(seq)?;
                let next = if n + 1 < list.len() { u32::try_from(record(w, n + 1)).ok()? } else { ITEM_LAST };
                let row = |state: usize| state.checked_mul(self.heads)?.checked_add(head);
                // The no-row marker is not a row.
                let row32 = |state: usize| u32::try_from(row(state)?).ok().filter(|&r| r != ITEM_NO_ROW);
                let r = &mut table[record(w, n) * ITEM_WORDS..][..ITEM_WORDS];
                r[ITEM_H0_ROW] = match unit.h0_state {
                    Some(state) => row32(state)?,
                    None => ITEM_NO_ROW,
                };
                r[ITEM_HT_ROW] = match unit.ht_state {
                    Some(state) => row32(state)?,
                    None => ITEM_NO_ROW,
                };
                r[ITEM_HEAD] = u32::try_from(head).ok()?;
                let vcol0 = block.checked_mul(self.block_width)?;
                r[ITEM_VCOL0] = u32::try_from(vcol0).ok()?;
                r[ITEM_U_COL] = u_columns.word(vcol0)?;
                r[ITEM_TOKEN_START] = u32::try_from(unit.token_start).ok()?;
                r[ITEM_LEN] = u32::try_from(unit.len).ok()?;
                r[ITEM_CHUNK_START] = u32::try_from(unit.chunk_start).ok()?;
                r[ITEM_NEXT] = next;
                r[ITEM_KEY_HEAD] = (head as u32).checked_div(u32::try_from(group).ok()?)?;
            }
        }
        Some(table)
    }

    /// The modelled finishing time of the busiest worker, given each item's cost (saturating).
    pub fn makespan(&self, cost: impl Fn(u32) -> u64) -> u64 {
        (0..self.workers())
            .map(|w| self.items_of(w).iter().map(|&i| cost(i)).fold(0, u64::saturating_add))
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// LPT as defined: items longest first (ties in item order), each to the least-loaded worker
    /// (the lowest index on ties), found by scanning every worker.
    fn naive_lpt(lengths: &[usize], heads: usize, col_blocks: usize, max_workers: usize) -> Vec<Vec<u32>> {
        let per_seq = heads * col_blocks;
        let cost = |i: u32| item_cost(lengths[i as usize / per_seq]);
        let mut order: Vec<u32> = (0..(lengths.len() * per_seq) as u32).collect();
        order.sort_by_key(|&i| (Reverse(cost(i)), i));
        let workers = max_workers.max(1).min(order.len());
        let (mut loads, mut lists) = (vec![0u64; workers], vec![Vec::new(); workers]);
        for item in order {
            let w = (0..workers).min_by_key(|&w| (loads[w], w)).unwrap();
            lists[w].push(item);
            loads[w] += cost(item);
        }
        lists
    }

    proptest! {
        #[test]
        fn the_schedule_is_lpt_as_defined(
            lengths in prop::collection::vec(0usize..3000, 0..12),
            heads in 1usize..5,
            col_blocks in 1usize..4,
            max_workers in 0usize..40,
        ) {
            let s = Schedule::try_lpt_lengths(&lengths, heads, col_blocks, max_workers).unwrap();
            let want = naive_lpt(&lengths, heads, col_blocks, max_workers);
            prop_assert_eq!(s.workers(), want.len());
            for (w, list) in want.iter().enumerate() {
                prop_assert_eq!(s.items_of(w), &list[..]);
            }
        }
    }

    #[test]
    fn longest_items_start_first_and_blocks_of_a_head_are_adjacent() {
        let plan = Plan::from_lengths(&[64, 4096, 0]);
        let s = Schedule::try_lpt(&plan, 2, 2, 4).unwrap();
        assert_eq!(s.workers(), 4);
        // Sequence 1's four items (2 heads x 2 blocks) are the longest: one per worker, in order.
        let firsts: Vec<u32> = (0..4).map(|w| s.items_of(w)[0]).collect();
        assert_eq!(firsts, vec![4, 5, 6, 7]);
        assert_eq!(s.table(&plan, 1).unwrap().len(), 12 * ITEM_WORDS);
    }

    #[test]
    fn records_of_a_small_schedule() {
        // Two sequences (lengths 64 and 200), one head, two blocks, two workers: the four items
        // cost 3, 3, 6, 6 chunks; worker 0 runs items 2 then 0, worker 1 items 3 then 1.
        let plan = Plan::from_lengths(&[64, 200]);
        let s = Schedule::try_lpt(&plan, 1, 2, 2).unwrap();
        assert_eq!((s.items_of(0), s.items_of(1)), (&[2u32, 0][..], &[3u32, 1][..]));
        let t = s.table(&plan, 1).unwrap();
        let rec = |r: usize| &t[r * ITEM_WORDS..][..ITEM_WORDS];
        // Records 0 and 1: the workers' first items (sequence 1, blocks 0 and 1), each naming its
        // worker's second item (records 2 and 3: sequence 0).
        // Words: h0 row, ht row, head, key head, first column, u column, first token, length,
        // first chunk, next record, two zeros.
        assert_eq!(rec(0), &[1, 1, 0, 0, 0, 0, 64, 200, 1, 2, 0, 0][..]);
        assert_eq!(rec(1), &[1, 1, 0, 0, 64, 64, 64, 200, 1, 3, 0, 0][..]);
        assert_eq!(rec(2), &[0, 0, 0, 0, 0, 0, 0, 64, 0, ITEM_LAST, 0, 0][..]);
        assert_eq!(rec(3), &[0, 0, 0, 0, 64, 64, 0, 64, 0, ITEM_LAST, 0, 0][..]);
    }

    #[test]
    fn prescan_and_segment_records() {
        // One 128-token segment, K = 128 and V = 64: three column blocks of [M | B], one head.
        let unit = Unit { token_start: 64, len: 128, chunk_start: 1, h0_state: None, ht_state: Some(5) };
        let s = Schedule::try_lpt_lengths(&[unit.len], 1, 3, 3).unwrap();
        let t = s.table_of(&[unit], 1, UColumns::Prescan { key_dim: 128 }).unwrap();
        let word = |r: usize, w: usize| t[r * ITEM_WORDS + w];
        // The key columns' blocks read no `u`; the value block reads `u` from column 0.
        assert_eq!((0..3).map(|r| word(r, ITEM_VCOL0)).collect::<Vec<_>>(), vec![0, 64, 128]);
        assert_eq!((0..3).map(|r| word(r, ITEM_U_COL)).collect::<Vec<_>>(), vec![ITEM_NO_U, ITEM_NO_U, 0]);
        assert!((0..3).all(|r| word(r, ITEM_HT_ROW) == 5 && word(r, ITEM_TOKEN_START) == 64));
        // A middle segment of the main pass: entry row 3, no final state.
        let middle = Unit { ht_state: None, h0_state: Some(3), ..unit };
        let s = Schedule::try_lpt_lengths(&[middle.len], 2, 1, 4).unwrap();
        let t = s.table_of(&[middle], 1, UColumns::Values).unwrap();
        let rows: Vec<_> = (0..2).map(|r| (t[r * ITEM_WORDS + ITEM_H0_ROW], t[r * ITEM_WORDS + ITEM_HT_ROW])).collect();
        assert_eq!(rows, vec![(6, ITEM_NO_ROW), (7, ITEM_NO_ROW)]);
    }

    #[test]
    fn offsets_beyond_32_bits_have_no_table() {
        let plan = Plan::from_lengths(&[1 << 32, 64]);
        let s = Schedule::try_lpt(&plan, 1, 2, 4).unwrap();
        assert_eq!(s.table(&plan, 1), None);
        let small = Plan::from_lengths(&[1 << 31, 64]);
        assert!(Schedule::try_lpt(&small, 1, 2, 4).unwrap().table(&small, 1).is_some());
    }

    #[test]
    fn fewer_items_than_workers_and_empty_batches() {
        let s = Schedule::try_lpt(&Plan::from_lengths(&[10]), 1, 2, 132).unwrap();
        assert_eq!((s.workers(), s.items_of(0), s.items_of(1)), (2, &[0u32][..], &[1u32][..]));
        let empty = Schedule::try_lpt(&Plan::from_lengths(&[]), 4, 2, 132).unwrap();
        assert_eq!((empty.workers(), empty.table(&Plan::from_lengths(&[]), 1)), (0, Some(vec![])));
        let one = Schedule::try_lpt(&Plan::from_lengths(&[70, 3]), 1, 2, 0).unwrap();
        assert_eq!((one.workers(), one.items_of(0)), (1, &[0u32, 1, 2, 3][..]));
    }

    #[test]
    fn bad_arguments_are_errors() {
        let plan = Plan::from_lengths(&[10, 20]);
        let err = Schedule::try_lpt(&plan, usize::MAX, 2, 4).unwrap_err();
        assert!(matches!(err, KdaError::Argument { name: "heads", .. }), "{err}");
        let err = Schedule::try_lpt(&plan, 1 << 31, 2, 4).unwrap_err();
        assert!(matches!(err, KdaError::Argument { name: "heads", .. }), "{err}");
        let err = Schedule::try_lpt(&plan, 1, 0, 4).unwrap_err();
        assert!(matches!(err, KdaError::Argument { name: "col_blocks", .. }), "{err}");
    }

    #[test]
    fn out_of_range_workers_and_foreign_plans_do_not_panic() {
        let plan = Plan::from_lengths(&[10, 20]);
        let s = Schedule::try_lpt(&plan, 1, 2, 4).unwrap();
        assert_eq!((s.items_of(4), s.items_of(usize::MAX)), (&[][..], &[][..]));
        assert_eq!(s.table(&Plan::from_lengths(&[10]), 1), None);
    }
}

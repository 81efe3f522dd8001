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
//! once per batch layout (in [`crate::gpu::DevicePlan`]) and uploaded with it.

use crate::Plan;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Modelled cost of an item, in units of one chunk's time: its chunks plus a fixed overhead
/// for loading the initial state, storing the final one and filling the pipeline. (An item
/// with no chunks still loads `h0` and stores `ht`.)
pub const ITEM_OVERHEAD: u64 = 2;

/// Modelled cost of one item of a sequence of `len` tokens.
pub fn item_cost(len: usize) -> u64 {
    kda_kernel::layout::chunks_of(len) as u64 + ITEM_OVERHEAD
}

/// Work lists of a persistent grid: worker `b` runs items `items[offsets[b] .. offsets[b + 1]]`
/// in order. An item is numbered `(seq * heads + head) * col_blocks + block`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    offsets: Vec<u32>,
    items: Vec<u32>,
}

impl Schedule {
    /// The LPT schedule of every (sequence, head, column block) item of `plan` over at most
    /// `max_workers` workers (fewer when there are fewer items; none for an empty batch; one if
    /// `max_workers` is 0).
    ///
    /// # Panics
    /// If the item count does not fit in `u32` (the launcher rejects such batches first).
    pub fn lpt(plan: &Plan, heads: usize, col_blocks: usize, max_workers: usize) -> Self {
        let lengths = plan.lengths();
        let count = lengths.len() * heads * col_blocks;
        let count32 = u32::try_from(count).expect("work items exceed u32");
        let workers = max_workers.max(1).min(count);
        // Longest first; ties in item order, so the column blocks of a head stay adjacent.
        let mut order: Vec<u32> = (0..count32).collect();
        let cost = |item: u32| item_cost(lengths[item as usize / (heads * col_blocks)]);
        order.sort_by_key(|&i| (Reverse(cost(i)), i));
        // Min-heap of (load, worker): the least-loaded worker, the lowest index on ties.
        let mut heap: BinaryHeap<Reverse<(u64, usize)>> = (0..workers).map(|w| Reverse((0, w))).collect();
        let mut lists: Vec<Vec<u32>> = vec![Vec::new(); workers];
        for item in order {
            let Reverse((load, w)) = heap.pop().expect("at least one worker when there are items");
            lists[w].push(item);
            heap.push(Reverse((load + cost(item), w)));
        }
        let mut offsets = Vec::with_capacity(workers + 1);
        offsets.push(0u32);
        let mut items = Vec::with_capacity(count);
        for list in lists {
            items.extend(list);
            offsets.push(items.len() as u32);
        }
        Self { offsets, items }
    }

    /// Workers (CTAs of the persistent grid).
    pub fn workers(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    /// The items of worker `w`, in the order it runs them.
    pub fn items_of(&self, w: usize) -> &[u32] {
        &self.items[self.offsets[w] as usize..self.offsets[w + 1] as usize]
    }

    /// The table the kernel reads: `workers + 1` offsets, then the items.
    pub fn table(&self) -> Vec<u32> {
        self.offsets.iter().chain(&self.items).copied().collect()
    }

    /// The modelled finishing time of the busiest worker, given each item's cost.
    pub fn makespan(&self, cost: impl Fn(u32) -> u64) -> u64 {
        (0..self.workers()).map(|w| self.items_of(w).iter().map(|&i| cost(i)).sum()).max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_items_start_first_and_blocks_of_a_head_are_adjacent() {
        let plan = Plan::from_lengths(&[64, 4096, 0]);
        let s = Schedule::lpt(&plan, 2, 2, 4);
        assert_eq!(s.workers(), 4);
        // Sequence 1's four items (2 heads x 2 blocks) are the longest: one per worker, in order.
        let firsts: Vec<u32> = (0..4).map(|w| s.items_of(w)[0]).collect();
        assert_eq!(firsts, vec![4, 5, 6, 7]);
        assert_eq!(s.table().len(), 5 + 12);
    }

    #[test]
    fn fewer_items_than_workers_and_empty_batches() {
        let s = Schedule::lpt(&Plan::from_lengths(&[10]), 1, 2, 132);
        assert_eq!((s.workers(), s.items_of(0), s.items_of(1)), (2, &[0u32][..], &[1u32][..]));
        let empty = Schedule::lpt(&Plan::from_lengths(&[]), 4, 2, 132);
        assert_eq!((empty.workers(), empty.table()), (0, vec![0]));
        let one = Schedule::lpt(&Plan::from_lengths(&[70, 3]), 1, 2, 0);
        assert_eq!((one.workers(), one.items_of(0)), (1, &[0u32, 1, 2, 3][..]));
    }
}

//! Column blocks of the Hopper kernel: how many value columns one chain (one CTA's item) holds.
//!
//! A wide block holds 64 columns, a narrow one 32 (`layout::hopper::Block`): narrow blocks
//! give a batch twice the chains, for the shapes that have fewer long chains than the GPU has
//! SMs (SPEC.md, "Parallelism"), at the price of reading each head's `k` and `w` tiles twice as
//! often (from L2) and of shared-memory operands in both products. [`Columns::choose`] weighs
//! the two with the split planner's model of a pass ([`crate::split`]): the larger of its rounds
//! and its bandwidth.

use crate::Plan;
use crate::schedule::item_cost;
use crate::split::{MAIN_CHAINS, Work, pass_time};
use kda_kernel::layout::hopper::{BV, NARROW_BV};

/// Time of one narrow chunk of a lone chain, as a fraction of a wide one (it runs half the
/// multiply-adds, but both products wait on shared-memory operands). Measured on the H200
/// (bench/RESULTS.md, "Narrow column blocks").
pub const NARROW_CHUNK_TIME: f64 = 0.6;

/// Narrow blocks are taken only when their modelled pass is below this fraction of the wide
/// one: they read each head's `k` and `w` tiles twice as often (from L2), which the model does
/// not see, so where both are bandwidth-bound the wide blocks stay.
pub const NARROW_MIN_GAIN: f64 = 0.9;

/// A column-block width of the Hopper kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Columns {
    /// 64 value columns per block (`layout::hopper::BV`).
    Wide,
    /// 32 value columns per block (`layout::hopper::NARROW_BV`).
    Narrow,
}

/// Which column blocks a plan uses, for `DevicePlan::with_columns`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColumnMode {
    /// The cost model decides ([`Columns::choose`]).
    Auto,
    /// Always these blocks (for tests and A/B runs).
    Force(Columns),
}

impl Columns {
    /// Value columns per block.
    pub const fn width(self) -> usize {
        match self {
            Columns::Wide => BV,
            Columns::Narrow => NARROW_BV,
        }
    }

    /// The blocks `mode` asks for, the cost model's choice under [`ColumnMode::Auto`].
    pub fn resolve(mode: ColumnMode, plan: &Plan, work: &Work) -> Self {
        match mode {
            ColumnMode::Auto => Self::choose(plan, work),
            ColumnMode::Force(columns) => columns,
        }
    }

    /// The blocks with the shorter modelled pass for `plan`'s sequences, whole (`work`'s block
    /// width is ignored): narrow blocks double the items, each chunk costing
    /// [`NARROW_CHUNK_TIME`] of a wide one, while the bandwidth bound stays that of the wide
    /// pass (the same bytes reach DRAM).
    pub fn choose(plan: &Plan, work: &Work) -> Self {
        if !work.value_dim.is_multiple_of(BV) {
            return Columns::Wide;
        }
        let items = |width: usize| {
            let blocks = (work.value_heads * work.value_dim.div_ceil(width)) as u64;
            plan.seqs().iter().map(move |d| (blocks, item_cost(d.len))).collect::<Vec<_>>()
        };
        let wide = pass_time(&mut items(BV).into_iter(), work.workers, MAIN_CHAINS) as f64;
        // Twice the chains of half the bytes each: the bandwidth bound in wide chunk times is
        // the narrow item-chunks over twice the chains.
        let narrow_rounds = pass_time(&mut items(NARROW_BV).into_iter(), work.workers, f64::INFINITY) as f64;
        let narrow = (narrow_rounds * NARROW_CHUNK_TIME).max(wide_bandwidth(&items(BV)));
        if narrow < wide * NARROW_MIN_GAIN { Columns::Narrow } else { Columns::Wide }
    }
}

/// The bandwidth bound of a wide pass over `items` ((count, cost) groups), in chunk times.
fn wide_bandwidth(items: &[(u64, u64)]) -> f64 {
    items.iter().map(|&(n, c)| (n * c) as f64).sum::<f64>() / MAIN_CHAINS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn work(value_heads: usize, key_dim: usize, value_dim: usize) -> Work {
        Work { value_heads, key_dim, value_dim, workers: 132, block_width: BV }
    }

    #[test]
    fn shapes_short_of_chains_take_narrow_blocks() {
        let long = Plan::from_lengths(&[8192]);
        // qwen3_next_8192 (32 value heads), kda_k64_8192 (64 heads of V = 64): 64 wide chains.
        assert_eq!(Columns::choose(&long, &work(32, 128, 128)), Columns::Narrow);
        assert_eq!(Columns::choose(&long, &work(64, 64, 64)), Columns::Narrow);
        // A few heads of a long sequence.
        assert_eq!(Columns::choose(&Plan::from_lengths(&[131072]), &work(4, 128, 128)), Columns::Narrow);
    }

    #[test]
    fn shapes_that_fill_the_gpu_keep_wide_blocks() {
        // fixed_8192 (128 wide chains), mixed_6, many_short.
        assert_eq!(Columns::choose(&Plan::from_lengths(&[8192]), &work(64, 128, 128)), Columns::Wide);
        let mixed = Plan::from_lengths(&[1300, 547, 2048, 963, 271, 3063]);
        assert_eq!(Columns::choose(&mixed, &work(64, 128, 128)), Columns::Wide);
        assert_eq!(Columns::choose(&Plan::from_lengths(&[128; 64]), &work(64, 128, 128)), Columns::Wide);
    }

    #[test]
    fn forced_modes_win() {
        let plan = Plan::from_lengths(&[8192]);
        let w = work(64, 128, 128);
        assert_eq!(Columns::resolve(ColumnMode::Force(Columns::Narrow), &plan, &w), Columns::Narrow);
        assert_eq!(Columns::resolve(ColumnMode::Auto, &plan, &w), Columns::Wide);
        assert_eq!((Columns::Wide.width(), Columns::Narrow.width()), (64, 32));
    }
}

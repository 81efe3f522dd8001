//! Column blocks of the Hopper kernel: how many value columns one chain (one CTA's item) holds.
//!
//! A wide block holds 64 columns, a narrow one 32 (`layout::hopper::Block`): narrow blocks give
//! a batch twice the chains, for the shapes that have fewer long chains than the GPU has SMs
//! (SPEC.md, "Parallelism"), at the price of reading each head's `k` and `w` tiles twice as often
//! (from L2) and of shared-memory operands in both products.
//!
//! Measured on the H200 (bench/history/2026-12-04-to-06-sessions.md, "Narrow column blocks"), the
//! traffic between L2 and the SMs, not DRAM, bounds a pass of many narrow chains: `qwen3_next_8192`
//! runs its 128 narrow chains at 1.46 us per chunk, its 64 wide ones at 1.49, so narrow blocks gain
//! only where they still fit in one round of the grid, and lose wherever a split, or a batch of
//! many items, keeps the SMs busy anyway (a split `tp_long_h4` 615 us narrow, 501 wide).
//! [`Columns::choose`] follows that.

use crate::split::{SplitMode, SplitPlan, Work};
use crate::{KdaError, Plan};
use kda_kernel::layout::hopper::{BV, NARROW_BV};

/// A column-block width of the Hopper kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Columns {
    /// 64 value columns per block (`layout::hopper::BV`).
    Wide,
    /// 32 value columns per block (`layout::hopper::NARROW_BV`).
    Narrow,
}

/// `auto`, `wide` or `narrow`: what [`ColumnMode::Auto`] stands for in a plan made on a device
/// (for tests and A/B runs of one build: the column blocks of the Hopper kernel, the consumer
/// groups of the portable kernel, the fused layer pass's included).
pub const COLUMNS_VAR: &str = "KDA_COLUMNS";

/// Which column blocks a plan uses, for `DevicePlan::with_columns`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColumnMode {
    /// The planner decides ([`Columns::choose`]), unless `KDA_COLUMNS` ([`COLUMNS_VAR`]) names
    /// the blocks.
    Auto,
    /// Always these blocks (for tests and A/B runs).
    Force(Columns),
}

impl ColumnMode {
    /// The mode `value` of `KDA_COLUMNS` names: unset, empty or `auto` [`ColumnMode::Auto`],
    /// `wide` or `narrow` those blocks forced; anything else an error naming the variable.
    pub fn parse_env(value: Option<&str>) -> Result<Self, KdaError> {
        match value.unwrap_or_default() {
            "" | "auto" => Ok(ColumnMode::Auto),
            "wide" => Ok(ColumnMode::Force(Columns::Wide)),
            "narrow" => Ok(ColumnMode::Force(Columns::Narrow)),
            other => {
                Err(KdaError::Argument { name: COLUMNS_VAR, reason: format!("`{other}`: one of auto, wide, narrow") })
            }
        }
    }

    /// `self`, with [`ColumnMode::Auto`] replaced by the blocks `KDA_COLUMNS` names.
    pub fn or_env(self) -> Result<Self, KdaError> {
        match self {
            ColumnMode::Auto => Self::parse_env(std::env::var(COLUMNS_VAR).ok().as_deref()),
            forced => Ok(forced),
        }
    }
}

impl Columns {
    /// Value columns per block.
    pub const fn width(self) -> usize {
        match self {
            Columns::Wide => BV,
            Columns::Narrow => NARROW_BV,
        }
    }

    /// Whether the Hopper kernel has an entry for key size `key_dim` in these blocks.
    pub fn runs(self, key_dim: usize) -> bool {
        kda_kernel::abi::hopper_for(key_dim, self.width()).is_some()
    }

    /// The blocks `mode` asks for, the planner's choice under [`ColumnMode::Auto`] (`split` as
    /// the plan will be split).
    pub fn resolve(mode: ColumnMode, plan: &Plan, work: &Work, split: SplitMode) -> Self {
        match mode {
            ColumnMode::Auto => Self::choose(plan, work, split),
            ColumnMode::Force(columns) => columns,
        }
    }

    /// Narrow blocks where the key size has only those, or where the batch in wide blocks is
    /// neither split (as `split` says) nor has more items than half the CTAs `work` names (its
    /// narrow items then still run in one round); wide blocks otherwise. `work`'s block width is
    /// ignored.
    pub fn choose(plan: &Plan, work: &Work, split: SplitMode) -> Self {
        if !Columns::Wide.runs(work.key_dim) {
            return Columns::Narrow;
        }
        if !work.value_dim.is_multiple_of(BV) {
            return Columns::Wide;
        }
        let wide = Work { block_width: BV, ..*work };
        if SplitPlan::decide(plan, &wide, split).is_split() {
            return Columns::Wide;
        }
        let items = plan.num_seqs().saturating_mul(work.value_heads).saturating_mul(work.value_dim / BV);
        if items.saturating_mul(2) <= work.workers { Columns::Narrow } else { Columns::Wide }
    }
}

/// What the portable kernel's choice of consumer groups per CTA needs to know about the device
/// and the shape (`layout::portable`: a CTA of two groups runs 64 value columns and shares each
/// chunk's `w` and `k` tiles between them; one of one group, 32 columns).
#[derive(Clone, Copy, Debug)]
pub struct PortableFit {
    /// `K`.
    pub key_dim: usize,
    /// `V`.
    pub value_dim: usize,
    /// Work items of the batch in blocks of one group's columns (sequences x value heads x
    /// `V / BV`).
    pub narrow_items: usize,
    /// SMs of the device.
    pub sms: usize,
    /// Dynamic shared memory a CTA may opt in to on the device.
    pub smem_per_block: usize,
    /// Whether the plan runs the fused layer pass, whose entries need more shared memory.
    pub fused: bool,
}

impl PortableFit {
    /// Whether the device and shape can run two-group CTAs: an entry for the key size, `V` a
    /// multiple of their block, their tiles and ring within the CTA's shared memory.
    pub fn wide_runs(&self) -> bool {
        use kda_kernel::layout::portable::{block_cols, entry_smem_bytes, has_entry};
        has_entry(self.key_dim, 2, self.fused)
            && self.value_dim.is_multiple_of(block_cols(2))
            && self.smem_per_block >= entry_smem_bytes(self.key_dim, 2, self.fused)
    }

    /// One-group items of `batch`: a CTA's block of `BV` value columns of one value head of one
    /// sequence, `value_heads` heads of `value_dim` columns (what [`PortableFit::narrow_items`]
    /// counts).
    pub fn narrow_items_of(batch: &Plan, value_heads: usize, value_dim: usize) -> usize {
        use kda_kernel::layout::portable::BV;
        batch.num_seqs().saturating_mul(value_heads).saturating_mul(value_dim / BV)
    }

    /// Consumer groups per CTA of the portable kernel as `mode` asks: forced narrow blocks take
    /// one, forced wide ones two where they run; the planner takes two where they run unless the
    /// batch has so few items that one round of narrow CTAs still leaves SMs free (the rule
    /// [`Columns::choose`] uses for the Hopper kernel: twice the chains there gain more than the
    /// shared tiles do).
    pub fn groups(&self, mode: ColumnMode) -> usize {
        let wide = match mode {
            ColumnMode::Force(Columns::Narrow) => false,
            ColumnMode::Force(Columns::Wide) => self.wide_runs(),
            ColumnMode::Auto => self.wide_runs() && self.narrow_items > self.sms,
        };
        if wide { 2 } else { 1 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fit(key_dim: usize, value_dim: usize, narrow_items: usize, smem_per_block: usize) -> PortableFit {
        PortableFit { key_dim, value_dim, narrow_items, sms: 132, smem_per_block, fused: false }
    }

    #[test]
    fn kda_columns_names_the_blocks_and_refuses_anything_else() {
        assert_eq!(ColumnMode::parse_env(None).unwrap(), ColumnMode::Auto);
        assert_eq!(ColumnMode::parse_env(Some("")).unwrap(), ColumnMode::Auto);
        assert_eq!(ColumnMode::parse_env(Some("auto")).unwrap(), ColumnMode::Auto);
        assert_eq!(ColumnMode::parse_env(Some("wide")).unwrap(), ColumnMode::Force(Columns::Wide));
        assert_eq!(ColumnMode::parse_env(Some("narrow")).unwrap(), ColumnMode::Force(Columns::Narrow));
        let refused = ColumnMode::parse_env(Some("Narrow"));
        assert!(matches!(refused, Err(KdaError::Argument { name: COLUMNS_VAR, .. })), "{refused:?}");
        // A forced mode is not the environment's to change.
        let forced = ColumnMode::Force(Columns::Narrow);
        assert_eq!(forced.or_env().unwrap(), forced);
    }

    #[test]
    fn the_portable_kernel_takes_two_groups_where_they_fit_and_the_batch_fills_the_gpu() {
        const H100: usize = 227 * 1024;
        const SM86: usize = 99 * 1024;
        // fixed_8192 (64 heads x 4 narrow blocks) on an H100: wide.
        assert_eq!(fit(128, 128, 256, H100).groups(ColumnMode::Auto), 2);
        assert_eq!(fit(64, 64, 256, H100).groups(ColumnMode::Auto), 2);
        // The same on a 99 KB GPU, at K = 256, or with V = 96: one group.
        assert_eq!(fit(128, 128, 256, SM86).groups(ColumnMode::Auto), 1);
        assert_eq!(fit(256, 128, 256, H100).groups(ColumnMode::Auto), 1);
        assert_eq!(fit(128, 96, 256, H100).groups(ColumnMode::Auto), 1);
        // Few items (tp_long_h4: 4 heads x 4 blocks): twice the chains instead.
        assert_eq!(fit(128, 128, 16, H100).groups(ColumnMode::Auto), 1);
        // Forced.
        assert_eq!(fit(128, 128, 16, H100).groups(ColumnMode::Force(Columns::Wide)), 2);
        assert_eq!(fit(128, 128, 256, H100).groups(ColumnMode::Force(Columns::Narrow)), 1);
        assert_eq!(fit(128, 128, 256, SM86).groups(ColumnMode::Force(Columns::Wide)), 1);
    }

    #[test]
    fn the_fused_pass_takes_two_groups_where_its_two_group_entry_fits() {
        const H100: usize = 227 * 1024;
        const A100: usize = 163 * 1024;
        let fused = |key_dim, smem_per_block| PortableFit { fused: true, ..fit(key_dim, 128, 256, smem_per_block) };
        let wide = ColumnMode::Force(Columns::Wide);
        // K = 128: two groups' q Γ and P tiles beside a two-stage ring need the H100's 227 KB.
        assert_eq!(fused(128, H100).groups(wide), 2);
        assert_eq!(fused(128, A100).groups(wide), 1);
        assert_eq!(fit(128, 128, 256, A100).groups(wide), 2, "the plain recurrence's fit the A100");
        // K = 64 fits the A100 in two groups too.
        assert_eq!(fused(64, A100).groups(wide), 2);
    }

    fn work(value_heads: usize, key_dim: usize, value_dim: usize) -> Work {
        let gates = crate::model::Gates { g: false, gk: true };
        Work { value_heads, key_dim, value_dim, workers: 132, block_width: BV, gates }
    }

    fn choose(lengths: &[usize], w: Work) -> Columns {
        Columns::choose(&Plan::from_lengths(lengths), &w, SplitMode::Auto)
    }

    #[test]
    fn shapes_short_of_chains_take_narrow_blocks() {
        // qwen3_next_8192 (32 value heads), kda_k64_8192 (64 heads of V = 64): 64 wide chains.
        assert_eq!(choose(&[8192], work(32, 128, 128)), Columns::Narrow);
        assert_eq!(choose(&[8192], work(64, 64, 64)), Columns::Narrow);
        // A few heads of a long sequence, unsplit.
        let long = Plan::from_lengths(&[131072]);
        assert_eq!(Columns::choose(&long, &work(4, 128, 128), SplitMode::Off), Columns::Narrow);
    }

    #[test]
    fn split_batches_and_batches_that_fill_the_gpu_keep_wide_blocks() {
        // The same long sequence split (tp_long_h4), tp_mixed_h8.
        assert_eq!(choose(&[131072], work(4, 128, 128)), Columns::Wide);
        assert_eq!(choose(&[65536, 8192, 300], work(8, 128, 128)), Columns::Wide);
        // fixed_8192 (128 wide chains), mixed_6, many_short, qwen3_next_mixed6.
        assert_eq!(choose(&[8192], work(64, 128, 128)), Columns::Wide);
        let mixed = [1300, 547, 2048, 963, 271, 3063];
        assert_eq!(choose(&mixed, work(64, 128, 128)), Columns::Wide);
        assert_eq!(choose(&[128; 64], work(64, 128, 128)), Columns::Wide);
        assert_eq!(choose(&mixed, work(32, 128, 128)), Columns::Wide);
    }

    #[test]
    fn forced_modes_win() {
        let plan = Plan::from_lengths(&[8192]);
        let w = work(64, 128, 128);
        let force = ColumnMode::Force(Columns::Narrow);
        assert_eq!(Columns::resolve(force, &plan, &w, SplitMode::Auto), Columns::Narrow);
        assert_eq!(Columns::resolve(ColumnMode::Auto, &plan, &w, SplitMode::Auto), Columns::Wide);
        assert_eq!((Columns::Wide.width(), Columns::Narrow.width()), (64, 32));
    }
}

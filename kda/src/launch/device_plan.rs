//! A batch layout uploaded once, and the borrowed device tensors of one launch.

use crate::columns::{ColumnMode, Columns, PortableFit};
use crate::layout::{hopper, portable};
use crate::model::ModelShape;
use crate::schedule::{UColumns, Unit};
use crate::split::{SplitMode, SplitPlan};
use crate::strides::Strides;
use crate::{Dims, KdaError, Plan, Schedule};
use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, SyncOnDrop};
use half::bf16;
use std::sync::{Arc, Mutex};

/// A [`Plan`] for one [`ModelShape`] (head counts, head sizes, gates, state layout) uploaded to
/// the device once, with the persistent kernel's work [`Schedule`] for this device and the
/// [`Strides`] of the tensors: reusable by every launch of the same batch layout.
pub struct DevicePlan {
    pub(super) plan: Plan,
    pub(super) shape: ModelShape,
    pub(super) strides: Strides,
    pub(super) schedule: Schedule,
    /// The plan's tables on the device, packed ([`Table`]): `None` only after a re-planning call
    /// failed, and then the plan refuses to launch.
    tables: Option<CudaSlice<u32>>,
    /// The sequences' descriptors (`Plan::descriptors`, i64 as pairs of words).
    pub(super) descriptors: Table,
    /// The Hopper kernel's work records (`Schedule::table`), when the batch's offsets fit them.
    pub(super) work: Option<Table>,
    /// The Hopper kernel's passes over split sequences, when the plan splits any.
    pub(super) split: Option<SplitDevice>,
    /// The split's planner verdict (unsplit when nothing is cut, or when the Hopper kernel
    /// cannot run the batch).
    pub(super) split_plan: SplitPlan,
    /// What splitting was asked for ([`DevicePlan::set_split`]), kept for a change of columns.
    split_mode: SplitMode,
    /// What column blocks were asked for ([`DevicePlan::set_columns`]).
    column_mode: ColumnMode,
    /// The Hopper kernel's column blocks.
    pub(super) columns: Columns,
    pub(super) ordinal: usize,
    /// CTAs of the persistent grid the device runs at once.
    pub(super) workers: usize,
    /// SMs of the device, their shared memory and what one CTA may opt in to (the portable
    /// kernel's choice of consumer groups and its grid).
    sms: usize,
    smem_per_sm: usize,
    smem_per_block: usize,
    /// The portable kernel's passes, when its records hold the batch's offsets.
    pub(super) portable: Option<PortableDevice>,
    /// A table of the caller's uploaded with the plan's (a layer's chunk records).
    pub(super) extra: Option<Table>,
    /// Whether the plan runs the fused layer pass: the portable kernel's consumer groups and grid
    /// then follow the fused entries' shared memory.
    fused_output: bool,
}

/// That `plan` fits `shape`'s kernels: its tensors in memory (`Dims::check`) and its work items
/// (at the narrowest column blocks) in the grid.
fn check_batch(plan: &Plan, shape: &ModelShape) -> Result<(), KdaError> {
    let value_heads = shape.value_heads;
    // The head counts (and that every tensor of the batch fits in memory).
    Dims::model(plan, shape).check()?;
    // Column blocks of the Hopper kernel at their narrowest (a partial last block when the
    // width does not divide `V`: such shapes take no Hopper launch, see `Kda::launch`).
    let col_blocks = shape.value_dim.div_ceil(hopper::NARROW_BV);
    let items = value_heads.checked_mul(col_blocks).and_then(|n| plan.num_seqs().checked_mul(n));
    if items.is_none_or(|n| n > i32::MAX as usize) {
        return Err(KdaError::Argument {
            name: "heads",
            reason: format!("N * HV = {} x {value_heads} work items exceed the grid limit", plan.num_seqs()),
        });
    }
    Ok(())
}

/// One of a plan's tables of 32-bit words: its words on the host, and where they start in the
/// plan's device tables once uploaded. A plan's tables travel to the device together, in one
/// allocation and one copy ([`DevicePlan::upload`]): callers that plan a short prompt afresh per
/// call paid an allocation, a copy and their events for each table separately.
#[derive(Clone, Debug)]
pub(super) struct Table {
    words: Vec<u32>,
    /// First word in the device tables.
    at: usize,
}

/// Each table starts on a 16-byte boundary (4 words): the kernels read records as vectors, and
/// the descriptors as 8-byte words.
const TABLE_ALIGN_WORDS: usize = 4;

impl Table {
    /// A table of `words`, or of one zero word when empty (the driver allocates no zero bytes,
    /// and an empty table still needs an address).
    pub(super) fn new(mut words: Vec<u32>) -> Self {
        if words.is_empty() {
            words.push(0);
        }
        Self { words, at: 0 }
    }

    /// A table of 64-bit values, each as two words (little-endian, as the GPU reads them).
    fn of_i64(values: &[i64]) -> Self {
        Self::new(values.iter().flat_map(|&x| [x as u32, (x as u64 >> 32) as u32]).collect())
    }

    /// The table's device address, the plan's device tables starting at `base`.
    pub(super) fn address(&self, base: u64) -> u64 {
        base + (self.at * std::mem::size_of::<u32>()) as u64
    }
}

/// The portable kernel's side of a plan: its own longest-first schedule in blocks of its `BV`
/// columns over its own workers, and its own split (the planner's verdict for those workers and
/// blocks), so that it runs at its best whichever kernel the device runs by default.
pub(super) struct PortableDevice {
    /// Consumer groups per CTA (`layout::portable`: the entry and its block of `groups * BV`
    /// columns).
    pub groups: usize,
    /// CTAs of its persistent grid the device runs at once.
    pub workers: usize,
    /// The unsplit pass.
    pub work: Pass,
    /// The split passes, when the planner cuts sequences for this kernel.
    pub split: Option<SplitDevice>,
    pub split_plan: SplitPlan,
}

/// A persistent kernel pass: its grid and its work records on the device.
pub(super) struct Pass {
    pub workers: usize,
    pub work: Table,
}

/// The device side of a split plan (`kda::split`): the pre-scan's and the main pass's work
/// tables, the merge's table, and the workspace the passes hand states through.
pub(super) struct SplitDevice {
    /// Pre-scan: each mapped segment over `K + V` columns, its map into `workspace.maps`.
    pub prescan: Pass,
    /// Main pass: every segment from its entry state in `workspace.entries`.
    pub main: Pass,
    /// The merge's records (`MERGE_WORDS` per sequence) and their count.
    pub merge_table: Table,
    pub merge_records: usize,
    /// Rows (`segments * HV`) of the entry states.
    pub entry_rows: usize,
    /// Locked while a launch enqueues its passes: launches sharing the plan on several streams
    /// then use the workspace one after another (cudarc orders each use after the previous
    /// one's, across streams).
    pub workspace: Mutex<Workspace>,
}

/// Device memory of the split passes, allocated with the plan (a launch allocates nothing).
pub(super) struct Workspace {
    /// `[maps * HV][K][K + V]` f32, key-first: the pre-scan's `[M | B]`.
    pub maps: CudaSlice<f32>,
    /// `[segments * HV][K][V]` f32 in the plan's layout: each segment's entry state.
    pub entries: CudaSlice<f32>,
}

impl DevicePlan {
    /// A plan for KDA's slice ([`ModelShape::kda`]: `gk`, `K = V = 128`, key-first states) with
    /// `heads` heads.
    pub fn new(stream: &Arc<CudaStream>, plan: Plan, heads: usize) -> Result<Self, KdaError> {
        Self::grouped(stream, plan, heads, heads)
    }

    /// [`DevicePlan::new`] with `value_heads` value heads, a multiple of `heads`; value head `i`
    /// reads key head `i / (value_heads / heads)`.
    pub fn grouped(stream: &Arc<CudaStream>, plan: Plan, heads: usize, value_heads: usize) -> Result<Self, KdaError> {
        Self::model(stream, plan, &ModelShape { value_heads, ..ModelShape::kda(heads) })
    }

    /// Schedules `plan`'s (sequence, value head, column block) items for `shape` over the SMs of
    /// `stream`'s device and uploads the descriptor and schedule tables on `stream`
    /// (asynchronously: the copies are ordered before any launch on the same stream). The
    /// tensors are packed until [`DevicePlan::with_strides`] says otherwise.
    pub fn model(stream: &Arc<CudaStream>, plan: Plan, shape: &ModelShape) -> Result<Self, KdaError> {
        Self::model_in(stream, plan, shape, ColumnMode::Auto)
    }

    /// [`DevicePlan::model`] in the Hopper kernel's column blocks as `columns` says (as
    /// [`DevicePlan::with_columns`], without planning and uploading the tables twice).
    pub fn model_in(
        stream: &Arc<CudaStream>,
        plan: Plan,
        shape: &ModelShape,
        columns: ColumnMode,
    ) -> Result<Self, KdaError> {
        Self::model_with(stream, plan, shape, columns, (None, false))
    }

    /// [`DevicePlan::model_in`] with `extra` uploaded beside the plan's tables (a layer's chunk
    /// records: one copy for all of them), for the fused layer pass where `fused_output` says so.
    pub(super) fn model_with(
        stream: &Arc<CudaStream>,
        plan: Plan,
        shape: &ModelShape,
        columns: ColumnMode,
        (extra, fused_output): (Option<Table>, bool),
    ) -> Result<Self, KdaError> {
        shape.validate()?;
        let value_heads = shape.value_heads;
        check_batch(&plan, shape)?;
        let sms = stream
            .context()
            .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?
            as usize;
        let workers = sms * hopper::CTAS_PER_SM;
        let smem_per_sm = stream.context().attribute(
            cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
        )? as usize;
        let smem_per_block = stream
            .context()
            .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?
            as usize;
        let descriptors = Table::of_i64(&plan.descriptors());
        let ordinal = stream.context().ordinal();
        let split_plan = SplitPlan::unsplit(&plan);
        let mut this = Self {
            // An empty placeholder: `set_columns` below makes the schedule.
            schedule: Schedule::try_lpt_lengths(&[], value_heads, 1, 0)?,
            plan,
            shape: *shape,
            strides: Strides::PACKED,
            tables: None,
            descriptors,
            work: None,
            split: None,
            split_plan,
            split_mode: SplitMode::Auto.or_env()?,
            column_mode: ColumnMode::Auto,
            columns: Columns::Wide,
            ordinal,
            workers,
            sms,
            smem_per_sm,
            smem_per_block,
            portable: None,
            extra,
            fused_output,
        };
        // (Plans the portable kernel's passes too.)
        this.plan_columns(stream, columns)?;
        this.upload(stream)?;
        Ok(this)
    }

    /// This plan with the Hopper kernel's column blocks as `mode` says ([`ColumnMode::Auto`],
    /// what [`DevicePlan::model`] does, lets the cost model decide: `kda::columns`), its
    /// schedule and split re-planned for them and uploaded on `stream`.
    pub fn with_columns(mut self, stream: &Arc<CudaStream>, mode: ColumnMode) -> Result<Self, KdaError> {
        self.set_columns(stream, mode)?;
        Ok(self)
    }

    /// [`DevicePlan::with_columns`] in place. A plan whose re-planning fails refuses to launch.
    pub fn set_columns(&mut self, stream: &Arc<CudaStream>, mode: ColumnMode) -> Result<(), KdaError> {
        let buffer = self.tables.take();
        self.plan_columns(stream, mode)?;
        self.upload_into(stream, buffer)
    }

    /// This plan re-planned in place for the batch `plan` (new sequence lengths; the same shape,
    /// strides, column and split modes), its tables uploaded into the plan's own device buffer
    /// when they fit it: no allocation and no free (a new plan per call measured 1 to 4 us more
    /// per call of a 128-token layer than re-planning, H100), and the buffer's address stays the
    /// same. The copy is ordered after every launch that read the old tables: on `stream` by the
    /// stream itself, on other streams by cudarc's events. A plan whose re-planning fails
    /// refuses to launch.
    ///
    /// ```no_run
    /// # use kda::{DevicePlan, Plan, model::ModelShape};
    /// # fn main() -> Result<(), kda::KdaError> {
    /// let stream = cudarc::driver::CudaContext::new(0)?.default_stream();
    /// let mut plan = DevicePlan::model(&stream, Plan::from_lengths(&[300, 17]), &ModelShape::kda(32))?;
    /// // ... launches of this batch ...
    /// plan.replan(&stream, Plan::from_lengths(&[301, 18]))?; // the next step's lengths
    /// # Ok(())
    /// # }
    /// ```
    pub fn replan(&mut self, stream: &Arc<CudaStream>, plan: Plan) -> Result<(), KdaError> {
        if self.extra.is_some() {
            // Its chunk records are the layer's, which only the layer plan rebuilds.
            return Err(KdaError::Argument {
                name: "plan",
                reason: "a layer's recurrence plan is re-planned through LayerPlan::replan".into(),
            });
        }
        self.replan_with(stream, plan, None)
    }

    /// [`DevicePlan::replan`] with `extra`, a table of the caller's uploaded with the plan's (a
    /// layer's chunk records).
    pub(super) fn replan_with(
        &mut self,
        stream: &Arc<CudaStream>,
        plan: Plan,
        extra: Option<Table>,
    ) -> Result<(), KdaError> {
        let buffer = self.tables.take();
        check_batch(&plan, &self.shape)?;
        self.descriptors = Table::of_i64(&plan.descriptors());
        self.split_plan = SplitPlan::unsplit(&plan);
        self.plan = plan;
        self.extra = extra;
        self.plan_columns(stream, self.column_mode)?;
        self.upload_into(stream, buffer)
    }

    /// Plans the column blocks `mode` asks for (and the portable passes), on the host.
    fn plan_columns(&mut self, stream: &Arc<CudaStream>, mode: ColumnMode) -> Result<(), KdaError> {
        let mode = mode.or_env()?;
        self.column_mode = mode;
        // The portable kernel's consumer groups follow the same mode.
        self.plan_portable(stream)?;
        let dims = self.dims();
        let columns = Columns::resolve(mode, &self.plan, &self.split_work(Columns::Wide), self.split_mode);
        if !columns.runs(dims.key_dim) && crate::layout::hopper::KEY_DIMS.contains(&dims.key_dim) {
            return Err(KdaError::Unsupported {
                argument: "columns",
                reason: format!("K = {}: the Hopper kernel runs it in {:?} blocks only", dims.key_dim, Columns::Narrow),
            });
        }
        self.use_columns(stream, columns)
    }

    /// Schedules the plan in `columns`, uploads its work records on `stream` and plans the split
    /// in them.
    fn use_columns(&mut self, stream: &Arc<CudaStream>, columns: Columns) -> Result<(), KdaError> {
        let dims = self.dims();
        self.columns = columns;
        let width = columns.width();
        let col_blocks = dims.value_dim.div_ceil(width);
        self.schedule =
            Schedule::try_lpt(&self.plan, dims.value_heads, col_blocks, self.workers)?.with_block_width(width);
        // No table (offsets past 32 bits): such batches take the baseline kernel.
        let table = self.schedule.table(&self.plan, dims.group());
        self.work = table.map(Table::new);
        self.plan_split(stream)
    }

    /// The Hopper kernel's column blocks.
    pub fn columns(&self) -> Columns {
        self.columns
    }

    /// The split planner's figures for this plan in `columns`.
    fn split_work(&self, columns: Columns) -> crate::split::Work {
        crate::split::Work::of(&self.shape, self.workers, columns.width())
    }

    /// This plan with long sequences split as `mode` says (docs/CONTRACT.md, "Splitting one
    /// sequence"): [`SplitMode::Auto`] (what [`DevicePlan::model`] does) lets the cost model
    /// decide, [`SplitMode::Off`] never splits, [`SplitMode::Chunks`] forces segments of that many
    /// chunks (`KDA_SPLIT` stands in for `Auto`: [`crate::split::SPLIT_VAR`]). Only the Hopper kernel runs split plans (the baseline runs every sequence whole);
    /// a batch the Hopper kernel cannot schedule, or whose split tables would not fit its 32-bit
    /// records, stays unsplit. Uploads the split's tables and allocates its workspace on
    /// `stream`.
    pub fn with_split(mut self, stream: &Arc<CudaStream>, mode: SplitMode) -> Result<Self, KdaError> {
        self.set_split(stream, mode)?;
        Ok(self)
    }

    /// [`DevicePlan::with_split`] in place. A plan whose re-planning fails refuses to launch.
    pub fn set_split(&mut self, stream: &Arc<CudaStream>, mode: SplitMode) -> Result<(), KdaError> {
        let buffer = self.tables.take();
        self.plan_split_mode(stream, mode)?;
        self.upload_into(stream, buffer)
    }

    /// Plans the split `mode` asks for (and the columns it implies), on the host; allocates a
    /// split's workspace.
    fn plan_split_mode(&mut self, stream: &Arc<CudaStream>, mode: SplitMode) -> Result<(), KdaError> {
        self.split_mode = mode.or_env()?;
        self.plan_portable(stream)?;
        if self.column_mode == ColumnMode::Auto {
            // The column choice depends on the split asked for (`Columns::choose`).
            let columns = Columns::choose(&self.plan, &self.split_work(Columns::Wide), mode);
            if columns != self.columns {
                return self.use_columns(stream, columns);
            }
        }
        self.plan_split(stream)
    }

    /// Plans the portable kernel's passes: its schedule over its workers and, as
    /// `self.split_mode` asks, its split. None when the kernel does not run the shape (its
    /// launch names why) or the batch's offsets do not fit its 32-bit records.
    fn plan_portable(&mut self, stream: &Arc<CudaStream>) -> Result<(), KdaError> {
        self.portable = None;
        let dims = self.dims();
        let fit = PortableFit {
            key_dim: dims.key_dim,
            value_dim: dims.value_dim,
            narrow_items: PortableFit::narrow_items_of(&self.plan, dims.value_heads, dims.value_dim),
            sms: self.sms,
            smem_per_block: self.smem_per_block,
            fused: self.fused_output,
        };
        let groups = fit.groups(self.column_mode);
        let width = portable::block_cols(groups);
        if !portable::KEY_DIMS.contains(&dims.key_dim) || !dims.value_dim.is_multiple_of(width) {
            return Ok(());
        }
        let smem = portable::entry_smem_bytes(dims.key_dim, groups, self.fused_output);
        let workers = portable::workers_of(smem, dims.key_dim, groups, self.sms, self.smem_per_sm);
        let schedule =
            Schedule::try_lpt(&self.plan, dims.value_heads, dims.value_dim / width, workers)?.with_block_width(width);
        let Some(table) = schedule.table(&self.plan, dims.group()) else { return Ok(()) };
        let work = Pass { workers: schedule.workers(), work: Table::new(table) };
        let split_work = crate::split::Work::of(&self.shape, workers, width);
        let decided = SplitPlan::decide(&self.plan, &split_work, self.split_mode);
        let split = if decided.is_split() { split_device(stream, &decided, &dims, workers, width)? } else { None };
        let split_plan = if split.is_some() { decided } else { SplitPlan::unsplit(&self.plan) };
        self.portable = Some(PortableDevice { groups, workers, work, split, split_plan });
        Ok(())
    }

    /// How the portable kernel's passes split the plan's sequences (one segment each when none
    /// is, or when the kernel does not run the shape).
    pub fn portable_split_plan(&self) -> SplitPlan {
        self.portable.as_ref().map_or_else(|| SplitPlan::unsplit(&self.plan), |p| p.split_plan.clone())
    }

    /// How the passes of `kernel` (as the launcher resolved it) split the plan's sequences: the
    /// portable kernel's own plan for it, the Hopper kernel's otherwise.
    pub fn split_plan_of(&self, kernel: crate::Kernel) -> SplitPlan {
        if kernel == crate::Kernel::Portable { self.portable_split_plan() } else { self.split_plan.clone() }
    }

    /// CTAs of the portable kernel's persistent grid on this plan's device (0 when it does not
    /// run the shape).
    pub fn portable_workers(&self) -> usize {
        self.portable.as_ref().map_or(0, |p| p.workers)
    }

    /// Value columns of the portable kernel's blocks on this plan (`groups * BV`; one group's
    /// when it does not run the shape).
    pub fn portable_block_width(&self) -> usize {
        portable::block_cols(self.portable.as_ref().map_or(1, |p| p.groups))
    }

    /// Plans the split `self.split_mode` asks for in the plan's columns, allocating its workspace
    /// on `stream`.
    fn plan_split(&mut self, stream: &Arc<CudaStream>) -> Result<(), KdaError> {
        let mode = self.split_mode;
        self.split = None;
        self.split_plan = SplitPlan::unsplit(&self.plan);
        let hopper_device = stream.context().compute_capability()?.0 == 9;
        let dims = self.dims();
        let fits = dims.key_dim.is_multiple_of(hopper::BV) && dims.value_dim.is_multiple_of(hopper::BV);
        if self.work.is_none() || !hopper_device || !fits {
            return Ok(());
        }
        let work = self.split_work(self.columns);
        let split = SplitPlan::decide(&self.plan, &work, mode);
        if split.is_split() {
            self.split = split_device(stream, &split, &dims, self.workers, self.columns.width())?;
            if self.split.is_some() {
                self.split_plan = split;
            }
        }
        Ok(())
    }

    /// CTAs of the persistent grid on this plan's device (its SMs times the CTAs one holds).
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// How the Hopper kernel's passes split the plan's sequences (one segment each when none is;
    /// [`DevicePlan::portable_split_plan`] is the portable kernel's).
    pub fn split_plan(&self) -> &SplitPlan {
        &self.split_plan
    }

    /// This plan for tensors at `strides` (`None` entries packed). Fails when a stride makes an
    /// output's rows overlap; buffer lengths and what each kernel can address are checked at
    /// launch.
    pub fn with_strides(mut self, strides: Strides) -> Result<Self, KdaError> {
        if strides.v_new.is_some() {
            // A length check against an unbounded buffer: only the overlap and overflow rules.
            strides.check_len(&self.dims(), crate::Tensor::VNew, usize::MAX)?;
        }
        self.strides = strides;
        Ok(self)
    }

    /// The host plan.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Key heads `H` of the batch.
    pub fn heads(&self) -> usize {
        self.shape.heads
    }

    /// Value heads `HV` of the batch.
    pub fn value_heads(&self) -> usize {
        self.shape.value_heads
    }

    /// Heads, head sizes, gates and state layout.
    pub fn shape(&self) -> &ModelShape {
        &self.shape
    }

    /// The tensors' strides.
    pub fn strides(&self) -> &Strides {
        &self.strides
    }

    /// The sizes of the batch's tensors.
    pub fn dims(&self) -> Dims {
        Dims::model(&self.plan, &self.shape)
    }

    /// The persistent kernel's work schedule.
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// Uploads every table of the plan in one copy, placing each ([`Table`]).
    fn upload(&mut self, stream: &Arc<CudaStream>) -> Result<(), KdaError> {
        self.upload_into(stream, None)
    }

    /// [`DevicePlan::upload`] into `buffer` when the tables fit it (a copy ordered after every
    /// launch that read it, by the stream or by cudarc's events), else into a new allocation.
    fn upload_into(&mut self, stream: &Arc<CudaStream>, buffer: Option<CudaSlice<u32>>) -> Result<(), KdaError> {
        let words = pack(self.tables_mut());
        self.tables = Some(match buffer {
            Some(mut b) if b.len() >= words.len() => {
                stream.memcpy_htod(&words, &mut b)?;
                b
            }
            _ => stream.clone_htod(&words)?,
        });
        Ok(())
    }

    /// Every table of the plan, in upload order.
    fn tables_mut(&mut self) -> Vec<&mut Table> {
        let mut all = vec![&mut self.descriptors];
        all.extend(self.work.as_mut());
        all.extend(self.extra.as_mut());
        if let Some(split) = self.split.as_mut() {
            all.extend(split_tables(split));
        }
        if let Some(portable) = self.portable.as_mut() {
            all.push(&mut portable.work.work);
            if let Some(split) = portable.split.as_mut() {
                all.extend(split_tables(split));
            }
        }
        all
    }

    /// The device address the plan's tables start at ([`Table::address`]) for a launch on
    /// `stream`, with the record that orders the launch after their upload; a typed refusal when
    /// the plan's last re-planning failed.
    pub(super) fn tables_on<'a>(&'a self, stream: &'a Arc<CudaStream>) -> Result<(u64, SyncOnDrop<'a>), KdaError> {
        let tables = self.tables.as_ref().ok_or_else(|| KdaError::Argument {
            name: "plan",
            reason: "its tables are not on the device: the last call that re-planned it failed".into(),
        })?;
        Ok(tables.device_ptr(stream))
    }
}

/// The input tensors of a launch, borrowed from the caller (flat views in the contract's layouts,
/// at the plan's strides; `H` key heads, `HV` value heads; states in the plan's layout, shown
/// key-first).
pub struct KdaInputs<'a> {
    /// `[T, H, K]` bf16.
    pub k: CudaView<'a, bf16>,
    /// `[T, HV, K]` bf16.
    pub w: CudaView<'a, bf16>,
    /// `[T, HV, V]` bf16.
    pub u: CudaView<'a, bf16>,
    /// `[T, HV]` f32 scalar gate: given exactly when the plan's shape has `g`.
    pub g: Option<CudaView<'a, f32>>,
    /// `[T, HV, K]` f32 per-key gate: given exactly when the plan's shape has `gk`.
    pub gk: Option<CudaView<'a, f32>>,
    /// `[N, HV, K, V]` f32, or `None` for zero initial states.
    pub h0: Option<CudaView<'a, f32>>,
}

/// The output tensors of a launch, borrowed mutably from the caller.
pub struct KdaOutputs<'a> {
    /// `[NT, HV, K, V]` bf16.
    pub h: CudaViewMut<'a, bf16>,
    /// `[T, HV, V]` bf16, at the plan's `v_new` strides.
    pub v_new: CudaViewMut<'a, bf16>,
    /// `[N, HV, K, V]` f32, or `None` to skip the final states.
    pub ht: Option<CudaViewMut<'a, f32>>,
}

/// The device side of `split` for a batch of `dims`, scheduled over `workers` CTAs; `None` when a
/// table or an entry row would not fit the kernels' 32-bit words.
fn split_device(
    stream: &Arc<CudaStream>,
    split: &SplitPlan,
    dims: &Dims,
    workers: usize,
    width: usize,
) -> Result<Option<SplitDevice>, KdaError> {
    let (hv, kd, vd) = (dims.value_heads, dims.key_dim, dims.value_dim);
    let pass = |units: Vec<Unit>, blocks: usize, u_columns: UColumns| -> Result<Option<Pass>, KdaError> {
        let schedule = Schedule::try_lpt_units(&units, u_columns, hv, (blocks, width), workers)?;
        let Some(table) = schedule.table_of(&units, dims.group(), u_columns) else { return Ok(None) };
        Ok(Some(Pass { workers: schedule.workers(), work: Table::new(table) }))
    };
    let prescan = pass(split.prescan_units(), (kd + vd) / width, UColumns::Prescan { key_dim: kd })?;
    let main = pass(split.main_units(), vd / width, UColumns::Values)?;
    let merge = split.merge_table();
    let entry_rows = split.segments().len().checked_mul(hv).filter(|&r| r <= i32::MAX as usize);
    let maps_len = split.maps().checked_mul(hv).and_then(|n| n.checked_mul(kd * (kd + vd)));
    let entries_len = entry_rows.and_then(|n| n.checked_mul(kd * vd));
    let (Some(prescan), Some(main), Some(merge), Some(entry_rows), Some(maps_len), Some(entries_len)) =
        (prescan, main, merge, entry_rows, maps_len, entries_len)
    else {
        return Ok(None);
    };
    let workspace = Workspace { maps: stream.alloc_zeros(maps_len)?, entries: stream.alloc_zeros(entries_len)? };
    Ok(Some(SplitDevice {
        prescan,
        main,
        merge_records: merge.len() / kda_kernel::layout::MERGE_WORDS,
        merge_table: Table::new(merge),
        entry_rows,
        workspace: Mutex::new(workspace),
    }))
}

/// `tables` one after another, each from a multiple of `TABLE_ALIGN_WORDS` words (zeros
/// between them), each told where it starts.
fn pack(tables: Vec<&mut Table>) -> Vec<u32> {
    let mut words: Vec<u32> = Vec::new();
    for table in tables {
        words.resize(words.len().next_multiple_of(TABLE_ALIGN_WORDS), 0);
        table.at = words.len();
        words.extend_from_slice(&table.words);
    }
    words
}

/// A split's three tables.
fn split_tables(split: &mut SplitDevice) -> [&mut Table; 3] {
    [&mut split.prescan.work, &mut split.main.work, &mut split.merge_table]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_pack_into_one_buffer_at_aligned_offsets() {
        let mut a = Table::of_i64(&[-1, 1 << 40]);
        let mut b = Table::new(vec![7; 5]);
        let mut empty = Table::new(Vec::new());
        let mut c = Table::new(vec![9, 8, 7]);
        let words = pack(vec![&mut a, &mut b, &mut empty, &mut c]);
        assert_eq!(a.words, [u32::MAX, u32::MAX, 0, 1 << 8]);
        assert_eq!([a.at, b.at, empty.at, c.at], [0, 4, 12, 16]);
        assert_eq!(words.len(), 19);
        assert_eq!(&words[..4], &a.words[..]);
        assert_eq!(&words[4..9], &[7; 5]);
        assert_eq!(&words[9..12], &[0; 3], "padding between tables");
        assert_eq!(words[12], 0, "an empty table holds one word");
        assert_eq!(&words[16..], &[9, 8, 7]);
        assert_eq!(c.address(0x1000), 0x1000 + 16 * 4);
        assert!([a.at, b.at, empty.at, c.at].iter().all(|&at| (at * 4) % 16 == 0));
    }
}

//! A batch layout uploaded once, and the borrowed device tensors of one launch.

use crate::layout::hopper;
use crate::model::ModelShape;
use crate::strides::Strides;
use crate::{Dims, KdaError, Plan, Schedule};
use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut};
use half::bf16;
use std::sync::Arc;

/// A [`Plan`] for one [`ModelShape`] (head counts, head sizes, gates, state layout) uploaded to
/// the device once, with the persistent kernel's work [`Schedule`] for this device and the
/// [`Strides`] of the tensors: reusable by every launch of the same batch layout.
pub struct DevicePlan {
    pub(super) plan: Plan,
    pub(super) shape: ModelShape,
    pub(super) strides: Strides,
    pub(super) schedule: Schedule,
    pub(super) descriptors: CudaSlice<i64>,
    /// The Hopper kernel's work records (`Schedule::table`), when the batch's offsets fit them.
    pub(super) work: Option<CudaSlice<u32>>,
    pub(super) ordinal: usize,
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
        shape.validate()?;
        let value_heads = shape.value_heads;
        let dims = Dims::model(&plan, shape);
        // The head counts (and that every tensor of the batch fits in memory).
        dims.check()?;
        // Column blocks of the Hopper kernel (a partial last block when `BV` does not divide `V`:
        // such shapes take no Hopper launch, see `Kda::launch`).
        let col_blocks = shape.value_dim.div_ceil(hopper::BV);
        let items = value_heads.checked_mul(col_blocks).and_then(|n| plan.num_seqs().checked_mul(n));
        if items.is_none_or(|n| n > i32::MAX as usize) {
            return Err(KdaError::Argument {
                name: "heads",
                reason: format!("N * HV = {} x {value_heads} work items exceed the grid limit", plan.num_seqs()),
            });
        }
        let sms = stream
            .context()
            .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?
            as usize;
        let schedule = Schedule::try_lpt(&plan, value_heads, col_blocks, sms * hopper::CTAS_PER_SM)?;
        // A one-word placeholder keeps the buffer non-empty for a batch of no sequences.
        let mut table = plan.descriptors();
        if table.is_empty() {
            table.push(0);
        }
        let descriptors = stream.clone_htod(&table)?;
        // No table (offsets past 32 bits): such batches take the baseline kernel.
        let work = schedule.table(&plan, dims.group()).map(|t| stream.clone_htod(&*non_empty(&t, 0))).transpose()?;
        let ordinal = stream.context().ordinal();
        Ok(Self { plan, shape: *shape, strides: Strides::PACKED, schedule, descriptors, work, ordinal })
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

/// `v`, or one `fill` element when `v` is empty (the driver cannot allocate zero bytes).
fn non_empty<T: Copy>(v: &[T], fill: T) -> std::borrow::Cow<'_, [T]> {
    if v.is_empty() { vec![fill].into() } else { v.into() }
}

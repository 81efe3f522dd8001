//! A batch layout uploaded once, and the borrowed device tensors of one launch.

use crate::layout::hopper;
use crate::{Dims, KdaError, Plan, Schedule};
use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut};
use half::bf16;
use std::sync::Arc;

/// A [`Plan`] for `heads` key heads and `value_heads` value heads uploaded to the device once,
/// with the persistent kernel's work [`Schedule`] for this device: reusable by every launch of
/// the same batch layout.
pub struct DevicePlan {
    pub(super) plan: Plan,
    pub(super) heads: usize,
    pub(super) value_heads: usize,
    pub(super) schedule: Schedule,
    pub(super) descriptors: CudaSlice<i64>,
    /// The Hopper kernel's work records (`Schedule::table`), when the batch's offsets fit them.
    pub(super) work: Option<CudaSlice<u32>>,
    pub(super) ordinal: usize,
}

impl DevicePlan {
    /// [`DevicePlan::grouped`] with one value head per key head (`HV = H`).
    pub fn new(stream: &Arc<CudaStream>, plan: Plan, heads: usize) -> Result<Self, KdaError> {
        Self::grouped(stream, plan, heads, heads)
    }

    /// Schedules `plan`'s (sequence, value head, column block) items over the SMs of `stream`'s
    /// device and uploads the descriptor and schedule tables on `stream` (asynchronously: the
    /// copies are ordered before any launch on the same stream). `value_heads` is a multiple of
    /// `heads`; value head `i` reads key head `i / (value_heads / heads)`.
    pub fn grouped(stream: &Arc<CudaStream>, plan: Plan, heads: usize, value_heads: usize) -> Result<Self, KdaError> {
        let dims = Dims::grouped(&plan, heads, value_heads);
        // The head counts (and that every tensor of the batch fits in memory).
        dims.check()?;
        let items = value_heads.checked_mul(hopper::COL_BLOCKS).and_then(|n| plan.num_seqs().checked_mul(n));
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
        let schedule = Schedule::try_lpt(&plan, value_heads, hopper::COL_BLOCKS, sms * hopper::CTAS_PER_SM)?;
        // A one-word placeholder keeps the buffer non-empty for a batch of no sequences.
        let mut table = plan.descriptors();
        if table.is_empty() {
            table.push(0);
        }
        let descriptors = stream.clone_htod(&table)?;
        // No table (offsets past 32 bits): such batches take the baseline kernel.
        let work = schedule.table(&plan, dims.group()).map(|t| stream.clone_htod(&*non_empty(&t, 0))).transpose()?;
        Ok(Self { plan, heads, value_heads, schedule, descriptors, work, ordinal: stream.context().ordinal() })
    }

    /// The host plan.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Key heads `H` of the batch.
    pub fn heads(&self) -> usize {
        self.heads
    }

    /// Value heads `HV` of the batch.
    pub fn value_heads(&self) -> usize {
        self.value_heads
    }

    /// The sizes of the batch's tensors.
    pub fn dims(&self) -> Dims {
        Dims::grouped(&self.plan, self.heads, self.value_heads)
    }

    /// The persistent kernel's work schedule.
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }
}

/// The input tensors of a launch, borrowed from the caller (flat views in the contract's layouts;
/// `H` key heads, `HV` value heads).
pub struct KdaInputs<'a> {
    /// `[T, H, K]` bf16.
    pub k: CudaView<'a, bf16>,
    /// `[T, HV, K]` bf16.
    pub w: CudaView<'a, bf16>,
    /// `[T, HV, V]` bf16.
    pub u: CudaView<'a, bf16>,
    /// `[T, HV, K]` f32.
    pub gk: CudaView<'a, f32>,
    /// `[N, HV, K, V]` f32, or `None` for zero initial states.
    pub h0: Option<CudaView<'a, f32>>,
}

/// The output tensors of a launch, borrowed mutably from the caller.
pub struct KdaOutputs<'a> {
    /// `[NT, HV, K, V]` bf16.
    pub h: CudaViewMut<'a, bf16>,
    /// `[T, HV, V]` bf16.
    pub v_new: CudaViewMut<'a, bf16>,
    /// `[N, HV, K, V]` f32, or `None` to skip the final states.
    pub ht: Option<CudaViewMut<'a, f32>>,
}

/// `v`, or one `fill` element when `v` is empty (the driver cannot allocate zero bytes).
fn non_empty<T: Copy>(v: &[T], fill: T) -> std::borrow::Cow<'_, [T]> {
    if v.is_empty() { vec![fill].into() } else { v.into() }
}

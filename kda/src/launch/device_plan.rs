//! A batch layout uploaded once, and the borrowed device tensors of one launch.

use crate::layout::hopper;
use crate::{KdaError, Plan, Schedule};
use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut};
use half::bf16;
use std::sync::Arc;

/// A [`Plan`] for `heads` heads uploaded to the device once, with the persistent kernel's work
/// [`Schedule`] for this device: reusable by every launch of the same batch layout.
pub struct DevicePlan {
    pub(super) plan: Plan,
    pub(super) heads: usize,
    pub(super) schedule: Schedule,
    pub(super) descriptors: CudaSlice<i64>,
    /// The Hopper kernel's work records (`Schedule::table`), when the batch's offsets fit them.
    pub(super) work: Option<CudaSlice<u32>>,
    pub(super) ordinal: usize,
}

impl DevicePlan {
    /// Schedules `plan`'s items over the SMs of `stream`'s device and uploads the descriptor and
    /// schedule tables on `stream` (asynchronously: the copies are ordered before any launch on
    /// the same stream).
    pub fn new(stream: &Arc<CudaStream>, plan: Plan, heads: usize) -> Result<Self, KdaError> {
        if heads == 0 {
            return Err(KdaError::Argument { name: "heads", reason: "must be at least 1".into() });
        }
        let items = heads.checked_mul(hopper::COL_BLOCKS).and_then(|n| plan.num_seqs().checked_mul(n));
        if items.is_none_or(|n| n > i32::MAX as usize) {
            return Err(KdaError::Argument {
                name: "heads",
                reason: format!("N * H = {} x {heads} work items exceed the grid limit", plan.num_seqs()),
            });
        }
        let sms = stream
            .context()
            .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?
            as usize;
        let schedule = Schedule::try_lpt(&plan, heads, hopper::COL_BLOCKS, sms * hopper::CTAS_PER_SM)?;
        // A one-word placeholder keeps the buffer non-empty for a batch of no sequences.
        let mut table = plan.descriptors();
        if table.is_empty() {
            table.push(0);
        }
        let descriptors = stream.clone_htod(&table)?;
        // No table (offsets past 32 bits): such batches take the baseline kernel.
        let work = schedule.table(&plan).map(|t| stream.clone_htod(&*non_empty(&t, 0))).transpose()?;
        Ok(Self { plan, heads, schedule, descriptors, work, ordinal: stream.context().ordinal() })
    }

    /// The host plan.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Heads `H` of the batch.
    pub fn heads(&self) -> usize {
        self.heads
    }

    /// The persistent kernel's work schedule.
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }
}

/// The input tensors of a launch, borrowed from the caller (flat views in the contract's layouts).
pub struct KdaInputs<'a> {
    /// `[T, H, K]` bf16.
    pub k: CudaView<'a, bf16>,
    /// `[T, H, K]` bf16.
    pub w: CudaView<'a, bf16>,
    /// `[T, H, V]` bf16.
    pub u: CudaView<'a, bf16>,
    /// `[T, H, K]` f32.
    pub gk: CudaView<'a, f32>,
    /// `[N, H, K, V]` f32, or `None` for zero initial states.
    pub h0: Option<CudaView<'a, f32>>,
}

/// The output tensors of a launch, borrowed mutably from the caller.
pub struct KdaOutputs<'a> {
    /// `[NT, H, K, V]` bf16.
    pub h: CudaViewMut<'a, bf16>,
    /// `[T, H, V]` bf16.
    pub v_new: CudaViewMut<'a, bf16>,
    /// `[N, H, K, V]` f32, or `None` to skip the final states.
    pub ht: Option<CudaViewMut<'a, f32>>,
}

/// `v`, or one `fill` element when `v` is empty (the driver cannot allocate zero bytes).
fn non_empty<T: Copy>(v: &[T], fill: T) -> std::borrow::Cow<'_, [T]> {
    if v.is_empty() { vec![fill].into() } else { v.into() }
}

//! Checkpoints for prefix caching (`../shared/LAYER.md`, serving): after a layer's prefill, the
//! state of chosen sequences after any token position, written to slots of a caller's pool, so
//! that an engine can cache a shared prefix wherever it ends.
//!
//! A state after `p` tokens is the entry state of the chunk holding token `p - 1` (kept in the
//! layer's workspace as `h`, bf16) advanced through that chunk's first tokens up to `p` (1 to 64
//! tokens), as the decode step runs a chain of tokens (`kda_advance_states`, one launch; the
//! decode step's code). Its error is the layer's on `ht` plus the bf16 rounding of `h`.

use super::args::{ArgNames, NamedArgs};
use super::decode::decode_supports;
use super::layer::{LayerInputs, LayerPlan, LayerWorkspace, LenCheck, OutputPath, check_devices, check_lengths, keep};
use super::{Kda, enqueue};
use crate::KdaError;
use crate::model::StateLayout;
use crate::pool::{Checkpoint, CheckpointTables, PoolElement, PoolShape, checkpoint_tables};
use cudarc::driver::{CudaSlice, CudaStream, CudaViewMut, DevicePtr, DevicePtrMut, DeviceSlice};
use kda_kernel::layout::decode::COLS;
use std::sync::Arc;

/// A layer plan's checkpoints, checked and uploaded: per checkpoint, its source state in `h`,
/// its first token row, its token count and its slot.
pub struct CheckpointPlan {
    layer: LayerPlanShape,
    pool: PoolShape,
    /// `[M]` i64: the chunk (index into `h`) whose entry state each checkpoint starts from.
    sources: CudaSlice<i64>,
    /// `[M]` i64: the first token row each checkpoint runs.
    first_rows: CudaSlice<i64>,
    /// `[M]` u32: the tokens each checkpoint runs (1 to `CHUNK`).
    counts: CudaSlice<u32>,
    /// `[M]` i64: each checkpoint's slot.
    slots: CudaSlice<i64>,
    items: usize,
}

/// What a checkpoint plan keeps of its layer plan, to check the launch's tensors against.
#[derive(Clone, Copy)]
struct LayerPlanShape {
    shape: crate::layer::LayerShape,
    /// The layer's state layout, `h`'s.
    layout: StateLayout,
    options: crate::layer::LayerOptions,
    tokens: usize,
    chunks: usize,
}

impl CheckpointPlan {
    /// Plans `checkpoints` of `layer`'s batch into `pool` and uploads them on `stream`. Refuses,
    /// with typed errors, what [`checkpoint_tables`] refuses, a pool that does not hold the
    /// layer's states, and the sizes the decode kernel does not run. The pool's layout may differ
    /// from the layer's. The checkpoints start from the chunk entry states `h` that only the
    /// separate output path writes: a layer plan on the fused path is refused (plan it with
    /// `LayerPlan::with_output_path(stream, OutputPath::Separate)`).
    pub fn new(
        stream: &Arc<CudaStream>,
        layer: &LayerPlan,
        pool: PoolShape,
        checkpoints: &[Checkpoint],
    ) -> Result<Self, KdaError> {
        if layer.output_path() != OutputPath::Separate {
            return Err(KdaError::Unsupported {
                argument: "layer",
                reason: "checkpoints read the chunk entry states `h`, which only OutputPath::Separate writes \
                         (LayerPlan::with_output_path)"
                    .into(),
            });
        }
        let shape = layer.shape();
        decode_supports(&shape, &pool)?;
        let batch = layer.batch();
        let CheckpointTables { mut sources, mut first_rows, mut counts, mut slots } =
            checkpoint_tables(batch, checkpoints, &pool)?;
        let items = checkpoints.len();
        // (One entry past the end keeps the buffers non-empty for a plan of no checkpoints.)
        let pad = |v: &mut Vec<i64>| v.push(0);
        pad(&mut sources);
        pad(&mut first_rows);
        pad(&mut slots);
        counts.push(0);
        Ok(Self {
            layer: LayerPlanShape {
                shape,
                layout: layer.state_layout(),
                options: layer.options(),
                tokens: batch.tokens(),
                chunks: batch.chunks(),
            },
            pool,
            sources: stream.clone_htod(&sources)?,
            first_rows: stream.clone_htod(&first_rows)?,
            counts: stream.clone_htod(&counts)?,
            slots: stream.clone_htod(&slots)?,
            items,
        })
    }

    /// Checkpoints planned.
    pub fn len(&self) -> usize {
        self.items
    }

    /// Whether no checkpoint is planned.
    pub fn is_empty(&self) -> bool {
        self.items == 0
    }
}

impl Kda {
    /// Writes `plan`'s checkpoints into `pool`: each the state of its sequence after its
    /// position, from the chunk entry states a [`Kda::launch_layer`] of the same layer plan and
    /// inputs left in `workspace.h`, advanced through the chunk's tokens from `inputs`. Call it
    /// after that launch, on the same stream (it is stream-ordered: no host synchronisation, no
    /// allocation). Validates every length, device and alignment first; a refused call launches
    /// nothing and writes nothing.
    pub fn launch_checkpoints<P: PoolElement>(
        &self,
        stream: &Arc<CudaStream>,
        plan: &CheckpointPlan,
        inputs: &LayerInputs<'_>,
        workspace: &LayerWorkspace,
        pool: &mut CudaViewMut<'_, P>,
    ) -> Result<(), KdaError> {
        plan.pool.check_element::<P>()?;
        let l = plan.layer;
        let s = l.shape;
        let (h, hv, kd, vd) = (s.heads, s.value_heads, s.key_dim, s.value_dim);
        let tokens = inputs.tokens();
        // The workspace may be larger than this plan needs (one sized for a longer batch).
        let h_len = l.chunks * hv * kd * vd;
        let others: [LenCheck; 2] = [
            ("h", Some(workspace.h.len().min(h_len)), Some(h_len)),
            ("pool", Some(pool.len()), Some(plan.pool.len()?)),
        ];
        check_lengths(&[&tokens.length_checks(l.tokens, &s, &l.options)[..], &others].concat())?;
        let ordinal = |x: &Arc<CudaStream>| x.context().ordinal();
        let here = [("stream", ordinal(stream)), ("plan", ordinal(plan.sources.stream()))];
        let others = [("h", ordinal(workspace.h.stream())), ("pool", ordinal(pool.stream()))];
        check_devices(self.ctx.ordinal(), &[&here[..], &tokens.devices(self.ctx.ordinal()), &others].concat())?;
        let ctas = plan.items.checked_mul(hv * (vd / COLS)).ok_or_else(|| KdaError::Argument {
            name: "checkpoints",
            reason: format!("{} checkpoints x {hv} heads exceed the grid", plan.items),
        })?;
        if ctas == 0 {
            return Ok(());
        }
        let word = |name: &'static str, x: usize| {
            u32::try_from(x).map_err(|_| KdaError::Argument { name, reason: format!("{x} exceeds 32 bits") })
        };
        let codes = l.options.codes();
        let mut records = Vec::new();
        let [q, k, v, g, beta, a_log, dt_bias] = tokens.addresses(stream, &mut records);
        let mut read = |x| keep(&mut records, x);
        let pool_address = read(pool.device_ptr_mut(stream));
        super::validate::check_alignments(&[
            ("pool", pool_address, super::decode::pool_alignment(plan.pool.dtype)),
            ("v", v, super::decode::V_ALIGNMENT),
        ])?;
        let args = AdvanceArgs {
            names: &ADVANCE_NAMES,
            ptrs: [
                q,
                k,
                v,
                g,
                beta,
                a_log,
                dt_bias,
                read(workspace.h.device_ptr(stream)),
                read(plan.sources.device_ptr(stream)),
                read(plan.first_rows.device_ptr(stream)),
                read(plan.counts.device_ptr(stream)),
                read(plan.slots.device_ptr(stream)),
                pool_address,
            ],
            words: [
                plan.pool.dtype.code(),
                plan.pool.layout.code(),
                l.layout.code(),
                word("heads", h)?,
                word("value_heads", hv)?,
                word("key_dim", kd)?,
                word("value_dim", vd)?,
                word("key_dim", s.gate_width())?,
                codes.options | tokens.dtypes().option_bits(),
                codes.gate_mode,
                codes.lower_bound_bits,
            ],
        };
        // SAFETY: every length was checked above (`h` holds every chunk of the plan's batch, the
        // inputs every token); the plan's sources are chunks of its batch, its rows and counts
        // stay inside their sequences, its slots lie inside the pool and none is named twice; the
        // pool's shape is the layer's and its alignment the kernel's (`decode_supports`, above);
        // `pool` is a `&mut` borrow, so it aliases no input.
        unsafe { enqueue(stream, &self.advance, ctas, |sink| args.push(sink)) }
    }
}

/// The checkpoint kernel's arguments (`kda_kernel::abi::ADVANCE_PARAMS`).
pub(super) type AdvanceArgs = NamedArgs<13, 11>;

/// The checkpoint kernel's parameter names.
const ADVANCE_NAMES: ArgNames<13, 11> = ArgNames {
    tensors: ["q", "k", "v", "g", "beta", "a_log", "dt_bias", "h", "sources", "first_rows", "counts", "slots", "pool"],
    words: [
        "pool_dtype",
        "pool_layout",
        "h_layout",
        "heads",
        "value_heads",
        "key_dim",
        "value_dim",
        "gate_width",
        "options",
        "gate_mode",
        "lower_bound_bits",
    ],
};

/// One argument list of the checkpoint kernel, for the launcher's ABI test (`args::tests`).
#[cfg(test)]
pub(super) fn sample_args() -> AdvanceArgs {
    NamedArgs::sample(&ADVANCE_NAMES)
}

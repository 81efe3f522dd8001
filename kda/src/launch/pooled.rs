//! The layer's prefill over a state pool (`../shared/LAYER.md`, "Decode": state pools): each
//! sequence starts from its slot of the caller's pool (or from zeros) and its final state goes
//! back to the slot, in place. Three steps on the caller's stream, nothing on the host between
//! them: `kda_pool_copy` gathers the sequences' states into a packed buffer, the layer runs
//! ([`Kda::launch_layer`]) with it as `h0` and a second packed buffer as `ht`, and
//! `kda_pool_copy` scatters that back to the slots. The two packed buffers ([`PooledStates`]) are
//! allocated once per plan, like the layer's workspace.

use super::args::{Address, ArgSink, push_named};
use super::layer::{check_devices, check_lengths, keep};
use super::{Kda, LayerDeviceOutputs, LayerInputs, LayerPlan, LayerWorkspace, enqueue};
use crate::KdaError;
use crate::pool::{PoolElement, PoolShape, SlotUse, slot_uses};
use cudarc::driver::{CudaSlice, CudaStream, CudaViewMut, DevicePtr, DevicePtrMut, DeviceSlice};
use half::bf16;
use kda_kernel::abi::PoolCopyCode;
use kda_kernel::layout::pool_copy::{PER_CTA, PER_THREAD};
use std::sync::Arc;

/// A layer plan's sequences mapped to the slots of a pool, checked and uploaded once.
pub struct LayerPool {
    pool: PoolShape,
    /// `[N + 1]` i64: each sequence's slot (negative: padding), then a padding entry.
    slots: CudaSlice<i64>,
    /// `[N + 1]` u32: nonzero where the sequence starts from zeros.
    fresh: CudaSlice<u32>,
    num_seqs: usize,
}

/// The packed initial and final states of a pooled launch (`[N, HV, K, V]` f32 each, in the
/// plan's layout).
pub struct PooledStates {
    h0: CudaSlice<f32>,
    ht: CudaSlice<f32>,
}

impl LayerPool {
    /// Maps `plan`'s sequences to slots of `pool`: `indices[n]` the slot of sequence `n`
    /// (negative: padding, whose slot is neither read nor written; it runs from zeros and its
    /// rows of `o` are written, so give a padding sequence no tokens to leave them untouched),
    /// `fresh[n]` when it starts from zeros. Refuses, with typed errors, a pool that does not hold
    /// the layer's states in the plan's layout and what `kda::pool::slot_uses` refuses.
    pub fn new(
        stream: &Arc<CudaStream>,
        plan: &LayerPlan,
        pool: PoolShape,
        indices: &[i64],
        fresh: &[bool],
    ) -> Result<Self, KdaError> {
        let s = plan.shape();
        let bad = |name, reason: String| Err(KdaError::Argument { name, reason });
        pool.check_holds(&s)?;
        if pool.layout != plan.state_layout() {
            return bad("pool", format!("a {:?} pool for a {:?} plan", pool.layout, plan.state_layout()));
        }
        if indices.len() != plan.batch().num_seqs() {
            return bad("slot_indices", format!("{} indices for {} sequences", indices.len(), plan.batch().num_seqs()));
        }
        pool.len()?;
        let uses = slot_uses(indices, fresh, &pool)?;
        let (slots, fresh) = SlotUse::decode_tables(&uses);
        Ok(Self { pool, slots: stream.clone_htod(&slots)?, fresh: stream.clone_htod(&fresh)?, num_seqs: uses.len() })
    }

    /// Allocates the packed states of a launch of this mapping on `stream`.
    pub fn states(&self, stream: &Arc<CudaStream>) -> Result<PooledStates, KdaError> {
        let len = self.packed_len()?.max(1);
        Ok(PooledStates { h0: stream.alloc_zeros(len)?, ht: stream.alloc_zeros(len)? })
    }

    /// f32 of one sequence's states (all its heads).
    fn state_len(&self) -> usize {
        self.pool.value_heads * self.pool.state_len()
    }

    fn packed_len(&self) -> Result<usize, KdaError> {
        self.num_seqs.checked_mul(self.state_len()).ok_or_else(|| KdaError::TooLarge {
            tensor: "states",
            shape: format!("[{}, {:?}]", self.num_seqs, self.pool),
        })
    }
}

impl Kda {
    /// The layer forward over `plan`'s batch with its states in the caller's `pool` (as
    /// `slots` maps them): each sequence from its slot (or zeros), `o` for every token, and the
    /// final states written back to the slots in place. `inputs.h0` must be `None` (the pool
    /// holds the initial states). Validates every length first; a refused call launches nothing
    /// and writes nothing. No allocation, no host synchronisation.
    #[allow(clippy::too_many_arguments)]
    pub fn launch_layer_pooled<P: PoolElement>(
        &self,
        stream: &Arc<CudaStream>,
        plan: &LayerPlan,
        slots: &LayerPool,
        inputs: &LayerInputs<'_>,
        pool: &mut CudaViewMut<'_, P>,
        o: &mut CudaViewMut<'_, bf16>,
        workspace: &mut LayerWorkspace,
        states: &mut PooledStates,
    ) -> Result<(), KdaError> {
        slots.pool.check_element::<P>()?;
        if inputs.h0.is_some() {
            return Err(KdaError::Argument {
                name: "h0",
                reason: "a pooled launch reads its initial states from the pool".into(),
            });
        }
        if slots.num_seqs != plan.batch().num_seqs() {
            return Err(KdaError::Argument {
                name: "slots",
                reason: format!("a mapping of {} sequences for a plan of {}", slots.num_seqs, plan.batch().num_seqs()),
            });
        }
        let packed = slots.packed_len()?;
        check_lengths(&[
            ("pool", Some(pool.len()), Some(slots.pool.len()?)),
            ("states.h0", Some(states.h0.len()), Some(packed.max(1))),
            ("states.ht", Some(states.ht.len()), Some(packed.max(1))),
        ])?;
        let ordinal = |x: &Arc<CudaStream>| x.context().ordinal();
        check_devices(
            self.ctx.ordinal(),
            &[
                ("slots", ordinal(slots.slots.stream())),
                ("pool", ordinal(pool.stream())),
                ("states", ordinal(states.h0.stream())),
            ],
        )?;
        if packed == 0 {
            // No sequence: the layer has nothing to run either (it checks its own arguments).
            let mut outputs = LayerDeviceOutputs { o: o.slice_mut(..), ht: None };
            return self.launch_layer(stream, plan, inputs, &mut outputs, workspace);
        }
        self.copy_states(stream, slots, pool, &mut states.h0, PoolCopyCode::Gather)?;
        {
            let pooled_inputs = LayerInputs {
                q: inputs.q.slice(..),
                k: inputs.k.slice(..),
                v: inputs.v.slice(..),
                g: inputs.g.view(),
                beta: inputs.beta.view(),
                a_log: inputs.a_log.as_ref().map(|x| x.slice(..)),
                dt_bias: inputs.dt_bias.as_ref().map(|x| x.slice(..)),
                h0: Some(states.h0.slice(..packed)),
            };
            let mut outputs = LayerDeviceOutputs { o: o.slice_mut(..), ht: Some(states.ht.slice_mut(..packed)) };
            self.launch_layer(stream, plan, &pooled_inputs, &mut outputs, workspace)?;
        }
        self.copy_states(stream, slots, pool, &mut states.ht, PoolCopyCode::Scatter)
    }

    /// One `kda_pool_copy` between `pool` and `packed` (checked by the caller).
    fn copy_states<P: PoolElement>(
        &self,
        stream: &Arc<CudaStream>,
        slots: &LayerPool,
        pool: &mut CudaViewMut<'_, P>,
        packed: &mut CudaSlice<f32>,
        direction: PoolCopyCode,
    ) -> Result<(), KdaError> {
        let state_len = slots.state_len();
        let ctas = slots.num_seqs.checked_mul(state_len.div_ceil(PER_CTA)).ok_or_else(|| KdaError::Argument {
            name: "slot_indices",
            reason: format!("{} sequences of {state_len} f32 exceed the grid", slots.num_seqs),
        })?;
        let mut records = Vec::new();
        let mut read = |x| keep(&mut records, x);
        let (slot_table, _s) = slots.slots.device_ptr(stream);
        let (fresh, _f) = slots.fresh.device_ptr(stream);
        let args = PoolCopyArgs {
            ptrs: [read(pool.device_ptr_mut(stream)), read(packed.device_ptr_mut(stream)), slot_table, fresh],
            state_len: u32::try_from(state_len).map_err(|_| KdaError::TooLarge {
                tensor: "pool",
                shape: format!("{:?}: states of 2^32 f32 or more", slots.pool),
            })?,
            direction: direction as u32,
            pool_dtype: slots.pool.dtype.code(),
        };
        debug_assert!(state_len.is_multiple_of(PER_THREAD), "K and V are multiples of 4");
        // SAFETY: the pool's and the packed buffer's lengths were checked against the mapping,
        // whose slots were checked against the pool (in range, none named twice); a state's
        // length is a multiple of four f32 (K and V are); `pool` and `packed` are distinct
        // borrows.
        unsafe { enqueue(stream, &self.pool_copy, ctas, |sink| args.push(sink)) }
    }
}

/// The pool copy's arguments (`kda_kernel::abi::POOL_COPY_PARAMS`).
pub(super) struct PoolCopyArgs {
    ptrs: [Address; 4],
    state_len: u32,
    direction: u32,
    pool_dtype: u32,
}

impl PoolCopyArgs {
    const TENSORS: [&'static str; 4] = ["pool", "packed", "slots", "fresh"];

    pub(super) fn push<'a>(&'a self, sink: &mut impl ArgSink<'a>) {
        push_named(sink, &Self::TENSORS, &self.ptrs);
        sink.push("state_len", &self.state_len);
        sink.push("direction", &self.direction);
        sink.push("pool_dtype", &self.pool_dtype);
    }
}

/// One argument list of the pool copy, for the launcher's ABI test (`args::tests`).
#[cfg(test)]
pub(super) fn sample_args() -> PoolCopyArgs {
    PoolCopyArgs { ptrs: [1; 4], state_len: 2, direction: 1, pool_dtype: 1 }
}

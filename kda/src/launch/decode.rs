//! The decode step on the GPU (`../shared/LAYER.md`, "Decode"): one token per sequence through the
//! layer, each sequence's state read from and written back to its slot of the caller's pool, in
//! place (`kda_decode_step`, one launch); or, to verify speculative drafts, a few tokens per
//! sequence as a chain or a tree, each token's state into a slot of its own
//! ([`DecodePlan::verify`]). [`DecodePlan`] checks the slot indices once (in range, no slot named
//! twice, no slot written by one sequence and read by another) and uploads them;
//! [`Kda::launch_decode`] allocates nothing and never synchronises, so a serving loop can capture
//! it in a CUDA graph.

use super::args::{Address, ArgNames, NamedArgs};
use super::float_input::FloatInput;
use super::layer::{LenCheck, check_devices, check_lengths, keep};
use super::{Kda, enqueue};
use crate::KdaError;
use crate::layer::{GateInput, LayerOptions, LayerShape, TokenDtypes};
use crate::pool::{DraftTables, PoolElement, PoolShape, SlotUse, StateDtype, draft_tables, slot_uses};
use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop};
use half::bf16;
use kda_kernel::layout::decode::{COLS, COPY_BYTES, K_MULTIPLE, MAX_K, VEC};
use std::sync::Arc;

/// One decode step's sequences and their slots, planned for the GPU.
pub struct DecodePlan {
    shape: LayerShape,
    options: LayerOptions,
    pool: PoolShape,
    /// `[N]` i64: each sequence's slot, negative for padding.
    slots: CudaSlice<i64>,
    /// `[N]` u32: nonzero where the sequence starts from zeros.
    fresh: CudaSlice<u32>,
    /// Tokens per sequence.
    draft: usize,
    /// `[N * draft]` i64: each token's parent, for a tree of draft tokens.
    parents: Option<CudaSlice<i64>>,
    /// `[N * draft]` i64: where each token's state goes.
    token_slots: Option<CudaSlice<i64>>,
    num_seqs: usize,
}

/// The decode step's token inputs on the device (one token per sequence; the shapes of a layer
/// problem of `N` one-token sequences).
pub struct DecodeInputs<'a> {
    /// `[N, H, K]` bf16.
    pub q: CudaView<'a, bf16>,
    /// `[N, H, K]` bf16.
    pub k: CudaView<'a, bf16>,
    /// `[N, HV, V]` bf16.
    pub v: CudaView<'a, bf16>,
    /// `[N, HV, K]` (KDA) or `[N, HV]` (GDN), f32 or bf16.
    pub g: FloatInput<'a>,
    /// `[N, HV]`, f32 or bf16.
    pub beta: FloatInput<'a>,
    /// `[HV]` f32, given exactly when the gate is raw.
    pub a_log: Option<CudaView<'a, f32>>,
    /// `[HV, K]` (KDA) or `[HV]` (GDN) f32, given exactly when the gate is raw.
    pub dt_bias: Option<CudaView<'a, f32>>,
}

impl<'a> DecodeInputs<'a> {
    /// Each token input's length against `rows` token rows of `shape`; `A_log` and `dt_bias`
    /// given exactly when `options` take the gate raw.
    pub(super) fn length_checks(&self, rows: usize, shape: &LayerShape, options: &LayerOptions) -> [LenCheck; 7] {
        let (h, hv, kd, vd, gw) = (shape.heads, shape.value_heads, shape.key_dim, shape.value_dim, shape.gate_width());
        let raw = !matches!(options.gate, GateInput::Log);
        [
            ("q", Some(self.q.len()), Some(rows * h * kd)),
            ("k", Some(self.k.len()), Some(rows * h * kd)),
            ("v", Some(self.v.len()), Some(rows * hv * vd)),
            ("g", Some(self.g.len()), Some(rows * hv * gw)),
            ("beta", Some(self.beta.len()), Some(rows * hv)),
            ("A_log", self.a_log.as_ref().map(|x| x.len()), raw.then_some(hv)),
            ("dt_bias", self.dt_bias.as_ref().map(|x| x.len()), raw.then_some(hv * gw)),
        ]
    }

    /// Each token input's device (an absent one counts as on `device`).
    pub(super) fn devices(&self, device: usize) -> [(&'static str, usize); 7] {
        let ordinal = |x: &Arc<CudaStream>| x.context().ordinal();
        let optional = |x: &Option<CudaView<'a, f32>>| x.as_ref().map_or(device, |x| ordinal(x.stream()));
        [
            ("q", ordinal(self.q.stream())),
            ("k", ordinal(self.k.stream())),
            ("v", ordinal(self.v.stream())),
            ("g", ordinal(self.g.stream())),
            ("beta", ordinal(self.beta.stream())),
            ("A_log", optional(&self.a_log)),
            ("dt_bias", optional(&self.dt_bias)),
        ]
    }

    /// The gate's and `beta`'s dtypes (the kernels' option bits for them:
    /// [`crate::layer::TokenDtypes::option_bits`]).
    pub fn dtypes(&self) -> TokenDtypes {
        TokenDtypes { g: self.g.dtype(), beta: self.beta.dtype() }
    }

    /// The token inputs' addresses in the kernels' order (`q`, `k`, `v`, `g`, `beta`, `a_log`,
    /// `dt_bias`; an absent one null), their stream records kept in `records` until the launch
    /// is enqueued.
    pub(super) fn addresses<'s>(
        &'s self,
        stream: &'s Arc<CudaStream>,
        records: &mut Vec<SyncOnDrop<'s>>,
    ) -> [Address; 7] {
        let optional = |x: &'s Option<CudaView<'a, f32>>, records: &mut Vec<SyncOnDrop<'s>>| {
            x.as_ref().map_or(0, |x| keep(records, x.device_ptr(stream)))
        };
        [
            keep(records, self.q.device_ptr(stream)),
            keep(records, self.k.device_ptr(stream)),
            keep(records, self.v.device_ptr(stream)),
            self.g.address(stream, records),
            self.beta.address(stream, records),
            optional(&self.a_log, records),
            optional(&self.dt_bias, records),
        ]
    }
}

impl DecodePlan {
    /// Plans a decode step of `indices.len()` sequences (`indices[n]` the slot of sequence `n`,
    /// negative for padding; `fresh[n]` when it starts from zeros) over `pool` for a layer of
    /// `shape` with `options`, and uploads the slots on `stream`. Refuses, with typed errors, a
    /// slot past the pool, a slot named twice, a pool that does not hold the layer's states, and
    /// the sizes the kernel does not run (`K` other than 64 or 128, `V` not a multiple of 64).
    pub fn new(
        stream: &Arc<CudaStream>,
        shape: LayerShape,
        options: LayerOptions,
        pool: PoolShape,
        indices: &[i64],
        fresh: &[bool],
    ) -> Result<Self, KdaError> {
        Self::verify(stream, shape, options, pool, indices, fresh, 1, None, None)
    }

    /// Plans a call of `draft` tokens per sequence (speculative decoding's verify step; the
    /// token inputs and `o` hold `N * draft` rows, sequence-major), from the sequences' slots as
    /// in [`DecodePlan::new`]. `parents` (`None`: a chain) gives each token's parent inside its
    /// sequence (negative: the sequence's initial state); `token_slots` (`None`: the last token's
    /// state goes back to the sequence's slot) the slot each token's state is written to
    /// (negative: none), so that the engine keeps the accepted prefix's state. Each token's output
    /// and state are bit for bit what one-token calls along its path give. Refuses what
    /// [`crate::pool::draft_tables`] refuses.
    #[allow(clippy::too_many_arguments)]
    pub fn verify(
        stream: &Arc<CudaStream>,
        shape: LayerShape,
        options: LayerOptions,
        pool: PoolShape,
        indices: &[i64],
        fresh: &[bool],
        draft: usize,
        parents: Option<&[i64]>,
        token_slots: Option<&[i64]>,
    ) -> Result<Self, KdaError> {
        decode_supports(&shape, &pool)?;
        let uses = slot_uses(indices, fresh, &pool)?;
        let DraftTables { draft, parents, token_slots } = draft_tables(&uses, draft, parents, token_slots, &pool)?;
        let (slots, fresh) = SlotUse::decode_tables(&uses);
        // (One padding entry past the end keeps the buffers non-empty for a call of no sequences.)
        let upload = |t: Vec<i64>| (!t.is_empty()).then(|| stream.clone_htod(&t)).transpose();
        Ok(Self {
            shape,
            options,
            pool,
            slots: stream.clone_htod(&slots)?,
            fresh: stream.clone_htod(&fresh)?,
            draft,
            parents: upload(parents)?,
            token_slots: upload(token_slots)?,
            num_seqs: uses.len(),
        })
    }

    /// Points the plan at new slots in place: the slot of each of its `N` sequences (negative:
    /// padding), which of them start fresh, and for a verify plan its tokens' parents and state
    /// slots, checked as
    /// [`DecodePlan::verify`] checks them and copied on `stream` into the buffers the plan
    /// already holds. A launch (or a CUDA graph captured from one) enqueued after this on
    /// `stream` runs the new slots: a serving loop captures one step per batch size and replays
    /// it as requests come and go. The plan keeps its sequence count, `draft` and kind: an
    /// `indices` of another length, or `parents` / `token_slots` given where the plan has none
    /// (or missing where it has them), is refused with a typed error, and a refused call copies
    /// nothing.
    pub fn rebind(
        &mut self,
        stream: &Arc<CudaStream>,
        indices: &[i64],
        fresh: &[bool],
        parents: Option<&[i64]>,
        token_slots: Option<&[i64]>,
    ) -> Result<(), KdaError> {
        let tables = rebound_tables(self.shape_of_tables(), &self.pool, indices, fresh, parents, token_slots)?;
        stream.memcpy_htod(&tables.slots, &mut self.slots)?;
        stream.memcpy_htod(&tables.fresh, &mut self.fresh)?;
        if let Some(buffer) = &mut self.parents {
            stream.memcpy_htod(&tables.parents, buffer)?;
        }
        if let Some(buffer) = &mut self.token_slots {
            stream.memcpy_htod(&tables.token_slots, buffer)?;
        }
        Ok(())
    }

    /// What [`DecodePlan::rebind`] keeps: the sequence count, `draft` and which tables it holds.
    fn shape_of_tables(&self) -> TablesShape {
        TablesShape {
            sequences: self.num_seqs,
            draft: self.draft,
            parents: self.parents.is_some(),
            token_slots: self.token_slots.is_some(),
        }
    }

    /// Tokens per sequence.
    pub fn draft(&self) -> usize {
        self.draft
    }

    /// Sequences (padding ones included).
    pub fn sequences(&self) -> usize {
        self.num_seqs
    }

    /// The layer's shape.
    pub fn shape(&self) -> LayerShape {
        self.shape
    }

    /// The layer's options.
    pub fn options(&self) -> LayerOptions {
        self.options
    }

    /// The pool's shape.
    pub fn pool(&self) -> PoolShape {
        self.pool
    }
}

/// The sequence count, tokens per sequence and tables of a plan, which [`DecodePlan::rebind`]
/// keeps.
#[derive(Clone, Copy, Debug, PartialEq)]
struct TablesShape {
    sequences: usize,
    draft: usize,
    parents: bool,
    token_slots: bool,
}

/// A decode plan's device tables as the kernel reads them.
struct DecodeTables {
    slots: Vec<i64>,
    fresh: Vec<u32>,
    parents: Vec<i64>,
    token_slots: Vec<i64>,
}

/// The tables of new slots for a plan of `shape` over `pool` ([`DecodePlan::rebind`]): checked
/// as [`DecodePlan::verify`] checks them, and refused unless they are the plan's shape.
fn rebound_tables(
    shape: TablesShape,
    pool: &PoolShape,
    indices: &[i64],
    fresh: &[bool],
    parents: Option<&[i64]>,
    token_slots: Option<&[i64]>,
) -> Result<DecodeTables, KdaError> {
    if indices.len() != shape.sequences {
        return Err(KdaError::Argument {
            name: "slot_indices",
            reason: format!(
                "{} sequences where the plan has {}: plan a call of this size instead",
                indices.len(),
                shape.sequences
            ),
        });
    }
    let uses = slot_uses(indices, fresh, pool)?;
    let tables = draft_tables(&uses, shape.draft, parents, token_slots, pool)?;
    let kept = |name: &'static str, planned: bool, given: bool| {
        if planned == given {
            Ok(())
        } else {
            let (has, gets) = if planned { ("has", "none") } else { ("has none", "some") };
            Err(KdaError::Argument {
                name,
                reason: format!("the plan {has}; rebinding gives {gets}: plan the call anew"),
            })
        }
    };
    kept("parents", shape.parents, !tables.parents.is_empty())?;
    kept("token_slots", shape.token_slots, !tables.token_slots.is_empty())?;
    let (slots, fresh) = SlotUse::decode_tables(&uses);
    Ok(DecodeTables { slots, fresh, parents: tables.parents, token_slots: tables.token_slots })
}

/// Whether the decode kernel runs `shape` over `pool` (typed refusals otherwise).
pub(super) fn decode_supports(shape: &LayerShape, pool: &PoolShape) -> Result<(), KdaError> {
    shape.validate()?;
    pool.check_holds(shape)?;
    let unsupported = |argument, reason: String| Err(KdaError::Unsupported { argument, reason });
    if shape.key_dim > MAX_K || !shape.key_dim.is_multiple_of(K_MULTIPLE) {
        return unsupported("key_dim", format!("the decode kernel holds multiples of {K_MULTIPLE} up to {MAX_K}"));
    }
    if !shape.value_dim.is_multiple_of(COLS) {
        return unsupported("value_dim", format!("the decode kernel takes multiples of {COLS}"));
    }
    pool.len()?;
    Ok(())
}

impl Kda {
    /// One decode step of `plan`'s sequences: reads each live sequence's state from its slot of
    /// `pool` (zeros for a fresh one), writes the state after the token back to the slot and the
    /// token's output to `o` (`[N, HV, V]` bf16; a padding sequence's rows untouched). Validates
    /// every length first, and that `q`, `k`, `v` and a per-key `g` start 16-byte aligned (the
    /// kernel copies their rows 16 bytes at a time; buffers from an allocation are); a refused
    /// call launches nothing and writes nothing.
    pub fn launch_decode<P: PoolElement>(
        &self,
        stream: &Arc<CudaStream>,
        plan: &DecodePlan,
        inputs: &DecodeInputs<'_>,
        pool: &mut CudaViewMut<'_, P>,
        o: &mut CudaViewMut<'_, bf16>,
    ) -> Result<(), KdaError> {
        plan.pool.check_element::<P>()?;
        let s = plan.shape;
        let (n, h, hv, kd, vd) = (plan.num_seqs, s.heads, s.value_heads, s.key_dim, s.value_dim);
        // Token rows: `draft` per sequence.
        let rows = n * plan.draft;
        let pool_len = plan.pool.len()?;
        let outputs: [LenCheck; 2] =
            [("pool", Some(pool.len()), Some(pool_len)), ("o", Some(o.len()), Some(rows * hv * vd))];
        check_lengths(&[&inputs.length_checks(rows, &s, &plan.options)[..], &outputs].concat())?;
        let ordinal = |x: &Arc<CudaStream>| x.context().ordinal();
        let here = [("stream", ordinal(stream)), ("plan", ordinal(plan.slots.stream()))];
        let outputs = [("pool", ordinal(pool.stream())), ("o", ordinal(o.stream()))];
        check_devices(self.ctx.ordinal(), &[&here[..], &inputs.devices(self.ctx.ordinal()), &outputs].concat())?;
        let ctas = n.checked_mul(hv).and_then(|x| x.checked_mul(vd / COLS)).ok_or_else(|| KdaError::Argument {
            name: "slot_indices",
            reason: format!("{n} sequences x {hv} heads exceed the grid"),
        })?;
        if ctas == 0 {
            return Ok(());
        }
        let word = |name: &'static str, x: usize| {
            u32::try_from(x).map_err(|_| KdaError::Argument { name, reason: format!("{x} exceeds 32 bits") })
        };
        let codes = plan.options.codes();
        let mut records = Vec::new();
        let [q, k, v, g, beta, a_log, dt_bias] = inputs.addresses(stream, &mut records);
        let mut read = |x| keep(&mut records, x);
        let (slots, _s) = plan.slots.device_ptr(stream);
        let (fresh, _f) = plan.fresh.device_ptr(stream);
        let parents = plan.parents.as_ref().map(|x| x.device_ptr(stream));
        let token_slots = plan.token_slots.as_ref().map(|x| x.device_ptr(stream));
        let args = DecodeArgs {
            names: &DECODE_NAMES,
            ptrs: [
                q,
                k,
                v,
                g,
                beta,
                a_log,
                dt_bias,
                slots,
                fresh,
                parents.as_ref().map_or(0, |x| x.0),
                token_slots.as_ref().map_or(0, |x| x.0),
                read(pool.device_ptr_mut(stream)),
                read(o.device_ptr_mut(stream)),
            ],
            words: [
                plan.pool.dtype.code(),
                plan.pool.layout.code(),
                word("draft", plan.draft)?,
                word("heads", h)?,
                word("value_heads", hv)?,
                word("key_dim", kd)?,
                word("value_dim", vd)?,
                word("key_dim", s.gate_width())?,
                codes.options
                    | inputs.dtypes().option_bits()
                    | self.stagger_bits(super::DECODE_STAGGER_VAR, super::DECODE_STAGGER_NS)?,
                codes.gate_mode,
                codes.lower_bound_bits,
                codes.scale_bits,
            ],
        };
        check_alignment(&args, plan.pool.dtype, s.gate_width(), inputs.dtypes())?;
        // SAFETY: every length and alignment was checked above; the plan's slots and token slots were checked
        // against the pool (in range, none written twice, none written by one sequence and read
        // by another: no two CTAs of different sequences touch one state), its parents precede
        // their tokens, and
        // the pool's shape is the layer's (`decode_supports`); `pool` and `o` are `&mut` borrows,
        // so they alias no input.
        unsafe { enqueue(stream, &self.decode, ctas, |sink| args.push(sink)) }
    }
}

/// The alignment in bytes each of the decode step's tensors needs (in `DecodeArgs::TENSORS`
/// order): the kernel copies the rows of `q`, `k`, `v` and a gate per key to shared memory 16
/// bytes at a time (`COPY_BYTES`; a gate per head one element), writes `o` in vectors of `VEC`
/// bf16, reads and writes the pool in vectors of `VEC` states, everything else one element at a
/// time (the gate and `beta` in their `dtypes`).
fn decode_alignments(pool: StateDtype, gate_width: usize, dtypes: TokenDtypes) -> [usize; 13] {
    let (bf16, f32, index) = (2, 4, 8);
    let bf16_vector = VEC * bf16;
    let pool = VEC * if pool == StateDtype::Bf16 { bf16 } else { f32 };
    let gate = if gate_width > 1 { COPY_BYTES } else { dtypes.g.bytes() };
    let beta = dtypes.beta.bytes();
    [COPY_BYTES, COPY_BYTES, COPY_BYTES, gate, beta, f32, f32, index, 4, index, index, pool, bf16_vector]
}

/// The alignment `v` needs: the kernels read it in vectors of `VEC` bf16.
pub(super) const V_ALIGNMENT: usize = VEC * 2;

/// The alignment a pool of `dtype` needs: the kernels read and write it in vectors of `VEC`
/// states.
pub(super) fn pool_alignment(dtype: StateDtype) -> usize {
    decode_alignments(dtype, 1, TokenDtypes::default())[11]
}

/// Every tensor of `args` at the alignment `decode_alignments` gives (absent ones are null).
fn check_alignment(
    args: &DecodeArgs,
    pool: StateDtype,
    gate_width: usize,
    dtypes: TokenDtypes,
) -> Result<(), KdaError> {
    let named: Vec<_> = DECODE_NAMES
        .tensors
        .iter()
        .zip(&args.ptrs)
        .zip(decode_alignments(pool, gate_width, dtypes))
        .map(|((&tensor, &address), required)| (tensor, address, required))
        .collect();
    super::validate::check_alignments(&named)
}

/// The decode step's arguments (`kda_kernel::abi::DECODE_PARAMS`).
pub(super) type DecodeArgs = NamedArgs<13, 12>;

/// The decode step's parameter names.
pub(super) const DECODE_NAMES: ArgNames<13, 12> = ArgNames {
    tensors: ["q", "k", "v", "g", "beta", "a_log", "dt_bias", "slots", "fresh", "parents", "token_slots", "pool", "o"],
    words: [
        "pool_dtype",
        "pool_layout",
        "draft",
        "heads",
        "value_heads",
        "key_dim",
        "value_dim",
        "gate_width",
        "options",
        "gate_mode",
        "lower_bound_bits",
        "scale_bits",
    ],
};

/// One argument list of the decode step, for the launcher's ABI test (`args::tests`).
#[cfg(test)]
pub(super) fn sample_args() -> DecodeArgs {
    NamedArgs::sample(&DECODE_NAMES)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layer::LayerKind;
    use crate::model::StateLayout;

    fn shape(key_dim: usize, value_dim: usize) -> LayerShape {
        LayerShape { kind: LayerKind::Kda, heads: 2, value_heads: 4, key_dim, value_dim }
    }

    fn pool(s: &LayerShape, layout: StateLayout) -> PoolShape {
        PoolShape {
            slots: 8,
            value_heads: s.value_heads,
            key_dim: s.key_dim,
            value_dim: s.value_dim,
            layout,
            dtype: crate::pool::StateDtype::F32,
        }
    }

    #[test]
    fn rebinding_keeps_the_plans_shape_and_checks_the_slots() {
        let s = shape(128, 128);
        let pool = pool(&s, StateLayout::KeyFirst);
        let chain = TablesShape { sequences: 3, draft: 1, parents: false, token_slots: false };
        let t = rebound_tables(chain, &pool, &[4, -1, 0], &[false, false, true], None, None).unwrap();
        assert_eq!((t.slots, t.fresh), (vec![4, -1, 0, -1], vec![0, 0, 1, 0]));
        assert!(t.parents.is_empty() && t.token_slots.is_empty());
        let refused = |r: Result<DecodeTables, KdaError>| match r {
            Err(KdaError::Argument { name, .. }) => name,
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("accepted"),
        };
        // Another sequence count, a slot named twice, a slot past the pool's 8.
        assert_eq!(refused(rebound_tables(chain, &pool, &[4, 0], &[false; 2], None, None)), "slot_indices");
        assert!(rebound_tables(chain, &pool, &[4, 4, 0], &[false; 3], None, None).is_err());
        assert!(rebound_tables(chain, &pool, &[4, 8, 0], &[false; 3], None, None).is_err());
        // Token slots where the plan has none, and none where it has them.
        let verify = TablesShape { sequences: 2, draft: 2, parents: false, token_slots: true };
        let chain2 = TablesShape { sequences: 2, draft: 2, parents: false, token_slots: false };
        let token_slots = [5, 1, 6, 2];
        assert_eq!(
            refused(rebound_tables(chain2, &pool, &[1, 2], &[false; 2], None, Some(&token_slots))),
            "token_slots"
        );
        assert_eq!(refused(rebound_tables(verify, &pool, &[1, 2], &[false; 2], None, None)), "token_slots");
        let t = rebound_tables(verify, &pool, &[1, 2], &[false; 2], None, Some(&token_slots)).unwrap();
        assert_eq!(t.token_slots, token_slots);
    }

    #[test]
    fn the_decode_kernel_refuses_what_it_does_not_run() {
        let ok = shape(128, 128);
        assert!(decode_supports(&ok, &pool(&ok, StateLayout::KeyFirst)).is_ok());
        let small = shape(64, 64);
        assert!(decode_supports(&small, &pool(&small, StateLayout::KeyFirst)).is_ok());
        let refused = |s: LayerShape, layout| match decode_supports(&s, &pool(&s, layout)) {
            Err(KdaError::Unsupported { argument, .. }) => argument,
            other => panic!("{s:?} {layout:?}: {other:?}"),
        };
        assert!(decode_supports(&ok, &pool(&ok, StateLayout::ValueFirst)).is_ok());
        assert_eq!(refused(shape(256, 128), StateLayout::ValueFirst), "key_dim");
        assert_eq!(refused(shape(256, 128), StateLayout::KeyFirst), "key_dim");
        let k96 = shape(96, 128);
        assert!(
            decode_supports(&k96, &pool(&k96, StateLayout::KeyFirst)).is_ok(),
            "three vectors of keys per key lane"
        );
        assert_eq!(refused(shape(80, 128), StateLayout::KeyFirst), "key_dim");
        assert_eq!(refused(shape(128, 32), StateLayout::KeyFirst), "value_dim");
        assert_eq!(refused(shape(128, 96), StateLayout::KeyFirst), "value_dim");
        let other_pool = PoolShape { value_heads: 2, ..pool(&ok, StateLayout::KeyFirst) };
        assert!(matches!(decode_supports(&ok, &other_pool), Err(KdaError::Argument { name: "pool", .. })));
    }

    #[test]
    fn misaligned_tensors_are_refused_by_name() {
        let mut args = sample_args();
        args.ptrs = [0x1000; 13];
        let (f32_pool, bf16_pool, per_key, per_head) = (StateDtype::F32, StateDtype::Bf16, 128, 1);
        let (f32s, bf16s) = (TokenDtypes::default(), TokenDtypes::BF16);
        check_alignment(&args, f32_pool, per_key, f32s).unwrap();
        // `q`, `k` and `v` are copied 16 bytes at a time.
        for (i, name) in [(0, "q"), (1, "k"), (2, "v")] {
            args.ptrs[i] = 0x1008;
            let err = check_alignment(&args, f32_pool, per_key, f32s).unwrap_err();
            assert!(matches!(err, KdaError::Alignment { tensor, required: 16, .. } if tensor == name), "{err}");
            args.ptrs[i] = 0x1000;
        }
        // A gate per key likewise, a gate per head one f32 at a time.
        args.ptrs[3] = 0x1004;
        assert!(matches!(
            check_alignment(&args, f32_pool, per_key, f32s),
            Err(KdaError::Alignment { tensor: "g", required: 16, .. })
        ));
        check_alignment(&args, f32_pool, per_head, f32s).unwrap();
        // A gate per head and `beta` in bf16 one element (2 bytes) at a time, in f32 4 bytes;
        // a bf16 gate per key is copied 16 bytes at a time as an f32 one is.
        args.ptrs[3] = 0x1002;
        args.ptrs[4] = 0x1002;
        check_alignment(&args, f32_pool, per_head, bf16s).unwrap();
        assert!(matches!(
            check_alignment(&args, f32_pool, per_head, f32s),
            Err(KdaError::Alignment { tensor: "g", required: 4, .. })
        ));
        assert!(matches!(
            check_alignment(&args, f32_pool, per_key, bf16s),
            Err(KdaError::Alignment { tensor: "g", required: 16, .. })
        ));
        args.ptrs[3] = 0x1000;
        assert!(matches!(
            check_alignment(&args, f32_pool, per_head, f32s),
            Err(KdaError::Alignment { tensor: "beta", required: 4, .. })
        ));
        args.ptrs[4] = 0x1000;
        // An f32 pool 16 bytes at a time, a bf16 one 8; `o` written 8 bytes at a time.
        args.ptrs[11] = 0x1008;
        assert!(matches!(
            check_alignment(&args, f32_pool, per_head, f32s),
            Err(KdaError::Alignment { tensor: "pool", required: 16, .. })
        ));
        check_alignment(&args, bf16_pool, per_head, f32s).unwrap();
        args.ptrs[12] = 0x1004;
        assert!(matches!(
            check_alignment(&args, bf16_pool, per_head, f32s),
            Err(KdaError::Alignment { tensor: "o", required: 8, .. })
        ));
    }
}

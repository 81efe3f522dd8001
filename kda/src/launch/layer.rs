//! The layer forward on the GPU (docs/CONTRACT.md, "The layer"): two or three launches on the
//! caller's stream, with nothing between them on the host. On the fused path
//! ([`OutputPath::Fused`], what 9.x runs at `K` of 64 or 128):
//!
//! 1. `kda_layer_prepare_fused`, one CTA per (chunk, value head): the gate activated and summed
//!    in the chunk, `q`/`k` normalised and `beta`'s sigmoid when asked, the WY representation
//!    `w`, `u`, the recurrence's keys and log2 gate, and each chunk's causal attention `P` and
//!    `q Γ`;
//! 2. the fused recurrence (`kda_layer_fused_hopper`: the Hopper kernel in wide blocks), which
//!    forms `o = scale ((q Γ) S + P v_new)` in its chunk loop and writes `o` and the final states,
//!    neither `h` nor `v_new`.
//!
//! On the separate path ([`OutputPath::Separate`]: every other GPU and size, and callers that
//! want every chunk's entry state `h`, e.g. for checkpoints), three launches: the prepare kernel,
//! the recurrence ([`Kda::launch`]) writing `h`, `v_new` and the final states, and an output
//! kernel forming `o` from `h` and `v_new`. Where a CTA gets the fused prepare kernel's 110 KB
//! (the A100 and H100 classes), the prepare kernel is `kda_layer_prepare_fused` and the output
//! kernel `kda_layer_output_prepared`, which reads its `P` and `q Γ`; elsewhere (sm_86, sm_89,
//! sm_120) `kda_layer_prepare` (step 1 without `P` and `q Γ`) and `kda_layer_output`, which
//! forms them again from `q`, `k` and the gate ([`ATTENTION_VAR`] forces either, for tests and
//! A/B runs). A per-head gate (Gated DeltaNet) takes `kda_layer_prepare_fused_scalar` in place
//! of `kda_layer_prepare_fused`: no gate tile, 73 KB, so the prepared pair runs on every sm_80+
//! GPU.
//!
//! The intermediates live in a [`LayerWorkspace`] the caller allocates once per plan. Like
//! [`Kda::launch`], [`Kda::launch_layer`] allocates nothing and never synchronises.

use super::args::{Address, ArgSink, push_named};
use super::device_plan::Table;
use super::float_input::FloatInput;
use super::{
    DecodeInputs, DevicePlan, FusedOutput, Kda, KdaInputs, KdaOptions, KdaOutputs, Kernel, Loaded, Module, enqueue,
};
use crate::columns::{ColumnMode, Columns};
use crate::layer::{GateInput, InputDtype, LayerKind, LayerOptions, LayerShape, chunk_table};
use crate::model::StateLayout;
use crate::{KdaError, Plan};
use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop};
use half::bf16;
use kda_kernel::layout::CHUNK;
use kda_kernel::layout::layer::{CHUNK_WORDS, MAX_K, MAX_V};
use std::sync::Arc;

/// `K` and `V` the layer kernels take are multiples of this (each of their eight warps owns whole
/// 8-column `mma` tiles of `[w | u]` and of `o`).
const LAYER_SIZE_STEP: usize = 64;

/// A layer batch planned for the GPU: the recurrence's [`DevicePlan`] and the chunk table of the
/// token-parallel kernels, uploaded once.
///
/// A Gated DeltaNet layer (Qwen3-Next's heads) over two prompts, from the model's device tensors:
///
/// ```no_run
/// use kda::layer::{GateInput, LayerKind, LayerOptions, LayerShape};
/// use kda::{Kda, LayerDeviceOutputs, LayerInputs, LayerPlan, Plan, bf16};
///
/// # fn main() -> Result<(), kda::KdaError> {
/// let (kda, stream) = Kda::open(0)?;
/// let batch = Plan::from_lengths(&[1000, 300]);
/// let shape = LayerShape { kind: LayerKind::Gdn, heads: 16, value_heads: 32, key_dim: 128, value_dim: 128 };
/// let options = LayerOptions { scale: 128f64.powf(-0.5), l2norm_qk: true, beta_sigmoid: false, gate: GateInput::Log };
/// let plan = LayerPlan::new(&stream, batch.clone(), shape, options)?;
/// let mut workspace = plan.workspace(&stream)?; // once per plan, reused by every launch
///
/// // The model's tensors (zeros here): q, k [T, 16, 128], v [T, 32, 128], g and beta [T, 32].
/// let t = batch.tokens();
/// let q = stream.alloc_zeros::<bf16>(t * 16 * 128)?;
/// let k = stream.alloc_zeros::<bf16>(t * 16 * 128)?;
/// let v = stream.alloc_zeros::<bf16>(t * 32 * 128)?;
/// let g = stream.alloc_zeros::<f32>(t * 32)?;
/// let beta = stream.alloc_zeros::<f32>(t * 32)?;
/// let mut o = stream.alloc_zeros::<bf16>(t * 32 * 128)?;
/// let mut ht = stream.alloc_zeros::<f32>(2 * 32 * 128 * 128)?;
///
/// let inputs = LayerInputs {
///     q: q.slice(..),
///     k: k.slice(..),
///     v: v.slice(..),
///     g: g.slice(..).into(), // an f32 or a bf16 view
///     beta: beta.slice(..).into(),
///     a_log: None,
///     dt_bias: None,
///     h0: None,
/// };
/// let mut outputs = LayerDeviceOutputs { o: o.slice_mut(..), ht: Some(ht.slice_mut(..)) };
/// // Two launches on `stream` on 9.x (three elsewhere), no host synchronisation, no allocation.
/// kda.launch_layer(&stream, &plan, &inputs, &mut outputs, &mut workspace)?;
/// stream.synchronize()?;
/// # Ok(())
/// # }
/// ```
pub struct LayerPlan {
    shape: LayerShape,
    options: LayerOptions,
    /// How `o` is formed: [`OutputPath::Fused`] or [`OutputPath::Separate`] (never `Auto`).
    output: OutputPath,
    /// On the separate path, where its output kernel takes `P` and `q Γ` from.
    attention: SeparateAttention,
    /// The recurrence's plan, whose device tables hold the chunk records too (`CHUNK_WORDS`
    /// words per chunk: first token, valid rows, in the recurrence's chunk order).
    recurrence: DevicePlan,
    /// The states' layout (`h0`, `ht`, and `h` in the workspace).
    layout: StateLayout,
    num_chunks: usize,
}

/// One launch of a layer forward, in the order a layer enqueues them: what
/// [`Kda::launch_layer_staged`] names after enqueueing each, so that a caller can time the
/// layer's kernels apart (CUDA events recorded between them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LayerStage {
    /// The token-parallel prepare kernel (on the fused path, with the output's token-parallel
    /// part).
    Prepare,
    /// The recurrence: its split's pre-scan and merge where the plan splits, then its main pass
    /// (on the fused path, forming `o`).
    Recurrence,
    /// The output kernel (the separate path only).
    Output,
}

impl LayerStage {
    /// The stage's name, for tables and records: `prepare`, `recurrence` or `output`.
    pub fn name(self) -> &'static str {
        match self {
            LayerStage::Prepare => "prepare",
            LayerStage::Recurrence => "recurrence",
            LayerStage::Output => "output",
        }
    }
}

/// `auto`, `fused` or `separate`: what [`OutputPath::Auto`] stands for (for tests and A/B runs
/// of one build).
pub const OUTPUT_VAR: &str = "KDA_LAYER_OUTPUT";

/// `auto`, `prepared` or `formed`: where the separate path's output kernel takes the causal
/// attention `P` and `q Γ` from (for tests and A/B runs of one build). Unset, empty or `auto`:
/// prepared where the device gives a CTA the fused prepare kernel's shared memory, else formed.
pub const ATTENTION_VAR: &str = "KDA_LAYER_ATTENTION";

/// Where the separate path's output kernel takes the chunk's causal attention `P` and `q Γ`
/// from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SeparateAttention {
    /// Formed by `kda_layer_prepare_fused` in the same pass as `L` and read by
    /// `kda_layer_output_prepared`: the chunk's gated product formed once per layer.
    Prepared,
    /// Formed again by `kda_layer_output` from `q`, `k` and the gate (GPUs without the fused
    /// prepare kernel's 110 KB per CTA).
    Formed,
}

impl SeparateAttention {
    /// What `ATTENTION_VAR`'s value `named` takes on a device that gives a CTA `optin` bytes of
    /// shared memory, for a layer whose gate is `per_head` or not; `prepared` where the fused
    /// prepare kernel for that gate does not fit is a typed error. The launcher's own rule
    /// ([`super::fits_device`]), so that a plan takes the pair exactly where a launcher on the
    /// device loads it.
    fn for_device(named: Option<&str>, optin: usize, per_head: bool) -> Result<Self, KdaError> {
        use kda_kernel::abi::LAYER_OUTPUT_PREPARED;
        let prepare = fused_prepare_abi(per_head);
        let fits = super::fits_device(prepare, optin) && super::fits_device(&LAYER_OUTPUT_PREPARED, optin);
        match named {
            None | Some("") | Some("auto") => Ok(if fits { Self::Prepared } else { Self::Formed }),
            Some("formed") => Ok(Self::Formed),
            Some("prepared") if fits => Ok(Self::Prepared),
            Some("prepared") => Err(KdaError::Unsupported {
                argument: ATTENTION_VAR,
                reason: format!(
                    "prepared attention needs {} bytes of shared memory per CTA; this device gives {optin}",
                    prepare.smem_bytes
                ),
            }),
            Some(other) => Err(KdaError::Argument {
                name: ATTENTION_VAR,
                reason: format!("`{other}`: expected auto, prepared or formed"),
            }),
        }
    }

    /// For `stream`'s device and a layer of `shape`, as `ATTENTION_VAR` says.
    fn of(stream: &Arc<CudaStream>, shape: &LayerShape) -> Result<Self, KdaError> {
        let optin = DeviceFit::of(stream.context())?.optin;
        Self::for_device(std::env::var(ATTENTION_VAR).ok().as_deref(), optin, shape.gate_width() == 1)
    }
}

/// The fused prepare kernel a layer runs: the variant without the gate tile where the gate is
/// `per_head` (or absent), which also fits the 99 KB a CTA gets on sm_86, sm_89 and sm_120.
fn fused_prepare_abi(per_head: bool) -> &'static kda_kernel::abi::KernelAbi {
    if per_head { &kda_kernel::abi::LAYER_PREPARE_FUSED_SCALAR } else { &kda_kernel::abi::LAYER_PREPARE_FUSED }
}

/// How a layer launch forms its output `o` (the module's docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OutputPath {
    /// The path `KDA_LAYER_OUTPUT` names ([`OUTPUT_VAR`]); unset, empty or `auto`:
    /// [`OutputPath::Fused`] where the device runs it and it pays (`K` of 64 or 128, `V` a
    /// multiple of 64; compute capability 9.x with the native module and the Hopper kernel not
    /// overridden by `KDA_MODULE` or `KDA_KERNEL`; or the portable kernel where the planner runs
    /// the fused pass in two-group CTAs: their shared memory on the device, the H100 class, and
    /// more one-group items than SMs in the batch), [`OutputPath::Separate`] elsewhere (the
    /// sm_86, sm_89 and sm_120 parts, batches short of chains on the portable kernel, the
    /// baseline kernel). Decided when the plan is made, for its batch.
    #[default]
    Auto,
    /// `o` formed in the recurrence's chunk loop (the Hopper kernel in wide column blocks, or the
    /// portable kernel): no `h` or `v_new` through memory.
    Fused,
    /// The recurrence writes every chunk's entry state `h` and `v_new` into the workspace, and an
    /// output kernel forms `o` from them: every GPU, and what [`Kda::launch_checkpoints`] needs.
    Separate,
}

impl OutputPath {
    /// Whether the fused path runs `shape`'s sizes (`K` of 64 or 128, `V` a multiple of 64), on
    /// a device that runs it (`Auto`'s rule).
    pub fn fused_runs(shape: &LayerShape) -> bool {
        kda_kernel::abi::hopper_fused_for(shape.key_dim, kda_kernel::layout::hopper::BV).is_some()
            && shape.value_dim.is_multiple_of(kda_kernel::layout::hopper::BV)
    }

    /// The path `KDA_LAYER_OUTPUT` names ([`OutputPath::Auto`] when unset, empty or `auto`).
    fn from_env() -> Result<Self, KdaError> {
        match std::env::var(OUTPUT_VAR).ok().as_deref() {
            None | Some("") | Some("auto") => Ok(OutputPath::Auto),
            Some("fused") => Ok(OutputPath::Fused),
            Some("separate") => Ok(OutputPath::Separate),
            Some(other) => Err(KdaError::Argument {
                name: OUTPUT_VAR,
                reason: format!("`{other}`: expected auto, fused or separate"),
            }),
        }
    }

    /// What `Auto` stands for, the one rule: the path `KDA_LAYER_OUTPUT` names; else
    /// [`OutputPath::Fused`] where the recurrence's kernel has the fused pass on this device
    /// (`kernel_fuses`: the Hopper kernel of the sm_90a module, or the portable kernel where the
    /// fused kernels' shared memory fits) and the pass has `shape`'s sizes,
    /// [`OutputPath::Separate`] elsewhere.
    fn auto_for(kernel_fuses: bool, shape: &LayerShape) -> Result<Self, KdaError> {
        Ok(match Self::from_env()? {
            OutputPath::Auto if kernel_fuses && Self::fused_runs(shape) => OutputPath::Fused,
            OutputPath::Auto => OutputPath::Separate,
            named => named,
        })
    }

    /// `self` on the device of `stream` for `shape` and `batch`: `Auto` resolved by
    /// [`OutputPath::auto_for`], the Hopper kernel taken to run where a launcher made from the
    /// environment's options (`KdaOptions::from_env`) would run it on that device, else the
    /// portable kernel's rule ([`portable_fuses`]).
    fn resolve(self, stream: &Arc<CudaStream>, shape: &LayerShape, batch: &Plan) -> Result<Self, KdaError> {
        match self {
            OutputPath::Auto => {
                let ctx = stream.context();
                let (major, _) = ctx.compute_capability()?;
                let options = KdaOptions::from_env()?;
                let hopper = major == 9
                    && options.module == Module::Native
                    && matches!(options.auto, Kernel::Auto | Kernel::Hopper);
                let portable = !hopper && matches!(options.auto, Kernel::Auto | Kernel::Portable);
                let portable = portable && portable_fuses(&DeviceFit::of(ctx)?, shape, batch);
                Self::auto_for(hopper || portable, shape)
            }
            path => Ok(path),
        }
    }
}

/// The layer's inputs on the device, borrowed from the caller (packed, token-major; the shapes of
/// [`crate::layer::LayerProblem`]).
pub struct LayerInputs<'a> {
    /// `[T, H, K]` bf16.
    pub q: CudaView<'a, bf16>,
    /// `[T, H, K]` bf16.
    pub k: CudaView<'a, bf16>,
    /// `[T, HV, V]` bf16.
    pub v: CudaView<'a, bf16>,
    /// `[T, HV, K]` (KDA) or `[T, HV]` (GDN), f32 or bf16: the gate, log-space or raw as the
    /// options say.
    pub g: FloatInput<'a>,
    /// `[T, HV]`, f32 or bf16: `beta`, or its logits.
    pub beta: FloatInput<'a>,
    /// `[HV]` f32, given exactly when the gate is raw.
    pub a_log: Option<CudaView<'a, f32>>,
    /// `[HV, K]` (KDA) or `[HV]` (GDN) f32, given exactly when the gate is raw.
    pub dt_bias: Option<CudaView<'a, f32>>,
    /// `[N, HV, K, V]` f32 initial states (`[N, HV, V, K]` in a value-first plan), or `None` for
    /// zeros.
    pub h0: Option<CudaView<'a, f32>>,
}

impl LayerInputs<'_> {
    /// The per-token inputs (all but `h0`), as the decode kernels read them.
    pub(super) fn tokens(&self) -> DecodeInputs<'_> {
        DecodeInputs {
            q: self.q.slice(..),
            k: self.k.slice(..),
            v: self.v.slice(..),
            g: self.g.view(),
            beta: self.beta.view(),
            a_log: self.a_log.as_ref().map(|x| x.slice(..)),
            dt_bias: self.dt_bias.as_ref().map(|x| x.slice(..)),
        }
    }
}

/// The layer's outputs on the device, borrowed mutably from the caller.
pub struct LayerDeviceOutputs<'a> {
    /// `[T, HV, V]` bf16.
    pub o: CudaViewMut<'a, bf16>,
    /// `[N, HV, K, V]` f32 final states (`[N, HV, V, K]` in a value-first plan), or `None` to skip
    /// them.
    pub ht: Option<CudaViewMut<'a, f32>>,
}

/// The intermediates of one layer launch: the recurrence's keys, `w`, `u` and gate (written by
/// the prepare kernel; on the fused path, of a per-key gate only each chunk's last row; Gated
/// DeltaNet's keys only when the layer normalises them, its recurrence reading the caller's `k`
/// otherwise); on the
/// separate path `h` and `v_new` (written by the recurrence: `h` holds every chunk's entry state,
/// for callers that want it), on the fused path `qg` and `attention` (written by the prepare
/// kernel). The other path's two are one element each.
pub struct LayerWorkspace {
    /// KDA: `[T, HV, K]`; GDN: `[T, H, K]`.
    pub k_rec: CudaSlice<bf16>,
    /// `[T, HV, K]`.
    pub w: CudaSlice<bf16>,
    /// `[T, HV, V]`.
    pub u: CudaSlice<bf16>,
    /// `[T, HV, K]` (KDA) or `[T, HV]` (GDN) f32, log2, cumulative inside each chunk.
    pub gate: CudaSlice<f32>,
    /// `[NT, HV, K, V]` bf16 (`[NT, HV, V, K]` in a value-first plan).
    pub h: CudaSlice<bf16>,
    /// `[T, HV, V]` bf16.
    pub v_new: CudaSlice<bf16>,
    /// `[T, HV, K]` bf16: `q Γ`.
    pub qg: CudaSlice<bf16>,
    /// `[T, HV, CHUNK]` bf16: each token's row of its chunk's causal attention.
    pub attention: CudaSlice<bf16>,
}

impl LayerPlan {
    /// Plans `plan` for a layer of `shape` with `options` on `stream`'s device and uploads its
    /// tables. Refuses, with a typed error, what the GPU layer does not run yet: `K` or `V` other
    /// than 64 or 128 (`layout::layer::MAX_K`, `MAX_V`).
    pub fn new(
        stream: &Arc<CudaStream>,
        plan: Plan,
        shape: LayerShape,
        options: LayerOptions,
    ) -> Result<Self, KdaError> {
        Self::with_path(stream, plan, shape, options, OutputPath::Auto)
    }

    /// [`LayerPlan::new`] with `o` formed as `path` says (`Auto` resolved for `stream`'s
    /// device; [`Kda::layer_output_path`] resolves it for a launcher).
    pub fn with_path(
        stream: &Arc<CudaStream>,
        plan: Plan,
        shape: LayerShape,
        options: LayerOptions,
        path: OutputPath,
    ) -> Result<Self, KdaError> {
        layer_supports(&shape)?;
        let table = chunk_table(&plan)?;
        let num_chunks = table.len() / CHUNK_WORDS;
        let output = path.resolve(stream, &shape, &plan)?;
        fused_sizes(output, &shape)?;
        let chunks = Table::new(table);
        let attention = SeparateAttention::of(stream, &shape)?;
        let recurrence = plan_recurrence(stream, plan, &shape, (StateLayout::KeyFirst, output), chunks)?;
        Ok(Self { shape, options, output, attention, recurrence, layout: StateLayout::KeyFirst, num_chunks })
    }

    /// This plan re-planned in place for the batch `batch` (new sequence lengths; the same shape,
    /// options, output path and state layout), its tables uploaded into its own device buffer
    /// when they fit ([`DevicePlan::replan`]): what a serving loop calls per step, with no
    /// allocation, no free and no wait on the device. A workspace serves any batch it holds: one
    /// from [`LayerPlan::workspace`] of the longest batch to come stays valid across re-plans (a
    /// launch refuses one too small, naming the buffer). A plan whose re-planning fails refuses
    /// to launch.
    ///
    /// ```no_run
    /// use kda::layer::{GateInput, LayerKind, LayerOptions, LayerShape};
    /// use kda::{Kda, LayerPlan, Plan};
    ///
    /// # fn main() -> Result<(), kda::KdaError> {
    /// let (kda, stream) = Kda::open(0)?;
    /// let shape = LayerShape { kind: LayerKind::Kda, heads: 32, value_heads: 32, key_dim: 128, value_dim: 128 };
    /// let options = LayerOptions { scale: 128f64.powf(-0.5), l2norm_qk: true, beta_sigmoid: true, gate: GateInput::Log };
    /// let mut plan = LayerPlan::new(&stream, Plan::from_lengths(&[128]), shape, options)?;
    /// let mut workspace = plan.workspace(&stream)?; // holds any batch of at most 128 tokens in 2 chunks
    /// // ... this prompt's layers: kda.launch_layer(&stream, &plan, ..., &mut workspace) ...
    /// plan.replan(&stream, Plan::from_lengths(&[100]))?; // the next prompt: the same workspace
    /// # Ok(())
    /// # }
    /// ```
    pub fn replan(&mut self, stream: &Arc<CudaStream>, batch: Plan) -> Result<(), KdaError> {
        let table = chunk_table(&batch)?;
        self.num_chunks = table.len() / CHUNK_WORDS;
        self.recurrence.replan_with(stream, batch, Some(Table::new(table)))
    }

    /// This plan with its states (`h0`, `ht`, and `h` in the workspace) in `layout`: key-first
    /// `[.., K, V]` (what [`LayerPlan::new`] plans) or value-first `[.., V, K]`. The recurrence is
    /// planned afresh (column blocks and split back to the planner's choice).
    pub fn with_state_layout(mut self, stream: &Arc<CudaStream>, layout: StateLayout) -> Result<Self, KdaError> {
        let batch = self.recurrence.plan().clone();
        self.recurrence = plan_recurrence(stream, batch, &self.shape, (layout, self.output), self.chunk_table()?)?;
        self.layout = layout;
        Ok(self)
    }

    /// This plan with its output formed as `path` says (`Auto` resolved for `stream`'s device;
    /// the workspace must then be allocated again: [`LayerPlan::workspace`]). The recurrence is
    /// planned afresh.
    pub fn with_output_path(mut self, stream: &Arc<CudaStream>, path: OutputPath) -> Result<Self, KdaError> {
        let output = path.resolve(stream, &self.shape, self.recurrence.plan())?;
        fused_sizes(output, &self.shape)?;
        let batch = self.recurrence.plan().clone();
        self.recurrence = plan_recurrence(stream, batch, &self.shape, (self.layout, output), self.chunk_table()?)?;
        self.output = output;
        Ok(self)
    }

    /// This plan with its recurrence in the column blocks `mode` names, for tests and A/B runs:
    /// on the fused path the Hopper kernel's 32-column blocks ([`Columns::Narrow`]) or the
    /// portable kernel's one-group CTAs. [`ColumnMode::Auto`] is the layer's own rule (wide
    /// blocks for the fused path unless `KDA_COLUMNS` names them). The split is planned afresh;
    /// [`LayerPlan::with_state_layout`] and [`LayerPlan::with_output_path`] plan the columns
    /// afresh too, so this comes after them.
    ///
    /// ```no_run
    /// use kda::columns::{ColumnMode, Columns};
    /// use kda::layer::{GateInput, LayerKind, LayerOptions, LayerShape};
    /// use kda::{Kda, LayerPlan, Plan};
    ///
    /// # fn main() -> Result<(), kda::KdaError> {
    /// let (_kda, stream) = Kda::open(0)?;
    /// // Qwen3-Next's layer on one prompt: 32 value heads, 64 wide chains.
    /// let shape = LayerShape { kind: LayerKind::Gdn, heads: 16, value_heads: 32, key_dim: 128, value_dim: 128 };
    /// let options = LayerOptions { scale: 128f64.powf(-0.5), l2norm_qk: true, beta_sigmoid: true, gate: GateInput::Log };
    /// let plan = LayerPlan::new(&stream, Plan::from_lengths(&[8192]), shape, options)?
    ///     .with_columns(&stream, ColumnMode::Force(Columns::Narrow))?; // 128 narrow chains
    /// # let _ = plan;
    /// # Ok(())
    /// # }
    /// ```
    pub fn with_columns(mut self, stream: &Arc<CudaStream>, mode: ColumnMode) -> Result<Self, KdaError> {
        let mode = match mode {
            ColumnMode::Auto => layer_columns(self.output)?,
            forced => forced,
        };
        self.recurrence.set_columns(stream, mode)?;
        Ok(self)
    }

    /// The chunk records among the recurrence plan's tables.
    fn chunk_records(&self) -> Result<&Table, KdaError> {
        self.recurrence.extra.as_ref().ok_or_else(|| KdaError::Argument {
            name: "plan",
            reason: "the layer plan's chunk records are missing from its tables".into(),
        })
    }

    /// A copy of the chunk records, for planning the recurrence again.
    fn chunk_table(&self) -> Result<Table, KdaError> {
        self.chunk_records().cloned()
    }

    /// How this plan forms `o`: [`OutputPath::Fused`] or [`OutputPath::Separate`].
    pub fn output_path(&self) -> OutputPath {
        self.output
    }

    /// Whether the prepare kernel forms the chunks' causal attention and `q Γ` (into the
    /// workspace's `qg` and `attention`): on the fused path, and on the separate path where the
    /// device runs the fused prepare kernel.
    fn prepares_attention(&self) -> bool {
        self.output == OutputPath::Fused || self.attention == SeparateAttention::Prepared
    }

    /// The states' layout.
    pub fn state_layout(&self) -> StateLayout {
        self.layout
    }

    /// The layer's shape.
    pub fn shape(&self) -> LayerShape {
        self.shape
    }

    /// The layer's options.
    pub fn options(&self) -> LayerOptions {
        self.options
    }

    /// The batch layout.
    pub fn batch(&self) -> &Plan {
        self.recurrence.plan()
    }

    /// The recurrence's plan (its column blocks and split can be set as for any recurrence).
    pub fn recurrence(&mut self) -> &mut DevicePlan {
        &mut self.recurrence
    }

    /// Allocates the intermediates of a launch of this plan on `stream`.
    pub fn workspace(&self, stream: &Arc<CudaStream>) -> Result<LayerWorkspace, KdaError> {
        let s = self.shape;
        let plan = self.recurrence.plan();
        let (t, nt) = (plan.tokens(), plan.chunks());
        let key_heads = s.recurrence_shape(self.layout).heads;
        let len = |a: usize, b: usize, c: usize| a.checked_mul(b).and_then(|x| x.checked_mul(c)).ok_or_else(overflow);
        // (One element at least: cudarc cannot allocate an empty buffer on every driver.)
        let bf = |n: usize| stream.alloc_zeros::<bf16>(n.max(1));
        let f = |n: usize| stream.alloc_zeros::<f32>(n.max(1));
        // Each path's own intermediates; the other's are one element.
        let (separate, attention) = (self.output == OutputPath::Separate, self.prepares_attention());
        let only = |wanted: bool, n: Result<usize, KdaError>| if wanted { n } else { Ok(1) };
        Ok(LayerWorkspace {
            k_rec: bf(len(t, key_heads, s.key_dim)?)?,
            w: bf(len(t, s.value_heads, s.key_dim)?)?,
            u: bf(len(t, s.value_heads, s.value_dim)?)?,
            gate: f(len(t, s.value_heads, s.gate_width())?)?,
            h: bf(only(separate, len(nt, s.value_heads, s.key_dim * s.value_dim))?)?,
            v_new: bf(only(separate, len(t, s.value_heads, s.value_dim))?)?,
            qg: bf(only(attention, len(t, s.value_heads, s.key_dim))?)?,
            attention: bf(only(attention, len(t, s.value_heads, CHUNK))?)?,
        })
    }
}

/// What the portable kernel's choice of the fused pass depends on about a device.
#[derive(Clone, Copy)]
pub(super) struct DeviceFit {
    /// SMs.
    sms: usize,
    /// Shared memory a CTA may opt in to.
    optin: usize,
}

impl DeviceFit {
    pub(super) fn of(ctx: &Arc<cudarc::driver::CudaContext>) -> Result<Self, KdaError> {
        use cudarc::driver::sys::CUdevice_attribute::*;
        Ok(Self {
            sms: ctx.attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as usize,
            optin: ctx.attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)? as usize,
        })
    }
}

/// Whether `Auto` takes the fused pass on the portable kernel for `shape` and `batch` on a
/// device of `fit`: where the fused prepare kernel fits and the planner would run the fused pass
/// in two-group CTAs (their entry within the CTA's shared memory, the H100 class, and more
/// one-group items than SMs: `PortableFit::groups`). Measured on an H100 (bench/RESULTS.md,
/// "The layer"): 1.15x to 1.30x faster than the separate path on such batches (KDA fixed_8192,
/// mixed_6, short prompts; GDN qwen3_next_mixed6), 1.07x slower on batches short of chains
/// (GDN qwen3_next_8192's 32 value heads, split few-head prompts), where the fused pass's 64
/// columns per chain halve the chains. The one-group fused entries (the A100 class, and
/// `OutputPath::Fused` forced) are correct on the simulator and not yet timed on a GPU.
fn portable_fuses(fit: &DeviceFit, shape: &LayerShape, batch: &Plan) -> bool {
    use crate::columns::{ColumnMode, PortableFit};
    let planner = PortableFit {
        key_dim: shape.key_dim,
        value_dim: shape.value_dim,
        narrow_items: PortableFit::narrow_items_of(batch, shape.value_heads, shape.value_dim),
        sms: fit.sms,
        smem_per_block: fit.optin,
        fused: true,
    };
    super::fits_device(&kda_kernel::abi::LAYER_PREPARE_FUSED, fit.optin) && planner.groups(ColumnMode::Auto) == 2
}

/// Whether `output` runs `shape`: the fused path its sizes only (a typed refusal otherwise).
fn fused_sizes(output: OutputPath, shape: &LayerShape) -> Result<(), KdaError> {
    if output == OutputPath::Fused && !OutputPath::fused_runs(shape) {
        return Err(KdaError::Unsupported {
            argument: "output_path",
            reason: format!(
                "the fused layer pass runs K = 64 or 128 and V a multiple of 64, not K = {}, V = {}",
                shape.key_dim, shape.value_dim
            ),
        });
    }
    Ok(())
}

/// The layer's recurrence plan for `batch`: the planner's column blocks and split, except that
/// the fused path runs wide blocks (on the portable kernel, two groups where the device has the
/// shared memory of the fused two-group entry, else one) unless `KDA_COLUMNS` names the blocks;
/// `chunks` (the chunk records) uploaded with its tables.
fn plan_recurrence(
    stream: &Arc<CudaStream>,
    batch: Plan,
    shape: &LayerShape,
    (layout, output): (StateLayout, OutputPath),
    chunks: Table,
) -> Result<DevicePlan, KdaError> {
    let fused = output == OutputPath::Fused;
    DevicePlan::model_with(
        stream,
        batch,
        &shape.recurrence_shape(layout),
        layer_columns(output)?,
        (Some(chunks), fused),
    )
}

/// The column blocks of a layer's recurrence on `output`: those `KDA_COLUMNS` names, else the
/// planner's, except that the fused path runs wide blocks.
fn layer_columns(output: OutputPath) -> Result<ColumnMode, KdaError> {
    Ok(match (output, ColumnMode::Auto.or_env()?) {
        // `KDA_COLUMNS=narrow` runs the fused pass in narrow blocks: the Hopper kernel's
        // 32-column entries, the portable kernel's one-group CTAs.
        (OutputPath::Fused, ColumnMode::Auto) => ColumnMode::Force(Columns::Wide),
        (_, mode) => mode,
    })
}

/// Whether the GPU layer runs `shape`: a valid layer shape with `K` and `V` of 64 or 128 (the
/// typed refusal names the size otherwise).
fn layer_supports(shape: &LayerShape) -> Result<(), KdaError> {
    shape.validate()?;
    for (argument, size, max) in [("key_dim", shape.key_dim, MAX_K), ("value_dim", shape.value_dim, MAX_V)] {
        if size > max || !size.is_multiple_of(LAYER_SIZE_STEP) {
            return Err(KdaError::Unsupported {
                argument,
                reason: format!("the GPU layer holds multiples of {LAYER_SIZE_STEP} up to {max}, got {size}"),
            });
        }
    }
    Ok(())
}

/// Each `(tensor, actual length, expected length)` (`None`: absent, or not wanted) must match:
/// the first that does not is a `KdaError::Shape` naming the tensor and both lengths.
pub(super) fn check_lengths(checks: &[LenCheck]) -> Result<(), KdaError> {
    let describe = |x: Option<usize>| x.map_or("absent".to_string(), |n| format!("{n} elements"));
    match checks.iter().find(|(_, actual, expected)| actual != expected) {
        Some(&(tensor, actual, expected)) => Err(KdaError::Shape {
            tensor,
            expected: describe(expected),
            expected_len: expected.unwrap_or(0),
            actual: describe(actual),
        }),
        None => Ok(()),
    }
}

/// Each `(name, device ordinal)` must be the launcher's device `expected`: the first that is not
/// is a `KdaError::WrongDevice` naming it.
pub(super) fn check_devices(expected: usize, named: &[(&'static str, usize)]) -> Result<(), KdaError> {
    match named.iter().find(|(_, actual)| *actual != expected) {
        Some(&(tensor, actual)) => Err(KdaError::WrongDevice { tensor, expected, actual }),
        None => Ok(()),
    }
}

/// The address of a device tensor, its stream record kept in `records` until the launch is
/// enqueued (cudarc's event tracking).
pub(super) fn keep<'a>(records: &mut Vec<SyncOnDrop<'a>>, (address, record): (u64, SyncOnDrop<'a>)) -> u64 {
    records.push(record);
    address
}

/// Bytes of one vector load of the layer kernels.
const LAYER_VECTOR_BYTES: usize = 16;

/// The caller's tensors the layer kernels read 16 bytes at a time start at a multiple of 16
/// bytes: `q`, `k`, `v` (their addresses, in that order); `g` with a column per key at a
/// multiple of 4 elements (a gate of one column per head is read one element at a time). Their
/// rows then are too: `K` and `V` are multiples of 64.
fn check_layer_alignment([q, k, v, g]: [Address; 4], gate_width: usize, gate: InputDtype) -> Result<(), KdaError> {
    // A per-key gate's rows are read 4 elements a load: 16 bytes in f32, 8 in bf16.
    let g_required = if gate_width > 1 { LAYER_VECTOR_BYTES * gate.bytes() / 4 } else { gate.bytes() };
    super::validate::check_alignments(&[
        ("q", q, LAYER_VECTOR_BYTES),
        ("k", k, LAYER_VECTOR_BYTES),
        ("v", v, LAYER_VECTOR_BYTES),
        ("g", g, g_required),
    ])
}

fn overflow() -> KdaError {
    KdaError::Argument { name: "cu_seqlens", reason: "the batch's tensors exceed the address space".into() }
}

/// `(name, actual length, expected length)` of a tensor, for the length checks.
pub(super) type LenCheck = (&'static str, Option<usize>, Option<usize>);

impl Kda {
    /// The layer forward over `plan`'s batch: `o` (and the final states when asked) from
    /// `inputs`, through `workspace` (from [`LayerPlan::workspace`]). Validates every length
    /// first, and that every tensor, the stream and the plan are on the launcher's device; a
    /// refused call launches nothing and writes nothing.
    pub fn launch_layer(
        &self,
        stream: &Arc<CudaStream>,
        plan: &LayerPlan,
        inputs: &LayerInputs<'_>,
        outputs: &mut LayerDeviceOutputs<'_>,
        workspace: &mut LayerWorkspace,
    ) -> Result<(), KdaError> {
        self.launch_layer_staged(stream, plan, inputs, outputs, workspace, &mut |_| Ok(()))
    }

    /// [`Kda::launch_layer`], calling `after(stage)` once each stage's launches are enqueued on
    /// `stream` ([`LayerStage`]: `Prepare`, `Recurrence`, then `Output` on the separate path),
    /// so that the caller can record an event there. Stages of a batch with no chunks enqueue
    /// nothing and are still named. An error of `after` ends the call with it (the stages
    /// already enqueued stay enqueued).
    ///
    /// Where a layer's time goes, by an event after each stage (`plan`, `inputs`, `outputs` and
    /// `workspace` as in [`LayerPlan`]'s example):
    ///
    /// ```no_run
    /// # use kda::{Kda, KdaError, LayerDeviceOutputs, LayerInputs, LayerPlan, LayerStage, LayerWorkspace};
    /// # fn time(kda: &Kda, stream: &std::sync::Arc<cudarc::driver::CudaStream>, plan: &LayerPlan,
    /// #     inputs: &LayerInputs<'_>, outputs: &mut LayerDeviceOutputs<'_>, workspace: &mut LayerWorkspace)
    /// #     -> Result<(), KdaError> {
    /// let start = stream.context().new_event(None)?;
    /// start.record(stream)?;
    /// let mut marks = Vec::new();
    /// kda.launch_layer_staged(stream, plan, inputs, outputs, workspace, &mut |stage: LayerStage| {
    ///     let mark = stream.context().new_event(None)?;
    ///     mark.record(stream)?;
    ///     marks.push((stage, mark));
    ///     Ok(())
    /// })?;
    /// let mut before = &start;
    /// for (stage, mark) in &marks {
    ///     println!("{}: {:.1} us", stage.name(), before.elapsed_ms(mark)? * 1e3);
    ///     before = mark;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn launch_layer_staged(
        &self,
        stream: &Arc<CudaStream>,
        plan: &LayerPlan,
        inputs: &LayerInputs<'_>,
        outputs: &mut LayerDeviceOutputs<'_>,
        workspace: &mut LayerWorkspace,
        after: &mut dyn FnMut(LayerStage) -> Result<(), KdaError>,
    ) -> Result<(), KdaError> {
        self.check_layer(stream, plan, inputs, outputs, workspace)?;
        let fused = plan.output == OutputPath::Fused;
        if fused {
            self.fused_layer_runs(&plan.recurrence)?;
        }
        let s = plan.shape;
        let p = plan.recurrence.plan();
        let (t, nt) = (p.tokens(), p.chunks());
        let (hv, kd, vd) = (s.value_heads, s.key_dim, s.value_dim);
        let key_heads = s.recurrence_shape(plan.layout).heads;
        // The caller's token inputs, read by both layer kernels: their addresses once.
        let tokens = inputs.tokens();
        let mut token_records = Vec::new();
        let [q, k, v, g, beta, a_log, dt_bias] = tokens.addresses(stream, &mut token_records);
        let dtypes = tokens.dtypes();
        check_layer_alignment([q, k, v, g], s.gate_width(), dtypes.g)?;
        let ctas = plan.num_chunks.checked_mul(hv).ok_or_else(overflow)?;
        let dims = LayerDims::of(&s)?;
        let codes = plan.options.codes();
        let (tables, _tables_record) = plan.recurrence.tables_on(stream)?;
        let chunks = plan.chunk_records()?.address(tables);
        if ctas > 0 {
            let mut records = Vec::new();
            let mut read = |x| keep(&mut records, x);
            let mut args = PrepareArgs {
                ptrs: [
                    k,
                    v,
                    g,
                    beta,
                    a_log,
                    dt_bias,
                    chunks,
                    read(workspace.k_rec.device_ptr_mut(stream)),
                    read(workspace.w.device_ptr_mut(stream)),
                    read(workspace.u.device_ptr_mut(stream)),
                    read(workspace.gate.device_ptr_mut(stream)),
                ],
                attention: None,
                dims,
                options: codes.options | dtypes.option_bits(),
                gate_mode: codes.gate_mode,
                lower_bound_bits: codes.lower_bound_bits,
            };
            let kernel = if plan.prepares_attention() {
                let outputs =
                    [read(workspace.qg.device_ptr_mut(stream)), read(workspace.attention.device_ptr_mut(stream))];
                args.attention = Some([q, outputs[0], outputs[1]]);
                self.fused_prepare_kernel(s.gate_width() == 1)?
            } else {
                self.layer_kernel(0)?
            };
            // SAFETY: every tensor was checked to hold the batch's rows above; the chunk table
            // was built from the same plan (each chunk's rows inside its sequence); `K`, `V` are
            // within the kernels' tiles (`LayerPlan::new`); the workspace buffers are `&mut`
            // borrows, so they alias no input (fused: `qg` and `attention` hold `[T, HV, K]` and
            // `[T, HV, CHUNK]`).
            unsafe { enqueue(stream, kernel, ctas, |sink| args.push(sink)) }?;
        }
        after(LayerStage::Prepare)?;
        let gate = || workspace.gate.slice(..t * hv * s.gate_width());
        // Gated DeltaNet's keys without the L2 norm inside are the caller's `k` itself: the
        // recurrence reads it, and the prepare kernel writes no copy.
        let keys_given = s.kind == LayerKind::Gdn && !plan.options.l2norm_qk;
        let rec_inputs = KdaInputs {
            k: if keys_given {
                inputs.k.slice(..t * key_heads * kd)
            } else {
                workspace.k_rec.slice(..t * key_heads * kd)
            },
            w: workspace.w.slice(..t * hv * kd),
            u: workspace.u.slice(..t * hv * vd),
            g: (s.kind == LayerKind::Gdn).then(gate),
            gk: (s.kind == LayerKind::Kda).then(gate),
            h0: inputs.h0.as_ref().map(|x| x.slice(..)),
        };
        if fused {
            let (qg, _qg_record) = workspace.qg.device_ptr(stream);
            let (attention, _attention_record) = workspace.attention.device_ptr(stream);
            let output = FusedOutput { qg, attention, scale_bits: codes.scale_bits };
            // The fused pass writes `o` where the recurrence writes `v_new` (same shape) and no
            // `h` (its view is not read).
            let mut rec_outputs = KdaOutputs {
                h: workspace.h.slice_mut(..),
                v_new: outputs.o.slice_mut(..),
                ht: outputs.ht.as_mut().map(|x| x.slice_mut(..)),
            };
            self.launch_with(stream, &plan.recurrence, &rec_inputs, &mut rec_outputs, Kernel::Auto, Some(output))?;
            return after(LayerStage::Recurrence);
        }
        {
            let mut rec_outputs = KdaOutputs {
                h: workspace.h.slice_mut(..nt * hv * kd * vd),
                v_new: workspace.v_new.slice_mut(..t * hv * vd),
                ht: outputs.ht.as_mut().map(|x| x.slice_mut(..)),
            };
            self.launch(stream, &plan.recurrence, &rec_inputs, &mut rec_outputs, Kernel::Auto)?;
        }
        after(LayerStage::Recurrence)?;
        if ctas > 0 {
            let mut records = Vec::new();
            let mut read = |x| keep(&mut records, x);
            let states = [
                read(workspace.h.device_ptr(stream)),
                read(workspace.v_new.device_ptr(stream)),
                read(outputs.o.device_ptr_mut(stream)),
                chunks,
            ];
            let (attention, kernel) = if plan.prepares_attention() {
                let prepared = [read(workspace.qg.device_ptr(stream)), read(workspace.attention.device_ptr(stream))];
                (OutputAttention::Prepared(prepared), self.prepared_output_kernel()?)
            } else {
                (OutputAttention::Formed([q, k, read(workspace.gate.device_ptr(stream))]), self.layer_kernel(1)?)
            };
            let args = OutputArgs {
                attention,
                states,
                dims,
                options: codes.options,
                scale_bits: codes.scale_bits,
                state_layout: plan.layout.code(),
            };
            // SAFETY: as for the prepare launch; `h` holds a state per (chunk, value head), in
            // the chunk table's order, written by the recurrence just before on this stream
            // (prepared: `qg` and `attention` by the fused prepare kernel before it).
            unsafe { enqueue(stream, kernel, ctas, |sink| args.push(sink)) }?;
        }
        after(LayerStage::Output)
    }
}

/// The head counts and sizes the layer kernels take, as `u32`.
#[derive(Clone, Copy)]
struct LayerDims {
    heads: u32,
    value_heads: u32,
    key_dim: u32,
    value_dim: u32,
    gate_width: u32,
}

impl LayerDims {
    fn of(s: &LayerShape) -> Result<Self, KdaError> {
        let word = |name: &'static str, x: usize| {
            u32::try_from(x).map_err(|_| KdaError::Argument { name, reason: format!("{x} exceeds 32 bits") })
        };
        Ok(Self {
            heads: word("heads", s.heads)?,
            value_heads: word("value_heads", s.value_heads)?,
            key_dim: word("key_dim", s.key_dim)?,
            value_dim: word("value_dim", s.value_dim)?,
            gate_width: word("key_dim", s.gate_width())?,
        })
    }

    fn push<'a>(&'a self, sink: &mut impl ArgSink<'a>) {
        sink.push("heads", &self.heads);
        sink.push("value_heads", &self.value_heads);
        sink.push("key_dim", &self.key_dim);
        sink.push("value_dim", &self.value_dim);
        sink.push("gate_width", &self.gate_width);
    }
}

/// The prepare kernel's arguments (`kda_kernel::abi::LAYER_PREPARE_PARAMS`; with `attention`,
/// the fused prepare kernel's, `LAYER_PREPARE_FUSED_PARAMS`).
pub(super) struct PrepareArgs {
    ptrs: [Address; 11],
    /// The fused prepare kernel's `q`, `qg` and `attention`.
    attention: Option<[Address; 3]>,
    dims: LayerDims,
    options: u32,
    gate_mode: u32,
    lower_bound_bits: u32,
}

impl PrepareArgs {
    const TENSORS: [&'static str; 11] =
        ["k", "v", "g", "beta", "a_log", "dt_bias", "chunks", "k_rec", "w", "u", "gate_out"];

    const ATTENTION: [&'static str; 3] = ["q", "qg", "attention"];

    pub(super) fn push<'a>(&'a self, sink: &mut impl ArgSink<'a>) {
        push_named(sink, &Self::TENSORS, &self.ptrs);
        if let Some(attention) = &self.attention {
            push_named(sink, &Self::ATTENTION, attention);
        }
        self.dims.push(sink);
        sink.push("options", &self.options);
        sink.push("gate_mode", &self.gate_mode);
        sink.push("lower_bound_bits", &self.lower_bound_bits);
    }
}

/// Where the output kernel takes the causal attention from: `q`, `k` and the prepare kernel's
/// gate (`kda_layer_output`), or the fused prepare kernel's `qg` and `attention`
/// (`kda_layer_output_prepared`).
pub(super) enum OutputAttention {
    Formed([Address; 3]),
    Prepared([Address; 2]),
}

/// The output kernel's arguments (`kda_kernel::abi::LAYER_OUTPUT_PARAMS`, or
/// `LAYER_OUTPUT_PREPARED_PARAMS`).
pub(super) struct OutputArgs {
    attention: OutputAttention,
    /// `h`, `v_new`, `o` and the chunk table.
    states: [Address; 4],
    dims: LayerDims,
    options: u32,
    scale_bits: u32,
    /// A `kda_kernel::abi::StateLayoutCode`.
    state_layout: u32,
}

impl OutputArgs {
    const FORMED: [&'static str; 3] = ["q", "k", "gate"];
    const PREPARED: [&'static str; 2] = ["qg", "attention"];
    const STATES: [&'static str; 4] = ["h", "v_new", "o", "chunks"];

    pub(super) fn push<'a>(&'a self, sink: &mut impl ArgSink<'a>) {
        match &self.attention {
            OutputAttention::Formed(ptrs) => push_named(sink, &Self::FORMED, ptrs),
            OutputAttention::Prepared(ptrs) => push_named(sink, &Self::PREPARED, ptrs),
        }
        push_named(sink, &Self::STATES, &self.states);
        self.dims.push(sink);
        sink.push("options", &self.options);
        sink.push("scale_bits", &self.scale_bits);
        sink.push("state_layout", &self.state_layout);
    }
}

impl Kda {
    /// Every length and device of a layer launch (the path's own intermediates: the other
    /// path's are not read): the first that does not match is a typed error naming it.
    fn check_layer(
        &self,
        stream: &Arc<CudaStream>,
        plan: &LayerPlan,
        inputs: &LayerInputs<'_>,
        outputs: &LayerDeviceOutputs<'_>,
        workspace: &LayerWorkspace,
    ) -> Result<(), KdaError> {
        let s = plan.shape;
        let p = plan.recurrence.plan();
        let (t, n, nt) = (p.tokens(), p.num_seqs(), p.chunks());
        let (h, hv, kd, vd) = (s.heads, s.value_heads, s.key_dim, s.value_dim);
        let raw = !matches!(plan.options.gate, GateInput::Log);
        let key_heads = s.recurrence_shape(plan.layout).heads;
        let opt = |present: bool, len: usize| present.then_some(len);
        let fused = plan.output == OutputPath::Fused;
        // The path's own intermediates (the other path's are not read). A workspace may be
        // larger than this batch needs (one sized for a longer batch, kept across `replan`): each
        // buffer must hold at least the batch's length.
        let at_least = |actual: usize, len: usize| (Some(actual.min(len.max(1))), Some(len.max(1)));
        let path_len =
            |wanted: bool, actual: usize, len: usize| if wanted { at_least(actual, len) } else { (None, None) };
        let (k_rec_actual, k_rec_len) = at_least(workspace.k_rec.len(), t * key_heads * kd);
        let (w_actual, w_len) = at_least(workspace.w.len(), t * hv * kd);
        let (u_actual, u_len) = at_least(workspace.u.len(), t * hv * vd);
        let (gate_actual, gate_len) = at_least(workspace.gate.len(), t * hv * s.gate_width());
        let (h_actual, h_len) = path_len(!fused, workspace.h.len(), nt * hv * kd * vd);
        let (vn_actual, vn_len) = path_len(!fused, workspace.v_new.len(), t * hv * vd);
        let attention = plan.prepares_attention();
        let (qg_actual, qg_len) = path_len(attention, workspace.qg.len(), t * hv * kd);
        let (p_actual, p_len) = path_len(attention, workspace.attention.len(), t * hv * CHUNK);
        let checks: [LenCheck; 18] = [
            ("q", Some(inputs.q.len()), Some(t * h * kd)),
            ("k", Some(inputs.k.len()), Some(t * h * kd)),
            ("v", Some(inputs.v.len()), Some(t * hv * vd)),
            ("g", Some(inputs.g.len()), Some(t * hv * s.gate_width())),
            ("beta", Some(inputs.beta.len()), Some(t * hv)),
            ("A_log", inputs.a_log.as_ref().map(|x| x.len()), opt(raw, hv)),
            ("dt_bias", inputs.dt_bias.as_ref().map(|x| x.len()), opt(raw, hv * s.gate_width())),
            ("h0", inputs.h0.as_ref().map(|x| x.len()), inputs.h0.as_ref().map(|_| n * hv * kd * vd)),
            ("o", Some(outputs.o.len()), Some(t * hv * vd)),
            ("ht", outputs.ht.as_ref().map(|x| x.len()), outputs.ht.as_ref().map(|_| n * hv * kd * vd)),
            ("workspace.k_rec", k_rec_actual, k_rec_len),
            ("workspace.w", w_actual, w_len),
            ("workspace.u", u_actual, u_len),
            ("workspace.v_new", vn_actual, vn_len),
            ("workspace.gate", gate_actual, gate_len),
            ("workspace.h", h_actual, h_len),
            ("workspace.qg", qg_actual, qg_len),
            ("workspace.attention", p_actual, p_len),
        ];
        check_lengths(&checks)?;
        let ordinal = |x: &Arc<CudaStream>| x.context().ordinal();
        let optional = |x: Option<usize>| x.unwrap_or(self.ctx.ordinal());
        check_devices(
            self.ctx.ordinal(),
            &[
                ("stream", ordinal(stream)),
                ("plan", plan.recurrence.ordinal),
                ("q", ordinal(inputs.q.stream())),
                ("k", ordinal(inputs.k.stream())),
                ("v", ordinal(inputs.v.stream())),
                ("g", ordinal(inputs.g.stream())),
                ("beta", ordinal(inputs.beta.stream())),
                ("A_log", optional(inputs.a_log.as_ref().map(|x| ordinal(x.stream())))),
                ("dt_bias", optional(inputs.dt_bias.as_ref().map(|x| ordinal(x.stream())))),
                ("h0", optional(inputs.h0.as_ref().map(|x| ordinal(x.stream())))),
                ("o", ordinal(outputs.o.stream())),
                ("ht", optional(outputs.ht.as_ref().map(|x| ordinal(x.stream())))),
                ("workspace", ordinal(workspace.w.stream())),
            ],
        )?;
        Ok(())
    }

    /// What [`OutputPath::Auto`] stands for with this launcher for `shape` and `batch`: the path
    /// `KDA_LAYER_OUTPUT` names; else [`OutputPath::Fused`] where this launcher runs the fused
    /// pass for `shape` (its sm_90a module loaded and the Hopper kernel what `Kernel::Auto` runs;
    /// or the portable kernel where the batch has the chains for its two-group fused CTAs and
    /// the device their shared memory), [`OutputPath::Separate`] elsewhere. A plan made with it
    /// ([`LayerPlan::with_path`]) runs on this launcher.
    pub fn layer_output_path(&self, shape: &LayerShape, batch: &Plan) -> Result<OutputPath, KdaError> {
        let fuses = match self.resolve(Kernel::Auto) {
            Kernel::Hopper => self.hopper_fused.is_some(),
            Kernel::Portable => {
                self.prepare_fused.is_some() && portable_fuses(&DeviceFit::of(self.context())?, shape, batch)
            }
            _ => false,
        };
        OutputPath::auto_for(fuses, shape)
    }

    /// Whether this launcher runs the fused layer pass over `recurrence` (checked before any
    /// launch of a fused layer): the fused prepare kernel loaded, and the kernel that takes the
    /// batch (`Kernel::Auto`'s) with a fused entry for its blocks: the Hopper kernel in wide
    /// blocks at a key size the pass has, or the portable kernel where the device gave a CTA the
    /// entry's shared memory.
    fn fused_layer_runs(&self, recurrence: &DevicePlan) -> Result<(), KdaError> {
        let dims = recurrence.dims();
        let choice = self.choose(Kernel::Auto, recurrence, &dims)?;
        let loaded = match choice {
            Kernel::Hopper => self.hopper_fused.is_some(),
            Kernel::Portable => true,
            Kernel::Baseline | Kernel::Auto => false,
        };
        if !loaded || self.prepare_fused.is_none() {
            return Err(KdaError::Unsupported {
                argument: "output_path",
                reason: format!(
                    "the plan forms o in the fused pass, which this launcher does not run: it takes the batch on the \
                     {choice:?} kernel on compute capability {:?}, and the fused kernels' shared memory {}: plan the \
                     layer with OutputPath::Separate",
                    self.compute_capability,
                    if self.prepare_fused.is_some() { "fits" } else { "does not fit" }
                ),
            });
        }
        self.fused_runs(choice, recurrence, &dims)
    }
}

impl Kda {
    /// The layer kernel `i` (0 prepare, 1 output).
    fn layer_kernel(&self, i: usize) -> Result<&Loaded, KdaError> {
        Ok(&self.layer[i])
    }

    /// The output kernel on prepared attention (loaded where the device gives a CTA the fused
    /// prepare kernel's shared memory, which the plan checked).
    fn prepared_output_kernel(&self) -> Result<&Loaded, KdaError> {
        self.output_prepared.as_ref().ok_or_else(|| KdaError::Unsupported {
            argument: "plan",
            reason: "the plan takes the attention from the fused prepare kernel, which this launcher's device does \
                     not run: plan the layer on this launcher's device"
                .into(),
        })
    }

    /// The fused layer's prepare kernel (loaded where the device gives a CTA its shared memory;
    /// `fused_layer_runs` checked that it is): its variant without the gate tile where the gate
    /// is `per_head` (or absent).
    fn fused_prepare_kernel(&self, per_head: bool) -> Result<&Loaded, KdaError> {
        let kernel = if per_head { &self.prepare_fused_scalar } else { &self.prepare_fused };
        kernel.as_ref().ok_or_else(|| KdaError::Unsupported {
            argument: "output_path",
            reason: "the fused layer pass needs a GPU that gives a CTA the fused prepare kernel's shared memory".into(),
        })
    }
}

/// One argument list of each layer kernel, for the launcher's ABI test (`args::tests`).
#[cfg(test)]
pub(super) fn sample_args() -> (PrepareArgs, [OutputArgs; 2], PrepareArgs) {
    let dims = LayerDims { heads: 1, value_heads: 2, key_dim: 3, value_dim: 4, gate_width: 5 };
    let prepare =
        |attention| PrepareArgs { ptrs: [1; 11], attention, dims, options: 1, gate_mode: 2, lower_bound_bits: 3 };
    let output = |attention| OutputArgs { attention, states: [1; 4], dims, options: 1, scale_bits: 2, state_layout: 1 };
    (
        prepare(None),
        [output(OutputAttention::Formed([1; 3])), output(OutputAttention::Prepared([2; 2]))],
        prepare(Some([2; 3])),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bf16_gate_per_key_needs_8_bytes_and_per_head_2() {
        let (at16, per_key, per_head) = (0x1000, 128, 1);
        let check = |g, width, dtype| check_layer_alignment([at16, at16, at16, g], width, dtype);
        // A per-key gate is read 4 elements a load: 16 bytes in f32, 8 in bf16.
        check(0x1010, per_key, InputDtype::F32).unwrap();
        check(0x1008, per_key, InputDtype::Bf16).unwrap();
        let refused = |g, width, dtype| match check(g, width, dtype) {
            Err(KdaError::Alignment { tensor: "g", required, .. }) => required,
            other => panic!("{other:?}"),
        };
        assert_eq!(refused(0x1008, per_key, InputDtype::F32), 16);
        assert_eq!(refused(0x1004, per_key, InputDtype::Bf16), 8);
        // A per-head gate one element at a time.
        check(0x1004, per_head, InputDtype::F32).unwrap();
        check(0x1002, per_head, InputDtype::Bf16).unwrap();
        assert_eq!(refused(0x1002, per_head, InputDtype::F32), 4);
        // `q`, `k` and `v` 16 bytes whatever the gate's dtype.
        let err = check_layer_alignment([0x1008, at16, at16, at16], per_key, InputDtype::Bf16).unwrap_err();
        assert!(matches!(err, KdaError::Alignment { tensor: "q", required: 16, .. }), "{err}");
    }

    #[test]
    fn auto_takes_the_portable_fused_pass_where_it_runs_two_groups() {
        let h100 = DeviceFit { sms: 132, optin: 227 * 1024 };
        let a100 = DeviceFit { sms: 108, optin: 163 * 1024 };
        let sm86 = DeviceFit { sms: 84, optin: 99 * 1024 };
        let kda = LayerShape { kind: LayerKind::Kda, heads: 64, value_heads: 64, key_dim: 128, value_dim: 128 };
        let gdn = LayerShape { kind: LayerKind::Gdn, heads: 16, value_heads: 32, key_dim: 128, value_dim: 128 };
        let one = Plan::from_lengths(&[8192]);
        let six = Plan::from_lengths(&[8192; 6]);
        // kda_fixed_8192: 256 one-group items on 132 SMs, the two-group entry within 227 KB.
        assert!(portable_fuses(&h100, &kda, &one));
        // gdn_qwen3_next_8192: 128 items, fewer than the SMs; its mixed batch has 768.
        assert!(!portable_fuses(&h100, &gdn, &one));
        assert!(portable_fuses(&h100, &gdn, &six));
        // The A100's 163 KB hold no two-group fused CTA at K = 128; 99 KB parts no fused kernel.
        assert!(!portable_fuses(&a100, &kda, &one));
        assert!(!portable_fuses(&sm86, &kda, &six));
    }

    #[test]
    fn the_separate_path_takes_prepared_attention_where_its_fused_prepare_kernel_fits() {
        use SeparateAttention::{Formed, Prepared};
        let (h100, a100, sm86) = (227 * 1024, 163 * 1024, 99 * 1024);
        for auto in [None, Some(""), Some("auto")] {
            for per_head in [false, true] {
                assert_eq!(SeparateAttention::for_device(auto, h100, per_head).unwrap(), Prepared);
                assert_eq!(SeparateAttention::for_device(auto, a100, per_head).unwrap(), Prepared);
            }
            // The 99 KB parts hold the scalar-gate variant only.
            assert_eq!(SeparateAttention::for_device(auto, sm86, false).unwrap(), Formed);
            assert_eq!(SeparateAttention::for_device(auto, sm86, true).unwrap(), Prepared);
        }
        assert_eq!(SeparateAttention::for_device(Some("formed"), h100, true).unwrap(), Formed);
        assert_eq!(SeparateAttention::for_device(Some("prepared"), a100, false).unwrap(), Prepared);
        let refused = SeparateAttention::for_device(Some("prepared"), sm86, false).unwrap_err();
        assert!(matches!(refused, KdaError::Unsupported { argument: ATTENTION_VAR, .. }), "{refused}");
        let unknown = SeparateAttention::for_device(Some("both"), h100, false).unwrap_err();
        assert!(unknown.to_string().contains("expected auto, prepared or formed"), "{unknown}");
    }

    #[test]
    fn the_chunk_table_lists_every_chunk_in_the_recurrences_order() {
        let plan = Plan::from_lengths(&[130, 0, 64, 1]);
        let table = chunk_table(&plan).unwrap();
        // 130 tokens: chunks of 64, 64 and 2 rows; the empty sequence none; then 64 and 1.
        assert_eq!(table, [0, 64, 64, 64, 128, 2, 130, 64, 194, 1]);
        assert_eq!(table.len() / CHUNK_WORDS, plan.chunks());
        for (c, seq) in plan.seqs().iter().flat_map(|s| (0..s.chunks()).map(move |c| (s.chunk_start + c, s))) {
            assert!(table[c * CHUNK_WORDS] as usize >= seq.token_start, "chunk {c} inside its sequence");
        }
        assert!(chunk_table(&Plan::from_lengths(&[0, 0])).unwrap().is_empty());
    }

    #[test]
    fn a_length_mismatch_names_its_tensor_and_both_lengths() {
        assert!(check_lengths(&[("q", Some(8), Some(8)), ("h0", None, None)]).is_ok());
        let cases: [(LenCheck, &str); 3] = [
            (("v", Some(7), Some(8)), "v: expected 8 elements, got 7 elements"),
            (("A_log", None, Some(4)), "A_log: expected 4 elements, got absent"),
            (("dt_bias", Some(4), None), "dt_bias: expected absent, got 4 elements"),
        ];
        for (check, what) in cases {
            match check_lengths(&[("q", Some(8), Some(8)), check]) {
                Err(KdaError::Shape { tensor, expected, actual, .. }) => {
                    assert_eq!(format!("{tensor}: expected {expected}, got {actual}"), what)
                }
                other => panic!("{what}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_tensor_on_another_device_is_named() {
        assert!(check_devices(1, &[("stream", 1), ("q", 1)]).is_ok());
        match check_devices(1, &[("stream", 1), ("q", 1), ("beta", 0), ("o", 2)]) {
            Err(KdaError::WrongDevice { tensor, expected, actual }) => {
                assert_eq!((tensor, expected, actual), ("beta", 1, 0))
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_fused_path_takes_only_its_sizes() {
        let shape =
            |key_dim, value_dim| LayerShape { kind: LayerKind::Kda, heads: 2, value_heads: 2, key_dim, value_dim };
        for (k, v) in [(64, 64), (64, 128), (128, 64), (128, 128)] {
            assert!(OutputPath::fused_runs(&shape(k, v)), "K = {k}, V = {v}");
            assert!(fused_sizes(OutputPath::Fused, &shape(k, v)).is_ok());
        }
        for (k, v) in [(256, 128), (96, 128), (128, 96), (128, 32)] {
            assert!(!OutputPath::fused_runs(&shape(k, v)), "K = {k}, V = {v}");
            let refused = fused_sizes(OutputPath::Fused, &shape(k, v));
            assert!(matches!(refused, Err(KdaError::Unsupported { argument: "output_path", .. })), "{refused:?}");
            // The separate path takes what the layer kernels hold (`layer_supports` decides).
            assert!(fused_sizes(OutputPath::Separate, &shape(k, v)).is_ok());
        }
    }

    #[test]
    fn the_gpu_layer_refuses_the_sizes_it_does_not_hold() {
        let shape =
            |key_dim, value_dim| LayerShape { kind: LayerKind::Gdn, heads: 2, value_heads: 4, key_dim, value_dim };
        for (k, v) in [(64, 64), (64, 128), (128, 64), (128, 128)] {
            assert!(layer_supports(&shape(k, v)).is_ok(), "K = {k}, V = {v}");
        }
        for (k, v, bad) in
            [(256, 128, "key_dim"), (128, 256, "value_dim"), (96, 128, "key_dim"), (128, 32, "value_dim")]
        {
            match layer_supports(&shape(k, v)) {
                Err(KdaError::Unsupported { argument, .. }) => assert_eq!(argument, bad, "K = {k}, V = {v}"),
                other => panic!("K = {k}, V = {v}: {other:?}"),
            }
        }
        let grouped_badly = LayerShape { value_heads: 3, ..shape(128, 128) };
        assert!(matches!(layer_supports(&grouped_badly), Err(KdaError::Argument { name: "value_heads", .. })));
    }
}

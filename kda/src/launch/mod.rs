//! The GPU launcher: loads the embedded PTX through the CUDA driver (cudarc, loaded at run time)
//! and launches the recurrence on the caller's stream after validating every argument.
//!
//! Layers: [`Kda`] owns the loaded module; [`DevicePlan`] is a [`Plan`] and its work [`Schedule`]
//! for a head count, uploaded once; [`KdaInputs`] and [`KdaOutputs`] borrow the caller's device
//! tensors. [`Kda::launch`] allocates nothing and never synchronises, so it can be captured in a
//! CUDA graph.

mod args;
mod checkpoint;
mod decode;
mod device_plan;
mod float_input;
mod layer;
mod options;
mod pooled;
mod tensor_map;
mod validate;

pub use checkpoint::CheckpointPlan;
pub use decode::{DecodeInputs, DecodePlan};
pub use device_plan::{DevicePlan, KdaInputs, KdaOutputs};
pub use float_input::{FloatBuffer, FloatInput};
pub use layer::{LayerDeviceOutputs, LayerInputs, LayerPlan, LayerStage, LayerWorkspace, OUTPUT_VAR, OutputPath};
pub use options::{CODE_VAR, Code, KERNEL_VAR, KdaOptions, MODULE_VAR, Module, ModuleCode};
pub use pooled::{LayerPool, PooledStates};
pub use validate::TENSOR_ALIGN;

use crate::model::StateLayout;
use crate::{Dims, KdaError, Tensor};
use args::{BaselineArgs, Checked, HopperArgs, MapsArg, MergeArgs, Pointers, PortableArgs};
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, LaunchConfig};
use kda_kernel::abi::{
    BASELINE, DECODE, HOPPER_ENTRIES, HOPPER_FUSED_ENTRIES, KernelAbi, LAYER_OUTPUT, LAYER_OUTPUT_PREPARED,
    LAYER_PREPARE, LAYER_PREPARE_FUSED, LAYER_PREPARE_FUSED_SCALAR, MERGE, POOL_COPY, PORTABLE_ENTRIES,
    PORTABLE_FUSED_ENTRIES, PassCode, TensorMaps, hopper_for, hopper_fused_for, portable_for, portable_fused_for,
};
use kda_kernel::layout::K_DIM;
use kda_kernel::layout::baseline::COL_BLOCKS as BASELINE_COL_BLOCKS;
use kda_kernel::layout::hopper::BV;
use kda_kernel::layout::portable::BV as PORTABLE_BV;
use std::sync::Arc;
use validate::{Launch, TensorArg, baseline_supports, check_launch, hopper_supports, portable_supports};

/// `CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT` value for "all of the unified L1 /
/// shared memory that can be shared memory".
const MAX_SHARED_CARVEOUT_PERCENT: i32 = 100;
/// Dynamic shared memory a kernel may use without opting in to more.
const DEFAULT_DYNAMIC_SMEM_BYTES: usize = 48 * 1024;

/// Which kernel a launch runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Kernel {
    /// The best kernel for the device.
    #[default]
    Auto,
    /// The scalar baseline kernel (sm_80+), KDA's slice only: the correctness reference the
    /// tensor-core kernels are measured against, run only when named.
    Baseline,
    /// The portable tensor-core kernel (sm_80+, `mma.sync`): the whole generalized contract
    /// (both gates or either or neither, grouped value heads, `K` in 64, 128, 256 and `V` any
    /// multiple of 32, either state layout, strided rows), one CTA per (sequence, value head,
    /// block of 32 value columns), both products of a chunk on the tensor cores.
    /// [`Kernel::Auto`] runs it on every GPU other than 9.x (3.5x to 14.7x the baseline's speed
    /// on the H100, 2026-12-06, `bench/RESULTS.md`, "Current results"), and on 9.x for what the
    /// Hopper kernel's limits leave.
    Portable,
    /// The warp-specialized TMA + wgmma kernel (compute capability 9.x only).
    Hopper,
}

/// A kernel function loaded from the embedded PTX, with its ABI.
struct Loaded {
    function: CudaFunction,
    abi: &'static KernelAbi,
}

/// Whether the device gives a CTA of `abi` its shared memory: its dynamic shared memory within
/// the device's opt-in limit per block (`smem_optin`, which already excludes what the driver
/// reserves per CTA).
fn fits_device(abi: &KernelAbi, smem_optin: usize) -> bool {
    abi.smem_bytes <= smem_optin
}

/// Whether a kernel whose compiled form runs at most `max_threads` threads per CTA (the driver's
/// `CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK`: the entry's `.maxntid`, or fewer where its
/// registers per thread leave less room) runs a CTA of `threads`.
fn runs_block(max_threads: i32, threads: usize) -> bool {
    usize::try_from(max_threads).is_ok_and(|most| threads <= most)
}

impl Loaded {
    /// Loads `abi`'s entry from `module`, checks that the compiled kernel runs a CTA of the
    /// entry's threads ([`KdaError::KernelResources`] where its registers do not allow it: the
    /// driver compiles the PTX for the device, and a launch would fail only later), and opts in to
    /// its shared memory.
    fn load(module: &Arc<cudarc::driver::CudaModule>, abi: &'static KernelAbi) -> Result<Self, KdaError> {
        use cudarc::driver::sys::CUfunction_attribute::*;
        let function = module.load_function(abi.entry)?;
        let max_threads = function.get_attribute(CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?;
        if !runs_block(max_threads, abi.threads) {
            return Err(KdaError::KernelResources {
                entry: abi.entry,
                threads: abi.threads,
                max_threads: max_threads.max(0) as usize,
                registers: function.num_regs()?.max(0) as usize,
            });
        }
        if abi.smem_bytes > DEFAULT_DYNAMIC_SMEM_BYTES {
            function.set_attribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, abi.smem_bytes as i32)?;
            // Prefer the largest shared-memory carveout: the kernel needs nearly all of it.
            function.set_attribute(CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, MAX_SHARED_CARVEOUT_PERCENT)?;
        }
        Ok(Self { function, abi })
    }
}

/// A loaded kernel module on one device.
///
/// `Kda` is `Send` and `Sync`: one launcher serves every thread, each launching on its own stream
/// (the driver's launches are thread-safe, and `launch` takes `&self`). A [`DevicePlan`] is too,
/// and is only read on the device after it is built, so launches on several streams may share it;
/// cudarc orders each use of its buffers after the upload on the plan's stream. The same holds for
/// a [`LayerPlan`]. A [`LayerWorkspace`] is written by every layer launch, so `launch_layer` takes
/// it as `&mut`: one workspace per stream that runs at the same time. The outputs of a launch are
/// `&mut` borrows, so no two launches can write the same buffer at once through the safe API.
pub struct Kda {
    ctx: Arc<CudaContext>,
    baseline: Loaded,
    /// The portable tensor-core kernel's entries (`abi::PORTABLE_ENTRIES`, in that order), each
    /// where the device gives a CTA its shared memory ([`fits_device`]): the two-group entries
    /// need 163 KB, which the sm_86, sm_89 and sm_120 parts (99 KB) do not have, and the planner
    /// never gives them those entries' blocks (`columns::PortableFit`).
    portable: Vec<Option<Loaded>>,
    /// The merge of split sequences.
    merge: Loaded,
    /// The layer's token-parallel kernels: prepare, output.
    layer: [Loaded; 2],
    /// The decode step.
    decode: Loaded,
    /// Checkpoints for prefix caching.
    advance: Loaded,
    /// Whole states between a pool and a packed buffer.
    pool_copy: Loaded,
    /// The warp-specialized kernel's entries, one per key size and block width (`abi::HOPPER_ENTRIES`,
    /// in that order), present on compute capability 9.x.
    hopper: Option<Vec<Loaded>>,
    /// The fused layer pass's Hopper entries (`abi::HOPPER_FUSED_ENTRIES`, in that order), with
    /// `hopper`.
    hopper_fused: Option<Vec<Loaded>>,
    /// The fused layer pass's portable entries (`abi::PORTABLE_FUSED_ENTRIES`, in that order),
    /// each where the device gives a CTA its shared memory ([`fits_device`]).
    portable_fused: Vec<Option<Loaded>>,
    /// The fused layer's prepare kernel (`abi::LAYER_PREPARE_FUSED`), where the device gives a
    /// CTA its shared memory (110 KB: not the sm_86, sm_89 and sm_120 parts).
    prepare_fused: Option<Loaded>,
    /// Its variant for a per-head gate or none (`abi::LAYER_PREPARE_FUSED_SCALAR`: no gate tile,
    /// three CTAs per SM on 9.x), where the device gives a CTA its shared memory (every GPU that
    /// has `prepare_fused`, and the 99 KB parts).
    prepare_fused_scalar: Option<Loaded>,
    /// The separate path's output kernel on the fused prepare kernel's attention
    /// (`abi::LAYER_OUTPUT_PREPARED`), loaded with `prepare_fused_scalar` (wherever a fused
    /// prepare kernel fits).
    output_prepared: Option<Loaded>,
    compute_capability: (i32, i32),
    module_code: ModuleCode,
    /// What [`Kernel::Auto`] stands for ([`KdaOptions::auto`]).
    auto: Kernel,
}

impl Kda {
    /// Loads the kernels on `ctx`'s device as the environment says ([`KdaOptions::from_env`]; by
    /// default the sm_90a module on compute capability 9.x, the portable sm_80 module on other
    /// devices of 8.0 or newer, from PTX).
    pub fn new(ctx: Arc<CudaContext>) -> Result<Self, KdaError> {
        Self::with_options(ctx, KdaOptions::from_env()?)
    }

    /// Loads the kernels on `ctx`'s device as `options` say.
    pub fn with_options(ctx: Arc<CudaContext>, options: KdaOptions) -> Result<Self, KdaError> {
        let compute_capability = ctx.compute_capability()?;
        let target = options::target(compute_capability, options.module)?;
        let (module, module_code) = options::load_module(&ctx, target, compute_capability, options.code)?;
        let baseline = Loaded::load(&module, &BASELINE)?;
        let smem_optin = ctx
            .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?
            as usize;
        let load_fitting = |entries: &[&'static KernelAbi]| {
            entries
                .iter()
                .map(|&abi| fits_device(abi, smem_optin).then(|| Loaded::load(&module, abi)).transpose())
                .collect::<Result<Vec<_>, _>>()
        };
        let portable = load_fitting(&PORTABLE_ENTRIES)?;
        let portable_fused = load_fitting(&PORTABLE_FUSED_ENTRIES)?;
        let prepare_fused = load_fitting(&[&LAYER_PREPARE_FUSED])?.pop().flatten();
        // The scalar-gate variant takes less shared memory: it fits wherever the generic one
        // does, and on the 99 KB parts too.
        let prepare_fused_scalar = load_fitting(&[&LAYER_PREPARE_FUSED_SCALAR])?.pop().flatten();
        let output_prepared = match prepare_fused_scalar {
            Some(_) => load_fitting(&[&LAYER_OUTPUT_PREPARED])?.pop().flatten(),
            None => None,
        };
        let merge = Loaded::load(&module, &MERGE)?;
        let layer = [Loaded::load(&module, &LAYER_PREPARE)?, Loaded::load(&module, &LAYER_OUTPUT)?];
        let decode = Loaded::load(&module, &DECODE)?;
        let advance = Loaded::load(&module, &kda_kernel::abi::ADVANCE)?;
        let pool_copy = Loaded::load(&module, &POOL_COPY)?;
        let load_all = |entries: &[&'static KernelAbi]| {
            entries.iter().map(|&abi| Loaded::load(&module, abi)).collect::<Result<Vec<_>, _>>()
        };
        let (hopper, hopper_fused) = if target == kda_kernel::abi::SM90A {
            (Some(load_all(&HOPPER_ENTRIES)?), Some(load_all(&HOPPER_FUSED_ENTRIES)?))
        } else {
            (None, None)
        };
        Ok(Self {
            ctx,
            baseline,
            portable,
            merge,
            layer,
            decode,
            advance,
            pool_copy,
            hopper,
            hopper_fused,
            portable_fused,
            prepare_fused,
            prepare_fused_scalar,
            output_prepared,
            compute_capability,
            module_code,
            auto: options.auto,
        })
    }

    /// The code the kernels were loaded from: a shipped cubin, or PTX the driver compiled.
    pub fn module_code(&self) -> ModuleCode {
        self.module_code
    }

    /// The context the kernels live in.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Compute capability of the device.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.compute_capability
    }

    /// The kernel [`Kernel::Auto`] resolves to on this device: the one [`KdaOptions::auto`]
    /// names, or else the Hopper kernel where it is loaded and the portable tensor-core kernel
    /// elsewhere.
    pub fn resolve(&self, kernel: Kernel) -> Kernel {
        resolve(kernel, self.auto, self.hopper.is_some())
    }

    /// The loaded `kernel` (the Hopper kernel's wide `K = 128` entry), or why this device has none.
    fn loaded(&self, kernel: Kernel) -> Result<&Loaded, KdaError> {
        self.loaded_for(kernel, K_DIM, BV)
    }

    /// The loaded `kernel` for key size `key_dim` in blocks of `width` value columns (the
    /// baseline has one entry for all), or why this device has none. A key size the Hopper
    /// kernel has no entry for is checked by `hopper_supports`; here it resolves to the wide
    /// `K = 128` entry.
    fn loaded_for(&self, kernel: Kernel, key_dim: usize, width: usize) -> Result<&Loaded, KdaError> {
        match (self.resolve(kernel), &self.hopper) {
            (Kernel::Hopper, Some(entries)) => {
                let abi = hopper_for(key_dim, width).unwrap_or(&kda_kernel::abi::HOPPER);
                let i = HOPPER_ENTRIES.iter().position(|&e| e.entry == abi.entry).unwrap_or(0);
                Ok(&entries[i])
            }
            (Kernel::Hopper, None) => Err(KdaError::Argument {
                name: "kernel",
                reason: format!(
                    "the Hopper kernel needs compute capability 9.x, this device has {:?}",
                    self.compute_capability
                ),
            }),
            (Kernel::Portable, _) => {
                let abi = portable_for(key_dim, width / PORTABLE_BV).unwrap_or(&kda_kernel::abi::PORTABLE);
                let i = PORTABLE_ENTRIES.iter().position(|&e| e.entry == abi.entry).unwrap_or(1);
                self.portable[i].as_ref().ok_or_else(|| KdaError::Unsupported {
                    argument: "kernel",
                    reason: format!(
                        "the portable kernel's {} needs {} bytes of shared memory per CTA, more than this device gives",
                        abi.entry, abi.smem_bytes
                    ),
                })
            }
            _ => Ok(&self.baseline),
        }
    }

    /// The fused layer pass's Hopper entry for key size `key_dim` in blocks of `bv` columns, when
    /// this device has it.
    fn loaded_fused(&self, key_dim: usize, bv: usize) -> Option<&Loaded> {
        let abi = hopper_fused_for(key_dim, bv)?;
        let i = HOPPER_FUSED_ENTRIES.iter().position(|&e| e.entry == abi.entry)?;
        self.hopper_fused.as_ref().map(|entries| &entries[i])
    }

    /// The fused layer pass's portable entry for key size `key_dim` and `groups` consumer groups,
    /// when this device has it (and gives a CTA its shared memory).
    fn loaded_portable_fused(&self, key_dim: usize, groups: usize) -> Option<&Loaded> {
        let abi = portable_fused_for(key_dim, groups)?;
        let i = PORTABLE_FUSED_ENTRIES.iter().position(|&e| e.entry == abi.entry)?;
        self.portable_fused[i].as_ref()
    }

    /// CTAs of `kernel` that one SM holds at once (the driver's occupancy calculation for the
    /// kernel's block size, registers and shared memory).
    pub fn ctas_per_sm(&self, kernel: Kernel) -> Result<u32, KdaError> {
        let f = self.loaded(kernel)?;
        let (threads, smem) = (f.abi.threads as u32, f.abi.smem_bytes);
        Ok(f.function.occupancy_max_active_blocks_per_multiprocessor(threads, smem, None)?)
    }

    /// Validates the arguments, then enqueues the recurrence on `stream`.
    ///
    /// No allocation, no host synchronisation: graph-capturable. Empty batches (no sequences)
    /// enqueue nothing; zero-length sequences get `ht = h0` (or zeros). A problem the chosen
    /// kernel cannot run is a [`KdaError::Unsupported`] naming what it lacks, with nothing
    /// launched.
    pub fn launch(
        &self,
        stream: &Arc<CudaStream>,
        plan: &DevicePlan,
        inputs: &KdaInputs<'_>,
        outputs: &mut KdaOutputs<'_>,
        kernel: Kernel,
    ) -> Result<(), KdaError> {
        self.launch_with(stream, plan, inputs, outputs, kernel, None)
    }

    /// [`Kda::launch`], or with `fused` the fused layer pass: the recurrence on the Hopper
    /// kernel in wide blocks writing the layer's output `o` (in `outputs.v_new`'s place) from
    /// `fused`'s `q Γ` and causal attention, and no `h` (`outputs.h` is not read, nor checked).
    fn launch_with(
        &self,
        stream: &Arc<CudaStream>,
        plan: &DevicePlan,
        inputs: &KdaInputs<'_>,
        outputs: &mut KdaOutputs<'_>,
        kernel: Kernel,
        fused: Option<FusedOutput>,
    ) -> Result<(), KdaError> {
        let dims = plan.dims();
        self.validate(stream, plan, &dims, inputs, outputs, fused.is_none())?;
        if dims.tokens == 0 {
            // No chunk to run: `h` and `v_new` are empty, and each final state is its initial one.
            self.loaded(kernel)?;
            return final_states_without_tokens(stream, inputs, outputs);
        }
        let choice = self.choose(kernel, plan, &dims)?;
        if fused.is_some() {
            self.fused_runs(choice, plan, &dims)?;
        }
        let ptrs = Pointers::of(stream, inputs, outputs);
        let hopper = || self.loaded_for(Kernel::Hopper, dims.key_dim, plan.columns.width());
        let (tables, _tables_record) = plan.tables_on(stream)?;
        match (choice, &plan.work, &plan.split) {
            (Kernel::Hopper, Some(_), Some(split)) => {
                let f = hopper()?;
                self.launch_split(stream, &dims, &ptrs, (split, tables), |pass| {
                    self.launch_pass(Kernel::Hopper, stream, f, plan, &dims, &ptrs, pass, fused)
                })
            }
            (Kernel::Hopper, Some(work), None) => {
                let pass = PassLaunch::recurrence(&dims, &ptrs, plan.schedule.workers(), work.address(tables));
                self.launch_pass(Kernel::Hopper, stream, hopper()?, plan, &dims, &ptrs, &pass, fused)
            }
            (Kernel::Portable, _, _) => self.launch_portable(stream, &dims, (plan, tables), &ptrs, fused),
            _ => self.launch_baseline(stream, &dims, (plan, tables), &ptrs),
        }
    }

    /// Whether the fused layer pass runs this launch: the Hopper kernel chosen (`choice`), at a
    /// key size and block width the pass has an entry for; or the portable kernel, with a fused
    /// entry for the plan's key size and consumer groups that this device loaded; a typed refusal
    /// otherwise.
    fn fused_runs(&self, choice: Kernel, plan: &DevicePlan, dims: &Dims) -> Result<(), KdaError> {
        let refuse = |reason: String| Err(KdaError::Unsupported { argument: "output_path", reason });
        if choice == Kernel::Portable {
            let groups = plan.portable_block_width() / PORTABLE_BV;
            if plan.portable.is_none() || self.loaded_portable_fused(dims.key_dim, groups).is_none() {
                return refuse(format!(
                    "the fused layer pass on the portable kernel runs K = 64 or 128 where the device gives a CTA its \
                     shared memory; this launch has K = {} in blocks of {} columns",
                    dims.key_dim,
                    plan.portable_block_width()
                ));
            }
            return Ok(());
        }
        if choice != Kernel::Hopper || plan.work.is_none() {
            return refuse(format!(
                "the fused layer pass runs on the Hopper kernel, and this launch takes the {choice:?} kernel                  (OutputPath::Separate runs the layer on any kernel)"
            ));
        }
        if self.loaded_fused(dims.key_dim, plan.columns.width()).is_none() {
            return refuse(format!(
                "the fused layer pass runs K = 64 or 128, the plan has {:?} blocks at K = {}",
                plan.columns, dims.key_dim
            ));
        }
        Ok(())
    }

    /// The kernel that runs this launch: the Hopper kernel where it is loaded, asked for, and its
    /// limits allow; the baseline when named; the portable kernel otherwise. Each must support
    /// the problem.
    fn choose(&self, kernel: Kernel, plan: &DevicePlan, dims: &Dims) -> Result<Kernel, KdaError> {
        let resolved = self.resolve(kernel);
        let hopper_takes = resolved == Kernel::Hopper && {
            self.loaded(Kernel::Hopper)?;
            hopper_supports(&plan.strides, dims)?;
            fits_tma(dims) && plan.work.is_some()
        };
        let chosen = dispatch(resolved, hopper_takes);
        match chosen {
            Kernel::Baseline => baseline_supports(&plan.shape, &plan.strides, dims)?,
            Kernel::Portable => {
                portable_supports(&plan.strides, dims)?;
                if plan.portable.is_none() {
                    return Err(portable_records_error());
                }
            }
            _ => {}
        }
        Ok(chosen)
    }

    /// A split plan's three passes (`kda::split`): the pre-scan's maps (and the first segments'
    /// exit states, from `h0`), the merge's entry states, the main pass from them; on `stream`,
    /// in order, with nothing between them on the host. `run` enqueues one pass of the
    /// persistent kernel (Hopper's or the portable one's); the split's tables lie in the plan's
    /// device tables from address `tables`.
    fn launch_split(
        &self,
        stream: &Arc<CudaStream>,
        dims: &Dims,
        ptrs: &Pointers<'_>,
        (split, tables): (&device_plan::SplitDevice, u64),
        run: impl Fn(&PassLaunch) -> Result<(), KdaError>,
    ) -> Result<(), KdaError> {
        use cudarc::driver::DevicePtrMut;
        // A poisoned lock only means another launch panicked while enqueueing: the buffers hold
        // nothing a launch relies on before writing it.
        let mut workspace = split.workspace.lock().unwrap_or_else(|e| e.into_inner());
        let workspace = &mut *workspace;
        let (maps, _maps_record) = workspace.maps.device_ptr_mut(stream);
        let (entries, _entries_record) = workspace.entries.device_ptr_mut(stream);
        let (prescan_work, main_work) = (split.prescan.work.address(tables), split.main.work.address(tables));
        let table = split.merge_table.address(tables);
        let (kd, vd) = (dims.key_dim, dims.value_dim);
        // The first segments start from `h0`, whose layout the pre-scan's is (its maps are
        // key-first whatever the layout).
        let prescan = PassLaunch {
            workers: split.prescan.workers,
            work: prescan_work,
            ht: maps,
            value_dim: (kd + vd) as u32,
            pass: PassCode::Prescan,
            ..PassLaunch::recurrence(dims, ptrs, 0, 0)
        };
        run(&prescan)?;
        let merge = MergeArgs {
            maps,
            h0: ptrs.h0,
            entries,
            table,
            heads: heads_u32(dims.value_heads)?,
            key_dim: kd as u32,
            value_dim: vd as u32,
            state_layout: dims.layout.code(),
        };
        let ctas = (split.merge_records.checked_mul(dims.value_heads))
            .and_then(|n| n.checked_mul(vd / kda_kernel::layout::merge::COLS))
            .ok_or_else(|| grid_error(dims))?;
        // SAFETY: the maps, entries and table were allocated and built with the plan for these
        // head counts and sizes (`split_device`): every row the merge records name exists, the
        // workspace is locked for this launch, `h0` was validated (or is 0); `K` and `V` are the
        // Hopper kernel's (`hopper_supports`), multiples of the merge's rows and columns.
        unsafe { enqueue(stream, &self.merge, ctas, |sink| merge.push(sink)) }?;
        let main = PassLaunch {
            workers: split.main.workers,
            work: main_work,
            h0: Some((entries, split.entry_rows)),
            ..PassLaunch::recurrence(dims, ptrs, 0, 0)
        };
        run(&main)
    }

    /// The baseline kernel: one CTA per (sequence, head, column block), longest sequence first.
    fn launch_baseline(
        &self,
        stream: &Arc<CudaStream>,
        dims: &Dims,
        (plan, tables): (&DevicePlan, u64),
        ptrs: &Pointers<'_>,
    ) -> Result<(), KdaError> {
        let items = per_item_grid(dims, BASELINE_COL_BLOCKS)?;
        if items == 0 {
            return Ok(());
        }
        let args = BaselineArgs::new(
            ptrs,
            plan.descriptors.address(tables),
            heads_u32(dims.value_heads)?,
            heads_u32(dims.heads)?,
        );
        // SAFETY: `validate` checked every buffer's length for this plan and `heads`, its
        // alignment and its device; the descriptors were built from the same plan; one CTA per
        // item; outputs are `&mut` borrows, so they cannot alias the inputs.
        unsafe { enqueue(stream, &self.baseline, items, |sink| args.push(sink)) }
    }

    /// The portable tensor-core kernel's entry for the problem's key size over the plan's
    /// portable passes: the persistent grid over its longest-first schedule, or the split's three
    /// passes.
    fn launch_portable(
        &self,
        stream: &Arc<CudaStream>,
        dims: &Dims,
        (plan, tables): (&DevicePlan, u64),
        ptrs: &Pointers<'_>,
        fused: Option<FusedOutput>,
    ) -> Result<(), KdaError> {
        let f = self.loaded_for(Kernel::Portable, dims.key_dim, plan.portable_block_width())?;
        // `choose` checked that the plan has the portable passes.
        let Some(portable) = &plan.portable else { return Err(portable_records_error()) };
        let run = |pass: &PassLaunch| self.launch_pass(Kernel::Portable, stream, f, plan, dims, ptrs, pass, fused);
        match &portable.split {
            Some(split) => self.launch_split(stream, dims, ptrs, (split, tables), run),
            None => run(&PassLaunch::recurrence(dims, ptrs, portable.work.workers, portable.work.work.address(tables))),
        }
    }

    /// One pass of a persistent kernel, `kernel` (`Kernel::Hopper` or `Kernel::Portable`, entry
    /// `f`): `pass.workers` CTAs over `pass.work`.
    #[allow(clippy::too_many_arguments)]
    fn launch_pass(
        &self,
        kernel: Kernel,
        stream: &Arc<CudaStream>,
        f: &Loaded,
        plan: &DevicePlan,
        dims: &Dims,
        ptrs: &Pointers<'_>,
        pass: &PassLaunch,
        fused: Option<FusedOutput>,
    ) -> Result<(), KdaError> {
        if pass.workers == 0 {
            return Ok(());
        }
        let (heads, h0) = (heads_u32(dims.value_heads)?, pass.h0.map_or(0, |(address, _)| address));
        if kernel == Kernel::Portable {
            // The pre-scan of a fused launch is the recurrence's own (it writes only its maps).
            let fused = fused.filter(|_| pass.pass != PassCode::Prescan);
            let groups = plan.portable_block_width() / PORTABLE_BV;
            let f = match fused {
                Some(_) => self.loaded_portable_fused(dims.key_dim, groups).ok_or_else(|| KdaError::Unsupported {
                    argument: "output_path",
                    reason: format!(
                        "no fused layer pass on the portable kernel at K = {}, {groups} groups",
                        dims.key_dim
                    ),
                })?,
                None => f,
            };
            let args = PortableArgs {
                ptrs: [ptrs.k, ptrs.w, ptrs.u, ptrs.g, ptrs.gk, h0, ptrs.h, ptrs.v_new, pass.ht],
                work: pass.work,
                heads,
                value_dim: pass.value_dim,
                state_layout: pass.layout.code(),
                pass: pass.pass as u32,
                strides: stride_pairs(
                    &plan.strides,
                    dims,
                    [Tensor::K, Tensor::W, Tensor::U, Tensor::G, Tensor::Gk, Tensor::VNew],
                ),
                fused: fused.map(|x| (x.qg, x.attention, x.scale_bits)),
            };
            // SAFETY: `validate` checked every buffer's length for this plan, heads and strides,
            // its alignment and its device, and `portable_supports` the key size, `V` and the
            // strides; the pass's records (built with the plan for these head counts and sizes,
            // in blocks of the kernel's `BV` columns) name each of its items once for exactly
            // `workers` CTAs, with rows inside its `h0` and `ht` (the split's workspace, or the
            // caller's states) and columns inside `value_dim`; outputs are `&mut` borrows (the
            // workspace is the plan's, locked), so they cannot alias the inputs. The fused pass
            // (`fused_runs` checked its entry is loaded for the plan's key size and groups) reads
            // `qg` and `attention`, the layer workspace's `[T, HV, K]` and `[T, HV, CHUNK]`
            // written by the fused prepare kernel before it on this stream, and writes `o` in
            // `v_new`'s place (validated as `v_new`), never `h`.
            return unsafe { enqueue(stream, f, pass.workers, |sink| args.push(sink)) };
        }
        let width = plan.columns.width();
        // The pre-scan of a fused launch is the recurrence's own (it writes only its maps).
        let fused = fused.filter(|_| pass.pass != PassCode::Prescan);
        let f = match fused {
            Some(_) => self.loaded_fused(dims.key_dim, width).ok_or_else(|| KdaError::Unsupported {
                argument: "output_path",
                reason: format!("no fused layer pass at K = {} in blocks of {width} columns", dims.key_dim),
            })?,
            None => f,
        };
        let fused_maps = fused.map(|x| (x.qg, x.attention));
        let args = HopperArgs {
            maps: MapsArg(TensorMaps(tensor_map::hopper_maps(ptrs, dims, &plan.strides, pass.h0, width, fused_maps)?)),
            g: ptrs.g,
            gk: ptrs.gk,
            h0,
            v_new: ptrs.v_new,
            ht: pass.ht,
            work: pass.work,
            heads,
            value_dim: pass.value_dim,
            state_layout: pass.layout.code(),
            pass: pass.pass as u32,
            strides: stride_pairs(&plan.strides, dims, [Tensor::G, Tensor::Gk, Tensor::VNew]),
            fused_scale_bits: fused.map(|x| x.scale_bits),
        };
        // SAFETY: `validate` checked every buffer's length for this plan, its strides and its
        // heads, its alignment and its device, and that the gates given are the shape's;
        // `hopper_supports` that the head sizes are the kernel's and the strides fit its
        // parameters and TMA; the tensor maps describe exactly `k`, `w`, `u`, `h`, `v_new` and
        // the pass's `h0` (an all-zero map only without one, which the kernel then never uses),
        // and TMA stores through them stay inside those buffers; the pass's records (built with
        // the plan for these head counts and sizes, `PassLaunch`) name each of its items once for
        // exactly `workers` CTAs, with rows inside its `h0` and `ht` and columns inside
        // `value_dim`; outputs are `&mut` borrows (the workspace is the plan's, locked), so they
        // cannot alias the inputs, and `v_new`'s rows are disjoint (`Strides::check_len`).
        unsafe { enqueue(stream, f, pass.workers, |sink| args.push(sink)) }
    }

    /// Checks a launch's tensors (`outputs.h` only when the launch writes it).
    fn validate(
        &self,
        stream: &Arc<CudaStream>,
        plan: &DevicePlan,
        dims: &Dims,
        inputs: &KdaInputs<'_>,
        outputs: &KdaOutputs<'_>,
        writes_h: bool,
    ) -> Result<(), KdaError> {
        // `heads >= 1` holds: `DevicePlan::new` rejects 0.
        let args = [
            Some(TensorArg::of(Tensor::K, &inputs.k, stream)),
            Some(TensorArg::of(Tensor::W, &inputs.w, stream)),
            Some(TensorArg::of(Tensor::U, &inputs.u, stream)),
            inputs.g.as_ref().map(|t| TensorArg::of(Tensor::G, t, stream)),
            inputs.gk.as_ref().map(|t| TensorArg::of(Tensor::Gk, t, stream)),
            inputs.h0.as_ref().map(|t| TensorArg::of(Tensor::H0, t, stream)),
            writes_h.then(|| TensorArg::of(Tensor::H, &outputs.h, stream)),
            Some(TensorArg::of(Tensor::VNew, &outputs.v_new, stream)),
            outputs.ht.as_ref().map(|t| TensorArg::of(Tensor::Ht, t, stream)),
        ];
        let args: Vec<TensorArg> = args.into_iter().flatten().collect();
        let launch = Launch {
            dims,
            shape: &plan.shape,
            strides: &plan.strides,
            ordinal: self.ctx.ordinal(),
            stream_ordinal: stream.context().ordinal(),
            plan_ordinal: plan.ordinal,
        };
        check_launch(&launch, &args)
    }
}

/// The fused layer pass's inputs beyond the recurrence's (`abi::HOPPER_FUSED_PARAMS`): the packed
/// `q Γ` (`[T, HV, K]` bf16) and causal attention (`[T, HV, CHUNK]` bf16) of the attention
/// kernel, and the output scale as f32 bits.
#[derive(Clone, Copy)]
pub(super) struct FusedOutput {
    pub qg: args::Address,
    pub attention: args::Address,
    pub scale_bits: u32,
}

/// What one launch of the Hopper kernel runs: its grid and work records, the states it starts
/// from (`h0` address and rows) and writes (`ht`, `value_dim` columns wide), their layout, and
/// the pass.
struct PassLaunch {
    workers: usize,
    work: args::Address,
    h0: Option<(args::Address, usize)>,
    ht: args::Address,
    value_dim: u32,
    /// The layout of the pass's states: of `h0` alone in the pre-scan, whose maps are always
    /// key-first.
    layout: StateLayout,
    pass: PassCode,
}

impl PassLaunch {
    /// The recurrence over `workers` CTAs and `work`, from the caller's `h0` to its `ht`.
    fn recurrence(dims: &Dims, ptrs: &Pointers<'_>, workers: usize, work: args::Address) -> Self {
        Self {
            workers,
            work,
            h0: (ptrs.h0 != 0).then_some((ptrs.h0, dims.seqs * dims.value_heads)),
            ht: ptrs.ht,
            value_dim: dims.value_dim as u32,
            layout: dims.layout,
            pass: PassCode::Recurrence,
        }
    }
}

/// `ht = h0` (or zeros) for a batch with no tokens, as copies on `stream`.
fn final_states_without_tokens(
    stream: &Arc<CudaStream>,
    inputs: &KdaInputs<'_>,
    outputs: &mut KdaOutputs<'_>,
) -> Result<(), KdaError> {
    match (&mut outputs.ht, &inputs.h0) {
        // Validated: both hold `[N, HV]` states in the same layout.
        (Some(ht), Some(h0)) => stream.memcpy_dtod(h0, ht)?,
        (Some(ht), None) => stream.memset_zeros(ht)?,
        (None, _) => {}
    }
    Ok(())
}

/// `heads` as the kernels' 32-bit parameter.
/// CTAs of a per-item kernel: one per (sequence, value head, column block).
fn per_item_grid(dims: &Dims, col_blocks: usize) -> Result<usize, KdaError> {
    (dims.value_heads.checked_mul(col_blocks)).and_then(|n| dims.seqs.checked_mul(n)).ok_or_else(|| grid_error(dims))
}

/// The token and head strides (elements) of `tensors` as the kernels take them (the launcher's
/// `*_supports` checked that they fit in 32 bits).
fn stride_pairs<const N: usize>(strides: &crate::Strides, dims: &Dims, tensors: [Tensor; N]) -> [[u32; 2]; N] {
    tensors.map(|t| {
        let s = strides.effective(dims, t);
        [s.token as u32, s.head as u32]
    })
}

/// Why the portable kernel cannot run a plan without its passes: the batch's token or chunk
/// offsets do not fit its 32-bit work records.
fn portable_records_error() -> KdaError {
    KdaError::Unsupported {
        argument: "plan",
        reason: "token or chunk offsets past 32 bits do not fit the portable kernel's work records \
                 (Kernel::Baseline takes 64-bit offsets)"
            .into(),
    }
}

fn heads_u32(heads: usize) -> Result<u32, KdaError> {
    u32::try_from(heads)
        .map_err(|_| KdaError::Argument { name: "heads", reason: format!("{heads} does not fit in 32 bits") })
}

fn grid_error(dims: &Dims) -> KdaError {
    KdaError::Argument {
        name: "heads",
        reason: format!("N * HV = {} x {} work items exceed the grid limit", dims.seqs, dims.value_heads),
    }
}

/// Enqueues `f` on `stream` with `ctas` CTAs and its block size and shared memory, with the
/// arguments `push` gives (checked against the kernel's parameter list before anything launches).
///
/// # Safety
/// The arguments satisfy the safety contract of `f`'s kernel for a grid of `ctas` CTAs, and every
/// buffer they name stays alive and unaliased until the kernel completes (the callers hold the
/// tensors' borrows and stream records across the call).
unsafe fn enqueue<'a>(
    stream: &'a Arc<CudaStream>,
    f: &'a Loaded,
    ctas: usize,
    push: impl FnOnce(&mut Checked<'a>),
) -> Result<(), KdaError> {
    let grid = u32::try_from(ctas)
        .ok()
        .filter(|&g| g <= i32::MAX as u32)
        .ok_or_else(|| KdaError::Argument { name: "heads", reason: format!("{ctas} CTAs exceed the grid limit") })?;
    let cfg = LaunchConfig {
        grid_dim: (grid, 1, 1),
        block_dim: (f.abi.threads as u32, 1, 1),
        shared_mem_bytes: f.abi.smem_bytes as u32,
    };
    let mut args = Checked::new(stream.launch_builder(&f.function), f.abi);
    push(&mut args);
    args.finish().map_err(|reason| KdaError::Argument { name: "kernel", reason })?;
    // SAFETY: the function's contract; the argument list is the kernel's, as just checked.
    unsafe { args.launch.launch(cfg) }?;
    Ok(())
}

/// What `kernel` stands for on a device with the Hopper kernel loaded or not, `auto` being what
/// [`Kernel::Auto`] was set to ([`KdaOptions::auto`]): the Hopper kernel where it is loaded, the
/// portable kernel elsewhere, unless `auto` names one.
fn resolve(kernel: Kernel, auto: Kernel, hopper_loaded: bool) -> Kernel {
    match (kernel, auto) {
        (Kernel::Auto, Kernel::Auto) if hopper_loaded => Kernel::Hopper,
        (Kernel::Auto, Kernel::Auto) => Kernel::Portable,
        (Kernel::Auto, chosen) => chosen,
        (other, _) => other,
    }
}

/// Whether the Hopper kernel's tensor maps reach all of a batch of `dims`: TMA coordinates are
/// 32-bit, so batches beyond 2^31 tokens or 2^31 rows of `h` (NT * HV) take a per-item kernel.
fn fits_tma(dims: &Dims) -> bool {
    dims.tokens <= i32::MAX as usize
        && dims.chunks.checked_mul(dims.value_heads).is_some_and(|rows| rows <= i32::MAX as usize)
}

/// The kernel a launch of `resolved` ([`resolve`]) runs: the Hopper kernel when it takes the
/// batch (`hopper_takes`: loaded, supported, within TMA's reach and with work records that fit
/// 32 bits), the baseline when named, and the portable kernel, which runs every shape the Hopper
/// kernel does, for the rest.
fn dispatch(resolved: Kernel, hopper_takes: bool) -> Kernel {
    match resolved {
        Kernel::Hopper if hopper_takes => Kernel::Hopper,
        Kernel::Baseline => Kernel::Baseline,
        _ => Kernel::Portable,
    }
}

#[cfg(test)]
mod dispatch_paths {
    //! Every path to a kernel, by compute capability (whether the Hopper kernel is loaded:
    //! `options::target`, tested there) and forced, and the fallback past TMA's reach.

    use super::*;
    use crate::model::StateLayout;

    #[test]
    fn auto_is_the_hopper_kernel_where_loaded_and_the_portable_one_elsewhere() {
        assert_eq!(resolve(Kernel::Auto, Kernel::Auto, true), Kernel::Hopper);
        assert_eq!(resolve(Kernel::Auto, Kernel::Auto, false), Kernel::Portable);
        for forced in [Kernel::Hopper, Kernel::Portable, Kernel::Baseline] {
            for loaded in [true, false] {
                // Named per launch, or as what `Auto` stands for (`KDA_KERNEL`).
                assert_eq!(resolve(forced, Kernel::Auto, loaded), forced);
                assert_eq!(resolve(Kernel::Auto, forced, loaded), forced);
                assert_eq!(resolve(forced, Kernel::Baseline, loaded), forced);
            }
        }
    }

    #[test]
    fn the_hopper_kernel_falls_back_to_the_portable_one_only_when_it_cannot_take_the_batch() {
        assert_eq!(dispatch(Kernel::Hopper, true), Kernel::Hopper);
        assert_eq!(dispatch(Kernel::Hopper, false), Kernel::Portable);
        assert_eq!(dispatch(Kernel::Portable, false), Kernel::Portable);
        assert_eq!(dispatch(Kernel::Baseline, false), Kernel::Baseline);
    }

    #[test]
    fn tma_reaches_two_to_the_31_tokens_and_rows_of_h() {
        let dims = |tokens, chunks, value_heads| Dims {
            tokens,
            heads: 1,
            value_heads,
            seqs: 1,
            chunks,
            key_dim: 128,
            value_dim: 128,
            layout: StateLayout::KeyFirst,
        };
        let most = i32::MAX as usize;
        assert!(fits_tma(&dims(300_000, 4_688, 64)));
        assert!(fits_tma(&dims(most, 1, 1)));
        assert!(!fits_tma(&dims(most + 1, 1, 1)));
        assert!(fits_tma(&dims(64, most, 1)));
        assert!(!fits_tma(&dims(64, most / 2 + 1, 2)));
        assert!(!fits_tma(&dims(64, usize::MAX, 2)), "a product past usize is out of reach");
    }
}

#[cfg(test)]
mod entries_loaded {
    //! Which portable entries a device loads, by its opt-in shared memory per CTA.

    use super::*;
    use kda_kernel::abi::{PORTABLE_K64_WIDE, PORTABLE_WIDE};

    /// Opt-in shared memory per CTA: the sm_86 / sm_89 / sm_120 parts, the A100, the H100 / H200.
    const SM86: usize = 99 * 1024;
    const A100: usize = 163 * 1024;
    const H100: usize = 227 * 1024;

    #[test]
    fn the_two_group_entries_load_only_where_the_device_gives_their_shared_memory() {
        let wide = |abi: &KernelAbi| abi.entry == PORTABLE_WIDE.entry || abi.entry == PORTABLE_K64_WIDE.entry;
        for abi in PORTABLE_ENTRIES {
            assert_eq!(fits_device(abi, SM86), !wide(abi), "{} on a 99 KB part", abi.entry);
            assert!(fits_device(abi, A100) && fits_device(abi, H100), "{}", abi.entry);
        }
        // The planner's rule is the same: two groups only where their entry fits.
        for key_dim in [64, 128] {
            let two = portable_for(key_dim, 2).unwrap();
            assert!(!fits_device(two, SM86) && fits_device(two, A100));
        }
    }

    #[test]
    fn an_entry_loads_only_where_its_compiled_form_runs_its_block() {
        // The driver's maximum threads per CTA: the entry's `.maxntid`, or fewer where the
        // compiled kernel's registers leave less room (a negative or zero answer runs nothing).
        assert!(runs_block(544, 544) && runs_block(1024, 288));
        assert!(
            !runs_block(512, 544),
            "the H100 at 120 registers: 17 warps put five in one quarter of the register file"
        );
        assert!(!runs_block(0, 32) && !runs_block(-1, 32));
        // Every entry's own block is within its `.maxntid` (the builder writes it as `threads`),
        // and within a CTA's 1024 threads.
        for abi in PORTABLE_ENTRIES.iter().chain(kda_kernel::abi::PORTABLE_FUSED_ENTRIES.iter()) {
            assert!(runs_block(1024, abi.threads), "{}", abi.entry);
        }
        let err = KdaError::KernelResources {
            entry: "kda_fwd_h_portable_wide",
            threads: 544,
            max_threads: 512,
            registers: 128,
        };
        assert!(err.to_string().contains("kda_fwd_h_portable_wide") && err.to_string().contains("544"), "{err}");
    }
}

#[cfg(test)]
mod thread_safety {
    //! The launcher's types cross threads as documented on [`Kda`] and [`DevicePlan`].

    use super::*;

    fn send_sync<T: Send + Sync>() {}

    #[test]
    fn the_launcher_and_plans_are_shared_across_threads() {
        send_sync::<Kda>();
        send_sync::<DevicePlan>();
        send_sync::<KdaInputs<'static>>();
        send_sync::<KdaOutputs<'static>>();
        send_sync::<LayerPlan>();
        send_sync::<LayerWorkspace>();
        send_sync::<LayerInputs<'static>>();
        send_sync::<LayerDeviceOutputs<'static>>();
    }
}

/// The environment variable that offsets the decode step's CTAs sharing an SM in its first
/// wave (nanoseconds per slot, `kda_kernel::layout::layer::OPT_STAGGER_SHIFT`): unset, the step
/// takes [`DECODE_STAGGER_NS`]; 0 starts them together.
pub const DECODE_STAGGER_VAR: &str = "KDA_DECODE_STAGGER_NS";
/// The decode step's offset between the first wave's CTAs of one SM, nanoseconds per slot, where
/// [`DECODE_STAGGER_VAR`] names none. Measured on the H100 (bench/RESULTS.md, "Decode",
/// 2026-12-08, two rounds): 2000 ns took verify_kda_64x4 from 120.6 to 115.9 us and
/// decode_kda_64 from 99.8 to 98.7, the other one-token steps within 0.3%; 6000 ns made every
/// shape slower. Off until a run of more rounds confirms the offset.
pub const DECODE_STAGGER_NS: u32 = 0;

impl Kda {
    /// The stagger and SM fields of a kernel's options word: `var`'s nanoseconds per slot, or
    /// `default_ns` where it is unset.
    fn stagger_bits(&self, var: &'static str, default_ns: u32) -> Result<u32, KdaError> {
        use cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT;
        use kda_kernel::layout::layer::STAGGER_UNIT_NS;
        let ns = match std::env::var(var) {
            Ok(value) => value.trim().parse().map_err(|_| KdaError::Argument {
                name: var,
                reason: format!("`{value}`: nanoseconds per slot (an integer)"),
            })?,
            Err(_) => default_ns,
        };
        if ns < STAGGER_UNIT_NS {
            return Ok(0);
        }
        Ok(stagger_field(ns, self.ctx.attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32))
    }
}

/// The options word's stagger and SM fields for `ns` nanoseconds per slot on `sms` SMs: whole
/// units of `STAGGER_UNIT_NS`, each field clamped to its 8 bits (0, the default, when `ns` is
/// below one unit).
fn stagger_field(ns: u32, sms: u32) -> u32 {
    use kda_kernel::layout::layer::{OPT_FIELD_MASK, OPT_SMS_SHIFT, OPT_STAGGER_SHIFT, STAGGER_UNIT_NS};
    let units = (ns / STAGGER_UNIT_NS).min(OPT_FIELD_MASK);
    if units == 0 {
        return 0;
    }
    units << OPT_STAGGER_SHIFT | sms.min(OPT_FIELD_MASK) << OPT_SMS_SHIFT
}

#[cfg(test)]
mod stagger_tests {
    use super::stagger_field;
    use kda_kernel::layout::layer::{OPT_FIELD_MASK, OPT_SMS_SHIFT, OPT_STAGGER_SHIFT, STAGGER_UNIT_NS};

    #[test]
    fn the_stagger_fields_hold_whole_units_and_the_sm_count() {
        let fields =
            |word: u32| ((word >> OPT_STAGGER_SHIFT) & OPT_FIELD_MASK, (word >> OPT_SMS_SHIFT) & OPT_FIELD_MASK);
        assert_eq!(stagger_field(0, 132), 0);
        assert_eq!(stagger_field(STAGGER_UNIT_NS - 1, 132), 0, "below one unit: off");
        assert_eq!(fields(stagger_field(2000, 132)), (2000 / STAGGER_UNIT_NS, 132));
        assert_eq!(fields(stagger_field(u32::MAX, 1000)), (OPT_FIELD_MASK, OPT_FIELD_MASK), "clamped");
        // The layer's option bits stay clear of both fields.
        use kda_kernel::layout::layer::{OPT_BETA_BF16, OPT_BETA_SIGMOID, OPT_GATE_BF16, OPT_L2NORM};
        let bits = OPT_L2NORM | OPT_BETA_SIGMOID | OPT_GATE_BF16 | OPT_BETA_BF16;
        assert_eq!(bits & stagger_field(u32::MAX, u32::MAX), 0);
    }
}

//! The GPU launcher: loads the embedded PTX through the CUDA driver (cudarc, loaded at run time)
//! and launches the recurrence on the caller's stream after validating every argument.
//!
//! Layers: [`Kda`] owns the loaded module; [`DevicePlan`] is a [`Plan`] and its work [`Schedule`]
//! for a head count, uploaded once; [`KdaInputs`]
//! and [`KdaOutputs`] borrow the caller's device tensors. [`Kda::launch`] allocates nothing and never
//! synchronises, so it can be captured in a CUDA graph.

use crate::layout::{baseline, hopper, CHUNK, K_DIM, V_DIM};
use crate::{ptx, Dims, KdaError, Outputs, Plan, Problem, Schedule};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr,
    DevicePtrMut, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use half::bf16;
use std::sync::Arc;

/// Device tensors must start at this many bytes: the alignment TMA tile loads need (and more than
/// the baseline's 32-bit accesses need).
pub const TENSOR_ALIGN: usize = 16;

/// `CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT` value for "all of the unified L1 /
/// shared memory that can be shared memory".
const MAX_SHARED_CARVEOUT_PERCENT: i32 = 100;

/// Which kernel a launch runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// The best kernel for the device.
    Auto,
    /// The portable baseline kernel (sm_80+).
    Baseline,
    /// The warp-specialized TMA + wgmma kernel (compute capability 9.x only).
    Hopper,
}

/// A loaded kernel module on one device.
pub struct Kda {
    ctx: Arc<CudaContext>,
    baseline: CudaFunction,
    /// The warp-specialized kernel, present on compute capability 9.x.
    hopper: Option<CudaFunction>,
    compute_capability: (i32, i32),
}

impl Kda {
    /// Loads the kernels on `ctx`'s device: the sm_90a module on compute capability 9.x, the
    /// portable sm_80 module on other devices of 8.0 or newer.
    pub fn new(ctx: Arc<CudaContext>) -> Result<Self, KdaError> {
        let compute_capability = ctx.compute_capability()?;
        let ptx = match compute_capability {
            (9, _) => ptx::SM90A,
            (major, _) if major >= 8 => ptx::SM80,
            _ => return Err(KdaError::UnsupportedDevice { compute_capability }),
        };
        let module = ctx.load_module(Ptx::from_src(ptx))?;
        let baseline = module.load_function(ptx::BASELINE_KERNEL)?;
        let hopper = if compute_capability.0 == 9 {
            let f = module.load_function(ptx::HOPPER_KERNEL)?;
            f.set_attribute(
                cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                hopper::SMEM_BYTES as i32,
            )?;
            // Prefer the largest shared-memory carveout: the ring, staging tiles and h0 slot
            // need nearly all of it.
            f.set_attribute(
                cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                MAX_SHARED_CARVEOUT_PERCENT,
            )?;
            Some(f)
        } else {
            None
        };
        Ok(Self { ctx, baseline, hopper, compute_capability })
    }

    /// The context the kernels live in.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Compute capability of the device.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.compute_capability
    }

    /// The kernel [`Kernel::Auto`] resolves to on this device.
    pub fn resolve(&self, kernel: Kernel) -> Kernel {
        match kernel {
            Kernel::Auto if self.hopper.is_some() => Kernel::Hopper,
            Kernel::Auto => Kernel::Baseline,
            other => other,
        }
    }

    /// CTAs of `kernel` that one SM holds at once (the driver's occupancy calculation for the
    /// kernel's block size, registers and shared memory).
    pub fn ctas_per_sm(&self, kernel: Kernel) -> Result<u32, KdaError> {
        let (f, threads, smem) = match (self.resolve(kernel), &self.hopper) {
            (Kernel::Hopper, Some(f)) => (f, hopper::THREADS, hopper::SMEM_BYTES),
            (Kernel::Hopper, None) => {
                return Err(KdaError::Argument { name: "kernel", reason: "no Hopper kernel on this device".into() })
            }
            _ => (&self.baseline, baseline::THREADS, baseline::SMEM_BYTES),
        };
        Ok(f.occupancy_max_active_blocks_per_multiprocessor(threads as u32, smem, None)?)
    }

    /// Validates the arguments, then enqueues the recurrence on `stream`.
    ///
    /// No allocation, no host synchronisation: graph-capturable. Empty batches (no sequences)
    /// enqueue nothing; zero-length sequences get `ht = h0` (or zeros).
    pub fn launch(
        &self,
        stream: &Arc<CudaStream>,
        plan: &DevicePlan,
        inputs: &KdaInputs<'_>,
        outputs: &mut KdaOutputs<'_>,
        kernel: Kernel,
    ) -> Result<(), KdaError> {
        let heads = plan.heads;
        let dims = Dims::new(&plan.plan, heads);
        self.validate(stream, plan, &dims, inputs, outputs)?;
        let kernel = self.resolve(kernel);
        let hopper = match (kernel, &self.hopper) {
            (Kernel::Hopper, Some(f)) => Some(f),
            (Kernel::Hopper, None) => {
                return Err(KdaError::Argument {
                    name: "kernel",
                    reason: format!(
                        "the Hopper kernel needs compute capability 9.x, this device has {:?}",
                        self.compute_capability
                    ),
                })
            }
            _ => None,
        };
        // TMA coordinates are 32-bit and a tensor map cannot describe an empty tensor: batches
        // with no tokens, or beyond 2^31 tokens or 2^31 rows of `h` (NT * H), take the baseline
        // (which also covers every batch whose work records would not fit in 32 bits).
        let hopper = hopper.filter(|_| {
            dims.tokens > 0
                && dims.tokens <= i32::MAX as usize
                && dims.chunks * heads <= i32::MAX as usize
                && plan.work.is_some()
        });
        // The Hopper kernel runs the plan's persistent schedule; the baseline one CTA per item.
        let items = match hopper {
            Some(_) => plan.schedule.workers(),
            None => dims.seqs * heads * baseline::COL_BLOCKS,
        };
        if items == 0 {
            return Ok(());
        }
        let grid = u32::try_from(items).ok().filter(|&g| g <= i32::MAX as u32).ok_or_else(|| {
            KdaError::Argument {
                name: "heads",
                reason: format!("N * H = {} work items exceed the grid limit", dims.seqs * heads),
            }
        })?;
        let heads_u32 = u32::try_from(heads).map_err(|_| KdaError::Argument {
            name: "heads",
            reason: format!("{heads} does not fit in 32 bits"),
        })?;
        let (k, _gk) = inputs.k.device_ptr(stream);
        let (w, _gw) = inputs.w.device_ptr(stream);
        let (u, _gu) = inputs.u.device_ptr(stream);
        let (gk, _gg) = inputs.gk.device_ptr(stream);
        let (h0, _g0) = match &inputs.h0 {
            Some(t) => {
                let (p, g) = t.device_ptr(stream);
                (p, Some(g))
            }
            None => (0, None),
        };
        let (h, _gh) = outputs.h.device_ptr_mut(stream);
        let (v_new, _gv) = outputs.v_new.device_ptr_mut(stream);
        let (ht, _gt) = match &mut outputs.ht {
            Some(t) => {
                let (p, g) = t.device_ptr_mut(stream);
                (p, Some(g))
            }
            None => (0, None),
        };
        let (seqs, _gs) = plan.descriptors.device_ptr(stream);
        let (work, _gw) = match (hopper, &plan.work) {
            (Some(_), Some(t)) => {
                let (p, g) = t.device_ptr(stream);
                (p, Some(g))
            }
            _ => (0, None),
        };
        let maps = match hopper {
            Some(_) => Some([
                TensorMapArg::tokens(k, dims.tokens, heads, K_DIM)?,
                TensorMapArg::tokens(w, dims.tokens, heads, K_DIM)?,
                TensorMapArg::tokens(u, dims.tokens, heads, V_DIM)?,
                TensorMapArg::rows(k, dims.tokens, heads, K_DIM)?,
                TensorMapArg::rows(w, dims.tokens, heads, K_DIM)?,
                TensorMapArg::rows(u, dims.tokens, heads, V_DIM)?,
                TensorMapArg::states(h, dims.chunks * heads)?,
                TensorMapArg::tokens(v_new, dims.tokens, heads, V_DIM)?,
                match h0 {
                    0 => TensorMapArg::unused(),
                    h0 => TensorMapArg::initial_states(h0, dims.seqs * heads)?,
                },
            ]),
            None => None,
        };
        let (func, cfg) = match hopper {
            Some(f) => {
                let cfg = LaunchConfig {
                    grid_dim: (grid, 1, 1),
                    block_dim: (hopper::THREADS as u32, 1, 1),
                    shared_mem_bytes: hopper::SMEM_BYTES as u32,
                };
                (f, cfg)
            }
            None => {
                let cfg = LaunchConfig {
                    grid_dim: (grid, 1, 1),
                    block_dim: (baseline::THREADS as u32, 1, 1),
                    shared_mem_bytes: baseline::SMEM_BYTES as u32,
                };
                (&self.baseline, cfg)
            }
        };
        let mut launch = stream.launch_builder(func);
        if let Some(maps) = &maps {
            for map in maps {
                launch.arg(map);
            }
        }
        launch.arg(&k).arg(&w).arg(&u).arg(&gk).arg(&h0);
        launch.arg(&h).arg(&v_new).arg(&ht).arg(&seqs).arg(&heads_u32);
        if maps.is_some() {
            launch.arg(&work);
        }
        // SAFETY: `validate` checked that every buffer has exactly the contract's length for this
        // plan and `heads`, is 16-byte aligned and lives on this device; the plan's descriptors were
        // built from the same `Plan`, and its schedule's records name each of the plan's items
        // once for exactly `grid` workers; the tensor maps describe exactly `k`, `w`, `u`, `h`, `v_new`
        // and `h0` (an unused map only when `h0` is null, which the kernel then never reads
        // through), and TMA stores through them stay inside those buffers; the grid,
        // block and shared-memory sizes are the ones the kernel documents; outputs are `&mut`
        // borrows, so they cannot alias the inputs.
        unsafe { launch.launch(cfg) }?;
        Ok(())
    }

    fn validate(
        &self,
        stream: &Arc<CudaStream>,
        plan: &DevicePlan,
        dims: &Dims,
        inputs: &KdaInputs<'_>,
        outputs: &KdaOutputs<'_>,
    ) -> Result<(), KdaError> {
        // `heads >= 1` holds: `DevicePlan::new` rejects 0.
        let ordinal = self.ctx.ordinal();
        for (name, actual) in [("stream", stream.context().ordinal()), ("plan", plan.ordinal)] {
            if actual != ordinal {
                return Err(KdaError::WrongDevice { tensor: name, expected: ordinal, actual });
            }
        }
        let args = [
            Some(TensorArg::of("k", &inputs.k, stream)),
            Some(TensorArg::of("w", &inputs.w, stream)),
            Some(TensorArg::of("u", &inputs.u, stream)),
            Some(TensorArg::of("gk", &inputs.gk, stream)),
            inputs.h0.as_ref().map(|t| TensorArg::of("h0", t, stream)),
            Some(TensorArg::of("h", &outputs.h, stream)),
            Some(TensorArg::of("v_new", &outputs.v_new, stream)),
            outputs.ht.as_ref().map(|t| TensorArg::of("ht", t, stream)),
        ];
        args.into_iter().flatten().try_for_each(|a| check_arg(dims, ordinal, a))
    }
}

/// What validation needs to know of one device tensor argument.
#[derive(Clone, Copy, Debug)]
struct TensorArg {
    name: &'static str,
    len: usize,
    address: u64,
    ordinal: usize,
}

impl TensorArg {
    fn of<T, S: DevicePtr<T>>(name: &'static str, t: &S, stream: &Arc<CudaStream>) -> Self {
        let (address, _record) = t.device_ptr(stream);
        Self { name, len: t.len(), address, ordinal: t.stream().context().ordinal() }
    }
}

/// Checks one argument's length against its contract shape, its alignment and its device.
fn check_arg(dims: &Dims, ordinal: usize, arg: TensorArg) -> Result<(), KdaError> {
    dims.check_len(arg.name, arg.len)?;
    if arg.ordinal != ordinal {
        return Err(KdaError::WrongDevice { tensor: arg.name, expected: ordinal, actual: arg.ordinal });
    }
    if arg.address % TENSOR_ALIGN as u64 != 0 {
        return Err(KdaError::Alignment { tensor: arg.name, required: TENSOR_ALIGN, address: arg.address });
    }
    Ok(())
}

/// A `CUtensorMap` passed to the Hopper kernel by value (the kernel declares these parameters
/// 64-byte aligned, as `CUtensorMap` is).
#[repr(transparent)]
struct TensorMapArg(cudarc::driver::sys::CUtensorMap);

// SAFETY: a plain 128-byte, 64-byte-aligned value the driver copies into the parameter buffer.
unsafe impl cudarc::driver::DeviceRepr for TensorMapArg {}

impl TensorMapArg {
    /// The tensor map of a packed `[T, H, width]` bf16 tensor at `address`, as a 3-D tensor
    /// `(width, H, T)` read in `[CHUNK][1][BOX_COLS]` boxes with the 128-byte swizzle (which the
    /// wgmma operands `k` and `w` need, and which keeps the `ldmatrix` reads of `u` free of bank
    /// conflicts).
    fn tokens(address: u64, tokens: usize, heads: usize, width: usize) -> Result<Self, KdaError> {
        Self::encode(address, Element::Bf16, [width, heads, tokens], [hopper::BOX_COLS, 1, CHUNK])
    }

    /// As [`Self::tokens`], in one-token boxes: the tail chunk's valid rows, one TMA each.
    fn rows(address: u64, tokens: usize, heads: usize, width: usize) -> Result<Self, KdaError> {
        Self::encode(address, Element::Bf16, [width, heads, tokens], [hopper::BOX_COLS, 1, 1])
    }

    /// The tensor map of the `h` output (`[NT, H, K, V]` bf16) as a 3-D tensor `(V, K, NT * H)`,
    /// written in `[1][K][BOX_COLS]` boxes (one CTA's `bf16(S)` for one chunk) with the 128-byte
    /// swizzle of the kernel's staging tile.
    fn states(address: u64, chunk_heads: usize) -> Result<Self, KdaError> {
        Self::encode(address, Element::Bf16, [V_DIM, K_DIM, chunk_heads], [hopper::BOX_COLS, K_DIM, 1])
    }

    /// The tensor map of `h0` (`[N, H, K, V]` f32) as a 3-D tensor `(V, K, N * H)`, read in
    /// unswizzled `[1][K][BV]` boxes (one item's initial state).
    fn initial_states(address: u64, seq_heads: usize) -> Result<Self, KdaError> {
        Self::encode(address, Element::F32, [V_DIM, K_DIM, seq_heads], [hopper::BV, K_DIM, 1])
    }

    /// A placeholder for a map the kernel does not use in this launch (all zero bytes).
    fn unused() -> Self {
        // SAFETY: `CUtensorMap` is plain bytes; the kernel never hands this one to TMA.
        Self(unsafe { std::mem::zeroed() })
    }

    /// A packed, contiguous tensor of extents `dims` (innermost first) in boxes of `boxes`
    /// elements: bf16 tiles 128-byte swizzled (as wgmma and the staging tiles lay them out), f32
    /// state blocks unswizzled.
    fn encode(address: u64, element: Element, dims: [usize; 3], boxes: [usize; 3]) -> Result<Self, KdaError> {
        use cudarc::driver::sys::*;
        let (data_type, bytes, swizzle) = match element {
            Element::Bf16 => (
                CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                2,
                CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            ),
            Element::F32 => (
                CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
                4,
                CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_NONE,
            ),
        };
        let strides: [u64; 2] = [dims[0] as u64 * bytes, (dims[0] * dims[1]) as u64 * bytes];
        let dims = dims.map(|d| d as u64);
        let boxes = boxes.map(|b| b as u32);
        let elem_strides: [u32; 3] = [1, 1, 1];
        let mut map = std::mem::MaybeUninit::<CUtensorMap>::uninit();
        // SAFETY: every pointer addresses a live local array of the rank's length; the driver
        // only writes `map`.
        unsafe {
            cuTensorMapEncodeTiled(
                map.as_mut_ptr(),
                data_type,
                3,
                address as *mut std::ffi::c_void,
                dims.as_ptr(),
                strides.as_ptr(),
                boxes.as_ptr(),
                elem_strides.as_ptr(),
                CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                swizzle,
                CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
            .result()?;
            Ok(Self(map.assume_init()))
        }
    }
}

/// Element types of the tensors the Hopper kernel reaches through tensor maps.
#[derive(Clone, Copy)]
enum Element {
    Bf16,
    F32,
}

/// A [`Plan`] for `heads` heads uploaded to the device once, with the persistent kernel's work
/// [`Schedule`] for this device: reusable by every launch of the same batch layout.
pub struct DevicePlan {
    plan: Plan,
    heads: usize,
    schedule: Schedule,
    descriptors: CudaSlice<i64>,
    /// The Hopper kernel's work records (`Schedule::table`), when the batch's offsets fit them.
    work: Option<CudaSlice<u32>>,
    ordinal: usize,
}

impl DevicePlan {
    /// Schedules `plan`'s items over the SMs of `stream`'s device and uploads the descriptor and
    /// schedule tables on `stream` (asynchronously: the copies are ordered before any launch on
    /// the same stream).
    pub fn new(stream: &Arc<CudaStream>, plan: Plan, heads: usize) -> Result<Self, KdaError> {
        if heads == 0 {
            return Err(KdaError::Argument { name: "heads", reason: "must be at least 1".into() });
        }
        let items = plan.num_seqs().checked_mul(heads * hopper::COL_BLOCKS);
        if items.is_none_or(|n| n > i32::MAX as usize) {
            return Err(KdaError::Argument {
                name: "heads",
                reason: format!("N * H = {} x {heads} work items exceed the grid limit", plan.num_seqs()),
            });
        }
        let sms = stream.context().attribute(
            cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )? as usize;
        let schedule = Schedule::lpt(&plan, heads, hopper::COL_BLOCKS, sms * hopper::CTAS_PER_SM);
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

/// A [`Problem`] copied to the device with output buffers, for tools and tests that start from
/// host data.
pub struct DeviceProblem {
    /// The uploaded plan (with its head count).
    pub plan: DevicePlan,
    /// `k` on the device.
    pub k: CudaSlice<bf16>,
    /// `w` on the device.
    pub w: CudaSlice<bf16>,
    /// `u` on the device.
    pub u: CudaSlice<bf16>,
    /// `gk` on the device.
    pub gk: CudaSlice<f32>,
    /// `h0` on the device.
    pub h0: Option<CudaSlice<f32>>,
    /// Output `h`.
    pub h: CudaSlice<bf16>,
    /// Output `v_new`.
    pub v_new: CudaSlice<bf16>,
    /// Output `ht`.
    pub ht: CudaSlice<f32>,
}

impl DeviceProblem {
    /// Uploads `p` and allocates zeroed outputs (a one-element buffer stands in for an empty one,
    /// since the driver cannot allocate zero bytes; views passed to the launch are exact).
    pub fn upload(stream: &Arc<CudaStream>, p: &Problem) -> Result<Self, KdaError> {
        p.validate()?;
        let d = p.dims();
        let up_bf = |v: &[bf16]| stream.clone_htod(non_empty(v, bf16::ZERO).as_ref());
        let up_f = |v: &[f32]| stream.clone_htod(non_empty(v, 0.0).as_ref());
        Ok(Self {
            plan: DevicePlan::new(stream, p.plan.clone(), p.heads)?,
            k: up_bf(&p.k)?,
            w: up_bf(&p.w)?,
            u: up_bf(&p.u)?,
            gk: up_f(&p.gk)?,
            h0: p.h0.as_deref().map(up_f).transpose()?,
            h: stream.alloc_zeros(d.h_len().max(1))?,
            v_new: stream.alloc_zeros(d.value_len().max(1))?,
            ht: stream.alloc_zeros(d.state_len().max(1))?,
        })
    }

    /// The sizes of the problem.
    pub fn dims(&self) -> Dims {
        Dims::new(self.plan.plan(), self.plan.heads())
    }

    /// Launches `kernel` on the uploaded tensors.
    pub fn launch(&mut self, kda: &Kda, stream: &Arc<CudaStream>, kernel: Kernel) -> Result<(), KdaError> {
        let d = self.dims();
        let inputs = KdaInputs {
            k: self.k.slice(..d.key_len()),
            w: self.w.slice(..d.key_len()),
            u: self.u.slice(..d.value_len()),
            gk: self.gk.slice(..d.key_len()),
            h0: self.h0.as_ref().map(|h0| h0.slice(..d.state_len())),
        };
        let mut outputs = KdaOutputs {
            h: self.h.slice_mut(..d.h_len()),
            v_new: self.v_new.slice_mut(..d.value_len()),
            ht: Some(self.ht.slice_mut(..d.state_len())),
        };
        kda.launch(stream, &self.plan, &inputs, &mut outputs, kernel)
    }

    /// Fills the outputs with a bit pattern (e.g. NaN) so that a test can see every element written.
    pub fn poison_outputs(&mut self, stream: &Arc<CudaStream>) -> Result<(), KdaError> {
        let h = vec![bf16::NAN; self.h.len()];
        let v = vec![bf16::NAN; self.v_new.len()];
        let t = vec![f32::NAN; self.ht.len()];
        stream.memcpy_htod(&h, &mut self.h)?;
        stream.memcpy_htod(&v, &mut self.v_new)?;
        stream.memcpy_htod(&t, &mut self.ht)?;
        Ok(())
    }

    /// Copies the outputs back (synchronises `stream`).
    pub fn download(&self, stream: &Arc<CudaStream>) -> Result<Outputs, KdaError> {
        let d = self.dims();
        let mut h = stream.clone_dtoh(&self.h)?;
        let mut v_new = stream.clone_dtoh(&self.v_new)?;
        let mut ht = stream.clone_dtoh(&self.ht)?;
        h.truncate(d.h_len());
        v_new.truncate(d.value_len());
        ht.truncate(d.state_len());
        Ok(Outputs { h, v_new, ht })
    }
}

fn non_empty<T: Copy>(v: &[T], fill: T) -> std::borrow::Cow<'_, [T]> {
    if v.is_empty() { vec![fill].into() } else { v.into() }
}

/// Median device time in microseconds of `repeat` launches, each timed by its own pair of CUDA
/// events (warm-up launches first; no synchronisation between the timed launches).
pub fn median_us(
    stream: &Arc<CudaStream>,
    warmup: usize,
    repeat: usize,
    mut launch: impl FnMut(usize) -> Result<(), KdaError>,
) -> Result<f64, KdaError> {
    if repeat == 0 {
        return Err(KdaError::Argument { name: "repeat", reason: "must be at least 1".into() });
    }
    for i in 0..warmup {
        launch(i)?;
    }
    let ctx = stream.context();
    let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let events: Vec<_> = (0..=repeat).map(|_| ctx.new_event(flags)).collect::<Result<_, _>>()?;
    events[0].record(stream)?;
    for i in 0..repeat {
        launch(warmup + i)?;
        events[i + 1].record(stream)?;
    }
    events[repeat].synchronize()?;
    let mut times = Vec::with_capacity(repeat);
    for pair in events.windows(2) {
        times.push(f64::from(pair[0].elapsed_ms(&pair[1])?) * 1e3);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[repeat / 2])
}

/// Bytes each copy of [`copy_bandwidth`] moves one way: large enough to leave the L2 (50 MB on an
/// H200) far behind.
pub const COPY_BENCH_BYTES: usize = 1 << 30;

/// Device-to-device copy bandwidth in bytes per second (read plus write), the median of `repeat`
/// event-timed copies of [`COPY_BENCH_BYTES`].
pub fn copy_bandwidth(stream: &Arc<CudaStream>, repeat: usize) -> Result<f64, KdaError> {
    let src = stream.alloc_zeros::<u8>(COPY_BENCH_BYTES)?;
    let mut dst = stream.alloc_zeros::<u8>(COPY_BENCH_BYTES)?;
    let us = median_us(stream, 2, repeat, |_| Ok(stream.memcpy_dtod(&src, &mut dst)?))?;
    Ok(2.0 * COPY_BENCH_BYTES as f64 / (us * 1e-6))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims() -> Dims {
        Dims::new(&Plan::from_lengths(&[200, 0, 65]), 2)
    }

    fn arg(name: &'static str, len: usize) -> TensorArg {
        TensorArg { name, len, address: 0x7000_0000, ordinal: 0 }
    }

    #[test]
    fn exact_lengths_pass() {
        let d = dims();
        for (name, len) in [("k", d.key_len()), ("gk", d.key_len()), ("u", d.value_len()), ("h", d.h_len()), ("ht", d.state_len())] {
            check_arg(&d, 0, arg(name, len)).unwrap();
        }
    }

    #[test]
    fn every_tensor_reports_its_own_shape() {
        let d = dims();
        let cases = [
            ("k", d.key_len(), "[T=265, H=2, K=128]"),
            ("w", d.key_len(), "[T=265, H=2, K=128]"),
            ("gk", d.key_len(), "[T=265, H=2, K=128]"),
            ("u", d.value_len(), "[T=265, H=2, V=128]"),
            ("v_new", d.value_len(), "[T=265, H=2, V=128]"),
            ("h0", d.state_len(), "[N=3, H=2, K=128, V=128]"),
            ("ht", d.state_len(), "[N=3, H=2, K=128, V=128]"),
            ("h", d.h_len(), "[NT=6, H=2, K=128, V=128]"),
        ];
        for (name, len, shape) in cases {
            for wrong in [len - 1, len + 1, 0] {
                let err = check_arg(&d, 0, arg(name, wrong)).unwrap_err();
                match &err {
                    KdaError::Shape { tensor, expected, expected_len, actual } => {
                        assert_eq!((*tensor, expected.as_str(), *expected_len), (name, shape, len));
                        assert_eq!(actual, &format!("{wrong} elements"));
                    }
                    other => panic!("{name}: unexpected {other}"),
                }
                assert!(err.to_string().contains(name), "{err}");
            }
        }
    }

    #[test]
    fn misaligned_and_foreign_tensors_are_rejected() {
        let d = dims();
        let mut a = arg("u", d.value_len());
        a.address += 2;
        let err = check_arg(&d, 0, a).unwrap_err();
        assert!(matches!(err, KdaError::Alignment { tensor: "u", required: TENSOR_ALIGN, .. }), "{err}");
        let mut a = arg("w", d.key_len());
        a.ordinal = 1;
        let err = check_arg(&d, 0, a).unwrap_err();
        assert!(matches!(err, KdaError::WrongDevice { tensor: "w", expected: 0, actual: 1 }), "{err}");
    }
}

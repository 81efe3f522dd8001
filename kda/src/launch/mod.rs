//! The GPU launcher: loads the embedded PTX through the CUDA driver (cudarc, loaded at run time)
//! and launches the recurrence on the caller's stream after validating every argument.
//!
//! Layers: [`Kda`] owns the loaded module; [`DevicePlan`] is a [`Plan`] and its work [`Schedule`]
//! for a head count, uploaded once; [`KdaInputs`] and [`KdaOutputs`] borrow the caller's device
//! tensors. [`Kda::launch`] allocates nothing and never synchronises, so it can be captured in a
//! CUDA graph.

mod device_plan;
mod tensor_map;
mod validate;

pub use device_plan::{DevicePlan, KdaInputs, KdaOutputs};
pub use validate::TENSOR_ALIGN;

use crate::layout::{baseline, hopper, K_DIM, V_DIM};
use crate::{ptx, Dims, KdaError};
use validate::{check_arg, TensorArg};
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;
use std::sync::Arc;
use tensor_map::TensorMapArg;

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


//! candle interop (feature `candle`): the recurrence, the whole layer and the decode step on
//! candle [`Tensor`]s of a CUDA device, their outputs returned as new candle tensors on the same
//! device (the decode step also updates the caller's pool tensor in place). Nothing is copied: the kernels read the inputs' device memory in place, on the device's own stream (so
//! they are ordered with the candle work around them), and write into fresh device buffers that
//! become the output tensors.
//!
//! Inputs must be contiguous, of the contract's dtype and shape (`docs/CONTRACT.md`; the shapes
//! below), on the device of the [`Kda`] given; anything else is a [`KdaError`] naming the tensor.
//! [`kda_on`] makes the [`Kda`] of a candle device.
//!
//! ```no_run
//! use candle_core::{DType, Device, Tensor};
//! use kda::candle::{RecurrenceTensors, kda_on, recurrence};
//! use kda::{DevicePlan, Plan};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let device = Device::new_cuda(0)?;
//! let kda = kda_on(&device)?;
//! let stream = kda::candle::stream_of(&device)?;
//! let (t, h) = (265, 4);
//! let plan = DevicePlan::new(&stream, Plan::from_cu_seqlens(&[0i32, 200, 265])?, h)?;
//! let k = Tensor::randn(0f32, 0.1, (t, h, 128), &device)?.to_dtype(DType::BF16)?;
//! let w = Tensor::randn(0f32, 0.1, (t, h, 128), &device)?.to_dtype(DType::BF16)?;
//! let u = Tensor::randn(0f32, 0.1, (t, h, 128), &device)?.to_dtype(DType::BF16)?;
//! let gk = Tensor::zeros((t, h, 128), DType::F32, &device)?;
//! let inputs = RecurrenceTensors { k: &k, w: &w, u: &u, g: None, gk: Some(&gk), h0: None };
//! let out = recurrence(&kda, &plan, &inputs)?;
//! println!("ht {:?}", out.ht.dims()); // [2, 4, 128, 128]
//! # Ok(())
//! # }
//! ```

use crate::layer::{GateInput, LayerKind};
use crate::{DecodeInputs, DecodePlan, DevicePlan, FloatInput, Kda, KdaError, KdaInputs, KdaOutputs, Kernel};
use crate::{LayerDeviceOutputs, LayerInputs};
use crate::{LayerPlan, LayerWorkspace, Tensor as Contract};
use candle_core::backend::BackendDevice;
use candle_core::cuda_backend::{CudaDType, CudaDevice, CudaStorage};
use candle_core::op::BackpropOp;
use candle_core::{DType, Device, Storage, StorageRef, Tensor};
use cudarc::driver::{CudaSlice, CudaStream, CudaView, DeviceRepr};
use half::bf16;
use std::sync::Arc;

/// The recurrence's inputs: `k` `[T, H, K]`, `w` and `u` `[T, HV, K]` / `[T, HV, V]` bf16; the
/// gates `g` `[T, HV]` and `gk` `[T, HV, K]` f32 as the plan's shape has them; `h0`
/// `[N, HV, K, V]` (or `[N, HV, V, K]` value-first) f32, or `None` for zeros.
pub struct RecurrenceTensors<'a> {
    /// `[T, H, K]` bf16.
    pub k: &'a Tensor,
    /// `[T, HV, K]` bf16.
    pub w: &'a Tensor,
    /// `[T, HV, V]` bf16.
    pub u: &'a Tensor,
    /// `[T, HV]` f32.
    pub g: Option<&'a Tensor>,
    /// `[T, HV, K]` f32.
    pub gk: Option<&'a Tensor>,
    /// `[N, HV, K, V]` f32.
    pub h0: Option<&'a Tensor>,
}

/// The recurrence's outputs, new tensors on the inputs' device.
pub struct RecurrenceOutputs {
    /// `[NT, HV, K, V]` bf16: the state entering every chunk.
    pub h: Tensor,
    /// `[T, HV, V]` bf16.
    pub v_new: Tensor,
    /// `[N, HV, K, V]` f32 final states.
    pub ht: Tensor,
}

/// The layer's inputs (`crate::layer::LayerProblem` has the same tensors): `q`, `k` `[T, H, K]`
/// and `v` `[T, HV, V]` bf16; the gate `[T, HV, K]` (KDA) or `[T, HV]` (Gated DeltaNet) and
/// `beta` `[T, HV]`, f32 or bf16 each (a model's projections go in as they come); `a_log` `[HV]`
/// and `dt_bias` `[HV, K]` or `[HV]` (with a raw gate), `h0` `[N, HV, K, V]`, f32.
pub struct LayerTensors<'a> {
    /// `[T, H, K]` bf16.
    pub q: &'a Tensor,
    /// `[T, H, K]` bf16.
    pub k: &'a Tensor,
    /// `[T, HV, V]` bf16.
    pub v: &'a Tensor,
    /// `[T, HV, K]` or `[T, HV]`, f32 or bf16.
    pub g: &'a Tensor,
    /// `[T, HV]`, f32 or bf16.
    pub beta: &'a Tensor,
    /// `[HV]` f32, exactly when the gate is raw.
    pub a_log: Option<&'a Tensor>,
    /// `[HV, K]` or `[HV]` f32, exactly when the gate is raw.
    pub dt_bias: Option<&'a Tensor>,
    /// `[N, HV, K, V]` f32, or `None` for zeros.
    pub h0: Option<&'a Tensor>,
}

/// The layer's outputs, new tensors on the inputs' device.
pub struct LayerTensorOutputs {
    /// `[T, HV, V]` bf16.
    pub o: Tensor,
    /// `[N, HV, K, V]` f32 final states.
    pub ht: Tensor,
}

/// The kernels loaded on candle `device`'s CUDA context.
pub fn kda_on(device: &Device) -> Result<Kda, KdaError> {
    Kda::new(cuda_device(device, "device")?.cuda_stream().context().clone())
}

/// candle `device`'s stream: plans and workspaces made on it are ordered with its work.
pub fn stream_of(device: &Device) -> Result<Arc<CudaStream>, KdaError> {
    Ok(cuda_device(device, "device")?.cuda_stream())
}

/// Runs the recurrence of `plan` (made for these tensors' batch and shape) on `inputs`.
pub fn recurrence(kda: &Kda, plan: &DevicePlan, inputs: &RecurrenceTensors<'_>) -> Result<RecurrenceOutputs, KdaError> {
    let device = cuda_device(inputs.k.device(), "k")?;
    let stream = device.cuda_stream();
    let dims = plan.dims();
    let shape = |t: Contract| dims.shape_of(t);
    let k = Held::new(inputs.k, "k", DType::BF16, &shape(Contract::K), device)?;
    let w = Held::new(inputs.w, "w", DType::BF16, &shape(Contract::W), device)?;
    let u = Held::new(inputs.u, "u", DType::BF16, &shape(Contract::U), device)?;
    let g = inputs.g.map(|t| Held::new(t, "g", DType::F32, &shape(Contract::G), device)).transpose()?;
    let gk = inputs.gk.map(|t| Held::new(t, "gk", DType::F32, &shape(Contract::Gk), device)).transpose()?;
    let h0 = inputs.h0.map(|t| Held::new(t, "h0", DType::F32, &shape(Contract::H0), device)).transpose()?;

    let lens = [elements(&shape(Contract::H))?, elements(&shape(Contract::VNew))?, elements(&shape(Contract::Ht))?];
    let mut h = alloc_written_by_launch::<bf16>(&stream, lens[0])?;
    let mut v_new = alloc_written_by_launch::<bf16>(&stream, lens[1])?;
    let mut ht = alloc_written_by_launch::<f32>(&stream, lens[2])?;
    let views = KdaInputs {
        k: k.view()?,
        w: w.view()?,
        u: u.view()?,
        g: g.as_ref().map(Held::view).transpose()?,
        gk: gk.as_ref().map(Held::view).transpose()?,
        h0: h0.as_ref().map(Held::view).transpose()?,
    };
    let mut outputs =
        KdaOutputs { h: h.slice_mut(..lens[0]), v_new: v_new.slice_mut(..lens[1]), ht: Some(ht.slice_mut(..lens[2])) };
    kda.launch(&stream, plan, &views, &mut outputs, Kernel::Auto)?;
    Ok(RecurrenceOutputs {
        h: wrap(h, &shape(Contract::H), device),
        v_new: wrap(v_new, &shape(Contract::VNew), device),
        ht: wrap(ht, &shape(Contract::Ht), device),
    })
}

/// Runs the whole layer of `plan` on `inputs` (`workspace` from `plan.workspace`, reused by
/// every call of the plan).
pub fn layer(
    kda: &Kda,
    plan: &LayerPlan,
    workspace: &mut LayerWorkspace,
    inputs: &LayerTensors<'_>,
) -> Result<LayerTensorOutputs, KdaError> {
    let device = cuda_device(inputs.q.device(), "q")?;
    let stream = device.cuda_stream();
    let s = plan.shape();
    let batch = plan.batch();
    let (t, n) = (batch.tokens(), batch.num_seqs());
    let (h, hv, kd, vd) = (s.heads, s.value_heads, s.key_dim, s.value_dim);
    let gate: &[usize] = match s.kind {
        LayerKind::Kda => &[t, hv, kd],
        LayerKind::Gdn => &[t, hv],
    };
    let bias: &[usize] = match s.kind {
        LayerKind::Kda => &[hv, kd],
        LayerKind::Gdn => &[hv],
    };
    let raw = !matches!(plan.options().gate, GateInput::Log);
    for (name, given) in [("a_log", inputs.a_log.is_some()), ("dt_bias", inputs.dt_bias.is_some())] {
        if given != raw {
            let reason =
                if raw { "the plan's gate is raw: give it" } else { "the plan's gate is in log space: give none" };
            return Err(KdaError::Argument { name, reason: reason.into() });
        }
    }
    let state = [n, hv, kd, vd];
    let q = Held::new(inputs.q, "q", DType::BF16, &[t, h, kd], device)?;
    let k = Held::new(inputs.k, "k", DType::BF16, &[t, h, kd], device)?;
    let v = Held::new(inputs.v, "v", DType::BF16, &[t, hv, vd], device)?;
    let g = Held::float(inputs.g, "g", gate, device)?;
    let beta = Held::float(inputs.beta, "beta", &[t, hv], device)?;
    let a_log = inputs.a_log.map(|x| Held::new(x, "a_log", DType::F32, &[hv], device)).transpose()?;
    let dt_bias = inputs.dt_bias.map(|x| Held::new(x, "dt_bias", DType::F32, bias, device)).transpose()?;
    let h0 = inputs.h0.map(|x| Held::new(x, "h0", DType::F32, &state, device)).transpose()?;

    let lens = [elements(&[t, hv, vd])?, elements(&state)?];
    let mut o = alloc_written_by_launch::<bf16>(&stream, lens[0])?;
    let mut ht = alloc_written_by_launch::<f32>(&stream, lens[1])?;
    let views = LayerInputs {
        q: q.view()?,
        k: k.view()?,
        v: v.view()?,
        g: g.float_view()?,
        beta: beta.float_view()?,
        a_log: a_log.as_ref().map(Held::view).transpose()?,
        dt_bias: dt_bias.as_ref().map(Held::view).transpose()?,
        h0: h0.as_ref().map(Held::view).transpose()?,
    };
    let mut outputs = LayerDeviceOutputs { o: o.slice_mut(..lens[0]), ht: Some(ht.slice_mut(..lens[1])) };
    kda.launch_layer(&stream, plan, &views, &mut outputs, workspace)?;
    Ok(LayerTensorOutputs { o: wrap(o, &[t, hv, vd], device), ht: wrap(ht, &state, device) })
}

/// A decode call's token inputs: `q`, `k` `[rows, H, K]` and `v` `[rows, HV, V]` bf16, the gate
/// `[rows, HV, K]` (KDA) or `[rows, HV]` (Gated DeltaNet) and `beta` `[rows, HV]` (f32 or bf16 each), `a_log`
/// `[HV]` and `dt_bias` `[HV, K]` or `[HV]` f32 with a raw gate; `rows` = the plan's sequences x
/// its tokens per sequence, sequence-major.
pub struct DecodeTensors<'a> {
    /// `[rows, H, K]` bf16.
    pub q: &'a Tensor,
    /// `[rows, H, K]` bf16.
    pub k: &'a Tensor,
    /// `[rows, HV, V]` bf16.
    pub v: &'a Tensor,
    /// `[rows, HV, K]` or `[rows, HV]`, f32 or bf16.
    pub g: &'a Tensor,
    /// `[rows, HV]`, f32 or bf16.
    pub beta: &'a Tensor,
    /// `[HV]` f32, exactly when the gate is raw.
    pub a_log: Option<&'a Tensor>,
    /// `[HV, K]` or `[HV]` f32, exactly when the gate is raw.
    pub dt_bias: Option<&'a Tensor>,
}

/// One call of the decode kernel (`Kda::launch_decode`) of `plan` on `inputs`, reading and
/// writing the states in `pool` (`[slots, HV, K, V]`, contiguous, f32 or bf16 as the plan's pool
/// says) in place, as the plan's slots say. Returns `o` `[rows, HV, V]` bf16 (zeros in a padding sequence's rows).
pub fn decode(kda: &Kda, plan: &DecodePlan, inputs: &DecodeTensors<'_>, pool: &Tensor) -> Result<Tensor, KdaError> {
    let device = cuda_device(pool.device(), "pool")?;
    let stream = device.cuda_stream();
    let s = plan.shape();
    let rows = plan.sequences() * plan.draft();
    let (h, hv, kd, vd) = (s.heads, s.value_heads, s.key_dim, s.value_dim);
    let gate: &[usize] = if s.kind == LayerKind::Kda { &[rows, hv, kd] } else { &[rows, hv] };
    let bias: &[usize] = if s.kind == LayerKind::Kda { &[hv, kd] } else { &[hv] };
    let p = plan.pool();
    let pool_dims = [p.slots, p.value_heads, p.key_dim, p.value_dim];
    let pool_dtype = match p.dtype {
        crate::pool::StateDtype::F32 => DType::F32,
        crate::pool::StateDtype::Bf16 => DType::BF16,
    };
    if pool.dtype() != pool_dtype || pool.dims() != pool_dims {
        return Err(KdaError::Argument {
            name: "pool",
            reason: format!("{:?} {:?}, expected {pool_dtype:?} {pool_dims:?}", pool.dtype(), pool.dims()),
        });
    }
    let q = Held::new(inputs.q, "q", DType::BF16, &[rows, h, kd], device)?;
    let k = Held::new(inputs.k, "k", DType::BF16, &[rows, h, kd], device)?;
    let v = Held::new(inputs.v, "v", DType::BF16, &[rows, hv, vd], device)?;
    let g = Held::float(inputs.g, "g", gate, device)?;
    let beta = Held::float(inputs.beta, "beta", &[rows, hv], device)?;
    let a_log = inputs.a_log.map(|x| Held::new(x, "a_log", DType::F32, &[hv], device)).transpose()?;
    let dt_bias = inputs.dt_bias.map(|x| Held::new(x, "dt_bias", DType::F32, bias, device)).transpose()?;
    let views = DecodeInputs {
        q: q.view()?,
        k: k.view()?,
        v: v.view()?,
        g: g.float_view()?,
        beta: beta.float_view()?,
        a_log: a_log.as_ref().map(Held::view).transpose()?,
        dt_bias: dt_bias.as_ref().map(Held::view).transpose()?,
    };
    // Zeroed, not left unfilled: a padding sequence's rows are not written.
    let len = elements(&[rows, hv, vd])?;
    let o = std::cell::RefCell::new(stream.alloc_zeros::<bf16>(len.max(1))?);
    let op = DecodeInPlace { kda, plan, inputs: &views, o: &o, stream: &stream, len, error: Default::default() };
    if let Err(e) = pool.inplace_op1(&op) {
        return Err(op.error.take().unwrap_or(KdaError::Argument { name: "pool", reason: e.to_string() }));
    }
    Ok(wrap(o.into_inner(), &[rows, hv, vd], device))
}

/// The decode call as a candle in-place op on the pool tensor (candle hands its storage over
/// mutably); the launch's typed error is kept for the caller.
struct DecodeInPlace<'a> {
    kda: &'a Kda,
    plan: &'a DecodePlan,
    inputs: &'a DecodeInputs<'a>,
    o: &'a std::cell::RefCell<CudaSlice<bf16>>,
    stream: &'a Arc<CudaStream>,
    len: usize,
    error: std::cell::RefCell<Option<KdaError>>,
}

impl candle_core::InplaceOp1 for DecodeInPlace<'_> {
    fn name(&self) -> &'static str {
        "kda-decode"
    }

    fn cpu_fwd(&self, _: &mut candle_core::CpuStorage, _: &candle_core::Layout) -> candle_core::Result<()> {
        candle_core::bail!("the decode step runs on CUDA devices only")
    }

    fn cuda_fwd(&self, storage: &mut CudaStorage, layout: &candle_core::Layout) -> candle_core::Result<()> {
        let fail = |e: KdaError| {
            let message = e.to_string();
            *self.error.borrow_mut() = Some(e);
            candle_core::Error::Msg(message)
        };
        let (start, end) = layout.contiguous_offsets().ok_or_else(|| {
            fail(KdaError::Argument { name: "pool", reason: "not contiguous: call .contiguous() first".into() })
        })?;
        let mut o = self.o.borrow_mut();
        let mut o = o.slice_mut(..self.len);
        let launched = match self.plan.pool().dtype {
            crate::pool::StateDtype::F32 => {
                let mut pool = storage.as_cuda_slice_mut::<f32>()?.slice_mut(start..end);
                self.kda.launch_decode(self.stream, self.plan, self.inputs, &mut pool, &mut o)
            }
            crate::pool::StateDtype::Bf16 => {
                let mut pool = storage.as_cuda_slice_mut::<bf16>()?.slice_mut(start..end);
                self.kda.launch_decode(self.stream, self.plan, self.inputs, &mut pool, &mut o)
            }
        };
        launched.map_err(fail)
    }
}

/// The CUDA device of `device`, or the error naming `tensor` (the argument it came from).
fn cuda_device<'a>(device: &'a Device, tensor: &'static str) -> Result<&'a CudaDevice, KdaError> {
    match device {
        Device::Cuda(d) => Ok(d),
        other => Err(KdaError::Argument {
            name: tensor,
            reason: format!("on {:?}: the kernels need a CUDA device", other.location()),
        }),
    }
}

/// An input tensor's storage, read-locked for the launch, checked for its dtype, shape, device
/// and contiguity.
struct Held<'a> {
    name: &'static str,
    dtype: DType,
    storage: StorageRef<'a>,
    /// The tensor's elements within its storage.
    range: std::ops::Range<usize>,
}

impl<'a> Held<'a> {
    fn new(
        tensor: &'a Tensor,
        name: &'static str,
        dtype: DType,
        shape: &[usize],
        device: &CudaDevice,
    ) -> Result<Self, KdaError> {
        let bad = |reason: String| KdaError::Argument { name, reason };
        if tensor.dtype() != dtype {
            return Err(bad(format!("{:?}, expected {dtype:?}", tensor.dtype())));
        }
        if tensor.dims() != shape {
            return Err(bad(format!("shape {:?}, expected {shape:?}", tensor.dims())));
        }
        match tensor.device() {
            Device::Cuda(d) if d.same_device(device) => {}
            other => return Err(bad(format!("on {:?}, not on the first tensor's device", other.location()))),
        }
        let (storage, layout) = tensor.storage_and_layout();
        let (start, end) =
            layout.contiguous_offsets().ok_or_else(|| bad("not contiguous: call .contiguous() first".into()))?;
        Ok(Self { name, dtype, storage, range: start..end })
    }

    /// [`Held::new`] for the gate or `beta`, which the kernels take in f32 or bf16.
    fn float(tensor: &'a Tensor, name: &'static str, shape: &[usize], device: &CudaDevice) -> Result<Self, KdaError> {
        match tensor.dtype() {
            dtype @ (DType::F32 | DType::BF16) => Self::new(tensor, name, dtype, shape, device),
            other => Err(KdaError::Argument { name, reason: format!("{other:?}, expected F32 or BF16") }),
        }
    }

    /// A [`Held::float`] tensor's elements as a device view in its dtype.
    fn float_view(&self) -> Result<FloatInput<'_>, KdaError> {
        Ok(if self.dtype == DType::BF16 { self.view::<bf16>()?.into() } else { self.view::<f32>()?.into() })
    }

    /// The tensor's elements as a device view.
    fn view<T: CudaDType>(&self) -> Result<CudaView<'_, T>, KdaError> {
        let bad = |reason: String| KdaError::Argument { name: self.name, reason };
        let Storage::Cuda(cuda) = &*self.storage else {
            return Err(bad("not in CUDA storage".into()));
        };
        let slice = cuda.as_cuda_slice::<T>().map_err(|e| bad(e.to_string()))?;
        Ok(slice.slice(self.range.clone()))
    }
}

/// Elements of `shape`.
fn elements(shape: &[usize]) -> Result<usize, KdaError> {
    let len = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
    len.ok_or_else(|| KdaError::TooLarge { tensor: "output", shape: format!("{shape:?}") })
}

/// A device buffer of `len` elements (one at least: the driver cannot allocate zero bytes) for an
/// output the next launch writes whole, left unfilled: a fill would cost as much memory traffic
/// as the kernel's own write of `h`.
///
/// Only for outputs the launch writes entirely (every element of `h`, `v_new`, `ht` and `o`; the
/// GPU suite poisons them and checks each one was written), and only wrapped into a tensor after
/// that launch was enqueued without error.
fn alloc_written_by_launch<T: DeviceRepr>(stream: &Arc<CudaStream>, len: usize) -> Result<CudaSlice<T>, KdaError> {
    // SAFETY: the buffer is not read before the launch that follows writes every element of its
    // first `len` (above); the spare element of an empty output is never part of a view.
    Ok(unsafe { stream.alloc::<T>(len.max(1)) }?)
}

/// `slice` as a candle tensor of `shape` on `device`, without a copy.
fn wrap<T: CudaDType>(slice: CudaSlice<T>, shape: &[usize], device: &CudaDevice) -> Tensor {
    let storage = Storage::Cuda(CudaStorage::wrap_cuda_slice(slice, device.clone()));
    Tensor::from_storage(storage, shape.to_vec(), BackpropOp::none(), false)
}

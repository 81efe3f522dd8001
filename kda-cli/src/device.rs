//! A problem's host data copied to the device, with output buffers, for tools and tests that start
//! from host data.

use cudarc::driver::{CudaSlice, CudaStream};
use kda::model::ModelView;
use kda::{DevicePlan, Dims, Kda, KdaError, KdaInputs, KdaOutputs, Kernel, Outputs, Problem, Strides, Tensor, bf16};
use std::sync::Arc;

/// A problem's inputs copied to the device (at chosen strides) with output buffers, for tools and
/// tests that start from host data.
pub struct DeviceProblem {
    /// The uploaded plan (with its shape and strides).
    pub plan: DevicePlan,
    /// `k` on the device.
    pub k: CudaSlice<bf16>,
    /// `w` on the device.
    pub w: CudaSlice<bf16>,
    /// `u` on the device.
    pub u: CudaSlice<bf16>,
    /// `g` on the device, when the shape has it.
    pub g: Option<CudaSlice<f32>>,
    /// `gk` on the device, when the shape has it.
    pub gk: Option<CudaSlice<f32>>,
    /// `h0` on the device.
    pub h0: Option<CudaSlice<f32>>,
    /// Output `h`.
    pub h: CudaSlice<bf16>,
    /// Output `v_new` (at the plan's `v_new` strides).
    pub v_new: CudaSlice<bf16>,
    /// Output `ht`.
    pub ht: CudaSlice<f32>,
}

impl DeviceProblem {
    /// Uploads KDA problem `p`, packed; see [`DeviceProblem::upload_model`].
    pub fn upload(stream: &Arc<CudaStream>, p: &Problem) -> Result<Self, KdaError> {
        p.validate()?;
        Self::upload_model(stream, &p.model_view(), Strides::PACKED)
    }

    /// Uploads `p` with its token-major tensors at `strides` (the elements between rows NaN, so
    /// that a read outside the rows shows) and allocates zeroed outputs (a one-element buffer
    /// stands in for an empty one, since the driver cannot allocate zero bytes; views passed to
    /// the launch are exact).
    pub fn upload_model(stream: &Arc<CudaStream>, p: &ModelView<'_>, strides: Strides) -> Result<Self, KdaError> {
        p.validate()?;
        let plan = DevicePlan::model(stream, p.plan.clone(), &p.shape)?.with_strides(strides)?;
        let d = plan.dims();
        let up_bf = |t: Tensor, v: &[bf16]| {
            let v = strides.scatter(&d, t, v, bf16::NAN);
            stream.clone_htod(non_empty(&v, bf16::ZERO).as_ref())
        };
        let up_f = |t: Tensor, v: &[f32]| {
            let v = strides.scatter(&d, t, v, f32::NAN);
            stream.clone_htod(non_empty(&v, 0.0).as_ref())
        };
        let v_new_len = strides.len_of(&d, Tensor::VNew)?;
        Ok(Self {
            k: up_bf(Tensor::K, p.k)?,
            w: up_bf(Tensor::W, p.w)?,
            u: up_bf(Tensor::U, p.u)?,
            g: p.g.map(|g| up_f(Tensor::G, g)).transpose()?,
            gk: p.gk.map(|gk| up_f(Tensor::Gk, gk)).transpose()?,
            h0: p.h0.map(|h0| up_f(Tensor::H0, h0)).transpose()?,
            h: stream.alloc_zeros(d.len_of(Tensor::H)?.max(1))?,
            v_new: stream.alloc_zeros(v_new_len.max(1))?,
            ht: stream.alloc_zeros(d.len_of(Tensor::Ht)?.max(1))?,
            plan,
        })
    }

    /// Sets the Hopper kernel's column blocks as `mode` says (`DevicePlan::set_columns`).
    pub fn set_columns(&mut self, stream: &Arc<CudaStream>, mode: kda::columns::ColumnMode) -> Result<(), KdaError> {
        self.plan.set_columns(stream, mode)
    }

    /// Splits the plan's long sequences as `mode` says (`DevicePlan::set_split`).
    pub fn set_split(&mut self, stream: &Arc<CudaStream>, mode: kda::split::SplitMode) -> Result<(), KdaError> {
        self.plan.set_split(stream, mode)
    }

    /// The sizes of the problem.
    pub fn dims(&self) -> Dims {
        self.plan.dims()
    }

    /// Launches `kernel` on the uploaded tensors.
    ///
    /// Fails with a shape error when a buffer was replaced by one shorter than the plan needs.
    pub fn launch(&mut self, kda: &Kda, stream: &Arc<CudaStream>, kernel: Kernel) -> Result<(), KdaError> {
        let (d, strides) = (self.dims(), *self.plan.strides());
        // Each tensor's length at the plan's strides (the states are always packed).
        let len = |t: Tensor| strides.len_of(&d, t);
        let inputs = KdaInputs {
            k: prefix(&self.k, &d, Tensor::K, len(Tensor::K)?)?,
            w: prefix(&self.w, &d, Tensor::W, len(Tensor::W)?)?,
            u: prefix(&self.u, &d, Tensor::U, len(Tensor::U)?)?,
            g: self.g.as_ref().map(|g| prefix(g, &d, Tensor::G, len(Tensor::G)?)).transpose()?,
            gk: self.gk.as_ref().map(|gk| prefix(gk, &d, Tensor::Gk, len(Tensor::Gk)?)).transpose()?,
            h0: self.h0.as_ref().map(|h0| prefix(h0, &d, Tensor::H0, len(Tensor::H0)?)).transpose()?,
        };
        let mut outputs = KdaOutputs {
            h: prefix_mut(&mut self.h, &d, Tensor::H, len(Tensor::H)?)?,
            v_new: prefix_mut(&mut self.v_new, &d, Tensor::VNew, len(Tensor::VNew)?)?,
            ht: Some(prefix_mut(&mut self.ht, &d, Tensor::Ht, len(Tensor::Ht)?)?),
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

    /// Copies the outputs back, `v_new` packed (synchronises `stream`).
    pub fn download(&self, stream: &Arc<CudaStream>) -> Result<Outputs, KdaError> {
        let d = self.dims();
        let mut h = stream.clone_dtoh(&self.h)?;
        let v_new = stream.clone_dtoh(&self.v_new)?;
        let mut ht = stream.clone_dtoh(&self.ht)?;
        h.truncate(d.h_len());
        ht.truncate(d.state_len());
        let mut v_new = self.plan.strides().gather(&d, Tensor::VNew, &v_new);
        v_new.truncate(d.value_len());
        Ok(Outputs { h, v_new, ht })
    }
}

/// The first `len` elements of `buf` (what `tensor` of sizes `d` spans).
fn prefix<'a, T>(
    buf: &'a CudaSlice<T>,
    d: &Dims,
    tensor: Tensor,
    len: usize,
) -> Result<cudarc::driver::CudaView<'a, T>, KdaError> {
    buf.try_slice(..len).ok_or_else(|| too_short(d, tensor, buf.len()))
}

/// [`prefix`] of an output buffer.
fn prefix_mut<'a, T>(
    buf: &'a mut CudaSlice<T>,
    d: &Dims,
    tensor: Tensor,
    len: usize,
) -> Result<cudarc::driver::CudaViewMut<'a, T>, KdaError> {
    let have = buf.len();
    buf.try_slice_mut(..len).ok_or_else(|| too_short(d, tensor, have))
}

fn too_short(d: &Dims, tensor: Tensor, have: usize) -> KdaError {
    KdaError::Shape {
        tensor: tensor.name(),
        expected: d.describe(tensor),
        expected_len: d.len_of(tensor).unwrap_or(usize::MAX),
        actual: format!("a buffer of {have} elements"),
    }
}

/// `v`, or one `fill` element when `v` is empty (the driver cannot allocate zero bytes).
fn non_empty<T: Copy>(v: &[T], fill: T) -> std::borrow::Cow<'_, [T]> {
    if v.is_empty() { vec![fill].into() } else { v.into() }
}

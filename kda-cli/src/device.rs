//! A problem's host data copied to the device, with output buffers, for tools and tests that start
//! from host data.

use cudarc::driver::{CudaSlice, CudaStream};
use kda::{DevicePlan, Dims, Kda, KdaError, KdaInputs, KdaOutputs, Kernel, Outputs, Problem, Tensor, bf16};
use std::sync::Arc;

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
            plan: DevicePlan::grouped(stream, p.plan.clone(), p.heads, p.value_heads)?,
            k: up_bf(&p.k)?,
            w: up_bf(&p.w)?,
            u: up_bf(&p.u)?,
            gk: up_f(&p.gk)?,
            h0: p.h0.as_deref().map(up_f).transpose()?,
            h: stream.alloc_zeros(d.len_of(Tensor::H)?.max(1))?,
            v_new: stream.alloc_zeros(d.len_of(Tensor::VNew)?.max(1))?,
            ht: stream.alloc_zeros(d.len_of(Tensor::Ht)?.max(1))?,
        })
    }

    /// The sizes of the problem.
    pub fn dims(&self) -> Dims {
        self.plan.dims()
    }

    /// Launches `kernel` on the uploaded tensors.
    ///
    /// Fails with a shape error when a buffer was replaced by one shorter than the plan needs.
    pub fn launch(&mut self, kda: &Kda, stream: &Arc<CudaStream>, kernel: Kernel) -> Result<(), KdaError> {
        let d = self.dims();
        let inputs = KdaInputs {
            k: prefix(&self.k, &d, Tensor::K)?,
            w: prefix(&self.w, &d, Tensor::W)?,
            u: prefix(&self.u, &d, Tensor::U)?,
            gk: prefix(&self.gk, &d, Tensor::Gk)?,
            h0: self.h0.as_ref().map(|h0| prefix(h0, &d, Tensor::H0)).transpose()?,
        };
        let mut outputs = KdaOutputs {
            h: prefix_mut(&mut self.h, &d, Tensor::H)?,
            v_new: prefix_mut(&mut self.v_new, &d, Tensor::VNew)?,
            ht: Some(prefix_mut(&mut self.ht, &d, Tensor::Ht)?),
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

/// The first elements of `buf`, as many as `tensor` of sizes `d` has.
fn prefix<'a, T>(buf: &'a CudaSlice<T>, d: &Dims, tensor: Tensor) -> Result<cudarc::driver::CudaView<'a, T>, KdaError> {
    let len = d.len_of(tensor)?;
    buf.try_slice(..len).ok_or_else(|| too_short(d, tensor, buf.len()))
}

/// [`prefix`] of an output buffer.
fn prefix_mut<'a, T>(
    buf: &'a mut CudaSlice<T>,
    d: &Dims,
    tensor: Tensor,
) -> Result<cudarc::driver::CudaViewMut<'a, T>, KdaError> {
    let (len, have) = (d.len_of(tensor)?, buf.len());
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

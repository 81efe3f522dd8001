//! Host-data helpers for tools and tests: a problem copied to the device, event timing and the
//! copy bandwidth.

use crate::{DevicePlan, Dims, Kda, KdaError, KdaInputs, KdaOutputs, Kernel, Outputs, Problem};
use cudarc::driver::{CudaSlice, CudaStream};
use half::bf16;
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

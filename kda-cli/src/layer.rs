//! A layer problem on the device: [`DeviceLayer`] uploads a [`LayerProblem`], launches the layer
//! forward (`kda::Kda::launch_layer`) and downloads `o` and the final states.

use cudarc::driver::{CudaSlice, CudaStream};
use kda::layer::{LayerOutputs, LayerProblem};
use kda::{Kda, KdaError, LayerDeviceOutputs, LayerInputs, LayerPlan, LayerWorkspace, bf16};
use std::sync::Arc;

/// A [`LayerProblem`]'s tensors on the device, its plan, the intermediates and the outputs.
pub struct DeviceLayer {
    /// The plan (its recurrence's column blocks and split can be set through it).
    pub plan: LayerPlan,
    workspace: LayerWorkspace,
    q: CudaSlice<bf16>,
    k: CudaSlice<bf16>,
    v: CudaSlice<bf16>,
    g: CudaSlice<f32>,
    beta: CudaSlice<f32>,
    a_log: Option<CudaSlice<f32>>,
    dt_bias: Option<CudaSlice<f32>>,
    h0: Option<CudaSlice<f32>>,
    o: CudaSlice<bf16>,
    ht: CudaSlice<f32>,
}

impl DeviceLayer {
    /// Validates `p`, plans it and copies it to the device on `stream`, with zeroed outputs.
    pub fn upload(stream: &Arc<CudaStream>, p: &LayerProblem) -> Result<Self, KdaError> {
        p.validate()?;
        let plan = LayerPlan::new(stream, p.plan.clone(), p.shape, p.options)?;
        let workspace = plan.workspace(stream)?;
        let s = p.shape;
        let (t, n) = (p.plan.tokens(), p.plan.num_seqs());
        // (One element at least: an empty batch still gets buffers.)
        let up_bf = |x: &[bf16]| if x.is_empty() { stream.alloc_zeros(1) } else { stream.clone_htod(x) };
        let up_f = |x: &[f32]| if x.is_empty() { stream.alloc_zeros(1) } else { stream.clone_htod(x) };
        Ok(Self {
            q: up_bf(&p.q)?,
            k: up_bf(&p.k)?,
            v: up_bf(&p.v)?,
            g: up_f(&p.g)?,
            beta: up_f(&p.beta)?,
            a_log: p.a_log.as_deref().map(up_f).transpose()?,
            dt_bias: p.dt_bias.as_deref().map(up_f).transpose()?,
            h0: p.h0.as_deref().map(up_f).transpose()?,
            o: stream.alloc_zeros((t * s.value_heads * s.value_dim).max(1))?,
            ht: stream.alloc_zeros((n * s.value_heads * s.key_dim * s.value_dim).max(1))?,
            plan,
            workspace,
        })
    }

    /// Enqueues the layer forward on `stream`.
    pub fn launch(&mut self, kda: &Kda, stream: &Arc<CudaStream>) -> Result<(), KdaError> {
        let s = self.plan.shape();
        let (t, n) = (self.plan.batch().tokens(), self.plan.batch().num_seqs());
        let (o_len, ht_len) = (t * s.value_heads * s.value_dim, n * s.value_heads * s.key_dim * s.value_dim);
        let inputs = LayerInputs {
            q: self.q.slice(..t * s.heads * s.key_dim),
            k: self.k.slice(..t * s.heads * s.key_dim),
            v: self.v.slice(..t * s.value_heads * s.value_dim),
            g: self.g.slice(..t * s.value_heads * s.gate_width()),
            beta: self.beta.slice(..t * s.value_heads),
            a_log: self.a_log.as_ref().map(|x| x.slice(..)),
            dt_bias: self.dt_bias.as_ref().map(|x| x.slice(..)),
            h0: self.h0.as_ref().map(|x| x.slice(..)),
        };
        let mut outputs = LayerDeviceOutputs { o: self.o.slice_mut(..o_len), ht: Some(self.ht.slice_mut(..ht_len)) };
        kda.launch_layer(stream, &self.plan, &inputs, &mut outputs, &mut self.workspace)
    }

    /// Waits for `stream` and copies `o` (as f32) and the final states back.
    pub fn download(&self, stream: &Arc<CudaStream>) -> Result<LayerOutputs, KdaError> {
        let s = self.plan.shape();
        let (t, n) = (self.plan.batch().tokens(), self.plan.batch().num_seqs());
        let o = stream.clone_dtoh(&self.o)?;
        let ht = stream.clone_dtoh(&self.ht)?;
        Ok(LayerOutputs {
            o: o[..t * s.value_heads * s.value_dim].iter().map(|x| x.to_f32()).collect(),
            ht: ht[..n * s.value_heads * s.key_dim * s.value_dim].to_vec(),
        })
    }
}

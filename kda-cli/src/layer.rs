//! A layer problem on the device: [`DeviceLayer`] uploads a [`LayerProblem`], launches the layer
//! forward (`kda::Kda::launch_layer`) and downloads `o` and the final states.

use cudarc::driver::{CudaSlice, CudaStream};
use kda::layer::{GateInput, LayerKind, LayerOptions, LayerOutputs, LayerProblem, LayerShape};
use kda::{Kda, KdaError, LayerDeviceOutputs, LayerInputs, LayerPlan, LayerWorkspace, bf16};
use std::sync::Arc;

/// A [`LayerProblem`]'s tensors on the device, its plan, the intermediates and the outputs.
pub struct DeviceLayer {
    /// The plan (its recurrence's column blocks and split can be set through it).
    pub plan: LayerPlan,
    workspace: LayerWorkspace,
    inputs: InputBuffers,
    o: CudaSlice<bf16>,
    ht: CudaSlice<f32>,
}

/// The layer's inputs on the device (each at least one element long, even for an empty batch).
struct InputBuffers {
    q: CudaSlice<bf16>,
    k: CudaSlice<bf16>,
    v: CudaSlice<bf16>,
    g: CudaSlice<f32>,
    beta: CudaSlice<f32>,
    a_log: Option<CudaSlice<f32>>,
    dt_bias: Option<CudaSlice<f32>>,
    h0: Option<CudaSlice<f32>>,
}

impl InputBuffers {
    /// Views of exactly `plan`'s lengths.
    fn views(&self, plan: &LayerPlan) -> LayerInputs<'_> {
        let s = plan.shape();
        let t = plan.batch().tokens();
        LayerInputs {
            q: self.q.slice(..t * s.heads * s.key_dim),
            k: self.k.slice(..t * s.heads * s.key_dim),
            v: self.v.slice(..t * s.value_heads * s.value_dim),
            g: self.g.slice(..t * s.value_heads * s.gate_width()),
            beta: self.beta.slice(..t * s.value_heads),
            a_log: self.a_log.as_ref().map(|x| x.slice(..)),
            dt_bias: self.dt_bias.as_ref().map(|x| x.slice(..)),
            h0: self.h0.as_ref().map(|x| x.slice(..)),
        }
    }
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
            inputs: InputBuffers {
                q: up_bf(&p.q)?,
                k: up_bf(&p.k)?,
                v: up_bf(&p.v)?,
                g: up_f(&p.g)?,
                beta: up_f(&p.beta)?,
                a_log: p.a_log.as_deref().map(up_f).transpose()?,
                dt_bias: p.dt_bias.as_deref().map(up_f).transpose()?,
                h0: p.h0.as_deref().map(up_f).transpose()?,
            },
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
        let inputs = self.inputs.views(&self.plan);
        let mut outputs = LayerDeviceOutputs { o: self.o.slice_mut(..o_len), ht: Some(self.ht.slice_mut(..ht_len)) };
        kda.launch_layer(stream, &self.plan, &inputs, &mut outputs, &mut self.workspace)
    }

    /// Writes `checkpoints` into `pool` from the chunk states the last [`DeviceLayer::launch`]
    /// left (`Kda::launch_checkpoints`, on the same stream).
    pub fn launch_checkpoints<P: kda::pool::PoolElement>(
        &self,
        kda: &Kda,
        stream: &Arc<CudaStream>,
        checkpoints: &kda::CheckpointPlan,
        pool: &mut CudaSlice<P>,
    ) -> Result<(), KdaError> {
        let inputs = self.inputs.views(&self.plan);
        kda.launch_checkpoints(stream, checkpoints, &inputs, &self.workspace, &mut pool.slice_mut(..))
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

/// The layer shapes the peers are measured on (`../shared/LAYER.md`): KDA at fixed_8192 with 64
/// heads in FlashKDA's configuration (gate activated inside with lower bound -5, L2 norm and
/// `beta`'s sigmoid inside), Gated DeltaNet at qwen3_next_8192 (16 key and 32 value heads, `g`
/// given in log space). Each as (name, shape, options, lengths).
pub fn layer_bench_shapes() -> Vec<(&'static str, LayerShape, LayerOptions, Vec<usize>)> {
    let scale = (PEER_HEAD_SIZE as f64).powf(-0.5);
    let size = PEER_HEAD_SIZE;
    vec![
        (
            "kda_fixed_8192",
            LayerShape { kind: LayerKind::Kda, heads: 64, value_heads: 64, key_dim: size, value_dim: size },
            LayerOptions { scale, l2norm_qk: true, beta_sigmoid: true, gate: GateInput::LowerBound(-5.0) },
            vec![8192],
        ),
        (
            "gdn_qwen3_next_8192",
            LayerShape { kind: LayerKind::Gdn, heads: 16, value_heads: 32, key_dim: size, value_dim: size },
            LayerOptions { scale, l2norm_qk: false, beta_sigmoid: false, gate: GateInput::Log },
            vec![8192],
        ),
    ]
}

/// The head size of the peers' layer shapes.
const PEER_HEAD_SIZE: usize = 128;

/// The layer's IO floor in bytes (`../shared/LAYER.md`): every input read once, `o` and the final
/// states written once.
pub fn layer_floor_bytes(p: &LayerProblem) -> usize {
    let s = p.shape;
    let (t, n) = (p.plan.tokens(), p.plan.num_seqs());
    let bf = 2 * (p.q.len() + p.k.len() + p.v.len() + t * s.value_heads * s.value_dim);
    let f = 4
        * (p.g.len() + p.beta.len() + p.h0.as_ref().map_or(0, Vec::len) + n * s.value_heads * s.key_dim * s.value_dim);
    bf + f
}

/// One timed layer shape: its median time over `repeat` launches after a checked first run
/// (every output finite), its IO floor at `bandwidth` bytes per second, and the first run's
/// outputs.
pub struct LayerTiming {
    /// Median of the event-timed launches, us.
    pub us: f64,
    /// The IO floor, us.
    pub floor_us: f64,
    /// `o` and the final states of the first run.
    pub outputs: LayerOutputs,
}

/// Runs `p` once (every element of `o` and `ht` must be finite), then times `repeat` launches.
pub fn time_layer(
    kda: &Kda,
    stream: &Arc<CudaStream>,
    p: &LayerProblem,
    repeat: usize,
    bandwidth: f64,
) -> Result<LayerTiming, KdaError> {
    let mut dev = DeviceLayer::upload(stream, p)?;
    dev.launch(kda, stream)?;
    let out = dev.download(stream)?;
    if let Some(bad) = out.o.iter().chain(&out.ht).position(|x| !x.is_finite()) {
        return Err(KdaError::Argument { name: "layer", reason: format!("output element {bad} is not finite") });
    }
    let us = crate::median_us(stream, 3, repeat, |_| dev.launch(kda, stream))?;
    Ok(LayerTiming { us, floor_us: layer_floor_bytes(p) as f64 / bandwidth * 1e6, outputs: out })
}

//! A layer problem on the device: [`DeviceLayer`] uploads a [`LayerProblem`], launches the layer
//! forward (`kda::Kda::launch_layer`) and downloads `o` and the final states.

use cudarc::driver::{CudaSlice, CudaStream};
use kda::layer::{GateInput, LayerKind, LayerOptions, LayerOutputs, LayerProblem, LayerShape, TokenDtypes};
use kda::{FloatBuffer, Kda, KdaError, LayerDeviceOutputs, LayerInputs, LayerPlan, LayerStage, LayerWorkspace, bf16};
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
    g: FloatBuffer,
    beta: FloatBuffer,
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

/// The lengths of `o` and the final states of `plan`'s batch.
fn output_lens(plan: &LayerPlan) -> (usize, usize) {
    let s = plan.shape();
    let (t, n) = (plan.batch().tokens(), plan.batch().num_seqs());
    (t * s.value_heads * s.value_dim, n * s.value_heads * s.key_dim * s.value_dim)
}

/// A launch's views of `plan`'s lengths: the inputs and the outputs `o`, `ht`.
fn views<'a>(
    inputs: &'a InputBuffers,
    o: &'a mut CudaSlice<bf16>,
    ht: &'a mut CudaSlice<f32>,
    plan: &LayerPlan,
) -> (LayerInputs<'a>, LayerDeviceOutputs<'a>) {
    let (o_len, ht_len) = output_lens(plan);
    (inputs.views(plan), LayerDeviceOutputs { o: o.slice_mut(..o_len), ht: Some(ht.slice_mut(..ht_len)) })
}

impl DeviceLayer {
    /// Validates `p`, plans it for `kda` (the output path it runs: [`Kda::layer_output_path`])
    /// and copies it to the device on `stream`, with zeroed outputs.
    pub fn upload(kda: &Kda, stream: &Arc<CudaStream>, p: &LayerProblem) -> Result<Self, KdaError> {
        Self::upload_on(stream, p, kda.layer_output_path(&p.shape, &p.plan)?)
    }

    /// [`DeviceLayer::upload`] with the layer's output formed as `path` says.
    pub fn upload_on(stream: &Arc<CudaStream>, p: &LayerProblem, path: kda::OutputPath) -> Result<Self, KdaError> {
        p.validate()?;
        let plan = LayerPlan::with_path(stream, p.plan.clone(), p.shape, p.options, path)?;
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
                g: FloatBuffer::upload(stream, &p.g, p.dtypes.g)?,
                beta: FloatBuffer::upload(stream, &p.beta, p.dtypes.beta)?,
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
        self.launch_staged(kda, stream, &mut |_| Ok(()))
    }

    /// [`DeviceLayer::launch`], calling `after(stage)` once each stage is enqueued
    /// (`Kda::launch_layer_staged`).
    pub fn launch_staged(
        &mut self,
        kda: &Kda,
        stream: &Arc<CudaStream>,
        after: &mut dyn FnMut(LayerStage) -> Result<(), KdaError>,
    ) -> Result<(), KdaError> {
        let (inputs, mut outputs) = views(&self.inputs, &mut self.o, &mut self.ht, &self.plan);
        kda.launch_layer_staged(stream, &self.plan, &inputs, &mut outputs, &mut self.workspace, after)
    }

    /// Enqueues the layer forward of this problem's inputs into its outputs under another plan
    /// and workspace (a plan re-planned for this batch: `LayerPlan::replan`).
    pub fn launch_with(
        &mut self,
        kda: &Kda,
        stream: &Arc<CudaStream>,
        plan: &LayerPlan,
        workspace: &mut LayerWorkspace,
    ) -> Result<(), KdaError> {
        let (inputs, mut outputs) = views(&self.inputs, &mut self.o, &mut self.ht, plan);
        kda.launch_layer(stream, plan, &inputs, &mut outputs, workspace)
    }

    /// Zeroes `o` and the final states on `stream` (before a launch whose writes are checked).
    pub fn zero_outputs(&mut self, stream: &Arc<CudaStream>) -> Result<(), KdaError> {
        stream.memset_zeros(&mut self.o)?;
        stream.memset_zeros(&mut self.ht)?;
        Ok(())
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
        let (o_len, ht_len) = output_lens(&self.plan);
        let o = stream.clone_dtoh(&self.o)?;
        let ht = stream.clone_dtoh(&self.ht)?;
        Ok(LayerOutputs { o: o[..o_len].iter().map(|x| x.to_f32()).collect(), ht: ht[..ht_len].to_vec() })
    }
}

/// One of the layer's bench shapes (`../shared/LAYER.md`, issue 21's tables).
#[derive(Clone, Debug)]
pub struct LayerBenchShape {
    /// The shape's name (recorded as `layer_<name>`).
    pub name: &'static str,
    /// Kind, heads and sizes.
    pub shape: LayerShape,
    /// The configuration the peers were measured in.
    pub options: LayerOptions,
    /// The gate's and `beta`'s dtypes in that configuration.
    pub dtypes: TokenDtypes,
    /// Sequence lengths.
    pub lengths: Vec<usize>,
    /// Short prompts, where launches and planning dominate: timed from the host over
    /// [`HOST_TIMED_CALLS`] back-to-back calls, planning included ([`time_layer_calls`]), as the
    /// peers' figures were taken, rather than by device events.
    pub host_timed: bool,
}

/// The layer shapes the peers are measured on (`../shared/LAYER.md`): KDA with the gate activated
/// inside (lower bound -5), L2 norm and `beta`'s sigmoid inside, the gate and `beta` in bf16
/// (FlashKDA's configuration: its benchmark passes the model's bf16 projections) on
/// fixed_8192 and mixed_6's lengths at 64 heads and on one 131072-token prompt at 4 heads; Gated
/// DeltaNet (`g` in log space, 16 key and 32 value heads: Qwen3-Next) on 8192 tokens and mixed_6's
/// lengths, and its 2 / 4-head shard on 65536 tokens; and the short prompts (128 and 1000 tokens,
/// KDA at 32 heads, Gated DeltaNet at 16 / 32), host-timed.
pub fn layer_bench_shapes() -> Vec<LayerBenchShape> {
    let scale = (PEER_HEAD_SIZE as f64).powf(-0.5);
    let size = PEER_HEAD_SIZE;
    let kda_options = LayerOptions { scale, l2norm_qk: true, beta_sigmoid: true, gate: GateInput::LowerBound(-5.0) };
    let gdn_options = LayerOptions { scale, l2norm_qk: false, beta_sigmoid: false, gate: GateInput::Log };
    let kda =
        |heads: usize| LayerShape { kind: LayerKind::Kda, heads, value_heads: heads, key_dim: size, value_dim: size };
    let gdn = |heads: usize| LayerShape {
        kind: LayerKind::Gdn,
        heads,
        value_heads: 2 * heads,
        key_dim: size,
        value_dim: size,
    };
    let mixed = crate::bench_shapes().into_iter().find(|s| s.0 == "mixed_6").map(|s| s.1).unwrap_or_default();
    let of = |name, shape: LayerShape, lengths: Vec<usize>, host_timed| {
        let kda = shape.kind == LayerKind::Kda;
        let options = if kda { kda_options } else { gdn_options };
        let dtypes = if kda { TokenDtypes::BF16 } else { TokenDtypes::default() };
        LayerBenchShape { name, shape, options, dtypes, lengths, host_timed }
    };
    vec![
        of("kda_fixed_8192", kda(64), vec![8192], false),
        of("kda_mixed_6", kda(64), mixed.clone(), false),
        of("kda_tp_long_h4", kda(4), vec![131072], false),
        of("gdn_qwen3_next_8192", gdn(16), vec![8192], false),
        of("gdn_qwen3_next_mixed6", gdn(16), mixed, false),
        of("gdn_tp_qwen3_next_h2", gdn(2), vec![65536], false),
        of("kda_short_128", kda(32), vec![128], true),
        of("kda_short_1000", kda(32), vec![1000], true),
        of("gdn_short_128", gdn(16), vec![128], true),
        of("gdn_short_1000", gdn(16), vec![1000], true),
    ]
}

impl LayerBenchShape {
    /// The shape's random problem from `seed` (`kda::inputs::random_layer_problem`, no initial
    /// states), the gate and `beta` in the shape's dtypes.
    pub fn problem(&self, seed: u64) -> LayerProblem {
        kda::inputs::random_layer_problem(&self.lengths, self.shape, self.options, false, seed).with_dtypes(self.dtypes)
    }
}

/// The largest relative errors of `o` and `ht` a bench shape may show against the f64 reference
/// on its sampled heads ([`reference_heads`]; issue 21's precision bound for the bench shapes).
pub const BENCH_ERROR_BOUNDS: [f64; 2] = [8e-3, 5e-3];

/// Back-to-back calls a host-timed shape's time is the mean of.
pub const HOST_TIMED_CALLS: usize = 100;

/// The key heads a large shape's f64 reference is computed on (every sequence, so every
/// sequence's last chunk): the first and the last (all of them at two heads or fewer). Heads are
/// independent, so a sample checks the same arithmetic as the whole at a fraction of the CPU
/// time ([`LayerProblem::key_heads`]).
pub fn reference_heads(shape: &LayerShape) -> Vec<usize> {
    if shape.heads <= 2 { (0..shape.heads).collect() } else { vec![0, shape.heads - 1] }
}

/// The head size of the peers' layer shapes.
const PEER_HEAD_SIZE: usize = 128;

/// The layer's IO floor in bytes (`../shared/LAYER.md`): every input read once, `o` and the final
/// states written once.
pub fn layer_floor_bytes(p: &LayerProblem) -> usize {
    let s = p.shape;
    let (t, n) = (p.plan.tokens(), p.plan.num_seqs());
    let bf = 2 * (p.q.len() + p.k.len() + p.v.len() + t * s.value_heads * s.value_dim);
    let f = 4 * (p.h0.as_ref().map_or(0, Vec::len) + n * s.value_heads * s.key_dim * s.value_dim);
    bf + f + p.g.len() * p.dtypes.g.bytes() + p.beta.len() * p.dtypes.beta.bytes()
}

/// One timed layer shape: its median time over `repeat` launches after a checked first run
/// (every output finite), its IO floor at `bandwidth` bytes per second, and the first run's
/// outputs.
pub struct LayerTiming {
    /// Median of the event-timed launches, us (a host-timed shape: the host's time per call,
    /// the batch re-planned in place each call).
    pub us: f64,
    /// A host-timed shape's time per call with the plan built once and reused, as every layer
    /// of a model reuses its batch's plan (`None` for a device-timed shape).
    pub plan_reused_us: Option<f64>,
    /// A host-timed shape's time per call with a new plan per call (`LayerPlan::with_path`, the
    /// previous one dropped) in place of `replan` (`None` for a device-timed shape).
    pub new_plan_us: Option<f64>,
    /// A host-timed shape's host time per plan built and dropped alone (`LayerPlan` with its
    /// tables uploaded, no launch), us: the planning share of `us` (`None` for a device-timed
    /// shape).
    pub planning_us: Option<f64>,
    /// Launches (device-timed) or calls (host-timed) behind `us`.
    pub timed: usize,
    /// The IO floor, us.
    pub floor_us: f64,
    /// Each stage's median device time over `timed` event-timed launches with the plan reused,
    /// us, in launch order (`kda_cli::median_stage_us`): where the layer's time goes.
    pub stages: Vec<(LayerStage, f64)>,
    /// `o` and the final states of the first run.
    pub outputs: LayerOutputs,
}

impl LayerTiming {
    /// How `us` was taken, for tables and logs.
    pub fn method(&self) -> String {
        match self.plan_reused_us {
            Some(reused) => {
                let new_plan = self.new_plan_us.map_or(String::new(), |p| format!("; a new plan per call {p:.1} us"));
                let planning = self.planning_us.map_or(String::new(), |p| format!("; planning alone {p:.1} us"));
                format!(
                    "host time per call of {}, re-planned in place ({reused:.1} us with the plan reused{new_plan}{planning})",
                    self.timed
                )
            }
            None => format!("median of {} launches", self.timed),
        }
    }

    /// The stages' times for tables: `prepare 645.2, recurrence 246.1` (us).
    pub fn stages_text(&self) -> String {
        self.stages.iter().map(|(stage, us)| format!("{} {us:.1}", stage.name())).collect::<Vec<_>>().join(", ")
    }
}

/// Uploads `p` and runs it once; every element of `o` and `ht` must be finite.
fn checked_first_run(
    kda: &Kda,
    stream: &Arc<CudaStream>,
    p: &LayerProblem,
) -> Result<(DeviceLayer, LayerOutputs), KdaError> {
    let mut dev = DeviceLayer::upload(kda, stream, p)?;
    dev.launch(kda, stream)?;
    let out = dev.download(stream)?;
    if let Some(bad) = out.o.iter().chain(&out.ht).position(|x| !x.is_finite()) {
        return Err(KdaError::Argument { name: "layer", reason: format!("output element {bad} is not finite") });
    }
    Ok((dev, out))
}

/// Runs `p` once (every element of `o` and `ht` must be finite), then times `repeat` launches.
pub fn time_layer(
    kda: &Kda,
    stream: &Arc<CudaStream>,
    p: &LayerProblem,
    repeat: usize,
    bandwidth: f64,
) -> Result<LayerTiming, KdaError> {
    let (mut dev, outputs) = checked_first_run(kda, stream, p)?;
    let us = crate::median_us(stream, 3, repeat, |_| dev.launch(kda, stream))?;
    let stages = stage_times(kda, stream, &mut dev, repeat)?;
    Ok(LayerTiming {
        us,
        plan_reused_us: None,
        new_plan_us: None,
        planning_us: None,
        timed: repeat,
        floor_us: layer_floor_bytes(p) as f64 / bandwidth * 1e6,
        stages,
        outputs,
    })
}

/// Each stage's median device time over `repeat` launches of `dev` (after one warm-up), timed
/// apart from the layer's own time so that the marks between stages add nothing to it.
fn stage_times(
    kda: &Kda,
    stream: &Arc<CudaStream>,
    dev: &mut DeviceLayer,
    repeat: usize,
) -> Result<Vec<(LayerStage, f64)>, KdaError> {
    crate::timing::median_stage_us(stream, 1, repeat, &mut |after| dev.launch_staged(kda, stream, after))
}

/// How [`time_layer_calls`] plans each call.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Planning {
    /// The batch re-planned in place (`LayerPlan::replan`: tables built and uploaded into the
    /// plan's own buffer).
    Replan,
    /// A new plan per call (`LayerPlan::with_path`), the previous one dropped.
    NewPlan,
    /// The plan built once and reused.
    Reuse,
    /// New plans built and dropped, nothing launched: the planning alone.
    Alone,
}

/// Runs `p` once (checked as [`time_layer`]), then `calls` calls back to back from the host, each
/// planning the batch afresh (`LayerPlan::replan`: its tables built and uploaded into the plan's
/// buffer) and launching the layer, and returns the host's wall time per call until the stream
/// has finished them: what a serving engine pays per layer for a short prompt, launches and
/// planning included; then the same with a new plan per call, with the plan built once and
/// reused by every call (what the other layers of a model pay), and the plans alone.
pub fn time_layer_calls(
    kda: &Kda,
    stream: &Arc<CudaStream>,
    p: &LayerProblem,
    calls: usize,
    bandwidth: f64,
) -> Result<LayerTiming, KdaError> {
    let (mut dev, outputs) = checked_first_run(kda, stream, p)?;
    let path = dev.plan.output_path();
    let mut per_call = |planning: Planning| -> Result<f64, KdaError> {
        let start = std::time::Instant::now();
        for _ in 0..calls {
            match planning {
                Planning::Replan => dev.plan.replan(stream, p.plan.clone())?,
                Planning::NewPlan => dev.plan = LayerPlan::with_path(stream, p.plan.clone(), p.shape, p.options, path)?,
                Planning::Reuse => {}
                Planning::Alone => drop(LayerPlan::with_path(stream, p.plan.clone(), p.shape, p.options, path)?),
            }
            if planning != Planning::Alone {
                dev.launch(kda, stream)?;
            }
        }
        stream.synchronize()?;
        Ok(start.elapsed().as_secs_f64() * 1e6 / calls.max(1) as f64)
    };
    // One untimed pass first: the first loop after the checked run measured 20 to 35 us per
    // call more than the same loop after it, whatever it planned (H100), so every loop timed
    // here is a warm one.
    per_call(Planning::Replan)?;
    let us = per_call(Planning::Replan)?;
    let new_plan_us = Some(per_call(Planning::NewPlan)?);
    let plan_reused_us = Some(per_call(Planning::Reuse)?);
    let planning_us = Some(per_call(Planning::Alone)?);
    let stages = stage_times(kda, stream, &mut dev, calls)?;
    Ok(LayerTiming {
        us,
        plan_reused_us,
        new_plan_us,
        planning_us,
        timed: calls,
        floor_us: layer_floor_bytes(p) as f64 / bandwidth * 1e6,
        stages,
        outputs,
    })
}

/// [`time_layer`], or [`time_layer_calls`] over [`HOST_TIMED_CALLS`] for a host-timed shape.
pub fn time_layer_shape(
    kda: &Kda,
    stream: &Arc<CudaStream>,
    (shape, p): (&LayerBenchShape, &LayerProblem),
    repeat: usize,
    bandwidth: f64,
) -> Result<LayerTiming, KdaError> {
    if shape.host_timed {
        time_layer_calls(kda, stream, p, HOST_TIMED_CALLS, bandwidth)
    } else {
        time_layer(kda, stream, p, repeat, bandwidth)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// KDA's shapes take the gate and `beta` in bf16 as FlashKDA's benchmark does, and their
    /// floor is LAYER.md's: `kda_fixed_8192` 158.4 us at the H200's 4.27 TB/s (LAYER.md: 159).
    #[test]
    fn the_kda_shapes_read_bf16_gates_and_their_floor_is_the_peers() {
        let shapes = layer_bench_shapes();
        for s in &shapes {
            let want = if s.shape.kind == LayerKind::Kda { TokenDtypes::BF16 } else { TokenDtypes::default() };
            assert_eq!(s.dtypes, want, "{}", s.name);
        }
        let fixed = shapes.iter().find(|s| s.name == "kda_fixed_8192").unwrap();
        let p = fixed.problem(1);
        assert_eq!(p.dtypes, TokenDtypes::BF16);
        let (t, h, k) = (8192, 64, 128);
        // q, k, v, o and g in bf16, beta in bf16, the final states in f32.
        let want = 5 * t * h * k * 2 + t * h * 2 + h * k * k * 4;
        assert_eq!(layer_floor_bytes(&p), want);
        assert_eq!((layer_floor_bytes(&p) as f64 / 4.27e12 * 1e6).round(), 158.0);
    }

    #[test]
    fn the_layer_bench_has_every_shape_of_the_issue_once() {
        let shapes = layer_bench_shapes();
        let names: Vec<&str> = shapes.iter().map(|s| s.name).collect();
        let want = [
            "kda_fixed_8192",
            "kda_mixed_6",
            "kda_tp_long_h4",
            "gdn_qwen3_next_8192",
            "gdn_qwen3_next_mixed6",
            "gdn_tp_qwen3_next_h2",
            "kda_short_128",
            "kda_short_1000",
            "gdn_short_128",
            "gdn_short_1000",
        ];
        assert_eq!(names, want);
        for s in &shapes {
            s.shape.validate().unwrap();
            // Short prompts are host-timed, and only they; Qwen3-Next's value heads are twice its
            // key heads; KDA's configuration activates the gate inside.
            assert_eq!(s.host_timed, s.name.contains("short"), "{}", s.name);
            assert_eq!(s.shape.group(), if s.shape.kind == LayerKind::Gdn { 2 } else { 1 }, "{}", s.name);
            assert_eq!(s.options.gate == GateInput::Log, s.shape.kind == LayerKind::Gdn, "{}", s.name);
            assert!(!s.lengths.is_empty() && s.lengths.iter().all(|&l| l > 0), "{}", s.name);
            let heads = reference_heads(&s.shape);
            assert!(heads.contains(&0) && heads.contains(&(s.shape.heads - 1)) && heads.len() <= 2, "{}", s.name);
        }
        let long = shapes.iter().find(|s| s.name == "kda_tp_long_h4").unwrap();
        assert_eq!((long.shape.heads, long.lengths.as_slice()), (4, &[131072][..]));
        let mixed = shapes.iter().find(|s| s.name == "kda_mixed_6").unwrap();
        assert_eq!(mixed.lengths.len(), 6);
    }
}

//! Serving from Rust: two prompts prefilled with the whole layer, their final states put into
//! slots of a state pool, then five decode steps that read and update each sequence's slot in
//! place, as a serving engine runs a model's linear-attention layer. At the end each slot must
//! equal the state of its whole sequence (prompt and decoded tokens) prefilled at once, by the
//! f64 definition of the layer.
//!
//! ```text
//! cargo run --release -p kda --example prefill_decode
//! ```

use kda::layer::{GateInput, LayerKind, LayerOptions, LayerProblem, LayerShape, layer_reference};
use kda::pool::PoolShape;
use kda::{
    DecodeInputs, DecodePlan, Kda, KdaError, LayerDeviceOutputs, LayerInputs, LayerPlan, StateLayout, bf16, inputs,
    rel_error,
};

/// Prompt lengths, decode steps, and the slot each sequence lives in.
const PROMPTS: [usize; 2] = [300, 70];
const STEPS: usize = 5;
const SLOTS: [i64; 2] = [3, 1];

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), KdaError> {
    let (kda, stream) = Kda::open(0)?;
    let (heads, kd, vd) = (4, 128, 128);
    let shape = LayerShape { kind: LayerKind::Kda, heads, value_heads: heads, key_dim: kd, value_dim: vd };
    let options = LayerOptions {
        scale: (kd as f64).powf(-0.5),
        l2norm_qk: true,
        beta_sigmoid: true,
        gate: GateInput::LowerBound(-5.0),
    };
    // Every token the two sequences will see: the prompts, then one token per step each.
    let whole = inputs::random_layer_problem(&PROMPTS.map(|p| p + STEPS), shape, options, false, 8);
    let state = heads * kd * vd;

    // Prefill: the whole layer over both prompts, final states into `ht`.
    let prompt = whole.select(&[(0, 0..PROMPTS[0]), (1, 0..PROMPTS[1])]);
    let plan = LayerPlan::new(&stream, prompt.plan.clone(), shape, options)?;
    let mut workspace = plan.workspace(&stream)?;
    let t = Tokens::upload(&stream, &prompt)?;
    let mut o = stream.alloc_zeros::<bf16>(prompt.v.len())?;
    let mut ht = stream.alloc_zeros::<f32>(PROMPTS.len() * state)?;
    let inputs = LayerInputs {
        q: t.q.as_view(),
        k: t.k.as_view(),
        v: t.v.as_view(),
        g: t.g.as_view().into(),
        beta: t.beta.as_view().into(),
        a_log: Some(t.a_log.as_view()),
        dt_bias: Some(t.dt_bias.as_view()),
        h0: None,
    };
    kda.launch_layer(
        &stream,
        &plan,
        &inputs,
        &mut LayerDeviceOutputs { o: o.as_view_mut(), ht: Some(ht.as_view_mut()) },
        &mut workspace,
    )?;

    // The pool: each sequence's final state copied into its slot on the device.
    let pool_shape = PoolShape::for_layer(&shape, 4, StateLayout::KeyFirst, kda::pool::StateDtype::F32);
    let mut pool = stream.alloc_zeros::<f32>(pool_shape.len()?)?;
    for (n, &slot) in SLOTS.iter().enumerate() {
        let slot = slot as usize;
        stream.memcpy_dtod(
            &ht.slice(n * state..(n + 1) * state),
            &mut pool.slice_mut(slot * state..(slot + 1) * state),
        )?;
    }

    // Decode: one plan for the batch's slots, one launch per step, the pool updated in place.
    let decode = DecodePlan::new(&stream, shape, options, pool_shape, &SLOTS, &[false; 2])?;
    let mut o_step = stream.alloc_zeros::<bf16>(PROMPTS.len() * heads * vd)?;
    for step in 0..STEPS {
        let token = whole
            .select(&[(0, PROMPTS[0] + step..PROMPTS[0] + step + 1), (1, PROMPTS[1] + step..PROMPTS[1] + step + 1)]);
        let t = Tokens::upload(&stream, &token)?;
        let inputs = DecodeInputs {
            q: t.q.as_view(),
            k: t.k.as_view(),
            v: t.v.as_view(),
            g: t.g.as_view().into(),
            beta: t.beta.as_view().into(),
            a_log: Some(t.a_log.as_view()),
            dt_bias: Some(t.dt_bias.as_view()),
        };
        kda.launch_decode(&stream, &decode, &inputs, &mut pool.as_view_mut(), &mut o_step.as_view_mut())?;
    }

    // Each slot against its whole sequence prefilled at once.
    let got = stream.clone_dtoh(&pool)?;
    let want = layer_reference(&whole)?;
    for (n, &slot) in SLOTS.iter().enumerate() {
        let slot = slot as usize;
        let e = rel_error(&got[slot * state..(slot + 1) * state], &want.ht[n * state..(n + 1) * state]);
        println!(
            "sequence {n} (slot {slot}): after {} prompt tokens and {STEPS} decode steps, within {e:.2e} of the whole sequence",
            PROMPTS[n]
        );
    }
    Ok(())
}

/// A layer problem's token tensors on the device.
struct Tokens {
    q: cudarc::driver::CudaSlice<bf16>,
    k: cudarc::driver::CudaSlice<bf16>,
    v: cudarc::driver::CudaSlice<bf16>,
    g: cudarc::driver::CudaSlice<f32>,
    beta: cudarc::driver::CudaSlice<f32>,
    a_log: cudarc::driver::CudaSlice<f32>,
    dt_bias: cudarc::driver::CudaSlice<f32>,
}

impl Tokens {
    fn upload(stream: &std::sync::Arc<cudarc::driver::CudaStream>, p: &LayerProblem) -> Result<Self, KdaError> {
        let raw = |x: &Option<Vec<f32>>| x.as_deref().expect("a raw gate has A_log and dt_bias").to_vec();
        Ok(Self {
            q: stream.clone_htod(&p.q)?,
            k: stream.clone_htod(&p.k)?,
            v: stream.clone_htod(&p.v)?,
            g: stream.clone_htod(&p.g)?,
            beta: stream.clone_htod(&p.beta)?,
            a_log: stream.clone_htod(&raw(&p.a_log))?,
            dt_bias: stream.clone_htod(&raw(&p.dt_bias))?,
        })
    }
}

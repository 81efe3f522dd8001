//! The whole KDA layer forward: `q`, `k`, `v`, the raw gate and `beta` in, `o` and the final
//! states out, as Kimi Linear calls it (the gate activated inside with a lower bound, L2-normed
//! `q` and `k`, `beta` as logits; the gate and `beta` in bf16, as the model's projections give
//! them), checked against the f64 definition of the layer.
//!
//! ```text
//! cargo run --release -p kda --example layer
//! ```

use kda::layer::{GateInput, LayerKind, LayerOptions, LayerShape, TokenDtypes, layer_reference};
use kda::{Kda, KdaError, LayerDeviceOutputs, LayerInputs, LayerPlan, Plan, bf16, inputs, rel_error};

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), KdaError> {
    let (kda, stream) = Kda::open(0)?;
    let lengths = [700, 64, 33];
    let shape = LayerShape { kind: LayerKind::Kda, heads: 8, value_heads: 8, key_dim: 128, value_dim: 128 };
    let options = LayerOptions {
        scale: 128f64.powf(-0.5),
        l2norm_qk: true,
        beta_sigmoid: true,
        gate: GateInput::LowerBound(-5.0),
    };
    // The gate and beta rounded to bf16, so that the reference sees what the GPU reads.
    let problem = inputs::random_layer_problem(&lengths, shape, options, true, 3).with_dtypes(TokenDtypes::BF16);
    let to_bf16 = |x: &[f32]| x.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>();

    let plan = LayerPlan::new(&stream, Plan::from_lengths(&lengths), shape, options)?;
    let mut workspace = plan.workspace(&stream)?; // once per plan, reused by every launch
    let (q, k, v) = (stream.clone_htod(&problem.q)?, stream.clone_htod(&problem.k)?, stream.clone_htod(&problem.v)?);
    let (g, beta) = (stream.clone_htod(&to_bf16(&problem.g))?, stream.clone_htod(&to_bf16(&problem.beta))?);
    let a_log = problem.a_log.as_deref().map(|x| stream.clone_htod(x)).transpose()?;
    let dt_bias = problem.dt_bias.as_deref().map(|x| stream.clone_htod(x)).transpose()?;
    let h0 = problem.h0.as_deref().map(|x| stream.clone_htod(x)).transpose()?;
    let mut o = stream.alloc_zeros::<bf16>(problem.v.len())?;
    let mut ht = stream.alloc_zeros::<f32>(lengths.len() * shape.value_heads * 128 * 128)?; // [N, HV, K, V]

    let inputs = LayerInputs {
        q: q.as_view(),
        k: k.as_view(),
        v: v.as_view(),
        g: g.as_view().into(), // bf16 here; an f32 view goes in the same way
        beta: beta.as_view().into(),
        a_log: a_log.as_ref().map(|x| x.as_view()),
        dt_bias: dt_bias.as_ref().map(|x| x.as_view()),
        h0: h0.as_ref().map(|x| x.as_view()),
    };
    let mut outputs = LayerDeviceOutputs { o: o.as_view_mut(), ht: Some(ht.as_view_mut()) };
    // On the stream: prepare and the recurrence forming `o` (9.x), or prepare, the recurrence, the output.
    kda.launch_layer(&stream, &plan, &inputs, &mut outputs, &mut workspace)?;

    let got_o: Vec<f32> = stream.clone_dtoh(&o)?.into_iter().map(f32::from).collect();
    let got_ht = stream.clone_dtoh(&ht)?;
    let want = layer_reference(&problem)?;
    println!(
        "o within {:.2e}, ht within {:.2e} of the f64 layer",
        rel_error(&got_o, &want.o),
        rel_error(&got_ht, &want.ht)
    );
    Ok(())
}

//! A KDA layer from candle tensors (feature `candle`): `q`, `k`, `v`, the raw gate and `beta` as a
//! model's projections would give them (all bf16; the gate and `beta` may be f32 as well), `o`
//! and the final states back as candle tensors, checked
//! against the f64 layer: within 1.5 times the error of a CPU model that rounds where the
//! kernels round (`Rounding::Kernels`), or the contract's bound where that is larger.
//!
//! ```text
//! cargo run --release -p kda --features candle --example candle_layer
//! ```

use candle_core::{Device, Tensor};
use kda::LayerPlan;
use kda::candle::{LayerTensors, kda_on, layer, stream_of};
use kda::layer::{
    GateInput, LayerKind, LayerOptions, LayerShape, Rounding, TokenDtypes, layer_chunked, layer_reference,
};
use kda::{Plan, inputs, precision, rel_error};

/// Headroom over the rounding model's error: the kernels' f32 sums run in another order.
const SLACK_OVER_MODEL: f64 = 1.5;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let device = Device::new_cuda(0)?;
    let kda = kda_on(&device)?;
    let lengths = [500, 37];
    let (h, kd) = (4, 128);
    let shape = LayerShape { kind: LayerKind::Kda, heads: h, value_heads: h, key_dim: kd, value_dim: kd };
    let options =
        LayerOptions { scale: (kd as f64).powf(-0.5), l2norm_qk: true, beta_sigmoid: true, gate: GateInput::Softplus };
    // The gate and beta rounded to bf16, so that the reference sees what the GPU reads.
    let p = inputs::random_layer_problem(&lengths, shape, options, false, 6).with_dtypes(TokenDtypes::BF16);
    let t = p.plan.tokens();
    let q = Tensor::from_slice(&p.q, (t, h, kd), &device)?;
    let k = Tensor::from_slice(&p.k, (t, h, kd), &device)?;
    let v = Tensor::from_slice(&p.v, (t, h, kd), &device)?;
    let g = Tensor::from_slice(&p.g, (t, h, kd), &device)?.to_dtype(candle_core::DType::BF16)?;
    let beta = Tensor::from_slice(&p.beta, (t, h), &device)?.to_dtype(candle_core::DType::BF16)?;
    let a_log = Tensor::from_slice(p.a_log.as_deref().expect("a raw gate"), h, &device)?;
    let dt_bias = Tensor::from_slice(p.dt_bias.as_deref().expect("a raw gate"), (h, kd), &device)?;

    let plan = LayerPlan::new(&stream_of(&device)?, Plan::from_lengths(&lengths), shape, options)?;
    let mut workspace = plan.workspace(&stream_of(&device)?)?;
    let inputs = LayerTensors {
        q: &q,
        k: &k,
        v: &v,
        g: &g,
        beta: &beta,
        a_log: Some(&a_log),
        dt_bias: Some(&dt_bias),
        h0: None,
    };
    let out = layer(&kda, &plan, &mut workspace, &inputs)?;
    println!("o {:?}, ht {:?}", out.o.dims(), out.ht.dims());

    let o: Vec<f32> = out.o.to_dtype(candle_core::DType::F32)?.flatten_all()?.to_vec1()?;
    let ht: Vec<f32> = out.ht.flatten_all()?.to_vec1()?;
    let want = layer_reference(&p)?;
    let errors = [rel_error(&o, &want.o), rel_error(&ht, &want.ht)];
    println!("o within {:.2e}, ht within {:.2e} of the f64 layer", errors[0], errors[1]);
    let model = layer_chunked(&p, Rounding::Kernels)?.errors(&want);
    for ((name, error), model) in ["o", "ht"].iter().zip(errors).zip(model) {
        let bound = (SLACK_OVER_MODEL * model).max(precision::ERROR_BOUND);
        if error >= bound {
            return Err(format!("{name}: {error:.2e} from the f64 layer, over {bound:.2e}").into());
        }
    }
    Ok(())
}

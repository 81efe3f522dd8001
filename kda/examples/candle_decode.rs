//! Decode steps from candle tensors (feature `candle`): a pool of states as a candle tensor, one
//! token per sequence per step, each step updating the sequences' slots in place and returning
//! `o`; checked against the f64 layer over the pool.
//!
//! ```text
//! cargo run --release -p kda --features candle --example candle_decode
//! ```

use candle_core::{Device, Tensor};
use kda::candle::{DecodeTensors, decode, kda_on, stream_of};
use kda::layer::{GateInput, LayerKind, LayerOptions, LayerShape};
use kda::pool::layer_reference_pooled;
use kda::pool::{PoolShape, StateDtype, slot_uses};
use kda::{DecodePlan, StateLayout, inputs, rel_error};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let device = Device::new_cuda(0)?;
    let kda = kda_on(&device)?;
    let (h, hv, kd) = (2, 4, 128);
    let shape = LayerShape { kind: LayerKind::Gdn, heads: h, value_heads: hv, key_dim: kd, value_dim: kd };
    let options =
        LayerOptions { scale: (kd as f64).powf(-0.5), l2norm_qk: true, beta_sigmoid: false, gate: GateInput::Log };
    let pool_shape = PoolShape::for_layer(&shape, 8, StateLayout::KeyFirst, StateDtype::F32);
    // Three sequences in slots 5, 1 and 6 (the last one new), and a padding entry.
    let (indices, fresh) = ([5i64, 1, -1, 6], [false, false, false, true]);
    let plan = DecodePlan::new(&stream_of(&device)?, shape, options, pool_shape, &indices, &fresh)?;
    let host_pool = inputs::random_pool(&pool_shape, 1);
    let pool = Tensor::from_slice(&host_pool, (8, hv, kd, kd), &device)?;
    let mut want_pool = host_pool.clone();
    let uses = slot_uses(&indices, &fresh, &pool_shape)?;

    for step in 0..3 {
        let p = inputs::random_layer_problem(&[1; 4], shape, options, false, 10 + step);
        let n = indices.len();
        let q = Tensor::from_slice(&p.q, (n, h, kd), &device)?;
        let k = Tensor::from_slice(&p.k, (n, h, kd), &device)?;
        let v = Tensor::from_slice(&p.v, (n, hv, kd), &device)?;
        let g = Tensor::from_slice(&p.g, (n, hv), &device)?;
        let beta = Tensor::from_slice(&p.beta, (n, hv), &device)?;
        let tokens = DecodeTensors { q: &q, k: &k, v: &v, g: &g, beta: &beta, a_log: None, dt_bias: None };
        let o = decode(&kda, &plan, &tokens, &pool)?;
        // After the first step the new sequence continues its slot like the others.
        let uses = if step == 0 { uses.clone() } else { slot_uses(&indices, &[false; 4], &pool_shape)? };
        let want: Vec<f32> = layer_reference_pooled(&p, &mut want_pool, &pool_shape, &uses)?
            .into_iter()
            .flat_map(|o| o.unwrap_or_else(|| vec![0.0; hv * kd]))
            .collect();
        let got: Vec<f32> = o.to_dtype(candle_core::DType::F32)?.flatten_all()?.to_vec1()?;
        println!("step {step}: o {:?} within {:.2e} of the f64 layer", o.dims(), rel_error(&got, &want));
    }
    let got_pool: Vec<f32> = pool.flatten_all()?.to_vec1()?;
    println!("pool after three steps within {:.2e}", rel_error(&got_pool, &want_pool));
    Ok(())
}

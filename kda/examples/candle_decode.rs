//! Decode steps from candle tensors (feature `candle`): a pool of states as a candle tensor, one
//! token per sequence per step, each step updating the sequences' slots in place and returning
//! `o`; checked against the f64 layer over the pool. The plan is rebound after the first step:
//! the new sequence then continues its slot like the others.
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

/// The bound on `o` against the f64 layer: its bf16 rounding (at most 2^-9 relative per element)
/// with headroom.
const O_BOUND: f64 = 4e-3;
/// The bound on the pooled f32 states per step taken.
const STATE_BOUND_PER_STEP: f64 = 1e-5;
/// Decode steps taken.
const STEPS: usize = 3;

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
    let stream = stream_of(&device)?;
    let mut plan = DecodePlan::new(&stream, shape, options, pool_shape, &indices, &fresh)?;
    let host_pool = inputs::random_pool(&pool_shape, 1);
    let pool = Tensor::from_slice(&host_pool, (8, hv, kd, kd), &device)?;
    let mut want_pool = host_pool.clone();
    let uses = slot_uses(&indices, &fresh, &pool_shape)?;

    for step in 0..STEPS {
        let p = inputs::random_layer_problem(&[1; 4], shape, options, false, 10 + step as u64);
        let n = indices.len();
        let q = Tensor::from_slice(&p.q, (n, h, kd), &device)?;
        let k = Tensor::from_slice(&p.k, (n, h, kd), &device)?;
        let v = Tensor::from_slice(&p.v, (n, hv, kd), &device)?;
        let g = Tensor::from_slice(&p.g, (n, hv), &device)?;
        let beta = Tensor::from_slice(&p.beta, (n, hv), &device)?;
        let tokens = DecodeTensors { q: &q, k: &k, v: &v, g: &g, beta: &beta, a_log: None, dt_bias: None };
        let o = decode(&kda, &plan, &tokens, &pool)?;
        // After the first step the new sequence continues its slot like the others: the plan's
        // tables say so from the next launch on.
        let uses = if step == 0 { uses.clone() } else { slot_uses(&indices, &[false; 4], &pool_shape)? };
        if step == 0 {
            plan.rebind(&stream, &indices, &[false; 4], None, None)?;
        }
        let want: Vec<f32> = layer_reference_pooled(&p, &mut want_pool, &pool_shape, &uses)?
            .into_iter()
            .flat_map(|o| o.unwrap_or_else(|| vec![0.0; hv * kd]))
            .collect();
        let got: Vec<f32> = o.to_dtype(candle_core::DType::F32)?.flatten_all()?.to_vec1()?;
        let error = rel_error(&got, &want);
        println!("step {step}: o {:?} within {error:.2e} of the f64 layer", o.dims());
        if error >= O_BOUND {
            return Err(format!("step {step}: o {error:.2e} from the f64 layer, over {O_BOUND:.0e}").into());
        }
    }
    let got_pool: Vec<f32> = pool.flatten_all()?.to_vec1()?;
    let (error, bound) = (rel_error(&got_pool, &want_pool), STATE_BOUND_PER_STEP * STEPS as f64);
    println!("pool after {STEPS} steps within {error:.2e}");
    if error >= bound {
        return Err(format!("the pool {error:.2e} from the f64 layer, over {bound:.0e}").into());
    }
    Ok(())
}

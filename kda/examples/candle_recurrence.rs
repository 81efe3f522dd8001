//! The recurrence on candle tensors (feature `candle`): a ragged batch built with candle on the
//! GPU, the outputs returned as candle tensors without a copy, checked against the f64 reference.
//!
//! ```text
//! cargo run --release -p kda --features candle --example candle_recurrence
//! ```
//!
//! The `candle` feature builds candle's CUDA backend, which needs nvcc (README, "candle").

use candle_core::{Device, Tensor};
use kda::candle::{RecurrenceTensors, kda_on, recurrence, stream_of};
use kda::{DevicePlan, Plan, inputs, precision, reference, rel_error};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let device = Device::new_cuda(0)?;
    let kda = kda_on(&device)?;
    let batch = Plan::from_lengths(&[300, 65, 1]);
    let heads = 4;
    // Random inputs from the library's generator, moved into candle tensors of the contract's
    // shapes (in a model they come from the layer's projections).
    let problem = inputs::try_random_problem(batch.clone(), heads, true, 4)?;
    let d = problem.dims();
    let k = Tensor::from_slice(&problem.k, d.shape_of(kda::Tensor::K), &device)?;
    let w = Tensor::from_slice(&problem.w, d.shape_of(kda::Tensor::W), &device)?;
    let u = Tensor::from_slice(&problem.u, d.shape_of(kda::Tensor::U), &device)?;
    let gk = Tensor::from_slice(&problem.gk, d.shape_of(kda::Tensor::Gk), &device)?;
    let h0 = Tensor::from_slice(problem.h0.as_deref().expect("drawn with h0"), d.shape_of(kda::Tensor::H0), &device)?;

    // The plan lives on candle's stream, so the launch is ordered with candle's own work.
    let plan = DevicePlan::new(&stream_of(&device)?, batch, heads)?;
    let inputs = RecurrenceTensors { k: &k, w: &w, u: &u, g: None, gk: Some(&gk), h0: Some(&h0) };
    let out = recurrence(&kda, &plan, &inputs)?;
    println!("h {:?}, v_new {:?}, ht {:?}", out.h.dims(), out.v_new.dims(), out.ht.dims());

    let got: Vec<f32> = out.ht.flatten_all()?.to_vec1()?;
    let error = rel_error(&got, &reference::reference(&problem)?.ht);
    println!("final states within {error:.2e} of the f64 reference");
    assert!(error < precision::bound(0.0));
    Ok(())
}

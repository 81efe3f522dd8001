//! The minimal call: the KDA recurrence on device buffers, checked against the f64 reference.
//!
//! ```text
//! cargo run --release -p kda --example recurrence
//! ```
//!
//! Two sequences of 300 and 65 tokens (the second ends in a partial chunk), 8 heads, K = V = 128,
//! from random initial states. Without a GPU it stops with the typed reason.

use kda::{DevicePlan, Kda, KdaError, KdaInputs, KdaOutputs, Kernel, Plan, inputs, precision, reference, rel_error};

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), KdaError> {
    let (kda, stream) = Kda::open(0)?;

    // The batch and its plan: built once per batch layout, reused by every launch.
    let batch = Plan::from_cu_seqlens(&[0i32, 300, 365])?;
    let heads = 8;
    let problem = inputs::try_random_problem(batch.clone(), heads, true, 1)?;
    let plan = DevicePlan::new(&stream, batch, heads)?;
    let d = plan.dims();

    // The inputs on the device (`clone_htod` copies a host slice), the outputs allocated there.
    let k = stream.clone_htod(&problem.k)?;
    let w = stream.clone_htod(&problem.w)?;
    let u = stream.clone_htod(&problem.u)?;
    let gk = stream.clone_htod(&problem.gk)?;
    let h0 = stream.clone_htod(problem.h0.as_deref().expect("drawn with h0"))?;
    let mut h = stream.alloc_zeros(d.h_len())?;
    let mut v_new = stream.alloc_zeros(d.value_len())?;
    let mut ht = stream.alloc_zeros(d.state_len())?;

    let inputs = KdaInputs {
        k: k.as_view(),
        w: w.as_view(),
        u: u.as_view(),
        g: None,
        gk: Some(gk.as_view()),
        h0: Some(h0.as_view()),
    };
    let mut outputs = KdaOutputs { h: h.as_view_mut(), v_new: v_new.as_view_mut(), ht: Some(ht.as_view_mut()) };
    // Validates every length, alignment and device, then enqueues: no allocation, no sync.
    kda.launch(&stream, &plan, &inputs, &mut outputs, Kernel::Auto)?;

    let got = stream.clone_dtoh(&ht)?;
    let want = reference::reference(&problem)?;
    let error = rel_error(&got, &want.ht);
    println!("{:?} kernel: final states within {error:.2e} of the f64 reference", kda.resolve(Kernel::Auto));
    assert!(error < precision::bound(0.0), "above the precision bound");
    Ok(())
}

//! A ragged batch from a list of prompt lengths, with a model's heads: Qwen3-Next's Gated
//! DeltaNet (16 key heads, 32 value heads, the scalar gate `g`), each sequence's final state
//! checked against the f64 reference.
//!
//! ```text
//! cargo run --release -p kda --example ragged
//! ```

use kda::model::{Gates, ModelShape};
use kda::{DevicePlan, Kda, KdaError, KdaInputs, KdaOutputs, Kernel, Plan, inputs, precision, reference, rel_error};

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), KdaError> {
    let (kda, stream) = Kda::open(0)?;

    // Prompts of any length, an empty one included; the plan's `cu_seqlens` is what FLA takes.
    let lengths = [1000, 1, 64, 0, 4097];
    let batch = Plan::from_lengths(&lengths);
    println!("cu_seqlens {:?}", batch.cu_seqlens());
    let shape = ModelShape { value_heads: 32, gates: Gates { g: true, gk: false }, ..ModelShape::kda(16) };
    let problem = inputs::try_random_model_problem(batch.clone(), shape, false, 2)?;
    let plan = DevicePlan::model(&stream, batch, &shape)?;
    let d = plan.dims();

    let view = problem.view();
    let (k, w, u) = (stream.clone_htod(view.k)?, stream.clone_htod(view.w)?, stream.clone_htod(view.u)?);
    let g = stream.clone_htod(view.g.expect("a Gated DeltaNet gate"))?;
    let mut h = stream.alloc_zeros(d.h_len())?;
    let mut v_new = stream.alloc_zeros(d.value_len())?;
    let mut ht = stream.alloc_zeros(d.state_len())?;
    let inputs = KdaInputs { k: k.as_view(), w: w.as_view(), u: u.as_view(), g: Some(g.as_view()), gk: None, h0: None };
    let mut outputs = KdaOutputs { h: h.as_view_mut(), v_new: v_new.as_view_mut(), ht: Some(ht.as_view_mut()) };
    kda.launch(&stream, &plan, &inputs, &mut outputs, Kernel::Auto)?;

    let got = stream.clone_dtoh(&ht)?;
    let want = reference::model_reference(&view)?;
    // `ht` is `[N, HV, K, V]`: one block of states per sequence.
    let per_sequence = d.value_heads * shape.state_len();
    for (n, len) in lengths.iter().enumerate() {
        let part = n * per_sequence..(n + 1) * per_sequence;
        let error = rel_error(&got[part.clone()], &want.ht[part]);
        println!("sequence {n} ({len} tokens): final state within {error:.2e} of the f64 reference");
        assert!(error < precision::bound(0.0), "sequence {n} above the precision bound");
    }
    Ok(())
}

//! What a new user of `kda` runs first: the f64 reference on a ragged batch and the whole layer
//! on the CPU, then opening the GPU, which without one must be a typed error, not a panic.

use kda::layer::{GateInput, LayerKind, LayerOptions, LayerShape, layer_reference};
use kda::{Kda, KdaError, Plan};

fn main() -> Result<(), KdaError> {
    // The recurrence: two sequences of 70 and 3 tokens, 2 heads, from an initial state.
    let plan = Plan::from_cu_seqlens(&[0i32, 70, 73])?;
    let problem = kda::inputs::try_random_problem(plan, 2, true, 7)?;
    let outputs = kda::reference::reference(&problem)?;
    let finite = outputs.ht.iter().all(|x| x.is_finite());
    println!("recurrence: {} final-state values, all finite: {finite}", outputs.ht.len());
    assert!(finite && outputs.ht.iter().any(|&x| x != 0.0));

    // The layer: Gated DeltaNet with grouped value heads, the gate given as logits.
    let shape = LayerShape { kind: LayerKind::Gdn, heads: 1, value_heads: 2, key_dim: 64, value_dim: 64 };
    let options = LayerOptions { scale: 0.125, l2norm_qk: true, beta_sigmoid: true, gate: GateInput::Softplus };
    let layer = kda::inputs::random_layer_problem(&[33, 64], shape, options, false, 11);
    let out = layer_reference(&layer)?;
    println!("layer: o has {} values, ht {}", out.o.len(), out.ht.len());
    assert!(out.o.iter().chain(&out.ht).all(|x| x.is_finite()));

    match Kda::open(0) {
        Ok((kda, _stream)) => println!("GPU: compute capability {:?}", kda.compute_capability()),
        Err(e @ (KdaError::NoDriver | KdaError::NoDevice { .. })) => println!("no GPU here, as a typed error: {e}"),
        Err(e) => return Err(e),
    }
    Ok(())
}

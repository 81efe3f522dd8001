//! Tensors from a safetensors file written by PyTorch (`safetensors.torch.save_file`, the layout
//! of `docs/CONTRACT.md`: `k`, `w`, `u`, `gk`, optional `h0` and `cu_seqlens`), run on the GPU,
//! the outputs written to another file, and compared with the file's own when it holds them.
//!
//! ```text
//! cargo run --release -p kda --example safetensors -- tests/fixtures/ragged_h3.safetensors /tmp/out.safetensors
//! ```

use kda::{DevicePlan, Kda, KdaError, KdaInputs, KdaOutputs, Kernel, Outputs, io, rel_error};
use std::path::PathBuf;

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), KdaError> {
    let mut args = std::env::args_os().skip(1).map(PathBuf::from);
    let (Some(input), Some(output)) = (args.next(), args.next()) else {
        eprintln!("usage: safetensors IN.safetensors OUT.safetensors");
        std::process::exit(2);
    };
    // Every tensor's dtype and shape is checked against the contract; a wrong one is a typed
    // error naming the tensor.
    let (problem, expected) = io::read_problem(&input)?;
    let (kda, stream) = Kda::open(0)?;
    let plan = DevicePlan::new(&stream, problem.plan.clone(), problem.heads)?;
    let d = plan.dims();

    let (k, w, u) = (stream.clone_htod(&problem.k)?, stream.clone_htod(&problem.w)?, stream.clone_htod(&problem.u)?);
    let gk = stream.clone_htod(&problem.gk)?;
    let h0 = problem.h0.as_deref().map(|h0| stream.clone_htod(h0)).transpose()?;
    let mut h = stream.alloc_zeros(d.h_len())?;
    let mut v_new = stream.alloc_zeros(d.value_len())?;
    let mut ht = stream.alloc_zeros(d.state_len())?;
    let inputs = KdaInputs {
        k: k.as_view(),
        w: w.as_view(),
        u: u.as_view(),
        g: None,
        gk: Some(gk.as_view()),
        h0: h0.as_ref().map(|h0| h0.as_view()),
    };
    let mut outputs = KdaOutputs { h: h.as_view_mut(), v_new: v_new.as_view_mut(), ht: Some(ht.as_view_mut()) };
    kda.launch(&stream, &plan, &inputs, &mut outputs, Kernel::Auto)?;

    let got = Outputs { h: stream.clone_dtoh(&h)?, v_new: stream.clone_dtoh(&v_new)?, ht: stream.clone_dtoh(&ht)? };
    // Written to a temporary file and renamed into place: never a half-written output.
    io::write_outputs(&output, &got, &d)?;
    println!("{} sequences, {} heads: wrote {}", problem.plan.num_seqs(), problem.heads, output.display());
    if let Some(want) = expected {
        let errors = [("h", rel_error(&got.h, &want.h)), ("v_new", rel_error(&got.v_new, &want.v_new))];
        let errors = errors.into_iter().chain([("ht", rel_error(&got.ht, &want.ht))]);
        for (name, error) in errors {
            println!("{name}: {error:.2e} from the file's outputs");
        }
    }
    Ok(())
}

//! The portable kernels' own source, run on the host by `kda_kernel::sim` (one host thread per
//! GPU thread) and checked against the f64 references: the kernels' logic (indexing, tails,
//! barriers, fragment layouts) is tested on every CI run, without a GPU.

use half::bf16;
use kda::inputs::random_problem;
use kda::layer::{LayerKind, LayerOutputs, LayerProblem, chunk_table, layer_reference};
use kda::model::ModelView;
use kda::reference::{model_reference, reference};
use kda::{Outputs, Plan, Problem};
use kda_kernel::layout::{baseline, layer};
use kda_kernel::sim::{self, Launch, ptr, ptr_mut};
use kda_tests::{POISON_BF16, POISON_F32, assert_close, layer_bounds};

/// Outputs of `p`'s sizes, every element poisoned.
fn poisoned_outputs(p: &Problem) -> Outputs {
    let d = p.dims();
    Outputs {
        h: vec![bf16::from_bits(POISON_BF16); d.h_len()],
        v_new: vec![bf16::from_bits(POISON_BF16); d.value_len()],
        ht: vec![f32::from_bits(POISON_F32); d.state_len()],
    }
}

/// Asserts no element of `out` still holds the poison.
fn assert_all_written(case: &str, out: &Outputs) {
    let h = out.h.iter().filter(|x| x.to_bits() == POISON_BF16).count();
    let v = out.v_new.iter().filter(|x| x.to_bits() == POISON_BF16).count();
    let ht = out.ht.iter().filter(|x| x.to_bits() == POISON_F32).count();
    assert_eq!([h, v, ht], [0; 3], "{case}: elements of h, v_new, ht never written");
}

/// The baseline kernel on `p`, as the launcher runs it: one CTA per (sequence, value head,
/// column block).
fn run_baseline(p: &Problem) -> Outputs {
    let d = p.dims();
    let seqs = p.plan.descriptors();
    let h0 = p.h0.as_deref().map_or(sim::Ptr::null(), ptr);
    let mut out = poisoned_outputs(p);
    let (k, w, u, gk) = (ptr(&p.k), ptr(&p.w), ptr(&p.u), ptr(&p.gk));
    let (h, v_new, ht, seqs_ptr) = (ptr_mut(&mut out.h), ptr_mut(&mut out.v_new), ptr_mut(&mut out.ht), ptr(&seqs));
    let launch = Launch {
        grid: d.seqs * d.value_heads * baseline::COL_BLOCKS,
        block: baseline::THREADS,
        shared_bytes: baseline::SMEM_BYTES,
    };
    // SAFETY: every buffer has the contract's size for this plan and these heads.
    let run = unsafe {
        sim::launch(launch, || {
            kda_kernel::baseline::kda_fwd_h_baseline(
                k.ptr() as *const u16,
                w.ptr() as *const u16,
                u.ptr() as *const u16,
                gk.ptr(),
                h0.ptr(),
                h.mut_ptr() as *mut u16,
                v_new.mut_ptr() as *mut u16,
                ht.mut_ptr(),
                seqs_ptr.ptr(),
                d.value_heads as u32,
                d.heads as u32,
            )
        })
    };
    run.unwrap_or_else(|e| panic!("baseline: {e}"));
    out
}

#[test]
fn the_baseline_kernel_matches_the_reference_on_ragged_tails() {
    // Lengths around the chunk: one token, a partial chunk, a whole one, one past, two and a bit.
    let p = random_problem(Plan::from_lengths(&[1, 63, 64, 65, 130]), 2, true, 11);
    let out = run_baseline(&p);
    assert_all_written("baseline ragged", &out);
    assert_close("baseline ragged", out.errors(&reference(&p).unwrap()));
}

/// A launch of the layer kernels over `p`'s chunk table: one CTA per (chunk, value head).
fn layer_launch(p: &LayerProblem, shared_bytes: usize) -> Launch {
    Launch { grid: p.plan.chunks() * p.shape.value_heads, block: layer::THREADS, shared_bytes }
}

/// The layer on the simulator as the launcher runs it: the prepare kernel, the recurrence (here
/// the f64 reference of the contract, on the prepare kernel's bf16 outputs), the output kernel.
fn run_layer(p: &LayerProblem) -> LayerOutputs {
    let s = p.shape;
    let (t, hv, kd, vd, gw) = (p.plan.tokens(), s.value_heads, s.key_dim, s.value_dim, s.gate_width());
    let rec = s.recurrence_shape();
    let codes = p.options.codes();
    let dims = [s.heads, hv, kd, vd, gw].map(|x| x as u32);
    let table = chunk_table(&p.plan).unwrap();
    let poison_bf = bf16::from_bits(POISON_BF16);
    let (mut k_rec, mut w, mut u) =
        (vec![poison_bf; t * rec.heads * kd], vec![poison_bf; t * hv * kd], vec![poison_bf; t * hv * vd]);
    let mut gate = vec![f32::from_bits(POISON_F32); t * hv * gw];
    let opt = |x: &Option<Vec<f32>>| x.as_deref().map_or(sim::Ptr::null(), ptr);
    let (q_in, k_in, v_in, g_in, beta) = (ptr(&p.q), ptr(&p.k), ptr(&p.v), ptr(&p.g), ptr(&p.beta));
    let (a_log, dt_bias, chunks) = (opt(&p.a_log), opt(&p.dt_bias), ptr(&table));
    let (k_out, w_out, u_out, gate_out) = (ptr_mut(&mut k_rec), ptr_mut(&mut w), ptr_mut(&mut u), ptr_mut(&mut gate));
    // SAFETY: every buffer holds the layer's rows for this plan and shape; the table was built
    // from the same plan.
    unsafe {
        sim::launch(layer_launch(p, layer::PREPARE_SMEM_BYTES), || {
            kda_kernel::layer::kda_layer_prepare(
                k_in.ptr() as *const u16,
                v_in.ptr() as *const u16,
                g_in.ptr(),
                beta.ptr(),
                a_log.ptr(),
                dt_bias.ptr(),
                chunks.ptr(),
                k_out.mut_ptr() as *mut u16,
                w_out.mut_ptr() as *mut u16,
                u_out.mut_ptr() as *mut u16,
                gate_out.mut_ptr(),
                dims[0],
                dims[1],
                dims[2],
                dims[3],
                dims[4],
                codes.options,
                codes.gate_mode,
                codes.lower_bound_bits,
            )
        })
    }
    .unwrap_or_else(|e| panic!("prepare: {e}"));
    for (name, written) in [("k_rec", &k_rec), ("w", &w), ("u", &u)] {
        assert!(written.iter().all(|x| x.to_bits() != POISON_BF16), "prepare left {name} unwritten");
    }
    assert!(gate.iter().all(|x| x.to_bits() != POISON_F32), "prepare left the gate unwritten");
    let is_kda = s.kind == LayerKind::Kda;
    let view = ModelView {
        plan: &p.plan,
        shape: rec,
        k: &k_rec,
        w: &w,
        u: &u,
        g: (!is_kda).then_some(&gate[..]),
        gk: is_kda.then_some(&gate[..]),
        h0: p.h0.as_deref(),
    };
    let recurrence = model_reference(&view).unwrap();
    let mut o = vec![poison_bf; t * hv * vd];
    let (h, v_new, o_out) = (ptr(&recurrence.h), ptr(&recurrence.v_new), ptr_mut(&mut o));
    let gate_in = ptr(&gate);
    // SAFETY: as above; `h` holds a state per (chunk, value head) in the table's order.
    unsafe {
        sim::launch(layer_launch(p, layer::OUTPUT_SMEM_BYTES), || {
            kda_kernel::layer::kda_layer_output(
                q_in.ptr() as *const u16,
                k_in.ptr() as *const u16,
                gate_in.ptr(),
                h.ptr() as *const u16,
                v_new.ptr() as *const u16,
                o_out.mut_ptr() as *mut u16,
                chunks.ptr(),
                dims[0],
                dims[1],
                dims[2],
                dims[3],
                dims[4],
                codes.options,
                codes.scale_bits,
            )
        })
    }
    .unwrap_or_else(|e| panic!("output: {e}"));
    assert!(o.iter().all(|x| x.to_bits() != POISON_BF16), "the output kernel left o unwritten");
    LayerOutputs { o: o.iter().map(|x| x.to_f32()).collect(), ht: recurrence.ht }
}

/// The layer's token-parallel kernels on the GPU suite's random layers (both kinds, grouped
/// heads, every gate form and option, partial chunks, empty sequences) against the f64
/// definition, within the bounds the GPU suite holds the whole layer to.
#[test]
fn the_layer_kernels_match_the_definition() {
    for (name, p) in kda_tests::random_layer_cases() {
        let want = layer_reference(&p).unwrap();
        let errs = run_layer(&p).errors(&want);
        let bounds = layer_bounds(&p, &want);
        println!("{name}: o {:.2e} ht {:.2e}, bounds {bounds:?}", errs[0], errs[1]);
        assert!(errs.iter().zip(&bounds).all(|(e, b)| e <= b), "{name}: {errs:?} over {bounds:?}");
    }
}

//! The GPU suite: every kernel against the f64 reference on the golden fixtures, every bench
//! shape (docs/CONTRACT.md#reference-shapes) and proptest-generated ragged batches, with guarded
//! and poisoned buffers, each output held to its precision bound (docs/CONTRACT.md#precision).
//!
//! Run with `cargo test -p kda-tests --release --features gpu --test gpu` on a machine with an
//! NVIDIA GPU (sm_80 or newer). Without a GPU every test here fails with the reason.
#![cfg(feature = "gpu")]

use kda::{Kernel, Plan, inputs, io, reference};
use kda_tests::{Gpu, assert_within_floor, errors, fixture, ragged_lengths, run_guarded};
use proptest::prelude::*;
use std::sync::Mutex;

/// The largest error seen per output over a test, printed for bench/RESULTS.md.
static WORST: Mutex<[f64; 3]> = Mutex::new([0.0; 3]);

fn record(case: &str, errs: [f64; 3]) {
    record_against_floor(case, errs, [0.0; 3]);
}

/// Records `errs` and checks each against its `kda::precision::bound` given `floor`, the error of
/// the f32 emulation (`reference::reference_f32`) of each output.
fn record_against_floor(case: &str, errs: [f64; 3], floor: [f64; 3]) {
    println!("{case}: rel err h {:.2e}  v_new {:.2e}  ht {:.2e}", errs[0], errs[1], errs[2]);
    {
        let mut w = WORST.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        for (worst, e) in w.iter_mut().zip(errs) {
            *worst = worst.max(e);
        }
    }
    assert_within_floor(case, errs, floor);
}

fn kernels() -> [Kernel; 2] {
    [Kernel::Auto, Kernel::Baseline]
}

#[test]
fn golden_fixtures() {
    let gpu = Gpu::open();
    for name in kda_tests::FIXTURES {
        let (p, golden) = io::read_problem(&fixture(name)).unwrap();
        let golden = golden.expect("fixture holds outputs");
        let want = reference::reference(&p).unwrap();
        for kernel in kernels() {
            let out = run_guarded(&gpu, &p, kernel);
            record(&format!("{name} {kernel:?} vs reference"), errors(&out, &want));
            record(&format!("{name} {kernel:?} vs FLA"), errors(&out, &golden));
        }
    }
}

#[test]
fn bench_shapes() {
    let gpu = Gpu::open();
    for (name, lengths) in kda_cli::bench_shapes() {
        let p = inputs::random_problem(Plan::from_lengths(&lengths), inputs::REFERENCE_HEADS, true, 7);
        let want = reference::reference(&p).unwrap();
        let floor = errors(&reference::reference_f32(&p).unwrap(), &want);
        println!("{name}: f32 rounding floor h {:.2e}  v_new {:.2e}  ht {:.2e}", floor[0], floor[1], floor[2]);
        for kernel in kernels() {
            let out = run_guarded(&gpu, &p, kernel);
            record_against_floor(&format!("{name} {kernel:?}"), errors(&out, &want), floor);
        }
    }
    println!("bench shapes, worst: {:?}", WORST.lock().unwrap_or_else(|poisoned| poisoned.into_inner()));
}

#[test]
fn empty_and_degenerate_batches() {
    let gpu = Gpu::open();
    for lengths in [vec![], vec![0], vec![0, 0, 3], vec![1], vec![64], vec![65], vec![63, 0, 129]] {
        for with_h0 in [true, false] {
            let p = inputs::random_problem(Plan::from_lengths(&lengths), 2, with_h0, 11);
            let want = reference::reference(&p).unwrap();
            for kernel in kernels() {
                let out = run_guarded(&gpu, &p, kernel);
                record(&format!("{lengths:?} h0={with_h0} {kernel:?}"), errors(&out, &want));
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn ragged_batches(lengths in ragged_lengths(), heads in 1usize..=3, with_h0: bool, seed: u64) {
        let gpu = GPU.get_or_init(Gpu::open);
        let p = inputs::random_problem(Plan::from_lengths(&lengths), heads, with_h0, seed);
        let want = reference::reference(&p).unwrap();
        for kernel in kernels() {
            let out = run_guarded(gpu, &p, kernel);
            record(&format!("{lengths:?} H={heads} h0={with_h0} {kernel:?}"), errors(&out, &want));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]
    /// Grouped value heads (HV = 2H or 3H): each value head reads its group's key head.
    #[test]
    fn grouped_value_heads(lengths in ragged_lengths(), heads in 1usize..=2, group in 2usize..=3, with_h0: bool, seed: u64) {
        let gpu = GPU.get_or_init(Gpu::open);
        let plan = Plan::from_lengths(&lengths);
        let p = inputs::try_random_grouped_problem(plan, heads, heads * group, with_h0, seed).unwrap();
        let want = reference::reference(&p).unwrap();
        for kernel in kernels() {
            let out = run_guarded(gpu, &p, kernel);
            record(&format!("{lengths:?} H={heads} HV={} h0={with_h0} {kernel:?}", heads * group), errors(&out, &want));
        }
    }
}

static GPU: std::sync::OnceLock<Gpu> = std::sync::OnceLock::new();

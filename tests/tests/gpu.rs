//! The GPU suite: every kernel against the f64 reference on the golden fixtures, every bench
//! shape (docs/CONTRACT.md#reference-shapes) and proptest-generated ragged batches, with guarded
//! and poisoned buffers, each output held to its precision bound (docs/CONTRACT.md#precision).
//!
//! Run with `cargo test -p kda-tests --release --features gpu --test gpu` on a machine with an
//! NVIDIA GPU (sm_80 or newer). Without a GPU every test here fails with the reason.
#![cfg(feature = "gpu")]

use kda::columns::{ColumnMode, Columns};
use kda::model::{Gates, ModelShape, StateLayout};
use kda::split::SplitMode;
use kda::{KdaError, Kernel, Outputs, Plan, Strides, inputs, io, reference};
use kda_tests::{
    Gpu, LAYER_BOUND_OVER_FLA, LAYER_FIXTURES, SPLIT_BOUND, SplitErrors, assert_within_floor, fixture, ragged_lengths,
    run_columns_guarded, run_guarded, run_model_guarded, run_split_guarded,
};
use proptest::prelude::*;
use std::sync::Mutex;

#[path = "gpu/stress.rs"]
mod stress;

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

fn kernels() -> [Kernel; 3] {
    [Kernel::Auto, Kernel::Baseline, Kernel::Portable]
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
            record(&format!("{name} {kernel:?} vs reference"), out.errors(&want));
            record(&format!("{name} {kernel:?} vs FLA"), out.errors(&golden));
        }
    }
}

#[test]
fn bench_shapes() {
    let gpu = Gpu::open();
    for (name, lengths) in kda_cli::bench_shapes() {
        let p = inputs::random_problem(Plan::from_lengths(&lengths), inputs::REFERENCE_HEADS, true, 7);
        let want = reference::reference(&p).unwrap();
        let floor = reference::reference_f32(&p).unwrap().errors(&want);
        println!("{name}: f32 rounding floor h {:.2e}  v_new {:.2e}  ht {:.2e}", floor[0], floor[1], floor[2]);
        for kernel in kernels() {
            let out = run_guarded(&gpu, &p, kernel);
            record_against_floor(&format!("{name} {kernel:?}"), out.errors(&want), floor);
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
                record(&format!("{lengths:?} h0={with_h0} {kernel:?}"), out.errors(&want));
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
            record(&format!("{lengths:?} H={heads} h0={with_h0} {kernel:?}"), out.errors(&want));
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
            record(&format!("{lengths:?} H={heads} HV={} h0={with_h0} {kernel:?}", heads * group), out.errors(&want));
        }
    }
}

/// Whether the Hopper kernel runs `shape` (`K` = 64 or 128; the GPU suite's device is a Hopper
/// GPU).
fn hopper_runs(shape: &ModelShape) -> bool {
    kda::layout::hopper::KEY_DIMS.contains(&shape.key_dim)
}

/// Whether the baseline kernel runs `shape`: KDA's slice only.
/// Every way of loading the kernels (`KdaOptions`: the PTX or the shipped cubin; the device's
/// module or the portable one that every other GPU takes) runs the golden fixtures within the
/// bound with each kernel it loads; the portable module has no Hopper kernel, and
/// `KdaOptions::auto` decides what `Kernel::Auto` runs.
#[test]
fn every_load_option_runs_the_fixtures() {
    use kda::{Code, Kda, KdaOptions, Module, ModuleCode};
    let gpu = Gpu::open();
    let ctx = gpu.kda.context().clone();
    for code in [Code::Ptx, Code::Cubin] {
        for module in [Module::Native, Module::Portable] {
            let kda = Kda::with_options(ctx.clone(), KdaOptions { code, module, auto: Kernel::Auto }).unwrap();
            let loaded = kda.module_code();
            println!("{code:?} {module:?}: kernels from {loaded}");
            if code == Code::Cubin && !matches!(loaded, ModuleCode::Cubin(_)) {
                println!("  NOTE: no cubin was taken for this device (none shipped for it, or the driver refused it)");
            }
            let with = Gpu { kda, stream: gpu.stream.clone() };
            let auto = with.kda.resolve(Kernel::Auto);
            assert_eq!(
                auto == Kernel::Hopper,
                module == Module::Native && gpu.kda.resolve(Kernel::Auto) == Kernel::Hopper
            );
            for name in kda_tests::FIXTURES {
                let (p, _) = io::read_problem(&fixture(name)).unwrap();
                let want = reference::reference(&p).unwrap();
                for kernel in [Kernel::Auto, Kernel::Baseline, Kernel::Portable] {
                    let out = run_guarded(&with, &p, kernel);
                    record(&format!("{name} {code:?} {module:?} {kernel:?}"), out.errors(&want));
                }
            }
        }
    }
    let kda = Kda::with_options(ctx, KdaOptions { auto: Kernel::Baseline, ..KdaOptions::default() }).unwrap();
    assert_eq!(kda.resolve(Kernel::Auto), Kernel::Baseline);
}

fn baseline_runs(shape: &ModelShape) -> bool {
    *shape == ModelShape { value_heads: shape.value_heads, ..ModelShape::kda(shape.heads) }
}

/// The layer and the model fixtures on the portable module (what every GPU but Hopper loads),
/// here on the H200: FLA's layer fixtures within the bound over FLA's error on both output paths
/// (the fused one on the portable kernel, forced: `Auto` gives these few-chain batches the
/// separate one), each model fixture through `Kernel::Auto` (the baseline for KDA's slice, the
/// portable kernel for the rest).
#[test]
fn the_portable_module_runs_the_layer_and_every_model() {
    use kda::{Kda, KdaOptions, Module};
    let gpu = Gpu::open();
    let options = KdaOptions { module: Module::Portable, ..KdaOptions::default() };
    let kda = Kda::with_options(gpu.kda.context().clone(), options).unwrap();
    let portable = Gpu { kda, stream: gpu.stream.clone() };
    for name in LAYER_FIXTURES {
        let (p, golden) = kda::layer::read_layer_fixture(&fixture(&format!("layer/{name}"))).unwrap();
        for path in kda_tests::output_paths(&portable, &p) {
            let out = kda_tests::run_layer_guarded_on(&portable, &p, StateLayout::KeyFirst, path);
            let errs = out.unwrap().errors(&golden.reference);
            let [fo, fh] = golden.fla_errors;
            println!(
                "portable module, layer {name} {path:?}: o {:.2e} ({:.2}x FLA's) ht {:.2e}",
                errs[0],
                errs[0] / fo,
                errs[1]
            );
            let within = errs[0] <= LAYER_BOUND_OVER_FLA * fo && errs[1] <= LAYER_BOUND_OVER_FLA * fh;
            assert!(within, "{name} {path:?}: {errs:?}");
        }
    }
    for name in kda_tests::MODEL_FIXTURES {
        let (p, _) = io::read_model_problem(&kda_tests::model_fixture(name)).unwrap();
        let want = reference::model_reference(&p.view()).unwrap();
        let out = run_model_guarded(&portable, &p.view(), Strides::PACKED, Kernel::Auto).unwrap();
        record(&format!("portable module, {name}"), out.errors(&want));
    }
}

/// Whether the portable tensor-core kernel runs `shape`: its key sizes, `V` in whole column
/// blocks.
fn portable_runs(shape: &ModelShape) -> bool {
    use kda::layout::portable::{BV, KEY_DIMS};
    KEY_DIMS.contains(&shape.key_dim) && shape.value_dim.is_multiple_of(BV)
}

/// The portable tensor-core kernel on the GPU over the simulator's cases
/// (`kda_tests::portable_model_cases`: every gate kind, state layout and key size, grouped heads,
/// partial chunks, strided rows), outputs poisoned and guarded, against the f64 reference.
#[test]
fn portable_kernel_runs_the_generalized_recurrence() {
    let gpu = Gpu::open();
    let mut failures = Vec::new();
    for case in kda_tests::portable_model_cases() {
        let p = case.problem.view();
        let want = reference::model_reference(&p).unwrap();
        let floor = reference::model_reference_f32(&p).unwrap().errors(&want);
        let errs = run_model_guarded(&gpu, &p, case.strides, Kernel::Portable).unwrap().errors(&want);
        let bounds = case.bounds(floor);
        println!("{}: h {:.2e} v_new {:.2e} ht {:.2e}", case.name, errs[0], errs[1], errs[2]);
        if errs.iter().zip(&bounds).any(|(e, b)| e.is_nan() || e >= b) {
            failures.push(case.name);
        }
    }
    assert!(failures.is_empty(), "{} cases out of bounds: {failures:#?}", failures.len());
}

/// The model fixtures (FLA's outputs): each kernel that runs the shape matches the reference and
/// FLA; each that does not refuses it with a typed error naming what it lacks.
#[test]
fn model_fixtures() {
    let gpu = Gpu::open();
    for name in kda_tests::MODEL_FIXTURES {
        let (p, golden) = io::read_model_problem(&kda_tests::model_fixture(name)).unwrap();
        let golden = golden.expect("fixture holds outputs");
        let want = reference::model_reference(&p.view()).unwrap();
        let kernels = [
            (Kernel::Auto, hopper_runs(&p.shape)),
            (Kernel::Baseline, baseline_runs(&p.shape)),
            (Kernel::Portable, portable_runs(&p.shape)),
        ];
        for (kernel, runs) in kernels {
            match run_model_guarded(&gpu, &p.view(), Strides::PACKED, kernel) {
                Ok(out) => {
                    assert!(runs, "{name} {kernel:?}: ran a shape it does not support");
                    record(&format!("{name} {kernel:?} vs reference"), out.errors(&want));
                    record(&format!("{name} {kernel:?} vs FLA"), out.errors(&golden));
                }
                Err(e) => {
                    assert!(!runs, "{name} {kernel:?}: {e}");
                    assert!(matches!(e, KdaError::Unsupported { .. }), "{name} {kernel:?}: {e}");
                    println!("{name} {kernel:?}: refused: {e}");
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, failure_persistence: None, ..ProptestConfig::default() })]
    /// Every gate kind x head grouping x state layout x key size (64, 128, 256) x value size (64
    /// to 512) x strided views x column blocks (wide, narrow; `K = 256` narrow only) on the Hopper
    /// kernel, against the f64 reference.
    #[test]
    fn model_variants(
        lengths in ragged_lengths(),
        shape in kda_tests::model_shapes(vec![64, 128, 256], vec![64, 128, 256, 512]),
        layouts in kda_tests::row_layouts(),
        narrow: bool,
        with_h0: bool,
        seed: u64,
    ) {
        let gpu = GPU.get_or_init(Gpu::open);
        let p = inputs::try_random_model_problem(Plan::from_lengths(&lengths), shape, with_h0, seed).unwrap();
        let strides = kda_tests::strides_of(layouts, &kda::Dims::model(&p.plan, &shape));
        let want = reference::model_reference(&p.view()).unwrap();
        // K = 256 runs in narrow blocks only.
        let narrow = narrow || !Columns::Wide.runs(shape.key_dim);
        let columns = ColumnMode::Force(if narrow { Columns::Narrow } else { Columns::Wide });
        let out = run_columns_guarded(gpu, &p.view(), strides, Kernel::Auto, SplitMode::Off, columns)
            .map_err(|e| TestCaseError::fail(e.to_string()))?.0;
        record(&format!("{lengths:?} {shape:?} {layouts:?} {columns:?} h0={with_h0}"), out.errors(&want));
    }
}

/// Both column widths of the Hopper kernel, forced.
const COLUMN_MODES: [ColumnMode; 2] = [ColumnMode::Force(Columns::Wide), ColumnMode::Force(Columns::Narrow)];

/// Every gate kind x state layout x value size class x strides x column blocks on a short, a
/// ragged and a long batch, each case printed before any is checked, so that one run shows the
/// whole matrix. The ungated recurrence is held to `precision::UNGATED_FLOOR_SLACK`, `K = 256`
/// to `precision::LONG_KEY_FLOOR_SLACK` (see there).
#[test]
fn model_matrix() {
    use kda_tests::RowLayout;
    let gpu = Gpu::open();
    let gates = [(false, true), (true, false), (true, true), (false, false)];
    let layouts = [StateLayout::KeyFirst, StateLayout::ValueFirst];
    let mut failures = Vec::new();
    for (lengths, columns) in
        [vec![130], vec![397, 3, 2], vec![4096, 1000]].into_iter().flat_map(|l| COLUMN_MODES.map(|c| (l.clone(), c)))
    {
        for (g, gk) in gates {
            for layout in layouts {
                for (key_dim, value_dim) in [(128, 128), (128, 512), (64, 64), (64, 256), (256, 512)] {
                    if columns == ColumnMode::Force(Columns::Wide) && !Columns::Wide.runs(key_dim) {
                        continue;
                    }
                    for rows in [RowLayout::Packed, RowLayout::Padded { pad: 64 }] {
                        let gates = Gates { g, gk };
                        let shape =
                            ModelShape { value_heads: 2, key_dim, value_dim, gates, layout, ..ModelShape::kda(1) };
                        let p = inputs::try_random_model_problem(Plan::from_lengths(&lengths), shape, true, 5).unwrap();
                        let strides = kda_tests::strides_of([rows; 6], &kda::Dims::model(&p.plan, &shape));
                        let want = reference::model_reference(&p.view()).unwrap();
                        let floor = reference::model_reference_f32(&p.view()).unwrap().errors(&want);
                        let out = run_columns_guarded(&gpu, &p.view(), strides, Kernel::Auto, SplitMode::Off, columns)
                            .unwrap()
                            .0;
                        let errs = out.errors(&want);
                        let case = format!(
                            "{lengths:?} g={g} gk={gk} {layout:?} K={key_dim} V={value_dim} {rows:?} {columns:?}"
                        );
                        let [h, v, t] = errs;
                        println!("{case}: rel err h {h:.2e}  v_new {v:.2e}  ht {t:.2e} (f32 floor h {:.2e})", floor[0]);
                        let bound = |f: f64| kda::precision::bound_for(g || gk, key_dim, f);
                        if errs.iter().zip(floor).any(|(&e, f)| e.is_nan() || e >= bound(f)) {
                            failures.push(case);
                        }
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} cases out of bounds: {failures:#?}", failures.len());
}

/// More items than CTAs (each CTA runs several back to back) on a grouped ragged batch of tiny
/// sequences behind a long one, for each gate kind, layout and value size class.
#[test]
fn model_items_back_to_back() {
    use kda_tests::RowLayout;
    let gpu = Gpu::open();
    let lengths = [397, 3, 3, 2, 2, 2, 2, 2, 2];
    let mut failures = Vec::new();
    for ((g, gk), columns) in [(true, false), (false, true)].into_iter().flat_map(|g| COLUMN_MODES.map(|c| (g, c))) {
        for layout in [StateLayout::KeyFirst, StateLayout::ValueFirst] {
            for (key_dim, value_dim) in [(128, 128), (128, 512), (64, 512)] {
                for rows in [RowLayout::Packed, RowLayout::Padded { pad: 64 }] {
                    let gates = Gates { g, gk };
                    let shape = ModelShape { value_heads: 3, key_dim, value_dim, gates, layout, ..ModelShape::kda(1) };
                    let p = inputs::try_random_model_problem(Plan::from_lengths(&lengths), shape, true, 9).unwrap();
                    let strides = kda_tests::strides_of([rows; 6], &kda::Dims::model(&p.plan, &shape));
                    let want = reference::model_reference(&p.view()).unwrap();
                    let out =
                        run_columns_guarded(&gpu, &p.view(), strides, Kernel::Auto, SplitMode::Off, columns).unwrap().0;
                    let [h, v, t] = out.errors(&want);
                    let case = format!("g={g} gk={gk} {layout:?} K={key_dim} V={value_dim} {rows:?} {columns:?}");
                    println!("{case}: rel err h {h:.2e}  v_new {v:.2e}  ht {t:.2e}");
                    if [h, v, t].iter().any(|e| e.is_nan() || *e >= kda::precision::ERROR_BOUND) {
                        failures.push(case);
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} cases out of bounds: {failures:#?}", failures.len());
}

/// Value-first states over many short items per CTA: each (sequence, value head, 64-column
/// block) of `ht` checked on its own, so a failure names the blocks it hits.
#[test]
fn value_first_blocks() {
    let gpu = Gpu::open();
    let mut failures = Vec::new();
    for (lengths, value_heads, value_dim) in [
        (vec![3usize; 30], 3usize, 128usize),
        (vec![3; 30], 1, 512),
        (vec![3; 9], 3, 512),
        (vec![397, 3, 3, 2, 2, 2, 2, 2, 2], 3, 512),
        (vec![200; 9], 3, 512),
        (vec![3; 200], 1, 128),
    ] {
        for (layout, columns) in
            [StateLayout::KeyFirst, StateLayout::ValueFirst].into_iter().flat_map(|l| COLUMN_MODES.map(|c| (l, c)))
        {
            let gates = Gates { g: false, gk: true };
            let shape = ModelShape { value_heads, value_dim, gates, layout, ..ModelShape::kda(1) };
            let p = inputs::try_random_model_problem(Plan::from_lengths(&lengths), shape, true, 9).unwrap();
            let want = reference::model_reference(&p.view()).unwrap();
            let out =
                run_columns_guarded(&gpu, &p.view(), Strides::PACKED, Kernel::Auto, SplitMode::Off, columns).unwrap().0;
            let (kd, vd) = (shape.key_dim, value_dim);
            let mut bad = Vec::new();
            for (n, (got, want)) in out.ht.chunks(kd * vd).zip(want.ht.chunks(kd * vd)).enumerate() {
                for block in 0..vd / 64 {
                    let cols = |x: &[f32]| -> Vec<f32> {
                        let block_cols = block * 64..(block + 1) * 64;
                        (0..kd).flat_map(|kk| block_cols.clone().map(move |v| x[shape.state_index(kk, v)])).collect()
                    };
                    let e = kda::rel_error(&cols(got), &cols(want));
                    if e.is_nan() || e > 1e-3 {
                        bad.push((n / value_heads, n % value_heads, block, e));
                    }
                }
            }
            let case = format!(
                "{} seqs (first {}), HV={value_heads}, V={value_dim}, {layout:?} {columns:?}",
                lengths.len(),
                lengths[0]
            );
            println!("{case}: {} bad blocks {:?}", bad.len(), &bad[..bad.len().min(12)]);
            if !bad.is_empty() {
                failures.push(case);
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Strides TMA cannot express, head sizes no kernel runs yet and gates that do not match the
/// plan are typed errors, with nothing launched.
#[test]
fn unsupported_model_launches_are_typed_errors() {
    let gpu = Gpu::open();
    let shape = ModelShape { gates: Gates { g: true, gk: false }, ..ModelShape::kda(1) };
    let p = inputs::try_random_model_problem(Plan::from_lengths(&[70]), shape, false, 3).unwrap();
    let odd = Strides { u: Some(kda::RowStrides { token: 128 + 4, head: 128 }), ..Strides::PACKED };
    let err = run_model_guarded(&gpu, &p.view(), odd, Kernel::Auto).unwrap_err();
    assert!(matches!(err, KdaError::Unsupported { argument: "u", .. }), "{err}");
    let k96 = ModelShape { key_dim: 96, value_dim: 64, ..shape };
    let p = inputs::try_random_model_problem(Plan::from_lengths(&[70]), k96, false, 3).unwrap();
    let err = run_model_guarded(&gpu, &p.view(), Strides::PACKED, Kernel::Auto).unwrap_err();
    assert!(matches!(err, KdaError::Unsupported { argument: "key_dim", .. }), "{err}");
    let v96 = ModelShape { value_dim: 96, ..shape };
    let p = inputs::try_random_model_problem(Plan::from_lengths(&[70]), v96, false, 3).unwrap();
    let err = run_model_guarded(&gpu, &p.view(), Strides::PACKED, Kernel::Auto).unwrap_err();
    assert!(matches!(err, KdaError::Unsupported { argument: "value_dim", .. }), "{err}");
    // The plan says `g`; inputs without it are refused.
    let p = inputs::try_random_model_problem(Plan::from_lengths(&[70]), shape, false, 3).unwrap();
    let view = kda::model::ModelView { g: None, ..p.view() };
    let err = run_model_guarded(&gpu, &view, Strides::PACKED, Kernel::Auto).unwrap_err();
    assert!(matches!(err, KdaError::Shape { tensor: "g", .. } | KdaError::Argument { name: "g", .. }), "{err}");
}

static GPU: std::sync::OnceLock<Gpu> = std::sync::OnceLock::new();

/// Ragged layouts for the split tests: one sequence several chunks long (its length rarely a
/// whole number of chunks, so its last segment ends in a partial chunk), and up to three more,
/// empty ones among them.
fn split_lengths() -> impl Strategy<Value = Vec<usize>> {
    // The first sequence is longer than the longest forced segment, so every case splits.
    (
        MAX_SEGMENT_CHUNKS * kda::layout::CHUNK + 1..1300,
        prop::collection::vec(prop_oneof![Just(0usize), 1usize..400], 0..3),
    )
        .prop_map(|(long, rest)| std::iter::once(long).chain(rest).collect())
}

/// The longest segment `split_sequences` forces, in chunks.
const MAX_SEGMENT_CHUNKS: usize = 4;

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]
    /// The split passes (pre-scan, merge, main pass) at forced segment lengths, single-chunk
    /// segments included, on every gate kind, head grouping, state layout and K, V in {64, 128,
    /// 256}, with and without `h0`: every output element written, no guard touched, and the
    /// results those of the unsplit recurrence within `SPLIT_BOUND`.
    #[test]
    fn split_sequences(
        lengths in split_lengths(),
        shape in kda_tests::model_shapes(vec![64, 128, 256], vec![64, 128, 256]),
        segment_chunks in 1usize..=MAX_SEGMENT_CHUNKS,
        narrow: bool,
        with_h0: bool,
        seed: u64,
    ) {
        let gpu = GPU.get_or_init(Gpu::open);
        let p = inputs::try_random_model_problem(Plan::from_lengths(&lengths), shape, with_h0, seed).unwrap();
        let mode = SplitMode::Chunks(segment_chunks);
        let narrow = narrow || !Columns::Wide.runs(shape.key_dim);
        let columns = ColumnMode::Force(if narrow { Columns::Narrow } else { Columns::Wide });
        let (out, split) = run_columns_guarded(gpu, &p.view(), Strides::PACKED, Kernel::Auto, mode, columns)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(split.is_split(), "{lengths:?} every {segment_chunks} chunks: not split");
        let SplitErrors { model, unsplit: errs, bounds } = SplitErrors::of(&out, &p.view(), &split);
        let case = format!("{lengths:?} {shape:?} every {segment_chunks} chunks {columns:?} h0={with_h0}");
        println!("{case}: vs split model {:.2e} {:.2e} {:.2e}, vs unsplit {:.2e} {:.2e} {:.2e} (bounds {:.2e} {:.2e} {:.2e})",
            model[0], model[1], model[2], errs[0], errs[1], errs[2], bounds[0], bounds[1], bounds[2]);
        prop_assert!(model.iter().all(|&e| e < SPLIT_BOUND), "{case}: vs split model {model:?}");
        prop_assert!(errs.iter().zip(&bounds).all(|(e, b)| e < b), "{case}: vs unsplit {errs:?}, bounds {bounds:?}");
    }
}

/// Every head size class split, each one case (the proptest draws them at random), on the Hopper
/// kernel and on the portable one (which plans and runs its own passes): the merge's loads must
/// stay inside `M`'s key columns at every `K`.
#[test]
fn split_head_sizes() {
    let gpu = Gpu::open();
    let sizes = [(64, 64), (64, 128), (64, 256), (128, 64), (128, 128), (128, 512), (256, 96)];
    for ((key_dim, value_dim), kernel) in sizes.into_iter().flat_map(|s| [(s, Kernel::Auto), (s, Kernel::Portable)]) {
        if kernel == Kernel::Auto && key_dim == 256 {
            continue; // the Hopper kernel's split needs V a multiple of 64
        }
        for layout in [StateLayout::KeyFirst, StateLayout::ValueFirst] {
            let shape = ModelShape { value_heads: 2, key_dim, value_dim, layout, ..ModelShape::kda(1) };
            let p = inputs::try_random_model_problem(Plan::from_lengths(&[700, 0, 90]), shape, true, 9).unwrap();
            let (out, split) =
                run_split_guarded(&gpu, &p.view(), Strides::PACKED, kernel, SplitMode::Chunks(2)).unwrap();
            assert!(split.is_split());
            let SplitErrors { model, unsplit: errs, bounds } = SplitErrors::of(&out, &p.view(), &split);
            let case = format!("{kernel:?} K={key_dim} V={value_dim} {layout:?}");
            println!(
                "{case}: vs split model {:.2e} {:.2e} {:.2e}, vs unsplit {:.2e}",
                model[0], model[1], model[2], errs[0]
            );
            assert!(model.iter().all(|&e| e < SPLIT_BOUND), "{case}: vs split model {model:?}");
            assert!(errs.iter().zip(&bounds).all(|(e, b)| e < b), "{case}: vs unsplit {errs:?}, bounds {bounds:?}");
        }
    }
}

/// A split launch, of the Hopper kernel and of the portable one, is deterministic (bitwise, run
/// after run) and free of host synchronisation and device allocation: captured in a CUDA graph
/// and replayed, it writes the same bits. Captured on a stream of its own (the legacy default stream cannot be captured), with buffers and plan
/// allocated while cudarc's event tracking is off: cudarc makes each use of a tracked buffer wait
/// on an event of its last use, and a capture cannot wait on work recorded before it began
/// (docs/CONTRACT.md, "CUDA graphs").
#[test]
fn split_launches_are_deterministic_and_graph_capturable() {
    for kernel in [Kernel::Auto, Kernel::Portable] {
        split_launch_is_deterministic_and_graph_capturable(kernel);
    }
}

/// [`split_launches_are_deterministic_and_graph_capturable`] on `kernel`'s split passes.
fn split_launch_is_deterministic_and_graph_capturable(kernel: Kernel) {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let gpu = Gpu::open();
    let shape = ModelShape { value_heads: 2, gates: Gates { g: true, gk: false }, ..ModelShape::kda(1) };
    let p = inputs::try_random_model_problem(Plan::from_lengths(&[3000, 0, 700]), shape, true, 3).unwrap();
    let ctx = gpu.kda.context().clone();
    let s = &ctx.new_stream().unwrap();
    let upload = |s| {
        let mut dev = kda_cli::DeviceProblem::upload_model(s, &p.view(), Strides::PACKED).unwrap();
        dev.set_split(s, SplitMode::Chunks(8)).unwrap();
        assert!(dev.plan.split_plan_of(gpu.kda.resolve(kernel)).is_split(), "{kernel:?}: not split");
        dev
    };
    let run = |dev: &mut kda_cli::DeviceProblem| {
        dev.poison_outputs(s).unwrap();
        dev.launch(&gpu.kda, s, kernel).unwrap();
        dev.download(s).unwrap()
    };
    let mut tracked = upload(s);
    let first = run(&mut tracked);
    for _ in 0..20 {
        assert!(run(&mut tracked) == first, "{kernel:?}: a split launch gave different bits");
    }
    let errs = first.errors(&reference::model_reference(&p.view()).unwrap());
    println!("{kernel:?} split: rel err h {:.2e}  v_new {:.2e}  ht {:.2e}", errs[0], errs[1], errs[2]);
    assert!(errs.iter().all(|&e| e < SPLIT_BOUND), "{kernel:?}: {errs:?}");

    // SAFETY: this test's buffers are used on one stream only, in order; tracking is back on
    // before the test ends.
    unsafe { ctx.disable_event_tracking() };
    let mut dev = upload(s);
    unsafe { ctx.enable_event_tracking() };
    dev.poison_outputs(s).unwrap();
    s.synchronize().unwrap();
    s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).expect("begin capture");
    let launched = dev.launch(&gpu.kda, s, kernel);
    let graph = s.end_capture(CUgraphInstantiate_flags(0));
    launched.expect("the split launch under capture");
    let graph = graph.expect("end capture").expect("a graph holding the launch");
    graph.launch().expect("graph launch");
    let replayed = dev.download(s).unwrap();
    assert!(replayed == first, "{kernel:?}: the captured split launch gave different bits");
}

/// The layer forward on the GPU, on each output path the device runs (fused; prepare,
/// recurrence, output), reproduces FLA's layer fixtures within the layer's bound, every element
/// of `o` and `ht` written and nothing outside them.
#[test]
fn layer_fixtures() {
    let gpu = Gpu::open();
    for name in LAYER_FIXTURES {
        let (p, golden) = kda::layer::read_layer_fixture(&fixture(&format!("layer/{name}"))).unwrap();
        for path in kda_tests::output_paths(&gpu, &p) {
            let out = kda_tests::run_layer_guarded_on(&gpu, &p, StateLayout::KeyFirst, path).unwrap();
            let errs = out.errors(&golden.reference);
            let [fo, fh] = golden.fla_errors;
            println!(
                "{name} {path:?}: GPU layer o {:.2e} ({:.2}x FLA's) ht {:.2e} ({:.2}x FLA's)",
                errs[0],
                errs[0] / fo,
                errs[1],
                errs[1] / fh
            );
            let within = errs[0] <= LAYER_BOUND_OVER_FLA * fo && errs[1] <= LAYER_BOUND_OVER_FLA * fh;
            assert!(within, "{name} {path:?}: {errs:?}");
        }
    }
}

/// Random layers of both kinds, grouped value heads, every gate form and option, ragged lengths
/// with partial chunks and empty sequences, against the f64 definition.
#[test]
fn layer_random() {
    use kda::layer::layer_reference;
    let gpu = Gpu::open();
    let cases = kda_tests::random_layer_cases();
    for (name, p) in &cases {
        let want = layer_reference(p).unwrap();
        let bounds = kda_tests::layer_bounds(p, &want);
        let paths = kda_tests::output_paths(&gpu, p);
        for &path in &paths {
            let out = kda_tests::run_layer_guarded_on(&gpu, p, StateLayout::KeyFirst, path).unwrap();
            let errs = out.errors(&want);
            println!("{name} {path:?}: o {:.2e} ht {:.2e}, bounds {bounds:?}", errs[0], errs[1]);
            assert!(errs.iter().zip(&bounds).all(|(e, b)| e <= b), "{name} {path:?}: {errs:?} over {bounds:?}");
        }
        if paths.contains(&kda::OutputPath::Fused) {
            // The fused pass in narrow blocks (the Hopper kernel's 32-column entries).
            let s = &gpu.stream;
            let plan = kda::LayerPlan::with_path(s, p.plan.clone(), p.shape, p.options, kda::OutputPath::Fused)
                .and_then(|plan| plan.with_columns(s, ColumnMode::Force(Columns::Narrow)))
                .unwrap();
            let mut workspace = plan.workspace(s).unwrap();
            let out = kda_tests::run_layer_guarded_with(&gpu, p, &plan, &mut workspace).unwrap();
            let errs = out.errors(&want);
            println!("{name} Fused, narrow: o {:.2e} ht {:.2e}, bounds {bounds:?}", errs[0], errs[1]);
            assert!(errs.iter().zip(&bounds).all(|(e, b)| e <= b), "{name} narrow: {errs:?} over {bounds:?}");
        }
    }
    println!("{} random layers", cases.len());
}

/// Checkpoints for prefix caching after a GPU prefill (`kda_tests::checkpoint_cases`: inside a
/// chunk, at a chunk's end and at the sequence's end), into poisoned f32 and bf16 pools, each
/// against the state of the prompt cut there; every slot not named keeps its poison. Then the
/// refusals: a position past the sequence, a slot named twice.
#[test]
fn checkpoints_match_the_prompts_cut_there() {
    use kda::pool::{Checkpoint, PoolShape, StateDtype};
    let gpu = Gpu::open();
    for case in kda_tests::checkpoint_cases() {
        let dev = prefill_and_checkpoint(&gpu, &case, StateDtype::F32);
        prefill_and_checkpoint(&gpu, &case, StateDtype::Bf16);
        let seq = case.p.plan.seqs()[0];
        let f32_pool = PoolShape::for_layer(&case.p.shape, case.slots, StateLayout::KeyFirst, StateDtype::F32);
        for bad in [
            vec![Checkpoint { sequence: 0, position: seq.len + 1, slot: 0 }],
            vec![Checkpoint { sequence: 0, position: 1, slot: 1 }, Checkpoint { sequence: 0, position: 1, slot: 1 }],
        ] {
            let err = kda::CheckpointPlan::new(&gpu.stream, &dev.plan, f32_pool, &bad).err();
            assert!(matches!(err, Some(KdaError::Argument { name: "checkpoints", .. })), "{bad:?}: {err:?}");
        }
    }
}

/// `case`'s layer on the GPU, then its checkpoints into a poisoned pool of `dtype`, checked
/// (`CheckpointCase::check`). Returns the layer on the device.
fn prefill_and_checkpoint(
    gpu: &Gpu,
    case: &kda_tests::CheckpointCase,
    dtype: kda::pool::StateDtype,
) -> kda_cli::DeviceLayer {
    use kda::pool::{PoolShape, StateDtype};
    let p = &case.p;
    let mut dev = kda_cli::DeviceLayer::upload_on(&gpu.stream, p, kda::OutputPath::Separate).unwrap();
    dev.launch(&gpu.kda, &gpu.stream).unwrap();
    let shape = PoolShape::for_layer(&p.shape, case.slots, StateLayout::KeyFirst, dtype);
    let plan = kda::CheckpointPlan::new(&gpu.stream, &dev.plan, shape, &case.checkpoints).unwrap();
    let len = shape.len().unwrap();
    if dtype == StateDtype::Bf16 {
        let mut pool = gpu.stream.clone_htod(&vec![half::bf16::from_bits(kda_tests::POISON_BF16); len]).unwrap();
        dev.launch_checkpoints(&gpu.kda, &gpu.stream, &plan, &mut pool).unwrap();
        case.check(dtype, &gpu.stream.clone_dtoh(&pool).unwrap());
    } else {
        let mut pool = gpu.stream.clone_htod(&vec![f32::from_bits(kda_tests::POISON_F32); len]).unwrap();
        dev.launch_checkpoints(&gpu.kda, &gpu.stream, &plan, &mut pool).unwrap();
        case.check(dtype, &gpu.stream.clone_dtoh(&pool).unwrap());
    }
    dev
}

/// The GPU layer on the peers' shapes (`kda layer --bench`'s, `../shared/LAYER.md`): a checked
/// first run (every element of `o` and `ht` finite, and, through `run_layer_guarded`, written and
/// nothing outside them), `o` and `ht` within the bench's bounds of the f64 reference on the
/// sampled key heads (every sequence), then the median of 20 event-timed launches (the short
/// prompts: the host's time per call, planning included) against the IO floor, printed for
/// bench/RESULTS.md.
#[test]
fn layer_speed_on_the_peer_shapes() {
    let gpu = Gpu::open();
    let bandwidth = kda_cli::copy_bandwidth(&gpu.stream, 10).unwrap();
    for s in kda_cli::layer_bench_shapes() {
        let p = s.problem(5);
        kda_tests::run_layer_guarded(&gpu, &p).unwrap();
        let t = kda_cli::time_layer_shape(&gpu.kda, &gpu.stream, (&s, &p), 20, bandwidth).unwrap();
        let heads = kda_cli::reference_heads(&s.shape);
        let want = kda::layer::layer_reference(&p.key_heads(&heads)).unwrap();
        let errs = t.outputs.key_heads(&p, &heads).errors(&want);
        println!(
            "{}: layer {:.1} us ({}), IO floor {:.1} us ({:.3} of it); stages (us) {}; heads {heads:?}: o {:.2e} ht {:.2e}",
            s.name,
            t.us,
            t.method(),
            t.floor_us,
            t.floor_us / t.us,
            t.stages_text(),
            errs[0],
            errs[1]
        );
        assert!(errs.iter().zip(kda_cli::BENCH_ERROR_BOUNDS).all(|(e, b)| *e <= b), "{}: {errs:?}", s.name);
        // The stages the layer's path launches, in order, each a positive time.
        use kda::LayerStage::{Output, Prepare, Recurrence};
        let fused = gpu.kda.layer_output_path(&s.shape, &p.plan).unwrap() == kda::OutputPath::Fused;
        let want_stages = if fused { vec![Prepare, Recurrence] } else { vec![Prepare, Recurrence, Output] };
        assert_eq!(t.stages.iter().map(|x| x.0).collect::<Vec<_>>(), want_stages, "{}", s.name);
        assert!(t.stages.iter().all(|&(_, us)| us > 0.0), "{}: {:?}", s.name, t.stages);
    }
}

/// The layer with value-first states (`LayerPlan::with_state_layout`): `h0` in and `ht` out as
/// `[N, HV, V, K]`, the output kernel reading `h` value-first; against the f64 definition at the
/// random layers' bound, and equal to the key-first run within it.
#[test]
fn layer_value_first_states() {
    use kda::layer::{GateInput, LayerKind, LayerOptions, LayerShape, layer_reference};
    let gpu = Gpu::open();
    for (c, kind) in [LayerKind::Kda, LayerKind::Gdn].into_iter().enumerate() {
        let shape = LayerShape { kind, heads: 2, value_heads: 2, key_dim: 128, value_dim: 64 };
        let options = LayerOptions {
            scale: 128f64.powf(-0.5),
            l2norm_qk: true,
            beta_sigmoid: true,
            gate: GateInput::LowerBound(-5.0),
        };
        let p = kda_tests::random_layer_problem(&[300, 0, 64, 17], shape, options, true, 70 + c as u64);
        let want = layer_reference(&p).unwrap();
        let bounds = kda_tests::layer_bounds(&p, &want);
        for layout in [StateLayout::KeyFirst, StateLayout::ValueFirst] {
            for path in kda_tests::output_paths(&gpu, &p) {
                let out = kda_tests::run_layer_guarded_on(&gpu, &p, layout, path).unwrap();
                let errs = out.errors(&want);
                println!(
                    "{kind:?} {layout:?} {path:?}: o {:.2e} ht {:.2e} (bounds {:.2e} {:.2e})",
                    errs[0], errs[1], bounds[0], bounds[1]
                );
                let within = errs.iter().zip(&bounds).all(|(e, b)| e <= b);
                assert!(within, "{kind:?} {layout:?} {path:?}: {errs:?} over {bounds:?}");
            }
        }
    }
}

/// `LayerPlan::replan`: one plan and one workspace carried across batches of other lengths (the
/// workspace sized by the longest), each launch bit for bit a fresh plan's, on every output
/// path; a batch the workspace does not hold is refused, naming the buffer.
#[test]
fn layer_replan_matches_fresh_plans() {
    use kda::LayerPlan;
    use kda::layer::{GateInput, LayerKind, LayerOptions, LayerShape};
    let gpu = Gpu::open();
    let s = &gpu.stream;
    let options = LayerOptions { scale: 128f64.powf(-0.5), l2norm_qk: true, beta_sigmoid: true, gate: GateInput::Log };
    for kind in [LayerKind::Kda, LayerKind::Gdn] {
        let shape = LayerShape { kind, heads: 2, value_heads: 4, key_dim: 128, value_dim: 128 };
        let batches: [&[usize]; 3] = [&[300, 0, 64, 17], &[129, 40], &[1, 65, 3]];
        let problems: Vec<_> = batches
            .iter()
            .enumerate()
            .map(|(i, l)| kda_tests::random_layer_problem(l, shape, options, i != 1, 90 + i as u64))
            .collect();
        for path in kda_tests::output_paths(&gpu, &problems[0]) {
            let mut plan = LayerPlan::with_path(s, problems[0].plan.clone(), shape, options, path).unwrap();
            let mut workspace = plan.workspace(s).unwrap();
            for (i, p) in problems.iter().enumerate() {
                if i > 0 {
                    plan.replan(s, p.plan.clone()).unwrap();
                }
                let got = kda_tests::run_layer_guarded_with(&gpu, p, &plan, &mut workspace).unwrap();
                let fresh = kda_tests::run_layer_guarded_on(&gpu, p, StateLayout::KeyFirst, path).unwrap();
                assert!(got.o == fresh.o && got.ht == fresh.ht, "{kind:?} {path:?} batch {i}: replanned differs");
                println!("{kind:?} {path:?} batch {:?}: replanned = fresh, bit for bit", batches[i]);
            }
            // Longer than the workspace holds: refused, the buffer named.
            let long = kda_tests::random_layer_problem(&[400], shape, options, true, 99);
            plan.replan(s, long.plan.clone()).unwrap();
            let e = kda_tests::run_layer_guarded_with(&gpu, &long, &plan, &mut workspace).unwrap_err();
            assert!(e.to_string().contains("workspace."), "{e}");
        }
    }
}

/// Re-planning in place while the launches before it are still queued: behind a long launch,
/// five batches each re-planned into one plan and launched with no synchronisation between
/// them, each into its own outputs; every launch ran its own batch (each re-plan's table copy
/// ordered after the launches that read the previous tables), bit for bit a fresh plan's.
#[test]
fn queued_replans_run_their_own_batches() {
    use kda::LayerPlan;
    use kda::layer::{GateInput, LayerKind, LayerOptions, LayerShape};
    use kda_cli::layer::DeviceLayer;
    let gpu = Gpu::open();
    let s = &gpu.stream;
    let options = LayerOptions { scale: 128f64.powf(-0.5), l2norm_qk: true, beta_sigmoid: true, gate: GateInput::Log };
    for kind in [LayerKind::Kda, LayerKind::Gdn] {
        let shape = LayerShape { kind, heads: 2, value_heads: 4, key_dim: 128, value_dim: 128 };
        // The first the longest: the workspace is sized by it.
        let batches: [&[usize]; 5] = [&[300, 0, 64, 17], &[129, 40], &[1, 65, 3], &[200], &[64, 64, 1]];
        let problems: Vec<_> = batches
            .iter()
            .enumerate()
            .map(|(i, l)| kda_tests::random_layer_problem(l, shape, options, i % 2 == 0, 120 + i as u64))
            .collect();
        let mut layers: Vec<_> = problems.iter().map(|p| DeviceLayer::upload(&gpu.kda, s, p).unwrap()).collect();
        let fresh: Vec<_> = layers
            .iter_mut()
            .map(|layer| {
                layer.launch(&gpu.kda, s).unwrap();
                layer.download(s).unwrap()
            })
            .collect();
        let long = kda_tests::random_layer_problem(&[8192], shape, options, true, 130);
        let mut long = DeviceLayer::upload(&gpu.kda, s, &long).unwrap();
        let path = layers[0].plan.output_path();
        let mut plan = LayerPlan::with_path(s, problems[0].plan.clone(), shape, options, path).unwrap();
        let mut workspace = plan.workspace(s).unwrap();
        for layer in &mut layers {
            layer.zero_outputs(s).unwrap();
        }
        long.launch(&gpu.kda, s).unwrap();
        for (layer, p) in layers.iter_mut().zip(&problems) {
            plan.replan(s, p.plan.clone()).unwrap();
            layer.launch_with(&gpu.kda, s, &plan, &mut workspace).unwrap();
        }
        s.synchronize().unwrap();
        for (i, (layer, fresh)) in layers.iter().zip(&fresh).enumerate() {
            let got = layer.download(s).unwrap();
            assert!(
                got.o == fresh.o && got.ht == fresh.ht,
                "{kind:?} batch {i} ({:?}): a queued re-plan differs",
                batches[i]
            );
        }
        println!("{kind:?}: {} queued re-plans ran their own batches, bit for bit", batches.len());
    }
}

/// The decode step (`Kda::launch_decode`) against the f64 layer over a pool
/// (`kda_tests::decode_cases`): both kinds, grouped value heads, the gate forms and options;
/// padding sequences (nothing read or written), a fresh sequence (from zeros).
#[test]
fn decode_step_matches_the_pooled_reference() {
    use kda::DecodePlan;
    let gpu = Gpu::open();
    for case in kda_tests::decode_cases() {
        let p = &case.p;
        let plan = DecodePlan::new(&gpu.stream, p.shape, p.options, case.pool_shape, &case.indices, &case.fresh);
        let (pool, o) = kda_tests::run_decode(&gpu, p, &plan.unwrap(), &case.pool);
        case.check(&pool, &o);
        // The same step over the pool's states value-first.
        let (kd, vd) = (p.shape.key_dim, p.shape.value_dim);
        let shape = kda::pool::PoolShape { layout: StateLayout::ValueFirst, ..case.pool_shape };
        let plan = DecodePlan::new(&gpu.stream, p.shape, p.options, shape, &case.indices, &case.fresh);
        let (pool, o) = kda_tests::run_decode(&gpu, p, &plan.unwrap(), &kda_tests::transposed(&case.pool, kd, vd));
        case.check(&kda_tests::transposed(&pool, vd, kd), &o);
    }
}

/// Speculative verify (`DecodePlan::verify`): each case's draft tokens, a chain and a tree, each
/// token's state into a slot of its own, against the definition, and bit for bit against
/// one-token calls along each token's path.
#[test]
fn verify_steps_match_the_definition_and_one_token_calls_bit_for_bit() {
    use kda::DecodePlan;
    use kda::pool::SlotUse;
    let gpu = Gpu::open();
    for case in kda_tests::verify_cases() {
        let p = &case.p;
        let s = p.shape;
        let (row, state, draft) = (s.value_heads * s.value_dim, s.value_heads * s.key_dim * s.value_dim, case.draft);
        let plan = DecodePlan::verify(
            &gpu.stream,
            s,
            p.options,
            case.pool_shape,
            &case.indices,
            &case.fresh,
            draft,
            Some(&case.parents),
            Some(&case.token_slots),
        )
        .unwrap();
        let (pool, o) = kda_tests::run_decode(&gpu, p, &plan, &case.pool);
        let want = case.reference();
        for (n, use_) in case.uses.iter().enumerate() {
            let Some(slot) = use_.slot() else { continue };
            for (t, (want_o, want_s)) in want[n].iter().enumerate() {
                let r = n * draft + t;
                let got_o: Vec<f32> = o[r * row..(r + 1) * row].iter().map(|x| x.to_f32()).collect();
                let ts = case.token_slots[r] as usize;
                let got_s = &pool[ts * state..(ts + 1) * state];
                let (eo, es) = (kda::rel_error(&got_o, want_o), kda::rel_error(got_s, want_s));
                println!("{} {n}/{t}: o {eo:.2e} state {es:.2e}", case.name);
                assert!(eo < kda_tests::DECODE_O_BOUND && es < kda_tests::DECODE_STATE_BOUND * draft as f64);
                // One-token calls along the token's path, from the same pool.
                let mut path = vec![t];
                while let Ok(parent) = usize::try_from(case.parents[n * draft + *path.last().unwrap()]) {
                    path.push(parent);
                }
                let (mut scratch, mut last_o) = (case.pool.clone(), Vec::new());
                for (step, &u) in path.iter().rev().enumerate() {
                    let (index, fresh) = (slot as i64, step == 0 && matches!(use_, SlotUse::Start(_)));
                    let one = DecodePlan::new(&gpu.stream, s, p.options, case.pool_shape, &[index], &[fresh]).unwrap();
                    (scratch, last_o) = kda_tests::run_decode(&gpu, &p.select(&[(n, u..u + 1)]), &one, &scratch);
                }
                let bits = |x: &[kda::bf16]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&last_o), bits(&o[r * row..(r + 1) * row]), "{} {n}/{t}: o bits", case.name);
                let same = scratch[slot * state..(slot + 1) * state]
                    .iter()
                    .zip(got_s)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{} {n}/{t}: state bits", case.name);
            }
        }
    }
}

/// The decode step captured once in a CUDA graph and replayed with new tokens copied into the
/// same input buffers: each replay continues every sequence from the state the previous one left
/// in its slot, and matches the pooled f64 layer step by step, the last one over other slots
/// (`DecodePlan::rebind`: permuted, a padding one moved, a fresh one); then the time per replay
/// of the one-step graph, and per step of a graph of `STEPS_PER_GRAPH` steps, is printed.
#[test]
fn decode_steps_replay_in_a_cuda_graph() {
    use kda::layer::{GateInput, LayerKind, LayerOptions, LayerShape};
    use kda::pool::layer_reference_pooled;
    use kda::pool::{PoolShape, slot_uses};
    use kda::{DecodePlan, bf16};
    const STEPS: u64 = 4;
    const TIMED_REPLAYS: usize = 200;
    let gpu = Gpu::open();
    let ctx = gpu.kda.context().clone();
    let s = &ctx.new_stream().unwrap();
    // Each case's slots, and the slots its last replay is rebound to (the last sequence fresh).
    for (heads, indices, rebound) in [(2, vec![2i64, -1, 0, 5], vec![5i64, 0, -1, 3]), (32, vec![0], vec![3])] {
        let shape = LayerShape { kind: LayerKind::Kda, heads, value_heads: heads, key_dim: 128, value_dim: 128 };
        let options = LayerOptions {
            scale: 128f64.powf(-0.5),
            l2norm_qk: true,
            beta_sigmoid: true,
            gate: GateInput::LowerBound(-5.0),
        };
        let n = indices.len();
        let fresh = vec![false; n];
        let pool_shape = PoolShape::for_layer(&shape, 6, StateLayout::KeyFirst, kda::pool::StateDtype::F32);
        let pool: Vec<f32> = kda::inputs::random_pool(&pool_shape, heads as u64);
        let mut uses = slot_uses(&indices, &fresh, &pool_shape).unwrap();
        let rebound_fresh: Vec<bool> = (0..n).map(|seq| seq + 1 == n).collect();
        // New tokens each step, one layer: every step keeps the first step's `A_log` and `dt_bias`.
        let mut steps: Vec<_> =
            (0..STEPS).map(|t| kda::inputs::random_layer_problem(&vec![1; n], shape, options, false, 70 + t)).collect();
        let (a_log, dt_bias) = (steps[0].a_log.clone(), steps[0].dt_bias.clone());
        for p in &mut steps {
            (p.a_log, p.dt_bias) = (a_log.clone(), dt_bias.clone());
        }

        // SAFETY: these buffers are used on this one stream only, in order; tracking is back on
        // before the test ends.
        unsafe { ctx.disable_event_tracking() };
        let mut plan = DecodePlan::new(s, shape, options, pool_shape, &indices, &fresh).unwrap();
        let first = &steps[0];
        let row = heads * 128;
        let poisoned_o = vec![bf16::from_bits(kda_tests::POISON_BF16); n * row];
        let mut b = StepBuffers {
            q: s.clone_htod(&first.q).unwrap(),
            k: s.clone_htod(&first.k).unwrap(),
            v: s.clone_htod(&first.v).unwrap(),
            g: s.clone_htod(&first.g).unwrap(),
            beta: s.clone_htod(&first.beta).unwrap(),
            a_log: s.clone_htod(first.a_log.as_deref().unwrap()).unwrap(),
            dt_bias: s.clone_htod(first.dt_bias.as_deref().unwrap()).unwrap(),
            pool: s.clone_htod(&pool).unwrap(),
            o: s.clone_htod(&poisoned_o).unwrap(),
        };
        unsafe { ctx.enable_event_tracking() };
        s.synchronize().unwrap();
        let graph = b.capture(&gpu, s, &plan, 1);

        let mut want_pool = pool.clone();
        for (t, p) in steps.iter().enumerate() {
            if t + 1 == steps.len() {
                // The last replay over other slots: the plan rebound in place, the graph as
                // captured.
                plan.rebind(s, &rebound, &rebound_fresh, None, None).expect("rebind");
                uses = slot_uses(&rebound, &rebound_fresh, &pool_shape).unwrap();
                // `o` poisoned again: a sequence live before may be padding now.
                s.memcpy_htod(&poisoned_o, &mut b.o).unwrap();
            }
            s.memcpy_htod(&p.q, &mut b.q).unwrap();
            s.memcpy_htod(&p.k, &mut b.k).unwrap();
            s.memcpy_htod(&p.v, &mut b.v).unwrap();
            s.memcpy_htod(&p.g, &mut b.g).unwrap();
            s.memcpy_htod(&p.beta, &mut b.beta).unwrap();
            graph.launch().expect("replay");
            let got_o = s.clone_dtoh(&b.o).unwrap();
            let want_o = layer_reference_pooled(p, &mut want_pool, &pool_shape, &uses).unwrap();
            for (seq, want) in want_o.iter().enumerate() {
                let got = &got_o[seq * row..(seq + 1) * row];
                match want {
                    Some(want) => {
                        let got: Vec<f32> = got.iter().map(|x| x.to_f32()).collect();
                        let e = kda::rel_error(&got, want);
                        assert!(
                            e < kda_tests::DECODE_O_BOUND,
                            "H {heads}, replay {t}, sequence {seq}: o error {e:.2e}"
                        );
                    }
                    None => assert!(
                        got.iter().all(|x| x.to_bits() == kda_tests::POISON_BF16),
                        "H {heads}: padding sequence {seq}'s o was written"
                    ),
                }
            }
        }
        let e = kda::rel_error(&s.clone_dtoh(&b.pool).unwrap(), &want_pool);
        assert!(
            e < kda_tests::DECODE_STATE_BOUND * STEPS as f64,
            "H {heads}: pool after {STEPS} replays: error {e:.2e}"
        );
        let us = kda_cli::median_us(s, 10, TIMED_REPLAYS, |_| graph.launch().map_err(kda::KdaError::from)).unwrap();
        // A serving engine captures a whole forward, every layer's step, in one graph: the
        // step's cost there is the graph's time over its steps.
        let steps = b.capture(&gpu, s, &plan, STEPS_PER_GRAPH);
        let per_step = kda_cli::median_us(s, 10, TIMED_REPLAYS, |_| steps.launch().map_err(kda::KdaError::from))
            .unwrap()
            / STEPS_PER_GRAPH as f64;
        println!(
            "H {heads}, {n} sequences: {STEPS} replays match the pooled layer; {us:.2} us per replayed one-step \
             graph, {per_step:.2} us per step in a replayed graph of {STEPS_PER_GRAPH} steps"
        );
    }
}

/// Steps [`decode_steps_replay_in_a_cuda_graph`] captures in one graph for its second timing, as
/// a model's layers' steps in one forward.
const STEPS_PER_GRAPH: usize = 32;

/// The device buffers of [`decode_steps_replay_in_a_cuda_graph`]'s decode step.
struct StepBuffers {
    q: cudarc::driver::CudaSlice<kda::bf16>,
    k: cudarc::driver::CudaSlice<kda::bf16>,
    v: cudarc::driver::CudaSlice<kda::bf16>,
    g: cudarc::driver::CudaSlice<f32>,
    beta: cudarc::driver::CudaSlice<f32>,
    a_log: cudarc::driver::CudaSlice<f32>,
    dt_bias: cudarc::driver::CudaSlice<f32>,
    pool: cudarc::driver::CudaSlice<f32>,
    o: cudarc::driver::CudaSlice<kda::bf16>,
}

impl StepBuffers {
    /// `count` decode steps of `plan` over these buffers captured in one CUDA graph on `s`.
    fn capture(
        &mut self,
        gpu: &Gpu,
        s: &std::sync::Arc<cudarc::driver::CudaStream>,
        plan: &kda::DecodePlan,
        count: usize,
    ) -> cudarc::driver::CudaGraph {
        use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
        s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).expect("begin capture");
        let launched: Result<(), KdaError> = (0..count).try_for_each(|_| {
            let inputs = kda::DecodeInputs {
                q: self.q.slice(..),
                k: self.k.slice(..),
                v: self.v.slice(..),
                g: self.g.slice(..).into(),
                beta: self.beta.slice(..).into(),
                a_log: Some(self.a_log.slice(..)),
                dt_bias: Some(self.dt_bias.slice(..)),
            };
            gpu.kda.launch_decode(s, plan, &inputs, &mut self.pool.slice_mut(..), &mut self.o.slice_mut(..))
        });
        let graph = s.end_capture(CUgraphInstantiate_flags(0));
        launched.expect("the decode steps under capture");
        graph.expect("end capture").expect("a graph holding the steps")
    }
}

/// The layer's prefill over a pool (`Kda::launch_layer_pooled`): a sequence continuing its
/// slot, a padding one with no tokens, a fresh one, one ending on a chunk boundary, against
/// `layer_reference_pooled`; every slot no live sequence names keeps its bits.
#[test]
fn pooled_prefill_matches_the_pooled_reference() {
    let gpu = Gpu::open();
    for kind in [kda::layer::LayerKind::Kda, kda::layer::LayerKind::Gdn] {
        let case = kda_tests::PooledPrefillCase::new(kind, 128, 300);
        let (pool, o) = run_pooled_prefill(&gpu, &case);
        case.check(&pool, &o);
    }
}

/// One pooled prefill (`Kda::launch_layer_pooled`: the pool copy kernel gathering the states,
/// the layer, the pool copy kernel scattering them back) of `case` with `o` poisoned first;
/// returns the pool after the call and `o` as f32.
fn run_pooled_prefill(gpu: &Gpu, case: &kda_tests::PooledPrefillCase) -> (Vec<f32>, Vec<f32>) {
    use kda::{LayerInputs, LayerPlan, LayerPool, bf16};
    let s = &gpu.stream;
    let p = &case.p;
    let plan = LayerPlan::new(s, p.plan.clone(), p.shape, p.options).unwrap();
    let slots = LayerPool::new(s, &plan, case.pool_shape, &case.indices, &case.fresh).unwrap();
    let (mut workspace, mut states) = (plan.workspace(s).unwrap(), slots.states(s).unwrap());
    let up_bf = |x: &[bf16]| s.clone_htod(x).unwrap();
    let up_f = |x: &[f32]| s.clone_htod(x).unwrap();
    let (q, k, v, g, beta) = (up_bf(&p.q), up_bf(&p.k), up_bf(&p.v), up_f(&p.g), up_f(&p.beta));
    let (a_log, dt_bias) = (up_f(p.a_log.as_ref().unwrap()), up_f(p.dt_bias.as_ref().unwrap()));
    let inputs = LayerInputs {
        q: q.slice(..),
        k: k.slice(..),
        v: v.slice(..),
        g: g.slice(..).into(),
        beta: beta.slice(..).into(),
        a_log: Some(a_log.slice(..)),
        dt_bias: Some(dt_bias.slice(..)),
        h0: None,
    };
    let mut pool_dev = up_f(&case.pool);
    let rows = p.plan.tokens() * p.shape.value_heads * p.shape.value_dim;
    let mut o = up_bf(&vec![bf16::from_bits(kda_tests::POISON_BF16); rows]);
    let (mut pool_view, mut o_view) = (pool_dev.slice_mut(..), o.slice_mut(..));
    let launched = gpu.kda.launch_layer_pooled(
        s,
        &plan,
        &slots,
        &inputs,
        &mut pool_view,
        &mut o_view,
        &mut workspace,
        &mut states,
    );
    launched.unwrap();
    s.synchronize().expect("pooled prefill");
    let got_o: Vec<f32> = s.clone_dtoh(&o).unwrap().iter().map(|x| x.to_f32()).collect();
    (s.clone_dtoh(&pool_dev).unwrap(), got_o)
}

/// How far a bf16 pool's states land from the f64 definition after one token: bf16's rounding
/// (2^-9 relative per element) of every state written, with headroom.
const BF16_POOL_BOUND: f64 = 1e-2;

/// What `cargo xtask sanitize` runs under compute-sanitizer for the kernels without a CLI, one
/// small case of each, checked against the reference (a sanitizer run that computed garbage
/// would otherwise pass): the decode step on an f32 and on a bf16 pool, speculative verify as a
/// chain and as a tree, the pooled prefill (with the pool copy kernel) of each layer kind at a
/// short length with a tail, and the recurrence without initial or final states (`h0` and `ht`
/// `None`). Each buffer a kernel reads is written by the host first, so initcheck holds the
/// kernels alone to account.
#[test]
fn sanitizer_workload() {
    use kda::DecodePlan;
    use kda::pool::StateDtype;
    let gpu = Gpu::open();
    let decode = kda_tests::decode_cases().swap_remove(0);
    let p = &decode.p;
    let plan =
        |pool_shape| DecodePlan::new(&gpu.stream, p.shape, p.options, pool_shape, &decode.indices, &decode.fresh);
    let (pool, o) = kda_tests::run_decode(&gpu, p, &plan(decode.pool_shape).unwrap(), &decode.pool);
    decode.check(&pool, &o);
    println!("decode, f32 pool: {}", decode.name);

    // The same step on a bf16 pool holding the f32 pool's states rounded.
    let bf16_shape = kda::pool::PoolShape { dtype: StateDtype::Bf16, ..decode.pool_shape };
    let rounded: Vec<f32> = decode.pool.iter().map(|&x| StateDtype::Bf16.stored(x)).collect();
    let mut want_pool = rounded.clone();
    let want_o = kda::pool::layer_reference_pooled(p, &mut want_pool, &decode.pool_shape, &decode.uses).unwrap();
    let bf16_pool: Vec<kda::bf16> = rounded.iter().map(|&x| kda::bf16::from_f32(x)).collect();
    let (pool, o) = kda_tests::run_decode(&gpu, p, &plan(bf16_shape).unwrap(), &bf16_pool);
    let pool: Vec<f32> = pool.iter().map(|x| x.to_f32()).collect();
    let row = p.shape.value_heads * p.shape.value_dim;
    for (n, want) in want_o.iter().enumerate() {
        let got: Vec<f32> = o[n * row..(n + 1) * row].iter().map(|x| x.to_f32()).collect();
        match want {
            Some(want) => assert!(kda::rel_error(&got, want) < kda_tests::DECODE_O_BOUND, "bf16 pool: o of {n}"),
            None => assert!(o[n * row..(n + 1) * row].iter().all(|x| x.to_bits() == kda_tests::POISON_BF16)),
        }
    }
    let e = kda::rel_error(&pool, &want_pool);
    assert!(e < BF16_POOL_BOUND, "bf16 pool: states {e:.2e}");
    println!("decode, bf16 pool: states {e:.2e}");

    for case in kda_tests::verify_cases() {
        let p = &case.p;
        let s = p.shape;
        let plan = DecodePlan::verify(
            &gpu.stream,
            s,
            p.options,
            case.pool_shape,
            &case.indices,
            &case.fresh,
            case.draft,
            Some(&case.parents),
            Some(&case.token_slots),
        )
        .unwrap();
        let (pool, o) = kda_tests::run_decode(&gpu, p, &plan, &case.pool);
        let (row, state) = (s.value_heads * s.value_dim, s.value_heads * s.key_dim * s.value_dim);
        let want = case.reference();
        for (n, use_) in case.uses.iter().enumerate() {
            if use_.slot().is_none() {
                continue;
            }
            for (t, (want_o, want_s)) in want[n].iter().enumerate() {
                let r = n * case.draft + t;
                let got_o: Vec<f32> = o[r * row..(r + 1) * row].iter().map(|x| x.to_f32()).collect();
                let ts = case.token_slots[r] as usize;
                let (eo, es) = (kda::rel_error(&got_o, want_o), kda::rel_error(&pool[ts * state..][..state], want_s));
                let bound = kda_tests::DECODE_STATE_BOUND * case.draft as f64;
                assert!(
                    eo < kda_tests::DECODE_O_BOUND && es < bound,
                    "{} {n}/{t}: o {eo:.2e} state {es:.2e}",
                    case.name
                );
            }
        }
        println!("verify: {}", case.name);
    }

    // Checkpoints after a prefill (the checkpoint kernel).
    let checkpoints = kda_tests::checkpoint_cases().swap_remove(0);
    prefill_and_checkpoint(&gpu, &checkpoints, StateDtype::F32);

    // A sequence of 130 tokens: two whole chunks and a tail.
    for kind in [kda::layer::LayerKind::Kda, kda::layer::LayerKind::Gdn] {
        let case = kda_tests::PooledPrefillCase::new(kind, 128, 130);
        let (pool, o) = run_pooled_prefill(&gpu, &case);
        case.check(&pool, &o);
    }

    let (problem, _) = io::read_problem(&fixture("two_seq_no_h0")).unwrap();
    let view = problem.model_view();
    assert!(view.h0.is_none(), "two_seq_no_h0 has no initial states");
    let out = run_without_final_states(&gpu, &view);
    let want = reference::model_reference(&view).unwrap();
    let errs = Outputs { ht: want.ht.clone(), ..out }.errors(&want);
    kda_tests::assert_close("two_seq_no_h0 without h0 and ht", errs);
    println!("recurrence without h0 and ht: h {:.2e} v_new {:.2e}", errs[0], errs[1]);
}

/// The recurrence (`Kernel::Auto`) on `p` with `ht: None`; `h` and `v_new` start as zeros (set by
/// the host, so initcheck sees them written), `ht` of the result is empty.
fn run_without_final_states(gpu: &Gpu, p: &kda::model::ModelView<'_>) -> Outputs {
    use kda::{DevicePlan, KdaInputs, KdaOutputs};
    let s = &gpu.stream;
    let plan = DevicePlan::model(s, p.plan.clone(), &p.shape).unwrap();
    let d = plan.dims();
    let (k, w, u) = (s.clone_htod(p.k).unwrap(), s.clone_htod(p.w).unwrap(), s.clone_htod(p.u).unwrap());
    let g = p.g.map(|g| s.clone_htod(g).unwrap());
    let gk = p.gk.map(|gk| s.clone_htod(gk).unwrap());
    let h0 = p.h0.map(|h0| s.clone_htod(h0).unwrap());
    let mut h = s.alloc_zeros::<kda::bf16>(d.h_len()).unwrap();
    let mut v_new = s.alloc_zeros::<kda::bf16>(d.value_len()).unwrap();
    {
        let inputs = KdaInputs {
            k: k.slice(..),
            w: w.slice(..),
            u: u.slice(..),
            g: g.as_ref().map(|g| g.slice(..)),
            gk: gk.as_ref().map(|gk| gk.slice(..)),
            h0: h0.as_ref().map(|h0| h0.slice(..)),
        };
        let mut outputs = KdaOutputs { h: h.slice_mut(..), v_new: v_new.slice_mut(..), ht: None };
        gpu.kda.launch(s, &plan, &inputs, &mut outputs, Kernel::Auto).unwrap();
    }
    s.synchronize().expect("the recurrence without final states");
    Outputs { h: s.clone_dtoh(&h).unwrap(), v_new: s.clone_dtoh(&v_new).unwrap(), ht: Vec::new() }
}

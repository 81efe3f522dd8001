//! `cargo xtask bench`: the benchmark of record (run on the GPU machine).
//!
//! In one process: measures device-to-device copy bandwidth, then for every reference shape
//! times each kernel (median of `--repeat` warm launches, each between its own CUDA events, inputs
//! rotated over enough copies that the L2 cannot keep them), checks the outputs against the f64
//! reference, prints a table and writes `bench/results.json`. Then the same for every model shape
//! of the generalized recurrence (`kda_cli::model_bench_shapes`) in a second table; a shape the
//! launcher refuses (`KdaError::Unsupported`) is a row and a record saying why. Last, the whole
//! layer on the peers' shapes (`kda layer --bench`'s), checked against the f64 definition.

use crate::args::Args;
use crate::harness::{DeviceProblem, bench_shapes, copy_bandwidth, floor_us, median_us};
use crate::proc::write_json;
use kda::columns::{ColumnMode, Columns};
use kda::model::{ModelShape, ModelView};
use kda::split::SplitMode;
use kda::{Dims, Kda, KdaError, KdaOptions, Kernel, Module, Outputs, Plan, Strides, inputs, reference, rel_error};
use kda_cli::{Progress, gates_name, layout_name, model_bench_shapes, model_floor_us};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Timed launches per shape and kernel (the issue asks for at least 100).
const DEFAULT_REPEAT: usize = 200;
const WARMUP: usize = 10;
const COPY_REPEAT: usize = 50;
/// Segment lengths (chunks) a split shape is also timed at, forced, to show the planner's
/// choice against its neighbours.
const SPLIT_SWEEP: [usize; 5] = [32, 64, 128, 256, 512];
/// Input copies are rotated until they span this many bytes: 5x the H200's 50 MB L2.
const ROTATION_BYTES: usize = 256 << 20;
/// Rotation copies: at least 2 so consecutive launches never reuse addresses, at most 8 to bound
/// device memory on the largest shape.
const MIN_COPIES: usize = 2;
const MAX_COPIES: usize = 8;
const SEED: u64 = crate::shapes::INPUT_SEED;
/// The whole benchmark is stopped (exit status 124) after this long, so a hang reports instead of
/// using up the device time.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(480);

#[derive(Debug, PartialEq)]
struct Options {
    repeat: usize,
    out_dir: PathBuf,
    limit: Duration,
    /// Also draw `chart.svg` beside `results.json`.
    plot: bool,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let a = Args::parse("bench", args, &["--repeat", "--out", "--timeout"], &["--plot"])?;
    a.no_positional("bench")?;
    Ok(Options {
        repeat: a.count("--repeat", DEFAULT_REPEAT)?,
        out_dir: a.path("--out", PathBuf::from("bench")),
        limit: a.timeout("--timeout", DEFAULT_TIMEOUT)?,
        plot: a.has("--plot"),
    })
}

pub fn run(args: &[String]) -> Result<(), String> {
    let o = parse(args)?;
    start_watchdog(o.limit);
    let (kda, stream) = Kda::open(0).map_err(|e| format!("bench needs a GPU: {e}"))?;
    let gpu = kda.context().name().map_err(|e| e.to_string())?;
    let date = chrono_free_date();
    println!("GPU: {gpu} (compute capability {:?}), {date}", kda.compute_capability());
    let copy_bw = copy_bandwidth(&stream, COPY_REPEAT).map_err(text)?;
    println!("device-to-device copy bandwidth: {:.3} TB/s (read + write)", copy_bw / 1e12);
    let best = kda.resolve(Kernel::Auto);
    print_occupancy(&kda, best);
    // Every item the bench times: the recurrence and model shapes, then the layer and decode
    // shapes once per module (twice on 9.x: the portable module's too).
    let modules = if best == Kernel::Hopper { 2 } else { 1 };
    let items = bench_shapes().len()
        + model_bench_shapes().len()
        + modules * (kda_cli::layer_bench_shapes().len() + kda_cli::decode_bench_shapes().len());
    let progress = Progress::new("bench", items);
    // The device work as closures over the stream, whose type (cudarc's) is not named here.
    let bench = Bench {
        best,
        copy_bw,
        upload: &|p: &ModelView<'_>| DeviceProblem::upload_model(&stream, p, Strides::PACKED),
        median_us: &|kernel: Kernel, devs: &mut [DeviceProblem]| {
            let copies = devs.len();
            median_us(&stream, WARMUP, o.repeat, |i| devs[i % copies].launch(&kda, &stream, kernel))
        },
        fresh_outputs: &|dev: &mut DeviceProblem, kernel: Kernel| {
            dev.poison_outputs(&stream)?;
            dev.launch(&kda, &stream, kernel)?;
            dev.download(&stream)
        },
        set_split: &|dev: &mut DeviceProblem, mode: SplitMode| dev.set_split(&stream, mode),
        set_columns: &|dev: &mut DeviceProblem, mode: ColumnMode| dev.set_columns(&stream, mode),
        progress: &progress,
    };
    let shapes = bench_shapes().into_iter().map(|(name, lengths)| bench.measure(name, lengths));
    let shapes = shapes.collect::<Result<Vec<_>, _>>()?;
    // The reference shapes' table first: it stands even if a model shape fails or time runs out.
    progress.out(&format!("\n{}\n", table(best, &shapes)));
    let models =
        model_bench_shapes().into_iter().map(|(name, lengths, shape)| bench.measure_model(name, lengths, shape));
    let models = models.collect::<Result<Vec<_>, _>>()?;
    progress.out(&format!("\nmodel shapes:\n\n{}", model_table(&models)));
    let layer_repeat = o.repeat.min(LAYER_REPEAT);
    let layer_cases = layer_cases()?;
    let time = |s: &kda_cli::LayerBenchShape, p: &kda::layer::LayerProblem| {
        kda_cli::time_layer_shape(&kda, &stream, (s, p), layer_repeat, copy_bw)
    };
    // A layer or decode shape that fails is reported in its table and fails the bench after the
    // results are written, so one shape does not cost the run's other numbers.
    let mut failed = Vec::new();
    let layers = layer_rows(&layer_cases, &time, ("layer", &progress), &mut failed);
    let rows = shapes.iter().map(|s| s.record(best, o.repeat));
    let time = |d: &kda_cli::DecodeShape| kda_cli::time_decode(&kda, &stream, d, o.repeat, copy_bw);
    let decodes = decode_rows(&time, o.repeat, ("decode", &progress), &mut failed);
    let mut rows: Vec<Value> =
        rows.chain(models.iter().map(|m| m.record(o.repeat))).chain(layers).chain(decodes).collect();
    // On a 9.x GPU, the layer and decode again with the portable module (what every other GPU
    // runs: its recurrence kernel in the layer), as `"layer-portable"` and `"decode-portable"`.
    if best == Kernel::Hopper {
        let options = KdaOptions { module: Module::Portable, ..KdaOptions::from_env().map_err(text)? };
        let portable = Kda::with_options(kda.context().clone(), options).map_err(text)?;
        let time = |s: &kda_cli::LayerBenchShape, p: &kda::layer::LayerProblem| {
            kda_cli::time_layer_shape(&portable, &stream, (s, p), layer_repeat, copy_bw)
        };
        rows.extend(layer_rows(&layer_cases, &time, ("layer-portable", &progress), &mut failed));
        let time = |d: &kda_cli::DecodeShape| kda_cli::time_decode(&portable, &stream, d, o.repeat, copy_bw);
        rows.extend(decode_rows(&time, o.repeat, ("decode-portable", &progress), &mut failed));
    }
    // The portable kernel's entries (`"kernel": "portable"`), where it ran the shape.
    let portable = shapes.iter().filter_map(|s| s.portable_record(o.repeat));
    let rows: Vec<Value> = rows.into_iter().chain(portable).collect();
    drop(progress);
    let doc = json!({ "gpu": gpu, "date": date, "copy_bw_Bps": copy_bw, "shapes": rows });
    write_results(&o.out_dir, &doc)?;
    if o.plot {
        crate::chart::write(&doc, &o.out_dir.join("chart.svg"))?;
    }
    if failed.is_empty() { Ok(()) } else { Err(format!("bench: shapes failed: {}", failed.join("; "))) }
}

/// The GPU work runs in this process: a watchdog thread ends it at `limit`.
fn start_watchdog(limit: Duration) {
    std::thread::spawn(move || {
        std::thread::sleep(limit);
        eprintln!("\nerror: bench timed out after {} s", limit.as_secs());
        std::process::exit(124);
    });
}

fn text(e: KdaError) -> String {
    e.to_string()
}

/// The occupancy of the best kernel and the baseline.
fn print_occupancy(kda: &Kda, best: Kernel) {
    for kernel in [best, Kernel::Baseline] {
        match kda.ctas_per_sm(kernel) {
            Ok(n) => println!("{kernel:?}: {n} CTAs per SM"),
            Err(e) => println!("{kernel:?}: CTAs per SM not known ({e})"),
        }
    }
}

/// Uploads a problem, packed.
type Upload<'a> = &'a dyn Fn(&ModelView<'_>) -> Result<DeviceProblem, KdaError>;
/// The median time of a kernel's launches in microseconds, rotated over the copies.
type MedianUs<'a> = &'a dyn Fn(Kernel, &mut [DeviceProblem]) -> Result<f64, KdaError>;
/// A kernel's outputs, fresh: poison, run once, download.
type FreshOutputs<'a> = &'a dyn Fn(&mut DeviceProblem, Kernel) -> Result<Outputs, KdaError>;
/// Re-plans an uploaded problem's split.
type SetSplit<'a> = &'a dyn Fn(&mut DeviceProblem, SplitMode) -> Result<(), KdaError>;
/// Re-plans an uploaded problem's column blocks.
type SetColumns<'a> = &'a dyn Fn(&mut DeviceProblem, ColumnMode) -> Result<(), KdaError>;

/// The device, its copy bandwidth and the kernel under test, with the device work as closures.
struct Bench<'a> {
    best: Kernel,
    copy_bw: f64,
    upload: Upload<'a>,
    median_us: MedianUs<'a>,
    fresh_outputs: FreshOutputs<'a>,
    set_split: SetSplit<'a>,
    set_columns: SetColumns<'a>,
    progress: &'a Progress,
}

/// What the benchmark measured on one shape.
struct Shape {
    name: &'static str,
    lengths: Vec<usize>,
    dims: Dims,
    copies: usize,
    us: f64,
    floor_us: f64,
    baseline_us: f64,
    /// The portable tensor-core kernel's median and its outputs' errors against the reference.
    portable: Option<(f64, [f64; 3])>,
    /// The column blocks timed, and the median with the other width forced.
    columns: Columns,
    other_columns_us: Option<f64>,
    errs: [f64; 3],
    f32_floor: f64,
}

/// Why the launcher refused a problem: a [`KdaError::Unsupported`]'s argument and reason.
#[derive(Clone, Debug, PartialEq)]
struct Refusal {
    argument: &'static str,
    reason: String,
}

/// `r`, with a [`KdaError::Unsupported`] as `Ok(Err(refusal))` and any other error as the error.
fn refusable<T>(r: Result<T, KdaError>) -> Result<Result<T, Refusal>, String> {
    match r {
        Ok(v) => Ok(Ok(v)),
        Err(KdaError::Unsupported { argument, reason }) => Ok(Err(Refusal { argument, reason })),
        Err(e) => Err(e.to_string()),
    }
}

/// The times of one problem on the device: the best kernel's and the baseline's medians, and
/// the split's.
struct Timing {
    /// Rotation copies of the inputs.
    copies: usize,
    us: f64,
    /// The split plan timed (`SplitPlan::summary`), and, when it splits, the median with splitting
    /// off.
    split: String,
    unsplit_us: Option<f64>,
    /// Medians at the forced segment lengths of `SPLIT_SWEEP` (split shapes only).
    sweep: Vec<(usize, f64)>,
    /// The Hopper kernel's column blocks as the planner chose them, and the median with the
    /// other width forced (the Hopper kernel only).
    columns: Columns,
    other_columns_us: Option<f64>,
    /// The baseline's median, or why the launcher refused it the problem.
    baseline_us: Result<f64, Refusal>,
    /// The portable tensor-core kernel's median, or its refusal.
    portable_us: Result<f64, Refusal>,
}

/// One problem on the device: its [`Timing`], the best kernel's fresh outputs, and the portable
/// kernel's where it ran the problem.
struct Timed {
    timing: Timing,
    out: Outputs,
    portable_out: Option<Outputs>,
}

impl Bench<'_> {
    /// Uploads `p` in rotation copies, times the best kernel and the baseline on them and runs the
    /// best kernel once more on fresh outputs; `Ok(Err(..))` when the launcher refuses the problem
    /// to the best kernel.
    fn time(&self, p: &ModelView<'_>) -> Result<Result<Timed, Refusal>, String> {
        let copies = rotation_copies(input_bytes(p));
        let devs = (0..copies).map(|_| (self.upload)(p)).collect::<Result<Vec<_>, _>>();
        let mut devs = match refusable(devs)? {
            Ok(devs) => devs,
            Err(refusal) => return Ok(Err(refusal)),
        };
        self.progress.stage(&format!("{copies} copies uploaded; timing"));
        let us = match refusable((self.median_us)(self.best, &mut devs))? {
            Ok(us) => us,
            Err(refusal) => return Ok(Err(refusal)),
        };
        let out = (self.fresh_outputs)(&mut devs[0], self.best).map_err(text)?;
        let split = devs[0].plan.split_plan().summary();
        let is_split = devs[0].plan.split_plan().is_split();
        let columns = devs[0].plan.columns();
        // Every copy re-planned in `mode`'s column blocks, then timed.
        let mut time_columns = |mode: ColumnMode| -> Result<f64, String> {
            for dev in devs.iter_mut() {
                (self.set_columns)(dev, mode).map_err(text)?;
            }
            (self.median_us)(self.best, &mut devs).map_err(text)
        };
        let mut other_columns_us = None;
        let other = match columns {
            Columns::Wide => Columns::Narrow,
            Columns::Narrow => Columns::Wide,
        };
        // (`K = 256` runs in narrow blocks only.)
        if self.best == Kernel::Hopper && other.runs(p.shape.key_dim) {
            self.progress.stage(&format!("{columns:?} blocks; timing {other:?}"));
            other_columns_us = Some(time_columns(ColumnMode::Force(other))?);
            time_columns(ColumnMode::Auto)?;
        }
        // Every copy re-planned as `mode`, then timed.
        let mut time_split = |mode: SplitMode| -> Result<f64, String> {
            for dev in devs.iter_mut() {
                (self.set_split)(dev, mode).map_err(text)?;
            }
            (self.median_us)(self.best, &mut devs).map_err(text)
        };
        let (mut unsplit_us, mut sweep) = (None, Vec::new());
        if is_split && self.best == Kernel::Hopper {
            self.progress.stage(&format!("split ({split}); timing unsplit and the sweep"));
            unsplit_us = Some(time_split(SplitMode::Off)?);
            for chunks in SPLIT_SWEEP {
                sweep.push((chunks, time_split(SplitMode::Chunks(chunks))?));
            }
        }
        let baseline_us = if self.best == Kernel::Baseline {
            Ok(us)
        } else {
            refusable((self.median_us)(Kernel::Baseline, &mut devs))?
        };
        let portable_us = refusable((self.median_us)(Kernel::Portable, &mut devs))?;
        let portable_out = match portable_us {
            Ok(_) => Some((self.fresh_outputs)(&mut devs[0], Kernel::Portable).map_err(text)?),
            Err(_) => None,
        };
        let timing =
            Timing { copies, us, split, unsplit_us, sweep, columns, other_columns_us, baseline_us, portable_us };
        Ok(Ok(Timed { timing, out, portable_out }))
    }

    /// Times the best kernel and the baseline on shape `name` and checks the best kernel's
    /// outputs against the f64 reference.
    fn measure(&self, name: &'static str, lengths: Vec<usize>) -> Result<Shape, String> {
        let t0 = Instant::now();
        self.progress.start(name);
        self.progress.stage("generating inputs");
        let p = inputs::random_problem(Plan::from_lengths(&lengths), inputs::REFERENCE_HEADS, true, SEED);
        let dims = p.dims();
        let refused = |kernel: Kernel, r: Refusal| format!("{name}: the {kernel:?} kernel refused it: {}", r.reason);
        let Timed {
            timing: Timing { copies, us, baseline_us, portable_us, columns, other_columns_us, .. },
            out,
            portable_out,
        } = self.time(&p.model_view())?.map_err(|r| refused(self.best, r))?;
        let baseline_us = baseline_us.map_err(|r| refused(Kernel::Baseline, r))?;
        self.progress.stage("reference");
        let want = reference::reference(&p).map_err(text)?;
        let errs = out.errors(&want);
        // The f32 rounding floor of this problem (see `reference::reference_f32`), on `h`.
        let f32_floor = rel_error(&reference::reference_f32(&p).map_err(text)?.h, &want.h);
        let floor_us = floor_us(&dims, self.copy_bw);
        self.progress.finish(&format!("done in {:.1} s", t0.elapsed().as_secs_f64()));
        let portable = portable_us.ok().zip(portable_out.map(|o| o.errors(&want)));
        Ok(Shape {
            name,
            lengths,
            dims,
            copies,
            us,
            floor_us,
            baseline_us,
            portable,
            columns,
            other_columns_us,
            errs,
            f32_floor,
        })
    }

    /// [`Bench::measure`] on model shape `name` (against `reference::model_reference`), or the
    /// launcher's refusal of it.
    fn measure_model(&self, name: &'static str, lengths: Vec<usize>, shape: ModelShape) -> Result<ModelRow, String> {
        let t0 = Instant::now();
        self.progress.start(name);
        self.progress.stage("generating inputs");
        let p = inputs::try_random_model_problem(Plan::from_lengths(&lengths), shape, true, SEED).map_err(text)?;
        let view = p.view();
        let floor_us = model_floor_us(&p.plan, &shape, self.copy_bw);
        let (seqs, tokens) = (p.plan.num_seqs(), p.plan.tokens());
        let result = match self.time(&view)? {
            Err(refusal) => {
                self.progress.finish(&format!("unsupported: {}", refusal.reason));
                Err(refusal)
            }
            Ok(Timed { timing, out, .. }) => {
                self.progress.stage("reference");
                let want = reference::model_reference(&view).map_err(text)?;
                let errs = out.errors(&want);
                let f32_floor = rel_error(&reference::model_reference_f32(&view).map_err(text)?.h, &want.h);
                self.progress.finish(&format!("done in {:.1} s", t0.elapsed().as_secs_f64()));
                for (chunks, t) in &timing.sweep {
                    self.progress
                        .line(&format!("    [{name}] segments of {chunks} chunks: {t:.1} us ({:.3})", floor_us / t));
                }
                Ok(Measured { timing, errs, f32_floor })
            }
        };
        Ok(ModelRow { name, lengths, shape, seqs, tokens, kernel: self.best, floor_us, result })
    }
}

/// Bytes of the inputs `k`, `w`, `u` and the gates of `p` (what each rotation copy holds besides
/// `h0`).
fn input_bytes(p: &ModelView<'_>) -> usize {
    let gates = p.g.map_or(0, <[f32]>::len) + p.gk.map_or(0, <[f32]>::len);
    (p.k.len() + p.w.len() + p.u.len()) * 2 + gates * 4
}

/// How many copies of inputs of `input_bytes` to rotate over so that the L2 cannot keep them.
fn rotation_copies(input_bytes: usize) -> usize {
    ROTATION_BYTES.div_ceil(input_bytes.max(1)).clamp(MIN_COPIES, MAX_COPIES)
}

impl Shape {
    /// The shape's row of the table.
    fn row(&self) -> String {
        let Shape { name, dims: d, us, floor_us, baseline_us, columns, other_columns_us, errs, f32_floor, .. } = self;
        format!(
            "| {name} | {} | {} | {} | {} | {us:.1} | {floor_us:.1} | {:.3} | {} | {baseline_us:.1} | {:.2}x | {:.2e} | {:.2e} | {:.2e} | {f32_floor:.2e} |",
            d.seqs,
            d.tokens,
            d.heads,
            columns.width(),
            floor_us / us,
            other_cell(*other_columns_us, *floor_us),
            baseline_us / us,
            errs[0],
            errs[1],
            errs[2]
        )
    }

    /// The portable kernel's record in `results.json`, where it ran the shape (its outputs are
    /// checked by the GPU suite, not here).
    fn portable_record(&self, repeat: usize) -> Option<Value> {
        let (us, [h, v_new, ht]) = self.portable?;
        Some(json!({
            "shape": self.name, "kernel": "portable", "us": us, "floor_us": self.floor_us,
            "ratio": self.floor_us / us, "repeat": repeat, "lengths": self.lengths, "heads": self.dims.heads,
            "rel_err_h": h, "rel_err_v_new": v_new, "rel_err_ht": ht, "f32_floor_h": self.f32_floor,
        }))
    }

    /// The shape's record in `results.json` (timed with kernel `best`, `repeat` launches).
    fn record(&self, best: Kernel, repeat: usize) -> Value {
        let Shape {
            name,
            lengths,
            dims: d,
            copies,
            us,
            floor_us,
            baseline_us,
            portable,
            columns,
            other_columns_us,
            errs,
            f32_floor,
        } = self;
        json!({
            "shape": name, "lengths": lengths, "heads": d.heads, "kernel": format!("{best:?}"),
            "us": us, "floor_us": floor_us, "ratio": floor_us / us, "baseline_us": baseline_us,
            "portable_us": portable.map(|(us, _)| us),
            "block_width": columns.width(), "other_blocks_us": other_columns_us,
            "rel_err_h": errs[0], "rel_err_v_new": errs[1], "rel_err_ht": errs[2], "f32_floor_h": f32_floor,
            "repeat": repeat, "rotation_copies": copies,
        })
    }
}

/// The markdown table of every shape, `best` being the kernel timed besides the baseline.
fn table(best: Kernel, shapes: &[Shape]) -> String {
    let mut table = vec![format!(
        "| shape | N | T | H | blocks | {best:?} us | floor us | floor/time | other blocks us (floor/time) | baseline us | speedup | rel err h | rel err v_new | rel err ht | f32 floor h |"
    )];
    table.push("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|".into());
    table.extend(shapes.iter().map(Shape::row));
    table.join("\n")
}

/// What the benchmark measured on a shape the launcher ran: its times and the best kernel's
/// errors.
struct Measured {
    timing: Timing,
    errs: [f64; 3],
    f32_floor: f64,
}

/// What the benchmark found on one model shape.
struct ModelRow {
    name: &'static str,
    lengths: Vec<usize>,
    shape: ModelShape,
    seqs: usize,
    tokens: usize,
    /// The kernel timed (or refused the shape).
    kernel: Kernel,
    floor_us: f64,
    result: Result<Measured, Refusal>,
}

/// `text` as one markdown table cell (a `|` escaped).
fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

impl ModelRow {
    /// The shape's row of the model table.
    fn row(&self) -> String {
        let ModelRow { name, shape: s, seqs, tokens, kernel, floor_us, .. } = self;
        let kernel = match &self.result {
            Ok(_) => format!("{kernel:?}"),
            Err(r) => cell(&format!("unsupported: {}", r.reason)),
        };
        let (gates, layout) = (gates_name(s.gates), layout_name(s.layout));
        let head = format!(
            "| {name} | {kernel} | {seqs} | {tokens} | {} | {} | {} | {} | {gates} | {layout} |",
            s.heads, s.value_heads, s.key_dim, s.value_dim
        );
        let tail = match &self.result {
            // Blocks, split and time empty, the floor, then nine empty cells.
            Err(_) => format!(" | | | {floor_us:.1} |{}", " |".repeat(9)),
            Ok(Measured {
                timing: Timing { us, split, unsplit_us, baseline_us, columns, other_columns_us, .. },
                errs,
                f32_floor,
            }) => {
                let (baseline, speedup) = match baseline_us {
                    Ok(b) => (format!("{b:.1}"), format!("{:.2}x", b / us)),
                    Err(_) => ("unsupported".into(), String::new()),
                };
                let unsplit = unsplit_us.map_or(String::new(), |u| format!("{u:.1} ({:.3})", floor_us / u));
                format!(
                    " {} | {split} | {us:.1} | {floor_us:.1} | {:.3} | {} | {unsplit} | {baseline} | {speedup} | {:.2e} | {:.2e} | {:.2e} | {f32_floor:.2e} |",
                    columns.width(),
                    floor_us / us,
                    other_cell(*other_columns_us, *floor_us),
                    errs[0],
                    errs[1],
                    errs[2]
                )
            }
        };
        head + &tail
    }

    /// The shape's record in `results.json` (`repeat` launches): the fields of [`Shape::record`]
    /// and the model's sizes; for a refused shape `"kernel": "unsupported"`, the kernel that
    /// refused it, the argument and the reason, and the floor (no time, no ratio).
    fn record(&self, repeat: usize) -> Value {
        let ModelRow { name, lengths, shape: s, kernel, floor_us, .. } = self;
        let mut r = json!({
            "shape": name, "lengths": lengths, "heads": s.heads, "value_heads": s.value_heads,
            "key_dim": s.key_dim, "value_dim": s.value_dim, "gates": gates_name(s.gates),
            "state_layout": layout_name(s.layout), "floor_us": floor_us,
        });
        let fields = match &self.result {
            Err(Refusal { argument, reason }) => json!({
                "kernel": "unsupported", "refused_by": format!("{kernel:?}"), "argument": argument, "reason": reason,
            }),
            Ok(Measured {
                timing:
                    Timing { copies, us, split, unsplit_us, sweep, columns, other_columns_us, baseline_us, portable_us },
                errs,
                f32_floor,
            }) => {
                let sweep: Vec<Value> =
                    sweep.iter().map(|(c, t)| json!({ "segment_chunks": c, "us": t, "ratio": floor_us / t })).collect();
                let mut m = json!({
                    "split_sweep": sweep,
                    "kernel": format!("{kernel:?}"), "us": us, "ratio": floor_us / us, "split": split,
                    "unsplit_us": unsplit_us, "unsplit_ratio": unsplit_us.map(|u| floor_us / u),
                    "block_width": columns.width(), "other_blocks_us": other_columns_us,
                    "baseline_us": baseline_us.as_ref().ok(), "portable_us": portable_us.as_ref().ok(),
                    "rel_err_h": errs[0], "rel_err_v_new": errs[1], "rel_err_ht": errs[2], "f32_floor_h": f32_floor,
                    "repeat": repeat, "rotation_copies": copies,
                });
                if let Err(refusal) = baseline_us {
                    m["baseline_unsupported"] = json!(refusal.reason);
                }
                m
            }
        };
        if let (Some(r), Value::Object(fields)) = (r.as_object_mut(), fields) {
            r.extend(fields);
        }
        r
    }
}

/// The markdown table of the model shapes: one row per shape and the kernel timed.
fn model_table(rows: &[ModelRow]) -> String {
    let mut table = vec![
        "| shape | kernel | N | T | H | HV | K | V | gates | state | blocks | split | us | floor us | floor/time | other blocks us (floor/time) | unsplit us (floor/time) | baseline us | speedup | rel err h | rel err v_new | rel err ht | f32 floor h |".to_string(),
        "|---|---|---:|---:|---:|---:|---:|---:|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|".into(),
    ];
    table.extend(rows.iter().map(ModelRow::row));
    table.join("\n")
}

/// A table cell of the time with the other column blocks and its floor/time (empty when not
/// timed).
fn other_cell(us: Option<f64>, floor_us: f64) -> String {
    us.map_or(String::new(), |u| format!("{u:.1} ({:.3})", floor_us / u))
}

/// Launches timed per layer shape: a layer launch takes milliseconds, not microseconds.
const LAYER_REPEAT: usize = 20;

/// A layer bench shape's problem and its f64 reference on the sampled key heads
/// (`kda_cli::reference_heads`), built once for both modules' rows.
struct LayerCase {
    shape: kda_cli::LayerBenchShape,
    problem: kda::layer::LayerProblem,
    heads: Vec<usize>,
    want: kda::layer::LayerOutputs,
}

/// Every layer bench shape's [`LayerCase`].
fn layer_cases() -> Result<Vec<LayerCase>, String> {
    let cases = kda_cli::layer_bench_shapes().into_iter().map(|shape| {
        let problem = shape.problem(SEED);
        let heads = kda_cli::reference_heads(&shape.shape);
        let want = kda::layer::layer_reference(&problem.key_heads(&heads)).map_err(text)?;
        Ok(LayerCase { shape, problem, heads, want })
    });
    cases.collect()
}

/// The whole layer on the peers' shapes (`kda_cli::layer_bench_shapes`): each timed by `time`
/// (`kda_cli::time_layer_shape`: the median of its launches, or for the short prompts the
/// host's time per call over `HOST_TIMED_CALLS`, planning included) and its first run's `o` and
/// final states checked against the f64 definition on the sampled heads; prints a table (a
/// shape over `kda_cli::BENCH_ERROR_BOUNDS` marked, a shape that fails named in `failed`),
/// returns a record per shape timed (`"kernel": kernel`).
fn layer_rows(
    cases: &[LayerCase],
    time: &dyn Fn(&kda_cli::LayerBenchShape, &kda::layer::LayerProblem) -> Result<kda_cli::LayerTiming, KdaError>,
    (kernel, progress): (&str, &Progress),
    failed: &mut Vec<String>,
) -> Vec<Value> {
    let mut rows = Vec::new();
    let mut lines = vec![
        "| layer shape | us | IO floor us | floor / time | timing | stages us | rel err o | rel err ht | heads checked |"
            .to_string(),
    ];
    lines.push("|---|---:|---:|---:|---|---|---:|---:|---|".into());
    for c in cases {
        let (s, p) = (&c.shape, &c.problem);
        let t = match progress.item(&format!("layer_{} ({kernel})", s.name), "timing", || time(s, p)) {
            Ok(t) => t,
            Err(e) => {
                lines.push(format!("| layer_{} | failed: {e} |", s.name));
                failed.push(format!("layer_{} ({kernel}): {e}", s.name));
                continue;
            }
        };
        let errs = t.outputs.key_heads(p, &c.heads).errors(&c.want);
        let within = errs.iter().zip(kda_cli::BENCH_ERROR_BOUNDS).all(|(e, b)| *e <= b);
        let ratio = t.floor_us / t.us;
        lines.push(format!(
            "| layer_{} | {:.1} | {:.1} | {ratio:.3} | {} | {} | {:.2e}{} | {:.2e} | {:?} of {} |",
            s.name,
            t.us,
            t.floor_us,
            t.method(),
            t.stages_text(),
            errs[0],
            if within { "" } else { " (over the bound)" },
            errs[1],
            c.heads,
            s.shape.heads
        ));
        rows.push(json!({
            "shape": format!("layer_{}", s.name), "kernel": kernel, "us": t.us, "floor_us": t.floor_us, "ratio": ratio,
            "rel_err_o": errs[0], "rel_err_ht": errs[1], "within_bounds": within, "reference_heads": c.heads,
            "repeat": t.timed, "host_timed": s.host_timed,
            "plan_reused_us": t.plan_reused_us, "new_plan_us": t.new_plan_us, "planning_us": t.planning_us,
            "stages_us": t.stages.iter().map(|(stage, us)| (stage.name().to_string(), json!(us))).collect::<serde_json::Map<_, _>>(),
            "lengths": s.lengths, "heads": s.shape.heads, "value_heads": s.shape.value_heads,
            "key_dim": s.shape.key_dim, "value_dim": s.shape.value_dim, "options": format!("{:?}", s.options),
            "g_dtype": s.dtypes.g.name(), "beta_dtype": s.dtypes.beta.name(),
        }));
    }
    progress.out(&format!("\nthe layer ({kernel}):\n\n{}", lines.join("\n")));
    rows
}

/// The decode step on LAYER.md's decode shapes (`kda_cli::decode_bench_shapes`): each timed by
/// `time` (`kda_cli::time_decode` over `repeat` calls, its first call checked against the f64
/// layer over the pool); prints a table (a shape that fails named in `failed`), returns a record
/// per shape timed (`"kernel": kernel`).
fn decode_rows(
    time: &dyn Fn(&kda_cli::DecodeShape) -> Result<kda_cli::DecodeTiming, KdaError>,
    repeat: usize,
    (kernel, progress): (&str, &Progress),
    failed: &mut Vec<String>,
) -> Vec<Value> {
    let mut rows = Vec::new();
    let mut lines = vec!["| decode shape | us | floor us | floor / time | rel err o | rel err ht |".to_string()];
    lines.push("|---|---:|---:|---:|---:|---:|".into());
    for d in kda_cli::decode_bench_shapes() {
        let t = match progress.item(&format!("{} ({kernel})", d.name), "timing", || time(&d)) {
            Ok(t) => t,
            Err(e) => {
                lines.push(format!("| {} | failed: {e} |", d.name));
                failed.push(format!("{} ({kernel}): {e}", d.name));
                continue;
            }
        };
        let ratio = t.floor_us / t.us;
        lines.push(format!(
            "| {} | {:.1} | {:.1} | {ratio:.3} | {:.2e} | {:.2e} |",
            d.name, t.us, t.floor_us, t.errors[0], t.errors[1]
        ));
        let s = d.shape;
        rows.push(json!({
            "shape": d.name, "kernel": kernel, "us": t.us, "floor_us": t.floor_us, "ratio": ratio,
            "rel_err_o": t.errors[0], "rel_err_ht": t.errors[1], "repeat": repeat, "seqs": d.seqs,
            "draft": d.draft, "heads": s.heads, "value_heads": s.value_heads, "key_dim": s.key_dim,
            "value_dim": s.value_dim, "options": format!("{:?}", d.options),
        }));
    }
    progress.out(&format!("\nthe decode step ({kernel}):\n\n{}", lines.join("\n")));
    rows
}

/// Writes `doc` to `out_dir/results.json`.
fn write_results(out_dir: &Path, doc: &Value) -> Result<(), String> {
    std::fs::create_dir_all(out_dir).map_err(|e| e.to_string())?;
    let path = out_dir.join("results.json");
    write_json(&path, doc)?;
    println!("wrote {}", path.display());
    Ok(())
}

/// Today's UTC date as `YYYY-MM-DD`, from the system clock (civil-from-days, no date crate).
fn chrono_free_date() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let z = (secs / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::strings;

    #[test]
    fn options() {
        let o = parse(&[]).unwrap();
        assert_eq!(o, Options { repeat: 200, out_dir: "bench".into(), limit: DEFAULT_TIMEOUT, plot: false });
        let o = parse(&strings(&["--repeat", "100", "--timeout=300", "--out", "/o", "--plot"])).unwrap();
        assert_eq!(o, Options { repeat: 100, out_dir: "/o".into(), limit: Duration::from_secs(300), plot: true });
        assert_eq!(parse(&strings(&["x"])).unwrap_err(), "bench: unexpected argument x");
        assert!(parse(&strings(&["--repeat", "0"])).is_err());
    }

    #[test]
    fn a_shape_in_the_table_and_the_results() {
        let shape = Shape {
            name: "tiny",
            lengths: vec![256],
            dims: Dims::new(&kda::Plan::from_lengths(&[256]), 64),
            copies: 8,
            us: 20.0,
            floor_us: 10.0,
            baseline_us: 50.0,
            portable: Some((40.0, [1e-4, 2e-4, 3e-4])),
            columns: Columns::Wide,
            other_columns_us: Some(25.0),
            errs: [1e-3, 2e-3, 3e-4],
            f32_floor: 1e-6,
        };
        let t = table(Kernel::Baseline, std::slice::from_ref(&shape));
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("| shape | N | T | H | blocks | Baseline us | floor us |"), "{}", lines[0]);
        assert_eq!(
            lines[2],
            "| tiny | 1 | 256 | 64 | 64 | 20.0 | 10.0 | 0.500 | 25.0 (0.400) | 50.0 | 2.50x | 1.00e-3 | 2.00e-3 | 3.00e-4 | 1.00e-6 |"
        );
        let r = shape.record(Kernel::Baseline, 100);
        assert_eq!(
            (r["kernel"].as_str(), r["ratio"].as_f64(), r["rotation_copies"].as_u64()),
            (Some("Baseline"), Some(0.5), Some(8))
        );
        assert_eq!(
            (r["lengths"][0].as_u64(), r["heads"].as_u64(), r["repeat"].as_u64()),
            (Some(256), Some(64), Some(100))
        );
        let p = shape.portable_record(100).expect("the portable kernel ran it");
        assert_eq!(
            (p["kernel"].as_str(), p["us"].as_f64(), p["ratio"].as_f64()),
            (Some("portable"), Some(40.0), Some(0.25))
        );
        assert_eq!((p["rel_err_h"].as_f64(), p["rel_err_ht"].as_f64()), (Some(1e-4), Some(3e-4)));
        assert!(Shape { portable: None, ..shape }.portable_record(100).is_none());
    }

    fn qwen_row(result: Result<Measured, Refusal>) -> ModelRow {
        let gates = kda::model::Gates { g: true, gk: false };
        let shape = ModelShape { value_heads: 32, gates, ..ModelShape::kda(16) };
        ModelRow {
            name: "qwen",
            lengths: vec![8192],
            shape,
            seqs: 1,
            tokens: 8192,
            kernel: Kernel::Hopper,
            floor_us: 90.0,
            result,
        }
    }

    #[test]
    fn a_model_shape_in_the_table_and_the_results() {
        let refusal = Refusal { argument: "g", reason: "a scalar gate: the baseline runs KDA".into() };
        let measured = Measured {
            timing: Timing {
                copies: 2,
                us: 100.0,
                split: "whole".into(),
                unsplit_us: None,
                sweep: vec![],
                columns: Columns::Narrow,
                other_columns_us: Some(180.0),
                baseline_us: Err(refusal.clone()),
                portable_us: Err(refusal),
            },
            errs: [1e-3, 2e-3, 3e-4],
            f32_floor: 1e-6,
        };
        let row = qwen_row(Ok(measured));
        let t = model_table(std::slice::from_ref(&row));
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3);
        let columns = |line: &str| line.matches('|').count();
        assert!(lines.iter().all(|l| columns(l) == 24), "{t}");
        assert_eq!(
            lines[2],
            "| qwen | Hopper | 1 | 8192 | 16 | 32 | 128 | 128 | g | [K, V] | 32 | whole | 100.0 | 90.0 | 0.900 | 180.0 (0.500) |  | unsupported |  | 1.00e-3 | 2.00e-3 | 3.00e-4 | 1.00e-6 |"
        );
        let r = row.record(100);
        assert_eq!(
            (r["shape"].as_str(), r["kernel"].as_str(), r["ratio"].as_f64()),
            (Some("qwen"), Some("Hopper"), Some(0.9))
        );
        assert_eq!(
            (r["us"].as_f64(), r["floor_us"].as_f64(), r["rel_err_v_new"].as_f64()),
            (Some(100.0), Some(90.0), Some(2e-3))
        );
        assert_eq!(
            (r["heads"].as_u64(), r["value_heads"].as_u64(), r["gates"].as_str()),
            (Some(16), Some(32), Some("g"))
        );
        assert_eq!(
            (r["state_layout"].as_str(), r["repeat"].as_u64(), r["rotation_copies"].as_u64()),
            (Some("[K, V]"), Some(100), Some(2))
        );
        assert!(r["baseline_us"].is_null());
        assert_eq!(r["baseline_unsupported"].as_str(), Some("a scalar gate: the baseline runs KDA"));

        let timed_baseline = Measured {
            timing: Timing {
                copies: 2,
                us: 100.0,
                split: "1 of 1 sequences cut: 4 segments of 32 chunks".into(),
                unsplit_us: Some(180.0),
                sweep: vec![(64, 150.0)],
                columns: Columns::Wide,
                other_columns_us: None,
                baseline_us: Ok(400.0),
                portable_us: Ok(300.0),
            },
            errs: [0.0; 3],
            f32_floor: 0.0,
        };
        let r = qwen_row(Ok(timed_baseline));
        assert!(r.row().contains("| 180.0 (0.500) | 400.0 | 4.00x |"), "{}", r.row());
        let r = r.record(100);
        assert_eq!((r["baseline_us"].as_f64(), r.get("baseline_unsupported")), (Some(400.0), None));
        assert_eq!((r["unsplit_us"].as_f64(), r["unsplit_ratio"].as_f64()), (Some(180.0), Some(0.5)));
    }

    #[test]
    fn a_refused_model_shape_is_a_row_and_a_record_with_its_reason() {
        let refusal = Refusal { argument: "key_dim", reason: "K = 64: the Hopper kernel runs K = 128 | here".into() };
        let row = qwen_row(Err(refusal));
        let t = model_table(std::slice::from_ref(&row));
        let line = t.lines().nth(2).unwrap();
        assert_eq!(
            line,
            "| qwen | unsupported: K = 64: the Hopper kernel runs K = 128 \\| here | 1 | 8192 | 16 | 32 | 128 | 128 | g | [K, V] | | | | 90.0 | | | | | | | | | |"
        );
        // The escaped `|` is not a column.
        assert_eq!(line.replace("\\|", "").matches('|').count(), 24);
        let r = row.record(100);
        assert_eq!((r["kernel"].as_str(), r["refused_by"].as_str()), (Some("unsupported"), Some("Hopper")));
        assert_eq!(
            (r["argument"].as_str(), r["reason"].as_str()),
            (Some("key_dim"), Some("K = 64: the Hopper kernel runs K = 128 | here"))
        );
        assert_eq!(
            (r["shape"].as_str(), r["floor_us"].as_f64(), r["key_dim"].as_u64()),
            (Some("qwen"), Some(90.0), Some(128))
        );
        for absent in ["ratio", "us", "baseline_us", "rel_err_h"] {
            assert!(r.get(absent).is_none(), "{absent}: {r}");
        }
    }

    #[test]
    fn only_an_unsupported_problem_is_a_refusal() {
        let unsupported = KdaError::Unsupported { argument: "value_dim", reason: "V = 96".into() };
        let refusal = Refusal { argument: "value_dim", reason: "V = 96".into() };
        assert_eq!(refusable::<()>(Err(unsupported)), Ok(Err(refusal)));
        assert_eq!(refusable(Ok(3)), Ok(Ok(3)));
        let other = KdaError::Argument { name: "repeat", reason: "must be at least 1".into() };
        assert_eq!(refusable::<()>(Err(other)), Err("argument `repeat`: must be at least 1".into()));
    }

    #[test]
    fn inputs_are_rotated_over_two_to_eight_copies() {
        let p = inputs::try_random_model_problem(
            Plan::from_lengths(&[3]),
            ModelShape { gates: kda::model::Gates { g: true, gk: true }, value_heads: 2, ..ModelShape::kda(1) },
            false,
            1,
        )
        .unwrap();
        // k (1 head), w, u (2 heads) in bf16; g (2 values a token) and gk (2 x 128) in f32.
        assert_eq!(input_bytes(&p.view()), 3 * (128 + 256 + 256) * 2 + 3 * (2 + 256) * 4);
        assert_eq!(rotation_copies(1), MAX_COPIES);
        assert_eq!(rotation_copies(100 << 20), 3);
        assert_eq!(rotation_copies(1 << 30), MIN_COPIES);
    }
}

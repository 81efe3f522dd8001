//! `cargo xtask bench`: the benchmark of record (run on the GPU machine).
//!
//! In one process: measures device-to-device copy bandwidth, then for every reference shape
//! times each kernel (median of `--repeat` warm launches, each between its own CUDA events, inputs
//! rotated over enough copies that the L2 cannot keep them), checks the outputs against the f64
//! reference, prints a table and writes `bench/results.json`.

use crate::args::Args;
use crate::harness::{DeviceProblem, bench_shapes, copy_bandwidth, floor_us, median_us};
use crate::outputs::rel_errors;
use crate::proc::write_json;
use kda::{Dims, Kda, KdaError, Kernel, Outputs, Plan, Problem, inputs, reference, rel_error};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Timed launches per shape and kernel (the issue asks for at least 100).
const DEFAULT_REPEAT: usize = 200;
const WARMUP: usize = 10;
const COPY_REPEAT: usize = 50;
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
}

fn parse(args: &[String]) -> Result<Options, String> {
    let a = Args::parse("bench", args, &["--repeat", "--out", "--timeout"], &[])?;
    a.no_positional("bench")?;
    Ok(Options {
        repeat: a.count("--repeat", DEFAULT_REPEAT)?,
        out_dir: a.path("--out", PathBuf::from("bench")),
        limit: a.timeout("--timeout", DEFAULT_TIMEOUT)?,
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
    // The device work as closures over the stream, whose type (cudarc's) is not named here.
    let bench = Bench {
        best,
        copy_bw,
        upload: &|p: &Problem| DeviceProblem::upload(&stream, p),
        median_us: &|kernel: Kernel, devs: &mut [DeviceProblem]| {
            let copies = devs.len();
            median_us(&stream, WARMUP, o.repeat, |i| devs[i % copies].launch(&kda, &stream, kernel))
        },
        fresh_outputs: &|dev: &mut DeviceProblem, kernel: Kernel| {
            dev.poison_outputs(&stream)?;
            dev.launch(&kda, &stream, kernel)?;
            dev.download(&stream)
        },
    };
    let shapes = bench_shapes().into_iter().map(|(name, lengths)| bench.measure(name, lengths));
    let shapes = shapes.collect::<Result<Vec<_>, _>>()?;
    println!("\n{}", table(best, &shapes));
    let rows: Vec<Value> = shapes.iter().map(|s| s.record(best, o.repeat)).collect();
    let doc = json!({ "gpu": gpu, "date": date, "copy_bw_Bps": copy_bw, "shapes": rows });
    write_results(&o.out_dir, &doc)
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

/// Uploads a problem.
type Upload<'a> = &'a dyn Fn(&Problem) -> Result<DeviceProblem, KdaError>;
/// The median time of a kernel's launches in microseconds, rotated over the copies.
type MedianUs<'a> = &'a dyn Fn(Kernel, &mut [DeviceProblem]) -> Result<f64, KdaError>;
/// A kernel's outputs, fresh: poison, run once, download.
type FreshOutputs<'a> = &'a dyn Fn(&mut DeviceProblem, Kernel) -> Result<Outputs, KdaError>;

/// The device, its copy bandwidth and the kernel under test, with the device work as closures.
struct Bench<'a> {
    best: Kernel,
    copy_bw: f64,
    upload: Upload<'a>,
    median_us: MedianUs<'a>,
    fresh_outputs: FreshOutputs<'a>,
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
    errs: [f64; 3],
    f32_floor: f64,
}

impl Bench<'_> {
    /// Times the best kernel and the baseline on shape `name` and checks the best kernel's
    /// outputs against the f64 reference.
    fn measure(&self, name: &'static str, lengths: Vec<usize>) -> Result<Shape, String> {
        let t0 = Instant::now();
        eprint!("[{name}] generating inputs ...");
        let p = inputs::random_problem(Plan::from_lengths(&lengths), inputs::REFERENCE_HEADS, true, SEED);
        let dims = p.dims();
        let copies = rotation_copies(&p);
        let mut devs = (0..copies).map(|_| (self.upload)(&p)).collect::<Result<Vec<_>, _>>().map_err(text)?;
        eprint!(" {copies} copies uploaded; timing ...");
        let us = (self.median_us)(self.best, &mut devs).map_err(text)?;
        let baseline_us = if self.best == Kernel::Baseline {
            us
        } else {
            (self.median_us)(Kernel::Baseline, &mut devs).map_err(text)?
        };
        let out = (self.fresh_outputs)(&mut devs[0], self.best).map_err(text)?;
        drop(devs);
        eprint!(" reference ...");
        let want = reference::reference(&p).map_err(text)?;
        let errs = rel_errors(&out, &want);
        // The f32 rounding floor of this problem (see `reference::reference_f32`), on `h`.
        let f32_floor = rel_error(&reference::reference_f32(&p).map_err(text)?.h, &want.h);
        let floor_us = floor_us(&dims, self.copy_bw);
        eprintln!(" done in {:.1} s", t0.elapsed().as_secs_f64());
        Ok(Shape { name, lengths, dims, copies, us, floor_us, baseline_us, errs, f32_floor })
    }
}

/// How many copies of `p`'s inputs to rotate over so that the L2 cannot keep them.
fn rotation_copies(p: &Problem) -> usize {
    let input_bytes = (p.k.len() + p.w.len() + p.u.len()) * 2 + p.gk.len() * 4;
    ROTATION_BYTES.div_ceil(input_bytes.max(1)).clamp(MIN_COPIES, MAX_COPIES)
}

impl Shape {
    /// The shape's row of the table.
    fn row(&self) -> String {
        let Shape { name, dims: d, us, floor_us, baseline_us, errs, f32_floor, .. } = self;
        format!(
            "| {name} | {} | {} | {} | {us:.1} | {floor_us:.1} | {:.3} | {baseline_us:.1} | {:.2}x | {:.2e} | {:.2e} | {:.2e} | {f32_floor:.2e} |",
            d.seqs,
            d.tokens,
            d.heads,
            floor_us / us,
            baseline_us / us,
            errs[0],
            errs[1],
            errs[2]
        )
    }

    /// The shape's record in `results.json` (timed with kernel `best`, `repeat` launches).
    fn record(&self, best: Kernel, repeat: usize) -> Value {
        let Shape { name, lengths, dims: d, copies, us, floor_us, baseline_us, errs, f32_floor } = self;
        json!({
            "shape": name, "lengths": lengths, "heads": d.heads, "kernel": format!("{best:?}"),
            "us": us, "floor_us": floor_us, "ratio": floor_us / us, "baseline_us": baseline_us,
            "rel_err_h": errs[0], "rel_err_v_new": errs[1], "rel_err_ht": errs[2], "f32_floor_h": f32_floor,
            "repeat": repeat, "rotation_copies": copies,
        })
    }
}

/// The markdown table of every shape, `best` being the kernel timed besides the baseline.
fn table(best: Kernel, shapes: &[Shape]) -> String {
    let mut table = vec![format!(
        "| shape | N | T | H | {best:?} us | floor us | floor/time | baseline us | speedup | rel err h | rel err v_new | rel err ht | f32 floor h |"
    )];
    table.push("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|".into());
    table.extend(shapes.iter().map(Shape::row));
    table.join("\n")
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
        assert_eq!(o, Options { repeat: 200, out_dir: "bench".into(), limit: DEFAULT_TIMEOUT });
        let o = parse(&strings(&["--repeat", "100", "--timeout=300", "--out", "/o"])).unwrap();
        assert_eq!(o, Options { repeat: 100, out_dir: "/o".into(), limit: Duration::from_secs(300) });
        assert_eq!(parse(&strings(&["x"])).unwrap_err(), "bench: unexpected argument x");
        assert!(parse(&strings(&["--repeat", "0"])).is_err());
    }

    #[test]
    fn a_shape_in_the_table_and_the_results() {
        let shape = Shape {
            name: "tiny",
            lengths: vec![256],
            dims: Dims { tokens: 256, heads: 64, value_heads: 64, seqs: 1, chunks: 4 },
            copies: 8,
            us: 20.0,
            floor_us: 10.0,
            baseline_us: 50.0,
            errs: [1e-3, 2e-3, 3e-4],
            f32_floor: 1e-6,
        };
        let t = table(Kernel::Baseline, std::slice::from_ref(&shape));
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("| shape | N | T | H | Baseline us | floor us |"), "{}", lines[0]);
        assert_eq!(
            lines[2],
            "| tiny | 1 | 256 | 64 | 20.0 | 10.0 | 0.500 | 50.0 | 2.50x | 1.00e-3 | 2.00e-3 | 3.00e-4 | 1.00e-6 |"
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
    }
}

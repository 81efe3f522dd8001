//! `cargo xtask bench`: the benchmark of record (run on the GPU machine).
//!
//! In one process: measures device-to-device copy bandwidth, then for every reference shape
//! times each kernel (median of `--repeat` warm launches, each between its own CUDA events, inputs
//! rotated over enough copies that the L2 cannot keep them), checks the outputs against the f64
//! reference, prints a table and writes `bench/results.json`.

use crate::harness::{DeviceProblem, bench_shapes, copy_bandwidth, median_us};
use kda::{Kda, Kernel, Plan, inputs, reference, rel_error};
use serde_json::json;
use std::path::PathBuf;
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

pub fn run(args: &[String]) -> Result<(), String> {
    let a = crate::args::Args::parse("bench", args, &["--repeat", "--out", "--timeout"], &[])?;
    if let Some(p) = a.positional.first() {
        return Err(format!("bench: unexpected argument {p}"));
    }
    let repeat = a.count("--repeat", DEFAULT_REPEAT)?;
    let out_dir = a.path("--out", PathBuf::from("bench"));
    let limit = a.timeout("--timeout", DEFAULT_TIMEOUT)?;
    // The GPU work runs in this process: a watchdog thread ends it at the limit.
    std::thread::spawn(move || {
        std::thread::sleep(limit);
        eprintln!("\nerror: bench timed out after {} s", limit.as_secs());
        std::process::exit(124);
    });
    let err = |e: kda::KdaError| e.to_string();
    let (kda, stream) = Kda::open(0).map_err(|e| format!("bench needs a GPU: {e}"))?;
    let gpu = kda.context().name().map_err(|e| e.to_string())?;
    let date = chrono_free_date();
    println!("GPU: {gpu} (compute capability {:?}), {date}", kda.compute_capability());
    let bw = copy_bandwidth(&stream, COPY_REPEAT).map_err(err)?;
    println!("device-to-device copy bandwidth: {:.3} TB/s (read + write)", bw / 1e12);

    let best = kda.resolve(Kernel::Auto);
    for kernel in [best, Kernel::Baseline] {
        match kda.ctas_per_sm(kernel) {
            Ok(n) => println!("{kernel:?}: {n} CTAs per SM"),
            Err(e) => println!("{kernel:?}: CTAs per SM not known ({e})"),
        }
    }
    let mut rows = Vec::new();
    let mut table = vec![format!(
        "| shape | N | T | H | {best:?} us | floor us | floor/time | baseline us | speedup | rel err h | rel err v_new | rel err ht | f32 floor h |"
    )];
    table.push("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|".into());
    for (name, lengths) in bench_shapes() {
        let t0 = Instant::now();
        eprint!("[{name}] generating inputs ...");
        let p = inputs::random_problem(Plan::from_lengths(&lengths), inputs::REFERENCE_HEADS, true, SEED);
        let d = p.dims();
        let input_bytes = (p.k.len() + p.w.len() + p.u.len()) * 2 + p.gk.len() * 4;
        let copies = ROTATION_BYTES.div_ceil(input_bytes.max(1)).clamp(MIN_COPIES, MAX_COPIES);
        let mut devs =
            (0..copies).map(|_| DeviceProblem::upload(&stream, &p)).collect::<Result<Vec<_>, _>>().map_err(err)?;
        eprint!(" {copies} copies uploaded; timing ...");
        let time = |kernel: Kernel, devs: &mut Vec<DeviceProblem>| {
            median_us(&stream, WARMUP, repeat, |i| devs[i % copies].launch(&kda, &stream, kernel))
        };
        let us = time(best, &mut devs).map_err(err)?;
        let baseline_us = if best == Kernel::Baseline { us } else { time(Kernel::Baseline, &mut devs).map_err(err)? };
        // Outputs of the best kernel, fresh: poison, run once, download.
        devs[0].poison_outputs(&stream).map_err(err)?;
        devs[0].launch(&kda, &stream, best).map_err(err)?;
        let out = devs[0].download(&stream).map_err(err)?;
        drop(devs);
        eprint!(" reference ...");
        let want = reference::reference(&p).map_err(err)?;
        let errs = [rel_error(&out.h, &want.h), rel_error(&out.v_new, &want.v_new), rel_error(&out.ht, &want.ht)];
        // The f32 rounding floor of this problem (see `reference::reference_f32`), on `h`.
        let f32_floor = rel_error(&reference::reference_f32(&p).map_err(err)?.h, &want.h);
        let floor_us = crate::harness::floor_us(&d, bw);
        eprintln!(" done in {:.1} s", t0.elapsed().as_secs_f64());
        table.push(format!(
            "| {name} | {} | {} | {} | {us:.1} | {floor_us:.1} | {:.3} | {baseline_us:.1} | {:.2}x | {:.2e} | {:.2e} | {:.2e} | {f32_floor:.2e} |",
            d.seqs, d.tokens, d.heads, floor_us / us, baseline_us / us, errs[0], errs[1], errs[2]
        ));
        rows.push(json!({
            "shape": name, "lengths": lengths, "heads": d.heads, "kernel": format!("{best:?}"),
            "us": us, "floor_us": floor_us, "ratio": floor_us / us, "baseline_us": baseline_us,
            "rel_err_h": errs[0], "rel_err_v_new": errs[1], "rel_err_ht": errs[2], "f32_floor_h": f32_floor,
            "repeat": repeat, "rotation_copies": copies,
        }));
    }
    println!("\n{}", table.join("\n"));
    let doc = json!({ "gpu": gpu, "date": date, "copy_bw_Bps": bw, "shapes": rows });
    std::fs::create_dir_all(&out_dir).map_err(|e| e.to_string())?;
    let path = out_dir.join("results.json");
    std::fs::write(&path, serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())? + "\n")
        .map_err(|e| format!("{}: {e}", path.display()))?;
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

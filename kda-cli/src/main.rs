//! `kda`: run the KDA inter-chunk recurrence (and the generalized recurrence of a model file) from
//! the command line.
//!
//! ```text
//! kda demo [--cpu]                                   a realistic workload: time, floor, error
//! kda run --inputs IN.safetensors --out OUT.safetensors [--repeat N] [--cpu] [--split MODE] [--columns MODE] [--explain]
//! kda layer --inputs IN.safetensors --out OUT.safetensors [--repeat N] [--cpu]
//! ```

use cudarc::driver::CudaStream;
use kda::columns::{ColumnMode, Columns};
use kda::model::{ModelProblem, ModelView};
use kda::split::{SplitMode, SplitPlan, Work};
use kda::{Kda, KdaError, Kernel, Outputs, Plan, Strides, inputs, io, precision, reference, rel_error};
use kda_cli::{DeviceProblem, RemoveOnInterrupt, copy_bandwidth, floor_us, gates_name, median_us};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

/// `--json` (any subcommand): each measurement as one JSON object per line on stdout (see
/// [`record`]); everything else, the narrative lines included, on stderr.
static JSON: OnceLock<bool> = OnceLock::new();

fn json_mode() -> bool {
    JSON.get().copied().unwrap_or(false)
}

/// A narrative line: stdout, or stderr under `--json` (stdout then holds only the records).
macro_rules! say {
    ($($arg:tt)*) => {
        if json_mode() { eprintln!($($arg)*) } else { println!($($arg)*) }
    };
}

/// A measurement: printed as one JSON line under `--json` (the narrative says the same to people).
fn record(command: &str, fields: serde_json::Value) {
    if json_mode() {
        let mut object = serde_json::json!({ "command": command });
        if let (Some(o), serde_json::Value::Object(f)) = (object.as_object_mut(), fields) {
            o.extend(f);
        }
        println!("{object}");
    }
}

/// Each subcommand and its help (`kda SUBCOMMAND --help`); `kda --help` prints them all.
const SUBCOMMANDS: [(&str, &str); 4] = [
    (
        "demo",
        "  kda demo [--cpu]
      Runs a realistic workload (H = 64, six ragged sequences, 8192 tokens) on the GPU and prints
      the kernel time, the memory floor and the error against the f64 reference. Without a GPU (or
      with --cpu) it says so and runs the CPU reference on a small default instead.",
    ),
    (
        "run",
        "  kda run --inputs IN.safetensors --out OUT.safetensors [--repeat N] [--cpu] [--split MODE]
          [--columns MODE] [--explain]
      Reads k, w, u, gk, optional h0 and cu_seqlens; writes h, v_new, ht. With --repeat N prints
      the median kernel time over N launches (CUDA events). --cpu computes with the f64 reference.
      A model file (a scalar gate g, grouped value heads, other head sizes, a value-first state)
      runs the same way; one that no GPU kernel runs (the Hopper kernel needs K = 64 or 128) fails with
      the reason and writes nothing; --cpu computes it.
      --split auto|off|N: split long sequences across the GPU as the planner decides (auto, the
      default), never (off), or into segments of N chunks. --columns auto|wide|narrow: the Hopper
      kernel's column blocks (64 or 32 value columns per chain) as the planner decides (auto, the
      default) or forced. --explain prints the work items, the column blocks and split the
      planner chose and its modelled time (for 132 SMs when no GPU is used).
      A layer file (q, k, v, the gate, beta; tests/fixtures/layer/README.md) runs the whole
      layer, as `kda layer` does.",
    ),
    (
        "layer",
        "  kda layer --bench [NAME,...] [--repeat N]
      The peers' layer shapes (kda_fixed_8192, kda_mixed_6, kda_tp_long_h4, gdn_qwen3_next_8192,
      gdn_qwen3_next_mixed6, gdn_tp_qwen3_next_h2; the short prompts kda_short_128, kda_short_1000,
      gdn_short_128, gdn_short_1000) on random inputs on the GPU: a checked first run, then the
      median time of N launches (the short prompts: the host's time per call over 100 calls back
      to back, each re-planning the batch in place, LayerPlan::replan) against the IO floor.
  kda layer --inputs IN.safetensors --out OUT.safetensors [--repeat N] [--cpu]
      The whole layer's forward on a layer file (q, k, v, the gate, beta, FLA's option names in
      the metadata; tests/fixtures/layer/README.md): writes o and ht. On the GPU (K and V up to
      128; a larger size fails with the reason and writes nothing), --repeat N printing the median
      time of N launches; --cpu computes it with the f64 reference.",
    ),
    (
        "decode",
        "  kda decode --bench [NAME,...] [--repeat N]
      The decode step's bench shapes (decode_kda_256, decode_kda_64, verify_kda_64x4,
      decode_gdn_256, decode_gdn_tp_h2_256, decode_kda_1) on random inputs and pools on the GPU: a
      first call checked against the f64 reference, then the median time of N calls against the
      decode floor.",
    ),
];

/// The demo's GPU workload: the `mixed_6` reference shape (docs/CONTRACT.md#reference-shapes).
const DEMO_LENGTHS: [usize; 6] = [1300, 547, 2048, 963, 271, 3063];
const DEMO_HEADS: usize = 64;
/// The CPU fallback's small default: a tail, a single token, an exact chunk and an empty sequence.
const DEMO_CPU_LENGTHS: [usize; 4] = [200, 1, 64, 0];
const DEMO_CPU_HEADS: usize = 4;
const DEMO_SEED: u64 = 2026;
/// Timed launches of the demo and copies of the bandwidth measurement.
const DEMO_REPEAT: usize = 50;
const COPY_REPEAT: usize = 20;
const WARMUP: usize = 3;
/// The device the CLI runs on.
const DEVICE: usize = 0;
/// CTAs `--explain` plans for when no GPU is used: an H200's SMs (one CTA each).
const EXPLAIN_DEFAULT_WORKERS: usize = 132;

fn main() -> ExitCode {
    let started = Instant::now();
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let json = args.iter().any(|a| a == "--json");
    args.retain(|a| a != "--json");
    JSON.set(json).expect("set once, here");
    if let [command, rest @ ..] = &args[..]
        && rest.iter().any(|a| a == "--help" || a == "-h")
        && SUBCOMMANDS.iter().any(|(name, _)| name == command)
    {
        println!("{}", usage(Some(command)));
        return ExitCode::SUCCESS;
    }
    let result = match args.first().map(String::as_str) {
        Some("demo") => demo(&args[1..], started),
        Some("run") => run(&args[1..]),
        Some("layer") => layer(&args[1..]),
        Some("decode") => decode(&args[1..]),
        Some("-h" | "--help" | "help") => {
            println!("{}", usage(None));
            Ok(())
        }
        _ => Err(CliError::Usage("expected a subcommand: demo, run, layer or decode".into())),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(CliError::Usage(msg)) => {
            eprintln!("error: {msg}\n{}", usage(None));
            ExitCode::from(2)
        }
        Err(CliError::Kda(e)) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
        Err(CliError::Check(msg)) => {
            eprintln!("FAILED: {msg}");
            ExitCode::FAILURE
        }
        Err(CliError::NoGpu(e)) => {
            eprintln!("error: {e}; pass --cpu to compute with the f64 reference instead");
            ExitCode::FAILURE
        }
    }
}

/// What `--json` does, under every usage.
const JSON_HELP: &str =
    "  --json (with any subcommand): each measurement as one JSON object per line on stdout, the rest on stderr.";

/// The usage of `command`, or of every subcommand.
fn usage(command: Option<&str>) -> String {
    let texts = SUBCOMMANDS.iter().filter(|(name, _)| command.is_none_or(|c| c == *name)).map(|(_, text)| *text);
    format!("usage:\n{}\n{JSON_HELP}", texts.collect::<Vec<_>>().join("\n"))
}

enum CliError {
    /// Bad command line: exit status 2 and the usage.
    Usage(String),
    Kda(KdaError),
    /// An output above the precision bound.
    Check(String),
    /// `run` without `--cpu` on a machine where no device opens.
    NoGpu(KdaError),
}

impl From<KdaError> for CliError {
    fn from(e: KdaError) -> Self {
        Self::Kda(e)
    }
}

/// Prints the cold start, the time from `started` (the start of `main`) to the first result,
/// and returns it in milliseconds.
fn print_cold_start(started: Instant, what: &str) -> f64 {
    let ms = started.elapsed().as_secs_f64() * 1e3;
    say!("cold start: {ms:.1} ms from process start to the first result ({what})");
    ms
}

fn demo(args: &[String], started: Instant) -> Result<(), CliError> {
    let cpu = match args {
        [] => false,
        [flag] if flag == "--cpu" => true,
        other => return Err(CliError::Usage(format!("demo: unexpected arguments {other:?}"))),
    };
    let gpu = if cpu { Err("--cpu given".to_string()) } else { Kda::open(DEVICE).map_err(|e| e.to_string()) };
    let (kda, stream) = match gpu {
        Ok(g) => g,
        Err(why) => {
            say!("no GPU run ({why}); running the CPU f64 reference on a small default instead");
            let p = inputs::random_problem(Plan::from_lengths(&DEMO_CPU_LENGTHS), DEMO_CPU_HEADS, true, DEMO_SEED);
            let t = Instant::now();
            let out = reference::reference(&p)?;
            let reference_ms = t.elapsed().as_secs_f64() * 1e3;
            let cold_start_ms = print_cold_start(started, "the f64 reference on the CPU");
            say!(
                "reference: lengths {DEMO_CPU_LENGTHS:?}, H = {DEMO_CPU_HEADS}: {} chunks in {reference_ms:.1} ms; |ht| = {:.4}",
                p.plan.chunks(),
                rel_error(&out.ht, &vec![0.0f32; out.ht.len()])
            );
            let fields = json!({ "gpu": null, "reason": why, "lengths": DEMO_CPU_LENGTHS, "heads": DEMO_CPU_HEADS,
                "reference_ms": reference_ms, "cold_start_ms": cold_start_ms });
            record("demo", fields);
            return Ok(());
        }
    };
    let name = kda.context().name().unwrap_or_else(|_| "unknown GPU".into());
    say!("device: {name} (compute capability {:?}); kernels from {}", kda.compute_capability(), kda.module_code());
    let p = inputs::random_problem(Plan::from_lengths(&DEMO_LENGTHS), DEMO_HEADS, true, DEMO_SEED);
    say!("workload: lengths {DEMO_LENGTHS:?}, H = {DEMO_HEADS}, K = V = 128, h0 and ht");
    let mut dev = DeviceProblem::upload(&stream, &p)?;
    let kernel = kda.resolve(Kernel::Auto);
    dev.launch(&kda, &stream, kernel)?;
    dev.download(&stream)?;
    let cold_start_ms = print_cold_start(
        started,
        "driver start, module load with the driver's PTX JIT (cached after the first run), upload, first launch, download",
    );
    let us = median_us(&stream, WARMUP, DEMO_REPEAT, |_| dev.launch(&kda, &stream, kernel))?;
    let bw = copy_bandwidth(&stream, COPY_REPEAT)?;
    let floor = floor_us(&p.dims(), bw);
    say!(
        "kernel {kernel:?}: {us:.1} us (median of {DEMO_REPEAT}); memory floor {floor:.1} us at {:.2} TB/s copy \
         bandwidth; floor/time = {:.3}",
        bw / 1e12,
        floor / us
    );
    let out = dev.download(&stream)?;
    let t = Instant::now();
    let want = reference::reference(&p)?;
    say!("f64 reference in {:.1} s", t.elapsed().as_secs_f64());
    let errors = out.errors(&want);
    record(
        "demo",
        json!({ "gpu": name, "kernel": format!("{kernel:?}"), "lengths": DEMO_LENGTHS, "heads": DEMO_HEADS,
            "us": us, "floor_us": floor, "ratio": floor / us, "copy_bw_Bps": bw, "repeat": DEMO_REPEAT,
            "cold_start_ms": cold_start_ms, "module": kda.module_code().to_string(), "rel_err_h": errors[0], "rel_err_v_new": errors[1],
            "rel_err_ht": errors[2] }),
    );
    check_errors(errors)
}

/// Prints the relative errors per output and fails at or above the precision bound
/// (docs/CONTRACT.md#precision). The demo's sequences (at most 3063 tokens) have an f32 rounding
/// floor well under `ERROR_BOUND`, so the bound is that constant.
fn check_errors(errs: [f64; 3]) -> Result<(), CliError> {
    let bound = precision::bound(0.0);
    let named = Outputs::NAMES.into_iter().zip(errs);
    let line: Vec<String> = named.clone().map(|(n, e)| format!("{n} {e:.2e}")).collect();
    say!("relative error vs f64 reference: {}", line.join(", "));
    // `rel_error` is never NaN: an infinite error (non-finite output) fails here.
    match named.into_iter().find(|&(_, e)| e >= bound) {
        Some((n, e)) => Err(CliError::Check(format!("{n}: relative error {e:.3e} >= {bound:e}"))),
        None => Ok(()),
    }
}

/// The arguments of `kda run`.
#[derive(Debug, PartialEq)]
struct RunArgs {
    input: PathBuf,
    output: PathBuf,
    repeat: Option<usize>,
    cpu: bool,
    split: SplitMode,
    columns: ColumnMode,
    explain: bool,
}

/// Parses `kda run`'s arguments; the error is the usage message.
fn parse_run(args: &[String]) -> Result<RunArgs, String> {
    let (mut input, mut output, mut repeat, mut cpu) = (None, None, None, false);
    let (mut split, mut columns, mut explain) = (SplitMode::Auto, ColumnMode::Auto, false);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |flag: &str| it.next().cloned().ok_or_else(|| format!("{flag} needs a value"));
        match a.as_str() {
            "--inputs" => input = Some(PathBuf::from(value("--inputs")?)),
            "--out" => output = Some(PathBuf::from(value("--out")?)),
            "--repeat" => {
                let v = value("--repeat")?;
                let n: usize = v.parse().map_err(|_| format!("--repeat {v}: not a count"))?;
                if n == 0 {
                    return Err("--repeat must be at least 1".into());
                }
                repeat = Some(n);
            }
            "--cpu" => cpu = true,
            "--explain" => explain = true,
            "--split" => {
                split = match value("--split")?.as_str() {
                    "auto" => SplitMode::Auto,
                    "off" => SplitMode::Off,
                    v => match v.parse::<usize>() {
                        Ok(n) if n >= 1 => SplitMode::Chunks(n),
                        _ => return Err(format!("--split {v}: auto, off or a number of chunks (at least 1)")),
                    },
                }
            }
            "--columns" => {
                columns = match value("--columns")?.as_str() {
                    "auto" => ColumnMode::Auto,
                    "wide" => ColumnMode::Force(Columns::Wide),
                    "narrow" => ColumnMode::Force(Columns::Narrow),
                    v => return Err(format!("--columns {v}: auto, wide or narrow")),
                }
            }
            other => return Err(format!("run: unexpected argument {other}")),
        }
    }
    let input = input.ok_or("run: --inputs is required")?;
    let output = output.ok_or("run: --out is required")?;
    if cpu && repeat.is_some() {
        return Err("--repeat times the GPU kernel; it cannot go with --cpu".into());
    }
    Ok(RunArgs { input, output, repeat, cpu, split, columns, explain })
}

fn run(args: &[String]) -> Result<(), CliError> {
    let a = parse_run(args).map_err(CliError::Usage)?;
    let (input, output, cpu) = (&a.input, &a.output, a.cpu);
    refuse_output_over_input(input, output)?;
    let p = match io::read_problem(input) {
        Ok((p, _expected)) => p,
        // Not the KDA slice: a generalized problem, a layer file (looked for only then, so a
        // recurrence file is not read once more for it), or the KDA reader's error.
        Err(kda_error) => match io::read_model_problem(input) {
            Ok((m, _expected)) => return run_model(&a, &m),
            Err(_) if kda::layer::is_layer_file(input) => return run_layer(&a),
            Err(_) => return Err(kda_error.into()),
        },
    };
    let d = p.dims();
    say!(
        "{}: N = {}, T = {}, H = {}, HV = {}, NT = {}, h0 {}",
        input.display(),
        d.seqs,
        d.tokens,
        d.heads,
        d.value_heads,
        d.chunks,
        if p.h0.is_some() { "given" } else { "zeros" }
    );
    let out = if cpu {
        explain_on_cpu(&a, &p.model_view());
        reference::reference(&p)?
    } else {
        let (kda, stream) = Kda::open(DEVICE).map_err(CliError::NoGpu)?;
        let dev = DeviceProblem::upload(&stream, &p)?;
        run_gpu(&kda, &stream, dev, &a)?
    };
    write_output(output, |path| io::write_outputs(path, &out, &d))?;
    say!("wrote h, v_new, ht to {}", output.display());
    Ok(())
}

/// Parses `kda layer`'s arguments: `kda run`'s, without the recurrence's planning options.
fn parse_layer(args: &[String]) -> Result<RunArgs, String> {
    let a = parse_run(args).map_err(|e| e.replacen("run:", "layer:", 1))?;
    if a.split != SplitMode::Auto || a.columns != ColumnMode::Auto || a.explain {
        return Err("layer: --split, --columns and --explain plan the recurrence; `kda run` takes them".into());
    }
    Ok(a)
}

/// `kda layer`: the whole layer's forward on a layer file, as `kda run` runs one; or, with
/// `--bench [NAME,...] [--repeat N]`, the peers' layer shapes on random inputs, timed.
fn layer(args: &[String]) -> Result<(), CliError> {
    if args.first().map(String::as_str) == Some("--bench") {
        return layer_bench(&args[1..]);
    }
    let a = parse_layer(args).map_err(CliError::Usage)?;
    refuse_output_over_input(&a.input, &a.output)?;
    run_layer(&a)
}

/// `kda layer --bench [NAME,...] [--repeat N]`: each named peer layer shape (all without names)
/// on random inputs: a checked first run, then the median of N event-timed launches (default
/// `LAYER_BENCH_REPEAT`) against the IO floor at the measured copy bandwidth.
fn layer_bench(args: &[String]) -> Result<(), CliError> {
    let shapes = kda_cli::layer_bench_shapes();
    let known: Vec<&str> = shapes.iter().map(|s| s.name).collect();
    let (names, repeat) = parse_bench("layer", args, &known, LAYER_BENCH_REPEAT).map_err(CliError::Usage)?;
    let (kda, stream) = Kda::open(0)?;
    let bandwidth = copy_bandwidth(&stream, LAYER_BENCH_COPIES)?;
    say!("copy bandwidth {:.3} TB/s", bandwidth / 1e12);
    for s in shapes.iter().filter(|s| names.is_empty() || names.iter().any(|n| n == s.name)) {
        let p = s.problem(LAYER_BENCH_SEED);
        let t = kda_cli::time_layer_shape(&kda, &stream, (s, &p), repeat, bandwidth)?;
        let fields = json!({ "shape": s.name, "us": t.us, "floor_us": t.floor_us, "ratio": t.floor_us / t.us,
            "repeat": t.timed, "host_timed": s.host_timed, "plan_reused_us": t.plan_reused_us, "new_plan_us": t.new_plan_us, "planning_us": t.planning_us, "copy_bw_Bps": bandwidth,
            "stages_us": t.stages.iter().map(|(stage, us)| (stage.name().to_string(), json!(us))).collect::<serde_json::Map<_, _>>() });
        record("layer-bench", fields);
        say!(
            "layer {}: {:.1} us ({}), IO floor {:.1} us ({:.3} of it); stages (us, device) {}",
            s.name,
            t.us,
            t.method(),
            t.floor_us,
            t.floor_us / t.us,
            t.stages_text()
        );
    }
    Ok(())
}

/// `--bench`'s arguments after it: the shapes named (each one of `known`; none: all) and
/// `--repeat N` (default `repeat`).
fn parse_bench(command: &str, args: &[String], known: &[&str], repeat: usize) -> Result<(Vec<String>, usize), String> {
    let (mut names, mut repeat) = (Vec::new(), repeat);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--repeat" => {
                let v = it.next().ok_or_else(|| format!("{command}: --repeat needs a count"))?;
                repeat = v.parse().ok().filter(|&n| n > 0).ok_or_else(|| format!("{command}: --repeat {v}"))?;
            }
            list => names.extend(list.split(',').map(String::from)),
        }
    }
    if let Some(n) = names.iter().find(|n| !known.contains(&n.as_str())) {
        return Err(format!("{command} --bench: unknown shape {n} (known: {})", known.join(", ")));
    }
    Ok((names, repeat))
}

/// `kda decode --bench [NAME,...] [--repeat N]`: each named decode shape (all without names) on
/// random inputs and pools: a first call checked against the f64 reference, then the median of N
/// event-timed calls against the decode floor at the measured copy bandwidth.
fn decode(args: &[String]) -> Result<(), CliError> {
    if args.first().map(String::as_str) != Some("--bench") {
        return Err(CliError::Usage("decode: expected --bench".into()));
    }
    let shapes = kda_cli::decode_bench_shapes();
    let known: Vec<&str> = shapes.iter().map(|d| d.name).collect();
    let (names, repeat) = parse_bench("decode", &args[1..], &known, DECODE_BENCH_REPEAT).map_err(CliError::Usage)?;
    let (kda, stream) = Kda::open(0)?;
    let bandwidth = copy_bandwidth(&stream, LAYER_BENCH_COPIES)?;
    say!("copy bandwidth {:.3} TB/s", bandwidth / 1e12);
    for d in shapes.iter().filter(|d| names.is_empty() || names.iter().any(|n| n == d.name)) {
        let t = kda_cli::time_decode(&kda, &stream, d, repeat, bandwidth)?;
        let [err_o, err_ht] = t.errors;
        let fields = json!({ "shape": d.name, "us": t.us, "floor_us": t.floor_us, "ratio": t.floor_us / t.us,
            "rel_err_o": err_o, "rel_err_ht": err_ht, "repeat": repeat, "copy_bw_Bps": bandwidth });
        record("decode-bench", fields);
        say!(
            "decode {}: median {:.2} us over {repeat} calls, floor {:.2} us ({:.3} of it); rel err o {err_o:.2e}, ht {err_ht:.2e}",
            d.name,
            t.us,
            t.floor_us,
            t.floor_us / t.us
        );
        if !(err_o <= DECODE_CHECK_BOUND && err_ht <= DECODE_CHECK_BOUND) {
            return Err(CliError::Check(format!(
                "decode {}: rel err o {err_o:.2e}, ht {err_ht:.2e} above {DECODE_CHECK_BOUND:.0e}",
                d.name
            )));
        }
    }
    Ok(())
}

/// Calls `kda decode --bench` times per shape, by default.
const DECODE_BENCH_REPEAT: usize = 100;
/// The error `kda decode --bench` accepts on `o` and the states: a sanity bound, several times
/// the bf16 rounding of `o` (about 2e-3); the GPU suite holds the kernel to the tight bounds.
const DECODE_CHECK_BOUND: f64 = 1e-2;

/// Launches `kda layer --bench` times per shape, by default.
const LAYER_BENCH_REPEAT: usize = 20;
/// Copies timed for the bandwidth `kda layer --bench` measures the floor at.
const LAYER_BENCH_COPIES: usize = 10;
/// The seed of `kda layer --bench`'s random inputs.
const LAYER_BENCH_SEED: u64 = 5;

/// The usage error of an `output` that names the file `input` is (the outputs would replace the
/// inputs).
fn refuse_output_over_input(input: &Path, output: &Path) -> Result<(), CliError> {
    if same_file(input, output) {
        return Err(CliError::Usage(format!(
            "--out {} names the input file {}: the outputs would replace the inputs; choose another path",
            output.display(),
            input.display()
        )));
    }
    Ok(())
}

/// `kda run` on a layer file (`q`, `k`, `v`, the gate, `beta` to `o` and `ht`): on the GPU
/// (`Kda::launch_layer`; `--repeat N` prints the median of N launches), or the f64 reference with
/// `--cpu`.
fn run_layer(a: &RunArgs) -> Result<(), CliError> {
    let (p, golden) = kda::layer::read_layer_problem(&a.input)?;
    let s = p.shape;
    say!(
        "{}: layer {:?}, N = {}, T = {}, H = {}, HV = {}, K = {}, V = {}, {:?}, h0 {}",
        a.input.display(),
        s.kind,
        p.plan.num_seqs(),
        p.plan.tokens(),
        s.heads,
        s.value_heads,
        s.key_dim,
        s.value_dim,
        p.options,
        if p.h0.is_some() { "given" } else { "zeros" }
    );
    let out = if a.cpu {
        kda::layer::layer_reference(&p)?
    } else {
        let (kda, stream) = Kda::open(0)?;
        let mut dev = kda_cli::DeviceLayer::upload(&kda, &stream, &p)?;
        match a.repeat {
            Some(n) => {
                let us = median_us(&stream, WARMUP, n, |_| dev.launch(&kda, &stream))?;
                say!("layer: median {us:.2} us over {n} launches");
                record("layer", json!({ "input": a.input.display().to_string(), "us": us, "repeat": n }));
            }
            None => dev.launch(&kda, &stream)?,
        }
        dev.download(&stream)?
    };
    if let Some(g) = golden {
        let [o, ht] = g.fla.errors(&out);
        say!("FLA's outputs in the file against this reference: o {o:.2e}, ht {ht:.2e}");
    }
    write_output(&a.output, |path| io::write_layer_outputs(path, &out, &p))?;
    say!("wrote o, ht to {}", a.output.display());
    Ok(())
}

/// Writes an output file with `write` (one of `kda::io`'s writers, which write into the file's
/// temporary ([`io::temporary_beside`]) and rename it into place when complete): Ctrl-C or a
/// `SIGTERM`/`SIGHUP` meanwhile removes the temporary before it ends the process, so no partial
/// file is left behind on error or interrupt.
fn write_output(output: &Path, write: impl FnOnce(&Path) -> Result<(), KdaError>) -> Result<(), KdaError> {
    let _armed = RemoveOnInterrupt::arm(&io::temporary_beside(output));
    write(output)
}

/// Whether `output` names the file `input` is: the same file through another spelling (`./`,
/// `..`), a symbolic link, or a hard link. An output that does not exist yet is compared through
/// its directory.
fn same_file(input: &Path, output: &Path) -> bool {
    let Ok(input) = std::fs::canonicalize(input) else {
        return false; // no input file: reading it fails with its own error
    };
    if let (Ok(a), Ok(b)) = (std::fs::metadata(&input), std::fs::metadata(output)) {
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            if (a.dev(), a.ino()) == (b.dev(), b.ino()) {
                return true;
            }
        }
        #[cfg(not(unix))]
        let _ = (a, b);
    }
    let dir = match output.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    match (std::fs::canonicalize(dir), output.file_name()) {
        (Ok(dir), Some(name)) => dir.join(name) == input,
        _ => false,
    }
}

/// `kda run` on a generalized problem (docs/CONTRACT.md#the-generalized-recurrence): on the GPU,
/// or with the f64 reference (`--cpu`). A problem no GPU kernel runs is the launcher's
/// [`KdaError::Unsupported`], and nothing is written.
fn run_model(a: &RunArgs, m: &ModelProblem) -> Result<(), CliError> {
    let (input, output) = (&a.input, &a.output);
    let s = m.shape;
    say!(
        "{}: N = {}, T = {}, H = {}, HV = {}, K = {}, V = {}, gates {}, state {:?}, h0 {}",
        input.display(),
        m.plan.num_seqs(),
        m.plan.tokens(),
        s.heads,
        s.value_heads,
        s.key_dim,
        s.value_dim,
        gates_name(s.gates),
        s.layout,
        if m.h0.is_some() { "given" } else { "zeros" }
    );
    let view = m.view();
    let out = if a.cpu {
        explain_on_cpu(a, &view);
        reference::model_reference(&view)?
    } else {
        let (kda, stream) = Kda::open(DEVICE).map_err(CliError::NoGpu)?;
        let dev = DeviceProblem::upload_model(&stream, &view, Strides::PACKED)?;
        run_gpu(&kda, &stream, dev, a)?
    };
    write_output(output, |path| io::write_model_outputs(path, &out, &view))?;
    say!("wrote h, v_new, ht to {}", output.display());
    Ok(())
}

/// Splits the problem uploaded in `dev` as `--split` says, prints the plan with `--explain`,
/// launches it once, or `--repeat` times printing the median, and downloads the outputs.
fn run_gpu(kda: &Kda, stream: &Arc<CudaStream>, mut dev: DeviceProblem, a: &RunArgs) -> Result<Outputs, CliError> {
    let kernel = kda.resolve(Kernel::Auto);
    dev.set_split(stream, a.split)?;
    dev.set_columns(stream, a.columns)?;
    if a.explain {
        // The plan of the kernel that runs: the portable kernel schedules its own blocks.
        let (workers, block_width, split) = if kernel == Kernel::Portable {
            (dev.plan.portable_workers(), dev.plan.portable_block_width(), dev.plan.portable_split_plan())
        } else {
            (dev.plan.workers(), dev.plan.columns().width(), dev.plan.split_plan().clone())
        };
        let work = Work::of(dev.plan.shape(), workers, block_width);
        say!("{}", explanation(dev.plan.plan(), &work, a.split, &split).trim_end());
    }
    match a.repeat {
        Some(n) => {
            let us = median_us(stream, WARMUP, n, |_| dev.launch(kda, stream, kernel))?;
            say!("kernel {kernel:?}: median {us:.2} us over {n} launches");
            record(
                "run",
                json!({ "input": a.input.display().to_string(), "kernel": format!("{kernel:?}"), "us": us, "repeat": n }),
            );
        }
        None => dev.launch(kda, stream, kernel)?,
    }
    Ok(dev.download(stream)?)
}

/// `--explain` without a GPU: the plan the planner makes for `EXPLAIN_DEFAULT_WORKERS` CTAs.
fn explain_on_cpu(a: &RunArgs, view: &ModelView<'_>) {
    if a.explain {
        let mut work = Work::of(&view.shape, EXPLAIN_DEFAULT_WORKERS, Columns::Wide.width());
        work.block_width = Columns::resolve(a.columns, view.plan, &work, a.split).width();
        let split = SplitPlan::decide(view.plan, &work, a.split);
        say!("(no GPU used: planned for {EXPLAIN_DEFAULT_WORKERS} SMs)");
        say!("{}", explanation(view.plan, &work, a.split, &split).trim_end());
    }
}

/// What `--explain` prints: the work items, the split (`mode` and what it gave) and the modelled
/// times of the batch unsplit and as split, in chunk times.
fn explanation(plan: &Plan, work: &Work, mode: SplitMode, split: &SplitPlan) -> String {
    let blocks = work.value_dim.div_ceil(work.block_width);
    let items = plan.num_seqs() * work.value_heads * blocks;
    let unsplit = SplitPlan::unsplit(plan).modelled_cost(work);
    let mut text = format!(
        "plan: {items} work items ({} sequences x {} value heads x {blocks} column blocks of {}) on {} CTAs\n",
        plan.num_seqs(),
        work.value_heads,
        work.block_width,
        work.workers
    );
    text += &format!("split ({mode:?}): {}\n", split.summary());
    if split.is_split() {
        let cut = (0..plan.num_seqs()).filter(|&n| split.segments_of(n).len() > 1).count();
        text += &format!(
            "  passes: pre-scan of {cut} first segments from h0 over V = {} columns and {} segment maps over \
             K + V = {} columns, merge, main pass of {} segments\n",
            work.value_dim,
            split.maps() - cut,
            work.key_dim + work.value_dim,
            split.segments().len()
        );
        if !split.keeps_precision(work) {
            text += &format!(
                "  precision: entry states composed through maps of segments shorter than {} chunks drift past \
                 the contract's bound with this gate (kda::split::PRECISE_SEGMENT_CHUNKS); the planner never \
                 chooses it\n",
                kda::split::PRECISE_SEGMENT_CHUNKS
            );
        }
    }
    text += &format!("  modelled time: {unsplit} chunk times unsplit, {} as planned\n", split.modelled_cost(work));
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn run_arguments() {
        let a = parse_run(&args(&["--inputs", "in.st", "--out", "o.st", "--repeat", "7"])).unwrap();
        let want = RunArgs {
            input: "in.st".into(),
            output: "o.st".into(),
            repeat: Some(7),
            cpu: false,
            split: SplitMode::Auto,
            columns: ColumnMode::Auto,
            explain: false,
        };
        assert_eq!(a, want);
        let a = parse_run(&args(&["--cpu", "--out", "o.st", "--inputs", "in.st"])).unwrap();
        assert_eq!(a, RunArgs { repeat: None, cpu: true, ..want });
        let a = parse_run(&args(&["--inputs", "i", "--out", "o", "--split", "off", "--explain"])).unwrap();
        assert_eq!((a.split, a.explain), (SplitMode::Off, true));
        let a = parse_run(&args(&["--inputs", "i", "--out", "o", "--split", "64"])).unwrap();
        assert_eq!(a.split, SplitMode::Chunks(64));
        let a = parse_run(&args(&["--inputs", "i", "--out", "o", "--columns", "narrow"])).unwrap();
        assert_eq!(a.columns, ColumnMode::Force(Columns::Narrow));
        assert_eq!(
            parse_run(&args(&["--inputs", "i", "--out", "o", "--columns", "32"])).unwrap_err(),
            "--columns 32: auto, wide or narrow"
        );
    }

    #[test]
    fn explain_names_the_split_and_its_modelled_time() {
        let work = Work {
            value_heads: 4,
            key_dim: 128,
            value_dim: 128,
            workers: 132,
            block_width: 64,
            gates: kda::model::Gates { g: false, gk: true },
        };
        let plan = Plan::from_lengths(&[131072]);
        let split = SplitPlan::decide(&plan, &work, SplitMode::Auto);
        let text = explanation(&plan, &work, SplitMode::Auto, &split);
        println!("{text}");
        assert!(
            text.starts_with("plan: 8 work items (1 sequences x 4 value heads x 2 column blocks of 64) on 132 CTAs")
        );
        assert!(text.contains("split (Auto): 1 of 1 sequences cut: 8 segments of 256 chunks"), "{text}");
        assert!(!text.contains("precision"), "{text}");
        // A forced cut into short segments says it leaves the contract.
        let forced = SplitPlan::decide(&plan, &work, SplitMode::Chunks(16));
        let forced = explanation(&plan, &work, SplitMode::Chunks(16), &forced);
        assert!(
            forced.contains("precision: entry states composed through maps of segments shorter than 256"),
            "{forced}"
        );
        assert!(
            text.contains(
                "pre-scan of 1 first segments from h0 over V = 128 columns and 6 segment maps over K + V = 256"
            ),
            "{text}"
        );
        let off = explanation(&plan, &work, SplitMode::Off, &SplitPlan::unsplit(&plan));
        assert!(off.contains("split (Off): whole") && !off.contains("pre-scan"), "{off}");
    }

    #[test]
    fn layer_arguments_are_run_arguments_without_the_planning_options() {
        let a = parse_layer(&args(&["--inputs", "i", "--out", "o", "--cpu"])).unwrap();
        assert!(a.cpu && a.repeat.is_none());
        let planning = "layer: --split, --columns and --explain plan the recurrence; `kda run` takes them";
        for extra in [&["--split", "off"][..], &["--columns", "narrow"], &["--explain"]] {
            let mut v = vec!["--inputs", "i", "--out", "o"];
            v.extend_from_slice(extra);
            assert_eq!(parse_layer(&args(&v)).unwrap_err(), planning);
        }
        assert_eq!(parse_layer(&args(&["--out", "o"])).unwrap_err(), "layer: --inputs is required");
    }

    #[test]
    fn bad_run_arguments_are_named() {
        let err = |a: &[&str]| parse_run(&args(a)).unwrap_err();
        assert_eq!(err(&["--out", "o"]), "run: --inputs is required");
        assert_eq!(err(&["--inputs", "i"]), "run: --out is required");
        assert_eq!(err(&["--inputs"]), "--inputs needs a value");
        assert_eq!(err(&["--inputs", "i", "--out", "o", "--repeat", "x"]), "--repeat x: not a count");
        assert_eq!(err(&["--inputs", "i", "--out", "o", "--repeat", "0"]), "--repeat must be at least 1");
        assert_eq!(err(&["--inputs", "i", "--out", "o", "-x"]), "run: unexpected argument -x");
        assert_eq!(
            err(&["--inputs", "i", "--out", "o", "--split", "0"]),
            "--split 0: auto, off or a number of chunks (at least 1)"
        );
        assert_eq!(
            err(&["--inputs", "i", "--out", "o", "--repeat", "3", "--cpu"]),
            "--repeat times the GPU kernel; it cannot go with --cpu"
        );
    }

    #[test]
    fn an_output_naming_the_input_is_the_same_file() {
        let dir = std::env::temp_dir().join(format!("kda-cli-same-file-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        let input = dir.join("in.safetensors");
        std::fs::write(&input, b"x").unwrap();
        assert!(same_file(&input, &dir.join("sub/../in.safetensors")));
        assert!(!same_file(&input, &dir.join("out.safetensors")));
        assert!(!same_file(&dir.join("missing"), &dir.join("missing")));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

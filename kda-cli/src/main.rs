//! `kda`: run the KDA inter-chunk recurrence from the command line.
//!
//! ```text
//! kda demo [--cpu]                                   a realistic workload: time, floor, error
//! kda run --inputs IN.safetensors --out OUT.safetensors [--repeat N] [--cpu]
//! ```

use cudarc::driver::CudaStream;
use kda::{Kda, KdaError, Kernel, Outputs, Plan, Problem, inputs, io, precision, reference, rel_error};
use kda_cli::{DeviceProblem, copy_bandwidth, floor_us, median_us};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

const USAGE: &str = "usage:
  kda demo [--cpu]
      Runs a realistic workload (H = 64, six ragged sequences, 8192 tokens) on the GPU and prints
      the kernel time, the memory floor and the error against the f64 reference. Without a GPU (or
      with --cpu) it says so and runs the CPU reference on a small default instead.
  kda run --inputs IN.safetensors --out OUT.safetensors [--repeat N] [--cpu]
      Reads k, w, u, gk, optional h0 and cu_seqlens; writes h, v_new, ht. With --repeat N prints
      the median kernel time over N launches (CUDA events). --cpu computes with the f64 reference.";

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

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("demo") => demo(&args[1..]),
        Some("run") => run(&args[1..]),
        Some("-h" | "--help" | "help") => {
            println!("{USAGE}");
            Ok(())
        }
        _ => Err(CliError::Usage("expected a subcommand: demo or run".into())),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(CliError::Usage(msg)) => {
            eprintln!("error: {msg}\n{USAGE}");
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

fn demo(args: &[String]) -> Result<(), CliError> {
    let cpu = match args {
        [] => false,
        [flag] if flag == "--cpu" => true,
        other => return Err(CliError::Usage(format!("demo: unexpected arguments {other:?}"))),
    };
    let gpu = if cpu { Err("--cpu given".to_string()) } else { Kda::open(DEVICE).map_err(|e| e.to_string()) };
    let (kda, stream) = match gpu {
        Ok(g) => g,
        Err(why) => {
            println!("no GPU run ({why}); running the CPU f64 reference on a small default instead");
            let p = inputs::random_problem(Plan::from_lengths(&DEMO_CPU_LENGTHS), DEMO_CPU_HEADS, true, DEMO_SEED);
            let t = Instant::now();
            let out = reference::reference(&p)?;
            println!(
                "reference: lengths {DEMO_CPU_LENGTHS:?}, H = {DEMO_CPU_HEADS}: {} chunks in {:.1} ms; |ht| = {:.4}",
                p.plan.chunks(),
                t.elapsed().as_secs_f64() * 1e3,
                rel_error(&out.ht, &vec![0.0f32; out.ht.len()])
            );
            return Ok(());
        }
    };
    let name = kda.context().name().unwrap_or_else(|_| "unknown GPU".into());
    println!("device: {name} (compute capability {:?})", kda.compute_capability());
    let p = inputs::random_problem(Plan::from_lengths(&DEMO_LENGTHS), DEMO_HEADS, true, DEMO_SEED);
    println!("workload: lengths {DEMO_LENGTHS:?}, H = {DEMO_HEADS}, K = V = 128, h0 and ht");
    let mut dev = DeviceProblem::upload(&stream, &p)?;
    let kernel = kda.resolve(Kernel::Auto);
    let us = median_us(&stream, WARMUP, DEMO_REPEAT, |_| dev.launch(&kda, &stream, kernel))?;
    let bw = copy_bandwidth(&stream, COPY_REPEAT)?;
    let floor = floor_us(&p.dims(), bw);
    println!(
        "kernel {kernel:?}: {us:.1} us (median of {DEMO_REPEAT}); memory floor {floor:.1} us at {:.2} TB/s copy \
         bandwidth; floor/time = {:.3}",
        bw / 1e12,
        floor / us
    );
    let out = dev.download(&stream)?;
    let t = Instant::now();
    let want = reference::reference(&p)?;
    println!("f64 reference in {:.1} s", t.elapsed().as_secs_f64());
    check_errors(&out, &want)
}

/// Prints the relative errors per output and fails at or above the precision bound
/// (docs/CONTRACT.md#precision). The demo's sequences (at most 3063 tokens) have an f32 rounding
/// floor well under `ERROR_BOUND`, so the bound is that constant.
fn check_errors(out: &Outputs, want: &Outputs) -> Result<(), CliError> {
    let bound = precision::bound(0.0);
    let errs = [
        ("h", rel_error(&out.h, &want.h)),
        ("v_new", rel_error(&out.v_new, &want.v_new)),
        ("ht", rel_error(&out.ht, &want.ht)),
    ];
    let line: Vec<String> = errs.iter().map(|(n, e)| format!("{n} {e:.2e}")).collect();
    println!("relative error vs f64 reference: {}", line.join(", "));
    // `rel_error` is never NaN: an infinite error (non-finite output) fails here.
    match errs.iter().find(|(_, e)| *e >= bound) {
        Some((n, e)) => Err(CliError::Check(format!("{n}: relative error {e:.3e} >= {bound:e}"))),
        None => Ok(()),
    }
}

fn run(args: &[String]) -> Result<(), CliError> {
    let (mut input, mut output, mut repeat, mut cpu) = (None, None, None, false);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |flag: &str| it.next().cloned().ok_or_else(|| CliError::Usage(format!("{flag} needs a value")));
        match a.as_str() {
            "--inputs" => input = Some(PathBuf::from(value("--inputs")?)),
            "--out" => output = Some(PathBuf::from(value("--out")?)),
            "--repeat" => {
                let v = value("--repeat")?;
                let n: usize = v.parse().map_err(|_| CliError::Usage(format!("--repeat {v}: not a count")))?;
                if n == 0 {
                    return Err(CliError::Usage("--repeat must be at least 1".into()));
                }
                repeat = Some(n);
            }
            "--cpu" => cpu = true,
            other => return Err(CliError::Usage(format!("run: unexpected argument {other}"))),
        }
    }
    let input = input.ok_or_else(|| CliError::Usage("run: --inputs is required".into()))?;
    let output = output.ok_or_else(|| CliError::Usage("run: --out is required".into()))?;
    if same_file(&input, &output) {
        return Err(CliError::Usage(format!(
            "--out {} names the input file {}: the outputs would replace the inputs; choose another path",
            output.display(),
            input.display()
        )));
    }
    let p = match io::read_problem(&input) {
        Ok((p, _expected)) => p,
        // Not the KDA slice the kernels run: a generalized problem, or the KDA reader's error.
        Err(kda_error) => match io::read_model_problem(&input) {
            Ok((m, _expected)) => return run_model(&input, &output, &m, cpu, repeat),
            Err(_) => return Err(kda_error.into()),
        },
    };
    let d = p.dims();
    println!(
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
        if repeat.is_some() {
            return Err(CliError::Usage("--repeat times the GPU kernel; it cannot go with --cpu".into()));
        }
        reference::reference(&p)?
    } else {
        let (kda, stream) = Kda::open(DEVICE).map_err(CliError::NoGpu)?;
        run_gpu(&kda, &stream, &p, repeat)?
    };
    io::write_outputs(&output, &out, &d)?;
    println!("wrote h, v_new, ht to {}", output.display());
    Ok(())
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

/// `kda run` on a generalized problem (docs/CONTRACT.md#the-generalized-recurrence): the f64
/// reference with `--cpu`; without it, the typed error saying which feature no kernel runs yet.
fn run_model(
    input: &Path,
    output: &Path,
    m: &kda::model::ModelProblem,
    cpu: bool,
    repeat: Option<usize>,
) -> Result<(), CliError> {
    let s = m.shape;
    let gates = match (s.gates.g, s.gates.gk) {
        (true, true) => "g and gk",
        (true, false) => "g",
        (false, true) => "gk",
        (false, false) => "none",
    };
    println!(
        "{}: N = {}, T = {}, H = {}, HV = {}, K = {}, V = {}, gates {gates}, state {:?}, h0 {}",
        input.display(),
        m.plan.num_seqs(),
        m.plan.tokens(),
        s.heads,
        s.value_heads,
        s.key_dim,
        s.value_dim,
        s.layout,
        if m.h0.is_some() { "given" } else { "zeros" }
    );
    if !cpu {
        let reason = format!(
            "H = {}, HV = {}, K = {}, V = {}, gates {gates}, {:?} state; the kernels run gk, HV = H, K = V = 128, \
             KeyFirst",
            s.heads, s.value_heads, s.key_dim, s.value_dim, s.layout
        );
        return Err(KdaError::Unsupported { argument: "inputs", reason }.into());
    }
    if repeat.is_some() {
        return Err(CliError::Usage("--repeat times the GPU kernel; it cannot go with --cpu".into()));
    }
    let out = reference::model_reference(&m.view())?;
    io::write_model_outputs(output, &out, &m.view())?;
    println!("wrote h, v_new, ht to {}", output.display());
    Ok(())
}

fn run_gpu(kda: &Kda, stream: &Arc<CudaStream>, p: &Problem, repeat: Option<usize>) -> Result<Outputs, CliError> {
    let mut dev = DeviceProblem::upload(stream, p)?;
    let kernel = kda.resolve(Kernel::Auto);
    match repeat {
        Some(n) => {
            let us = median_us(stream, WARMUP, n, |_| dev.launch(kda, stream, kernel))?;
            println!("kernel {kernel:?}: median {us:.2} us over {n} launches");
        }
        None => dev.launch(kda, stream, kernel)?,
    }
    Ok(dev.download(stream)?)
}

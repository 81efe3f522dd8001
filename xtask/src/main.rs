//! Project tasks, run here as `cargo xtask <command>` and on a GPU machine without Rust as
//! `target/gpu-bundle/xtask <command>` (from the repository root, after `cargo xtask bundle` here).
//! Every child process a GPU command starts runs under a timeout (see [`proc`]).

mod ab;
mod args;
mod bench;
mod bundle;
mod chart;
mod proc;
mod profile;
mod ptx;
mod sanitize;
mod session;
mod shapes;
mod suite;

use std::process::ExitCode;

/// The measuring harness shared with the `kda` CLI, imported from one place.
mod harness {
    pub use kda_cli::{DeviceProblem, bench_shapes, copy_bandwidth, cuda_tool, floor_us, median_us};
}

const USAGE: &str = "\
usage: cargo xtask <command> [options]   (on a GPU machine without Rust: target/gpu-bundle/xtask <command>)
  ptx [--write | --check]               ptxas resource report (registers, shared memory, spills) of every kernel; --write rebuilds
                                        the shipped PTX (kda/ptx/) from source, --check fails unless it equals a rebuild byte for byte; no GPU
  bundle [--out DIR] [--with REV,...] [--pack] [--candle [--cuda DIR]]   builds kda, xtask and the GPU suite's test binary (release) into DIR (target/gpu-bundle); --with adds the kda of each git revision as kda-REV, for ab;
                                        --pack strips them and packs DIR into DIR.tar.xz (tar xJf it on the GPU machine);
                                        --candle adds the candle examples and their run.sh in DIR/candle (packed apart, into DIR-candle.tar.xz), built
                                        with the nvcc and CUDA 13 libraries of --cuda DIR (else $CUDA_ROOT, $CUDA_PATH, .venv-nvcc's nvidia/cu13)
  gpu-suite [--timeout S] [-- ARGS]     GPU: the GPU suite (one test thread, fixtures from tests/fixtures); ARGS go to the test binary
  bench [--repeat N] [--out DIR] [--timeout S] [--plot]   GPU: copy bandwidth, every bench shape with each kernel; writes DIR/results.json (bench), with --plot also DIR/chart.svg
  plot [--results FILE] [--out FILE]    the chart of a saved run (bench/results.json to bench/chart.svg); no GPU
  profile [--shape NAME [--portable] | --layer NAME | --decode NAME] [--skip N] [--out DIR]  GPU: ncu profile of one kda_fwd_h_hopper launch on a shape (fixed_8192) after N (3),
                                        --portable of the portable kernel's, with --layer of the layer's prepare and output kernels under `kda layer --bench NAME`,
                                        with --decode of the decode step under `kda decode --bench NAME`;
                                        details and SASS source CSV in DIR (target/profile)
  sanitize [--out DIR] [--tools A,B] [--only S,...]   GPU: compute-sanitizer memcheck, racecheck, synccheck, initcheck over every kernel
                                        variant (`kda run`, `kda layer`, the suite's sanitizer_workload); --tools: a subset, --only: the cases
                                        whose name contains one of S (_wide _narrow _split _portable_kernel _baseline _layer gpu_);
                                        a table of the summaries; logs in DIR (target/sanitize)
  ab KDA... [--shapes A,B] [--rounds N] [--repeat N] [--timeout S] [--out DIR] [--time-unchecked] [--deadline S]   GPU: checks kda builds against the f64 reference, then times them round by round (none started after S seconds); ab.json, ab.log in DIR (target/ab)
  gpu-session [--out DIR] [--quick]     GPU: nvidia-smi, suite, demo, PyTorch round trip, bench, sanitize (--quick: suite, bench); session.log, results.json in DIR (target/gpu-session)
GPU commands find kda and gpu next to this executable, or in --bundle DIR. Shapes (H = 64 unless said):
  fixed_8192 mixed_6 fixed_32k many_short tiny random_ragged_32k decode_like ragged_many (8 ragged lengths, H = 32)
  split_tails (5 lengths up to 700 with tails, H = 2, no h0)";

/// A failed command: the message, and the exit status to leave with.
pub struct Failure {
    pub code: u8,
    pub message: String,
}

impl From<String> for Failure {
    fn from(message: String) -> Self {
        Self { code: 1, message }
    }
}

impl From<&str> for Failure {
    fn from(message: &str) -> Self {
        message.to_string().into()
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rest = args.get(1..).unwrap_or_default();
    let result: Result<(), Failure> = match args.first().map(String::as_str) {
        Some("ptx") => ptx::run(rest).map_err(Failure::from),
        Some("bundle") => bundle::run(rest).map_err(Failure::from),
        Some("gpu-suite") => suite::run(rest),
        Some("bench") => bench::run(rest).map_err(Failure::from),
        Some("plot") => chart::run(rest).map_err(Failure::from),
        Some("profile") => profile::run(rest).map_err(Failure::from),
        Some("sanitize") => sanitize::run(rest).map_err(Failure::from),
        Some("ab") => ab::run(rest).map_err(Failure::from),
        Some("gpu-session") => session::run(rest).map_err(Failure::from),
        Some("help" | "-h" | "--help") => {
            println!("{USAGE}");
            Ok(())
        }
        _ => Err(USAGE.into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("error: {}", f.message);
            ExitCode::from(f.code.max(1))
        }
    }
}

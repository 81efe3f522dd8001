//! Project tasks: `cargo xtask ptx` (ptxas resource report per kernel) and `cargo xtask bench`
//! (every SPEC reference shape on the GPU against the memory floor).

mod bench;
mod ptx;

use std::process::ExitCode;

const USAGE: &str = "usage: cargo xtask <ptx | bench [--repeat N] [--out DIR]>
  ptx    ptxas -v resource report (registers, shared memory, spills) of every kernel, for sm_90a
         and sm_80. ptxas comes from $KDA_CUDA_BIN, ./.venv-cuda (.ci/setup) or PATH.
  bench  runs on the GPU: copy bandwidth, then every reference shape with each kernel; prints a
         table and writes bench/results.json";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("ptx") => ptx::run(),
        Some("bench") => bench::run(&args[1..]),
        _ => Err(USAGE.to_string()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

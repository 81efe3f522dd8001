//! `xtask gpu-session [--out DIR] [--quick] [--bundle DIR]`: one whole GPU session on a machine
//! without Rust, from the bundle. Steps, each under a timeout: `nvidia-smi`, the GPU suite,
//! `kda demo`, a PyTorch-written file through `kda run` on the GPU and with `--cpu` (compared in
//! Python), the benchmark and the sanitizers. `--quick`: device info, the suite and the benchmark
//! only. Ends with a summary of the steps' exit statuses.
//!
//! Two files are left in DIR (default `target/gpu-session`): `results.json` (the benchmark's) and
//! `session.log`, every step's whole log in turn and the summary, rewritten after each step so a
//! session cut short still leaves what ran. (A device call returns at most 8 files, so the steps'
//! own logs stay in a scratch directory.)

use crate::args::Args;
use crate::proc::{Finished, Scratch, bundle_bin, bundle_dir, create_dir, describe, repo_root, run_logged, tail};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// The PyTorch round trip script, relative to the repository root.
const INTEROP: &str = "tests/interop/torch_roundtrip.py";

struct Step {
    name: &'static str,
    limit: Duration,
    cmd: Command,
}

fn step(name: &'static str, secs: u64, program: impl AsRef<std::ffi::OsStr>) -> Step {
    Step { name, limit: Duration::from_secs(secs), cmd: Command::new(program) }
}

pub fn run(args: &[String]) -> Result<(), String> {
    let a = Args::parse("gpu-session", args, &["--out", "--bundle"], &["--quick"])?;
    if let Some(p) = a.positional.first() {
        return Err(format!("gpu-session: unexpected argument {p}"));
    }
    let out = a.path("--out", "target/gpu-session");
    let quick = a.has("--quick");
    let bundle = bundle_dir(a.value("--bundle"))?;
    let kda = bundle_bin(&bundle, "kda")?;
    bundle_bin(&bundle, "gpu")?;
    let me = std::env::current_exe().map_err(|e| format!("cannot locate this executable: {e}"))?;
    let root = repo_root();
    create_dir(&out)?;
    let scratch = Scratch::new("session")?;
    let file = |name: &str| scratch.join(name);

    let mut steps = Vec::new();
    let mut s = step("device", 30, "nvidia-smi");
    s.cmd.args(["--query-gpu=name,driver_version,clocks.sm,clocks.mem", "--format=csv"]);
    steps.push(s);
    // The suite's own timeout is 300 s; the step's is a little longer so the suite reports first.
    let mut s = step("gpu_suite", 330, &me);
    s.cmd.arg("gpu-suite").arg("--bundle").arg(&bundle);
    steps.push(s);
    if !quick {
        let mut s = step("demo", 60, &kda);
        s.cmd.arg("demo");
        steps.push(s);
        let mut s = step("interop_make", 60, "python3");
        s.cmd.arg(root.join(INTEROP)).arg("make").arg(file("torch_in.safetensors"));
        steps.push(s);
        let mut s = step("interop_gpu", 60, &kda);
        s.cmd.args(["run", "--inputs"]).arg(file("torch_in.safetensors"));
        s.cmd.arg("--out").arg(file("torch_gpu.safetensors")).args(["--repeat", "50"]);
        steps.push(s);
        let mut s = step("interop_cpu", 60, &kda);
        s.cmd.args(["run", "--cpu", "--inputs"]).arg(file("torch_in.safetensors"));
        s.cmd.arg("--out").arg(file("torch_cpu.safetensors"));
        steps.push(s);
        let mut s = step("interop_compare", 60, "python3");
        s.cmd.arg(root.join(INTEROP)).arg("compare").arg(file("torch_in.safetensors"));
        s.cmd.arg(file("torch_gpu.safetensors")).arg(file("torch_cpu.safetensors"));
        steps.push(s);
    }
    // The benchmark's own limit is 300 s (it runs in one process, under a watchdog).
    let mut s = step("bench", 330, &me);
    s.cmd.args(["bench", "--repeat", "100", "--timeout", "300", "--out"]).arg(&out);
    steps.push(s);
    if !quick {
        // Six sanitizer runs of at most 120 s each.
        let mut s = step("sanitize", 780, &me);
        s.cmd.arg("sanitize").arg("--bundle").arg(&bundle).arg("--out").arg(scratch.join("sanitize"));
        steps.push(s);
    }

    let mut results: Vec<(&str, Finished)> = Vec::new();
    let mut combined = String::new();
    for mut s in steps {
        let log = scratch.join(&format!("{}.log", s.name));
        let what = describe(&s.cmd);
        println!("== {}: {what} (timeout {} s)", s.name, s.limit.as_secs());
        let (f, text) = match run_logged(&mut s.cmd, s.limit, &log) {
            Ok(r) => r,
            Err(e) => (Finished { code: Some(127), timed_out: false, secs: 0.0 }, e),
        };
        println!("   {}: {}", s.name, f.describe());
        println!("{}", tail(&text, 25));
        combined += &format!("######## {}: {what}\n{text}\n######## {}: {}\n", s.name, s.name, f.describe());
        results.push((s.name, f));
        // Written after every step, so a session cut short still leaves its log.
        write(&out.join("session.log"), &format!("{combined}######## summary\n{}\n", summary(&results)))?;
    }
    println!("\n{}", summary(&results));
    println!("wrote {}", out.join("session.log").display());
    let failed: Vec<&str> = results.iter().filter(|(_, f)| !f.ok()).map(|(n, _)| *n).collect();
    if failed.is_empty() { Ok(()) } else { Err(format!("gpu-session: failed steps: {}", failed.join(", "))) }
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

/// One line per step: name, `ok`/`FAIL`, how it ended.
fn summary(results: &[(&str, Finished)]) -> String {
    let lines: Vec<String> = results
        .iter()
        .map(|(name, f)| format!("{name:<16} {:<4} {}", if f.ok() { "ok" } else { "FAIL" }, f.describe()))
        .collect();
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_names_each_step_and_its_status() {
        let ok = Finished { code: Some(0), timed_out: false, secs: 12.0 };
        let hung = Finished { code: None, timed_out: true, secs: 300.0 };
        let s = summary(&[("gpu_suite", ok), ("bench", hung)]);
        assert_eq!(s, "gpu_suite        ok   rc=0 in 12.0 s\nbench            FAIL timed out after 300.0 s");
    }
}

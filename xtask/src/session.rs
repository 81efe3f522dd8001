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
use crate::proc::{
    Finished, Scratch, bundle_bin, bundle_dir, create_dir, describe, repo_root, run_logged, tail, write_text,
};
use kda::CODE_VAR;
use std::ffi::OsStr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// The PyTorch round trip script, relative to the repository root.
const INTEROP: &str = "tests/interop/torch_roundtrip.py";

struct Step {
    name: &'static str,
    limit: Duration,
    cmd: Command,
}

fn step(name: &'static str, secs: u64, program: impl AsRef<OsStr>) -> Step {
    Step { name, limit: Duration::from_secs(secs), cmd: Command::new(program) }
}

impl Step {
    /// Sets an environment variable of the step's command.
    fn env(mut self, name: &str, value: &str) -> Self {
        self.cmd.env(name, value);
        self
    }

    /// Adds an argument to the step's command.
    fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.cmd.arg(arg);
        self
    }

    /// Adds arguments to the step's command.
    fn args<S: AsRef<OsStr>>(mut self, args: impl IntoIterator<Item = S>) -> Self {
        self.cmd.args(args);
        self
    }
}

/// Where the session's programs are and where its files go.
struct Places {
    /// The output directory.
    out: PathBuf,
    bundle: PathBuf,
    /// The bundle's `kda`.
    kda: PathBuf,
    /// This executable.
    me: PathBuf,
    /// The repository root.
    root: PathBuf,
    scratch: Scratch,
}

impl Places {
    /// Finds the bundle (in `bundle`, else next to this executable) with its `kda` and `gpu`,
    /// creates `out` and the scratch space.
    fn find(out: PathBuf, bundle: Option<&str>) -> Result<Self, String> {
        let bundle = bundle_dir(bundle)?;
        let kda = bundle_bin(&bundle, "kda")?;
        bundle_bin(&bundle, "gpu")?;
        let me = std::env::current_exe().map_err(|e| format!("cannot locate this executable: {e}"))?;
        let root = repo_root();
        create_dir(&out)?;
        let scratch = Scratch::new("session")?;
        Ok(Self { out, bundle, kda, me, root, scratch })
    }
}

pub fn run(args: &[String]) -> Result<(), String> {
    let a = Args::parse("gpu-session", args, &["--out", "--bundle"], &["--quick"])?;
    a.no_positional("gpu-session")?;
    let quick = a.has("--quick");
    let places = Places::find(a.path("--out", "target/gpu-session"), a.value("--bundle"))?;
    let results = run_steps(steps(&places, quick), &places)?;
    println!("\n{}", summary(&results));
    println!("wrote {}", places.out.join("session.log").display());
    let failed: Vec<&str> = results.iter().filter(|(_, f)| !f.ok()).map(|(n, _)| *n).collect();
    if failed.is_empty() { Ok(()) } else { Err(format!("gpu-session: failed steps: {}", failed.join(", "))) }
}

/// The session's steps in order; `quick` keeps only the device info, the suite and the benchmark.
fn steps(p: &Places, quick: bool) -> Vec<Step> {
    let mut steps = vec![
        step("device", 30, "nvidia-smi").args(["--query-gpu=name,driver_version,clocks.sm,clocks.mem", "--format=csv"]),
        // The suite's own timeout is 300 s; the step's is a little longer so the suite reports first.
        // The stress tests (huge tensors, 100,000 sequences, 100-run determinism) run apart.
        step("gpu_suite", 330, &p.me)
            .arg("gpu-suite")
            .arg("--bundle")
            .arg(&p.bundle)
            .args(["--", "--skip", "stress::"]),
    ];
    if !quick {
        let stress = step("gpu_stress", 330, &p.me).arg("gpu-suite").arg("--bundle").arg(&p.bundle);
        steps.push(stress.args(["--", "stress::"]));
        steps.push(step("demo", 60, &p.kda).arg("demo"));
        // The same demo from the shipped cubin: its cold start and kernel time beside the PTX's.
        steps.push(step("demo_cubin", 60, &p.kda).arg("demo").env(CODE_VAR, "cubin"));
        steps.extend(interop_steps(p));
    }
    // The benchmark's own limit is 300 s (it runs in one process, under a watchdog).
    steps.push(
        step("bench", 330, &p.me).args(["bench", "--plot", "--repeat", "100", "--timeout", "300", "--out"]).arg(&p.out),
    );
    if !quick {
        // 164 sanitizer runs (41 cases under 4 tools), each seconds to tens of seconds (racecheck
        // the slowest); each run has its own limit (`sanitize`), the step an hour for them all.
        let sanitize = step("sanitize", 3600, &p.me).arg("sanitize").arg("--bundle").arg(&p.bundle);
        steps.push(sanitize.arg("--out").arg(p.scratch.join("sanitize")));
    }
    steps
}

/// The PyTorch round trip: a PyTorch-written file through `kda run` on the GPU and with `--cpu`,
/// the two outputs compared in Python.
fn interop_steps(p: &Places) -> [Step; 4] {
    let file = |name: &str| p.scratch.join(name);
    let (input, gpu, cpu) =
        (file("torch_in.safetensors"), file("torch_gpu.safetensors"), file("torch_cpu.safetensors"));
    [
        step("interop_make", 60, "python3").arg(p.root.join(INTEROP)).arg("make").arg(&input),
        step("interop_gpu", 60, &p.kda)
            .args(["run", "--inputs"])
            .arg(&input)
            .arg("--out")
            .arg(&gpu)
            .args(["--repeat", "50"]),
        step("interop_cpu", 60, &p.kda).args(["run", "--cpu", "--inputs"]).arg(&input).arg("--out").arg(&cpu),
        step("interop_compare", 60, "python3").arg(p.root.join(INTEROP)).arg("compare").arg(&input).arg(&gpu).arg(&cpu),
    ]
}

/// Runs the steps in turn and returns how each ended. `session.log` gathers their logs and is
/// rewritten, with the summary so far, after every step, so a session cut short still leaves it.
fn run_steps(steps: Vec<Step>, p: &Places) -> Result<Vec<(&'static str, Finished)>, String> {
    let mut results = Vec::new();
    let mut combined = String::new();
    for mut s in steps {
        let what = describe(&s.cmd);
        let (f, text) = run_step(&mut s, &what, &p.scratch);
        combined += &format!("######## {}: {what}\n{text}\n######## {}: {}\n", s.name, s.name, f.describe());
        results.push((s.name, f));
        write_text(&p.out.join("session.log"), &format!("{combined}######## summary\n{}\n", summary(&results)))?;
    }
    Ok(results)
}

/// Runs step `s` (command `what`) with its log in `scratch`, and prints how it ended and the
/// log's last lines. A step that cannot start ends as `rc=127`, its log the reason.
fn run_step(s: &mut Step, what: &str, scratch: &Scratch) -> (Finished, String) {
    let log = scratch.join(&format!("{}.log", s.name));
    println!("== {}: {what} (timeout {} s)", s.name, s.limit.as_secs());
    let (f, text) = match run_logged(&mut s.cmd, s.limit, &log) {
        Ok(r) => r,
        Err(e) => (Finished { code: Some(127), timed_out: false, secs: 0.0 }, e),
    };
    println!("   {}: {}", s.name, f.describe());
    println!("{}", tail(&text, 25));
    (f, text)
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

    #[test]
    fn the_steps_and_their_commands() {
        let p = Places {
            out: "/o".into(),
            bundle: "/b".into(),
            kda: "/b/kda".into(),
            me: "/b/xtask".into(),
            root: "/r".into(),
            scratch: Scratch::new("test-steps").unwrap(),
        };
        let s = p.scratch.0.display();
        let py = "python3 /r/tests/interop/torch_roundtrip.py";
        let expected = [
            ("device", 30, "nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv".to_string()),
            ("gpu_suite", 330, "/b/xtask gpu-suite --bundle /b -- --skip stress::".into()),
            ("gpu_stress", 330, "/b/xtask gpu-suite --bundle /b -- stress::".into()),
            ("demo", 60, "/b/kda demo".into()),
            ("demo_cubin", 60, "/b/kda demo".into()),
            ("interop_make", 60, format!("{py} make {s}/torch_in.safetensors")),
            (
                "interop_gpu",
                60,
                format!("/b/kda run --inputs {s}/torch_in.safetensors --out {s}/torch_gpu.safetensors --repeat 50"),
            ),
            (
                "interop_cpu",
                60,
                format!("/b/kda run --cpu --inputs {s}/torch_in.safetensors --out {s}/torch_cpu.safetensors"),
            ),
            (
                "interop_compare",
                60,
                format!("{py} compare {s}/torch_in.safetensors {s}/torch_gpu.safetensors {s}/torch_cpu.safetensors"),
            ),
            ("bench", 330, "/b/xtask bench --plot --repeat 100 --timeout 300 --out /o".into()),
            ("sanitize", 3600, format!("/b/xtask sanitize --bundle /b --out {s}/sanitize")),
        ];
        let got: Vec<_> = steps(&p, false).iter().map(|s| (s.name, s.limit.as_secs(), describe(&s.cmd))).collect();
        assert_eq!(got, expected);
        let quick: Vec<_> = steps(&p, true).iter().map(|s| s.name).collect();
        assert_eq!(quick, ["device", "gpu_suite", "bench"]);
    }
}

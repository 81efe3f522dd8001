//! `xtask sanitize [--out DIR] [--bundle DIR]`: compute-sanitizer's memcheck, racecheck and
//! synccheck over `kda run` on ragged inputs with tails: the golden fixture `ragged_h3` (one
//! item per CTA), `ragged_many` (512 items, so CTAs of the persistent grid run several back to
//! back), and the model fixtures the GPU runs (the scalar gate with grouped value heads,
//! value-first states, both gates, no gate at V = 256, K = 64, K = 256), each in wide and in narrow
//! column blocks (`K = 256` narrow only), and the whole layer (`kda layer`) on three layer
//! fixtures. Prints each run's summary line, and the
//! log of a run that reports an error or hazard, fails or times out (the first and last 60
//! lines); fails if any does. Each run's whole log is in DIR (default `target/sanitize`), one
//! file per tool and input.

use crate::args::Args;
use crate::proc::{Scratch, abridge, bundle_bin, bundle_dir, create_dir, cuda_cli, repo_root, run_logged};
use crate::shapes;
use std::process::Command;
use std::time::Duration;

const TOOLS: &[&str] = &["memcheck", "racecheck", "synccheck"];
const RUN_TIMEOUT: Duration = Duration::from_secs(120);

/// The model fixtures the GPU runs in both column widths (`tests/fixtures/models/`).
const MODEL_FIXTURES: [&str; 5] = ["gdn_gva_ragged", "kda_gva_vfirst", "g_and_gk", "plain_delta_k128_v256", "kda_k64"];
/// The model fixtures the GPU runs in narrow blocks only.
const NARROW_FIXTURES: [&str; 1] = ["gdn_k256_v512"];
/// How an input runs: the recurrence in a column width (`kda run --columns`), or the whole
/// layer (`kda layer`: its prepare and output kernels around the recurrence).
#[derive(Clone, Copy)]
enum Mode {
    Columns(&'static str),
    Layer,
}

impl Mode {
    /// The mode's name in the log file names and the summary.
    fn name(self) -> &'static str {
        match self {
            Mode::Columns(width) => width,
            Mode::Layer => "layer",
        }
    }
}

/// The column blocks each recurrence input runs in.
const WIDTHS: [Mode; 2] = [Mode::Columns("wide"), Mode::Columns("narrow")];
/// The layer fixtures (`tests/fixtures/layer/`): KDA ragged with tails, the gate activated
/// inside, Gated DeltaNet with grouped value heads.
const LAYER_FIXTURES: [&str; 3] = ["kda_layer_ragged", "kda_layer_gate_in_kernel", "gdn_layer_gva_ragged"];

pub fn run(args: &[String]) -> Result<(), String> {
    let a = Args::parse("sanitize", args, &["--out", "--bundle"], &[])?;
    a.no_positional("sanitize")?;
    let out = a.path("--out", "target/sanitize");
    let kda = bundle_bin(&bundle_dir(a.value("--bundle"))?, "kda")?;
    let sanitizer = cuda_cli("compute-sanitizer");
    create_dir(&out)?;
    let scratch = Scratch::new("sanitize")?;
    let many = scratch.join("ragged_many.safetensors");
    shapes::write("ragged_many", &many)?;
    let fixture = |name: &str| repo_root().join(format!("tests/fixtures/{name}.safetensors"));
    let mut inputs = vec![("ragged_h3", fixture("ragged_h3"), &WIDTHS[..]), ("ragged_many", many, &WIDTHS[..])];
    // Every variant of the Hopper kernel: the scalar gate with grouped heads, value-first states,
    // both gates, no gate at V = 256, K = 64, K = 256.
    inputs.extend(MODEL_FIXTURES.map(|name| (name, fixture(&format!("models/{name}")), &WIDTHS[..])));
    inputs.extend(NARROW_FIXTURES.map(|name| (name, fixture(&format!("models/{name}")), &WIDTHS[1..])));
    inputs.extend(LAYER_FIXTURES.map(|name| (name, fixture(&format!("layer/{name}")), &[Mode::Layer][..])));

    let mut failed = Vec::new();
    for tool in TOOLS {
        for (name, input, modes) in &inputs {
            for &mode in modes.iter() {
                let width = mode.name();
                let log = out.join(format!("sanitizer_{tool}_{name}_{width}.txt"));
                let mut cmd = Command::new(&sanitizer);
                cmd.args(["--tool", tool]).arg(&kda);
                cmd.arg(if let Mode::Layer = mode { "layer" } else { "run" });
                cmd.arg("--inputs").arg(input).arg("--out").arg(scratch.join("sanitized.safetensors"));
                if let Mode::Columns(width) = mode {
                    cmd.args(["--columns", width]);
                }
                println!("== {tool} on {name} ({width}) ...");
                let (f, text) = run_logged(&mut cmd, RUN_TIMEOUT, &log)?;
                let summary = summary_line(&text);
                let clean = summary.is_some_and(reports_nothing);
                let case = format!("{name} {width}");
                println!("   {tool:<9} {case:<28} {}; {}", summary.unwrap_or("no summary line"), f.describe());
                if !(f.ok() && clean) {
                    println!("{}", abridge(&text, 60, 60));
                    failed.push(format!("{tool} on {case}"));
                }
            }
        }
    }
    if failed.is_empty() {
        println!("sanitize: no errors or hazards (logs in {})", out.display());
        Ok(())
    } else {
        Err(format!("sanitize: {} (logs in {})", failed.join(", "), out.display()))
    }
}

/// compute-sanitizer's summary: `========= ERROR SUMMARY: 0 errors` (memcheck, synccheck) or
/// `========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)`.
fn summary_line(log: &str) -> Option<&str> {
    log.lines().rev().find(|l| l.contains("SUMMARY:")).map(|l| l.trim_start_matches(['=', ' ']).trim_end())
}

/// Whether every count on a summary line is 0.
fn reports_nothing(summary: &str) -> bool {
    let after = summary.split_once("SUMMARY:").map_or(summary, |(_, rest)| rest);
    after.split(|c: char| !c.is_ascii_digit()).filter(|s| !s.is_empty()).all(|n| n.bytes().all(|b| b == b'0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_lines() {
        let clean = "wrote h\n========= ERROR SUMMARY: 0 errors\n";
        assert_eq!(summary_line(clean), Some("ERROR SUMMARY: 0 errors"));
        assert!(reports_nothing(summary_line(clean).unwrap()));
        let race = "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)";
        assert!(reports_nothing(summary_line(race).unwrap()));
        let hazards = "========= RACECHECK SUMMARY: 3 hazards displayed (0 errors, 3 warnings)";
        assert!(!reports_nothing(summary_line(hazards).unwrap()));
        assert!(!reports_nothing("ERROR SUMMARY: 10 errors"));
        assert_eq!(summary_line("kda run: no CUDA device"), None);
    }
}

//! `xtask profile [--shape NAME | --layer NAME | --decode NAME] [--skip N] [--out DIR] [--bundle DIR]`: an Nsight
//! Compute profile of one launch of the Hopper kernel under `kda run` on one shape (default
//! `fixed_8192`), after skipping `N` of its launches (default 3; a split shape launches the kernel
//! twice per run, the pre-scan then the main pass, so an even `N` profiles a pre-scan), clocks
//! left alone; with `--layer`, of the layer's two kernels named `kda_layer_*` under `kda layer
//! --bench NAME`, past its checked first run (the separate path's prepare and output kernels, or
//! on the fused path the prepare kernel and the fused recurrence); with `--decode`, of the decode
//! step (`kda_decode_step`) under `kda decode --bench NAME`, past its checked first call; with
//! `--portable`, of the portable tensor-core kernel (`KDA_KERNEL=portable`) on the shape. Leaves in
//! DIR: `profile.ncu-rep`, `ncu_run.txt` (ncu's own log), `ncu.txt` (the details page of the
//! summary sections) and `source.csv` (per-SASS-instruction warp stall samples).

use crate::args::Args;
use crate::proc::{Scratch, bundle_bin, bundle_dir, create_dir, cuda_cli, describe, run_logged, tail};
use crate::shapes;
use std::process::Command;
use std::time::Duration;

/// Every entry of the Hopper kernel (wide, narrow, each key size).
const KERNEL: &str = "regex:^kda_fwd_h_hopper";
/// Every entry of the portable tensor-core kernel (each key size).
const PORTABLE_KERNEL: &str = "regex:^kda_fwd_h_portable";
/// The layer's kernels (`kda_layer_prepare` and `kda_layer_output`, or `kda_layer_prepare_fused`
/// and `kda_layer_fused_hopper`).
const LAYER_KERNELS: &str = "regex:^kda_layer_";
/// Layer launches skipped: the checked first run's two.
const LAYER_SKIP: usize = 2;
/// The decode step's kernel (`kda_decode_step`).
const DECODE_KERNELS: &str = "regex:^kda_decode";
/// Decode launches skipped: the checked first call's.
const DECODE_SKIP: usize = 1;
const SECTIONS: &[&str] = &[
    "SpeedOfLight",
    "MemoryWorkloadAnalysis",
    "WarpStateStats",
    "Occupancy",
    "LaunchStats",
    "SchedulerStats",
    "SourceCounters",
];
/// Launches of the kernel skipped before the one profiled: past the first run's.
const DEFAULT_SKIP: usize = 3;
const PROFILE_TIMEOUT: Duration = Duration::from_secs(300);
const EXPORT_TIMEOUT: Duration = Duration::from_secs(180);

/// What a profile runs under ncu.
#[derive(Clone, Copy)]
enum Target<'a> {
    /// `kda run` on recurrence shape `shape`: the Hopper kernel, or with `portable` the portable one.
    Recurrence { shape: &'a str, portable: bool },
    /// `kda COMMAND --bench NAME` (`layer` or `decode`): `launches` of the kernels `kernels`,
    /// after `skip` by default (the checked first run's).
    Bench { command: &'static str, name: &'a str, kernels: &'static str, launches: &'static str, skip: usize },
}

pub fn run(args: &[String]) -> Result<(), String> {
    let a = Args::parse(
        "profile",
        args,
        &["--shape", "--layer", "--decode", "--skip", "--out", "--bundle"],
        &["--portable"],
    )?;
    a.no_positional("profile")?;
    let recurrence_args = a.value("--shape").is_some() || a.has("--portable");
    let target = match (a.value("--layer"), a.value("--decode")) {
        (Some(_), Some(_)) => return Err("profile: one of --layer and --decode".into()),
        (Some(_), None) | (None, Some(_)) if recurrence_args => {
            return Err("profile: --layer and --decode profile their own kernels; --shape and --portable name a \
                        recurrence run"
                .into());
        }
        (Some(name), None) => {
            Target::Bench { command: "layer", name, kernels: LAYER_KERNELS, launches: "2", skip: LAYER_SKIP }
        }
        (None, Some(name)) => {
            Target::Bench { command: "decode", name, kernels: DECODE_KERNELS, launches: "1", skip: DECODE_SKIP }
        }
        (None, None) => {
            Target::Recurrence { shape: a.value("--shape").unwrap_or("fixed_8192"), portable: a.has("--portable") }
        }
    };
    let default_skip = match target {
        Target::Bench { skip, .. } => skip,
        Target::Recurrence { .. } => DEFAULT_SKIP,
    };
    let skip = a.parsed::<usize>("--skip", default_skip)?.to_string();
    let out = a.path("--out", "target/profile");
    let kda = bundle_bin(&bundle_dir(a.value("--bundle"))?, "kda")?;
    let ncu = cuda_cli("ncu");
    create_dir(&out)?;
    let scratch = Scratch::new("profile")?;

    let report = out.join("profile");
    let mut cmd = Command::new(&ncu);
    let (kernels, launches) = match target {
        Target::Bench { kernels, launches, .. } => (kernels, launches),
        Target::Recurrence { portable: true, .. } => (PORTABLE_KERNEL, "1"),
        Target::Recurrence { portable: false, .. } => (KERNEL, "1"),
    };
    if let Target::Recurrence { portable: true, .. } = target {
        cmd.env("KDA_KERNEL", "portable");
    }
    cmd.args(["--clock-control", "none", "--kernel-name", kernels, "--launch-skip", &skip, "--launch-count", launches]);
    for s in SECTIONS {
        cmd.args(["--section", s]);
    }
    cmd.args(["--import-source", "no", "-f", "-o"]).arg(&report);
    match target {
        Target::Bench { command, name, .. } => {
            // The bench draws its own random inputs; one timed launch after the checked one.
            cmd.arg(&kda).args([command, "--bench", name, "--repeat", "1"]);
        }
        Target::Recurrence { shape, .. } => {
            let input = scratch.join(&format!("{shape}.safetensors"));
            println!("== inputs: {shape} -> {}", input.display());
            shapes::write(shape, &input)?;
            cmd.arg(&kda).arg("run").arg("--inputs").arg(&input);
            cmd.arg("--out").arg(scratch.join("out.safetensors")).args(["--repeat", "5"]);
        }
    }
    println!("== ncu: {}", describe(&cmd));
    let (f, log) = run_logged(&mut cmd, PROFILE_TIMEOUT, &out.join("ncu_run.txt"))?;
    println!("== ncu: {}\n{}", f.describe(), tail(&log, 5));
    if !f.ok() {
        return Err(format!("ncu {} (log: {})", f.describe(), out.join("ncu_run.txt").display()));
    }

    let rep = out.join("profile.ncu-rep");
    let mut details = Command::new(&ncu);
    details.arg("--import").arg(&rep).args(["--page", "details"]);
    let (f, text) = run_logged(&mut details, EXPORT_TIMEOUT, &out.join("ncu.txt"))?;
    if !f.ok() {
        return Err(format!("details page export {}: {}", f.describe(), tail(&text, 5)));
    }
    let mut source = Command::new(&ncu);
    source.arg("--import").arg(&rep).args(["--page", "source", "--csv", "--print-source", "sass"]);
    let (f, csv) = run_logged(&mut source, EXPORT_TIMEOUT, &out.join("source.csv"))?;
    if !f.ok() {
        println!("source page export {}: {}", f.describe(), csv.chars().take(300).collect::<String>());
    }
    println!("{text}");
    println!("wrote {} (ncu.txt, source.csv, profile.ncu-rep, ncu_run.txt)", out.display());
    Ok(())
}

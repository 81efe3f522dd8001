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
/// The decode step's kernels (the step, and the pool copy where a bench shape uses one).
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

pub fn run(args: &[String]) -> Result<(), String> {
    let a = Args::parse(
        "profile",
        args,
        &["--shape", "--layer", "--decode", "--skip", "--out", "--bundle"],
        &["--portable"],
    )?;
    a.no_positional("profile")?;
    let (layer, decode) = (a.value("--layer"), a.value("--decode"));
    if (layer.is_some() || decode.is_some()) && (a.value("--shape").is_some() || a.has("--portable")) {
        return Err("profile: --layer and --decode profile their own kernels; --shape and --portable name a \
                    recurrence run"
            .into());
    }
    if layer.is_some() && decode.is_some() {
        return Err("profile: one of --layer and --decode".into());
    }
    let shape = a.value("--shape").unwrap_or("fixed_8192");
    let default_skip = match (layer, decode) {
        (Some(_), _) => LAYER_SKIP,
        (_, Some(_)) => DECODE_SKIP,
        _ => DEFAULT_SKIP,
    };
    let skip = a.parsed::<usize>("--skip", default_skip)?.to_string();
    let out = a.path("--out", "target/profile");
    let kda = bundle_bin(&bundle_dir(a.value("--bundle"))?, "kda")?;
    let ncu = cuda_cli("ncu");
    create_dir(&out)?;
    let scratch = Scratch::new("profile")?;

    let report = out.join("profile");
    let mut cmd = Command::new(&ncu);
    let portable = a.has("--portable");
    let (kernels, launches) = match (layer, decode, portable) {
        (Some(_), _, _) => (LAYER_KERNELS, "2"),
        (_, Some(_), _) => (DECODE_KERNELS, "1"),
        (None, None, true) => (PORTABLE_KERNEL, "1"),
        (None, None, false) => (KERNEL, "1"),
    };
    if portable {
        cmd.env("KDA_KERNEL", "portable");
    }
    cmd.args(["--clock-control", "none", "--kernel-name", kernels, "--launch-skip", &skip, "--launch-count", launches]);
    for s in SECTIONS {
        cmd.args(["--section", s]);
    }
    cmd.args(["--import-source", "no", "-f", "-o"]).arg(&report);
    if let Some(name) = layer {
        // The layer's bench draws its own random inputs; one timed launch after the checked one.
        cmd.arg(&kda).args(["layer", "--bench", name, "--repeat", "1"]);
    } else if let Some(name) = decode {
        // The same for the decode step's bench shapes.
        cmd.arg(&kda).args(["decode", "--bench", name, "--repeat", "1"]);
    } else {
        let input = scratch.join(&format!("{shape}.safetensors"));
        println!("== inputs: {shape} -> {}", input.display());
        shapes::write(shape, &input)?;
        cmd.arg(&kda).arg("run").arg("--inputs").arg(&input);
        cmd.arg("--out").arg(scratch.join("out.safetensors")).args(["--repeat", "5"]);
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

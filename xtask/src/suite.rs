//! `xtask gpu-suite [--timeout S] [--bundle DIR] [-- ARGS]`: the GPU suite's prebuilt test binary
//! (`gpu` in the bundle) with one test thread and its output shown, the golden fixtures read from
//! the repository's `tests/fixtures`; its exit status is ours.

use crate::Failure;
use crate::args::Args;
use crate::proc::{bundle_bin, bundle_dir, repo_root, run_timed};
use std::process::Command;
use std::time::Duration;

const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// A failing proptest case is reported after a short shrink, not after minutes of GPU runs.
const SHRINK_ITERS: &str = "16";

pub fn run(args: &[String]) -> Result<(), Failure> {
    let a = Args::parse("gpu-suite", args, &["--timeout", "--bundle"], &[])?;
    let limit = a.timeout("--timeout", DEFAULT_TIMEOUT)?;
    let gpu = bundle_bin(&bundle_dir(a.value("--bundle"))?, "gpu")?;
    let mut cmd = Command::new(&gpu);
    cmd.args(test_args(&a.positional));
    cmd.env("KDA_FIXTURES", repo_root().join("tests/fixtures"));
    if std::env::var_os("PROPTEST_MAX_SHRINK_ITERS").is_none() {
        cmd.env("PROPTEST_MAX_SHRINK_ITERS", SHRINK_ITERS);
    }
    println!("== gpu-suite: {} (timeout {} s)", crate::proc::describe(&cmd), limit.as_secs());
    let f = run_timed(&mut cmd, limit, None)?;
    println!("== gpu-suite: {}", f.describe());
    if f.ok() { Ok(()) } else { Err(Failure { code: f.exit_code(), message: format!("gpu suite {}", f.describe()) }) }
}

/// The test binary's arguments: one test thread and the output shown, then `positional` without
/// the flags already given (libtest refuses an option given twice).
fn test_args(positional: &[String]) -> Vec<String> {
    const FIXED: [&str; 2] = ["--test-threads=1", "--nocapture"];
    let given = positional.iter().filter(|a| !FIXED.contains(&a.as_str()));
    FIXED.iter().map(|a| a.to_string()).chain(given.cloned()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::strings;

    #[test]
    fn the_suite_flags_are_given_once() {
        let fixed = strings(&["--test-threads=1", "--nocapture"]);
        assert_eq!(test_args(&[]), fixed);
        let args = test_args(&strings(&["layer_random", "--nocapture", "--skip", "stress::"]));
        assert_eq!(args, strings(&["--test-threads=1", "--nocapture", "layer_random", "--skip", "stress::"]));
        assert_eq!(test_args(&strings(&["--test-threads=1"])), fixed);
    }
}

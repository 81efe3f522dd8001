//! `cargo xtask bundle [--out DIR] [--with REV,...] [--pack]`: the binaries a GPU machine without
//! Rust runs, built here in release mode and copied into `target/gpu-bundle/` as `kda` (the CLI),
//! `xtask` (this program: bench, gpu-suite, profile, sanitize, ab, gpu-session) and `gpu` (the GPU
//! suite's test binary). `--with` also builds the `kda` of each git revision named (a branch, a
//! commit) in a worktree of its own under `target/bundle-worktrees/`, copied in as
//! `kda-<rev>`: the builds `xtask ab` compares on the GPU. `--pack` strips the binaries and packs
//! the folder into `DIR.tar.xz` (a few MiB), for when the folder and the tracked tree together pass
//! what a device call carries; on the GPU machine `tar xJf target/gpu-bundle.tar.xz -C target`
//! unpacks it.

use crate::args::Args;
use crate::proc::{create_dir, repo_root};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// What the device machine accepts from one working tree (ignored paths carried along).
const CARRY_LIMIT: u64 = 64 << 20;

pub fn run(args: &[String]) -> Result<(), String> {
    let a = Args::parse("bundle", args, &["--out", "--with"], &["--pack"])?;
    a.no_positional("bundle")?;
    let root = repo_root();
    let out = a.path("--out", root.join("target/gpu-bundle"));
    let revisions = a.list("--with", &[]);
    // Three builds: `--bin kda` finds the CLI in whichever workspace package holds it, and would
    // filter xtask's binary out of a combined build.
    let kda = build(&["build", "--release", "--bin", "kda"], &root, |t| is(t, "kda", "bin"))?;
    let xtask = build(&["build", "--release", "-p", "xtask"], &root, |t| is(t, "xtask", "bin"))?;
    let gpu = build(
        &["test", "-p", "kda-tests", "--release", "--features", "gpu", "--test", "gpu", "--no-run"],
        &root,
        |t| is(t, "gpu", "test"),
    )?;
    let mut builds = vec![("kda".to_string(), kda), ("xtask".into(), xtask), ("gpu".into(), gpu)];
    for rev in &revisions {
        builds.push((format!("kda-{}", file_name_of(rev)), build_revision(&root, rev)?));
    }
    create_dir(&out)?;
    let mut total = 0;
    for (name, src) in builds {
        let dst = out.join(name);
        // Removed first: a copy onto a running executable fails, an unlink does not.
        let _ = std::fs::remove_file(&dst);
        let bytes = std::fs::copy(&src, &dst).map_err(|e| format!("{} -> {}: {e}", src.display(), dst.display()))?;
        println!("{:>8.1} MiB  {}  (from {})", mib(bytes), dst.display(), src.display());
        total += bytes;
    }
    println!("{:>8.1} MiB  in all", mib(total));
    if !revisions.is_empty() {
        // Relative to the repository root, where commands on the GPU machine run.
        let dir = out.strip_prefix(&root).unwrap_or(&out).display().to_string();
        let others: Vec<String> = revisions.iter().map(|r| format!("{dir}/kda-{}", file_name_of(r))).collect();
        println!("compare on the GPU: {dir}/xtask ab {dir}/kda {}", others.join(" "));
    }
    let tree = tracked_bytes(&root)?;
    let carried = if a.has("--pack") { pack(&out)? } else { total };
    println!("{:>8.1} MiB  carried with the tracked tree's {:.1} MiB", mib(carried), mib(tree));
    if tree + carried > CARRY_LIMIT {
        let hint = if a.has("--pack") { "" } else { "; --pack strips and compresses it" };
        return Err(format!(
            "the bundle and the tracked tree are {:.1} MiB, over the {} MiB a device call carries{hint}",
            mib(tree + carried),
            CARRY_LIMIT >> 20
        ));
    }
    Ok(())
}

/// Bytes of the files git tracks under `root` (what every device call carries besides the
/// paths named).
fn tracked_bytes(root: &Path) -> Result<u64, String> {
    let out = Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(root)
        .output()
        .map_err(|e| format!("cannot run git: {e}"))?;
    let names = String::from_utf8_lossy(&out.stdout);
    Ok(names
        .split('\0')
        .filter(|n| !n.is_empty())
        .filter_map(|n| std::fs::metadata(root.join(n)).ok())
        .map(|m| m.len())
        .sum())
}

/// Strips the binaries in `dir` (where `strip` exists: symbols only, the code is the same) and
/// packs `dir` into `dir.tar.xz`; returns the archive's bytes.
fn pack(dir: &Path) -> Result<u64, String> {
    let run = |cmd: &mut Command, what: &str| -> Result<(), String> {
        let status = cmd.status().map_err(|e| format!("cannot run {what}: {e}"))?;
        if status.success() { Ok(()) } else { Err(format!("{what} failed ({status})")) }
    };
    let binaries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    if run(Command::new("strip").args(&binaries), "strip").is_err() {
        println!("strip failed or is missing: packing the binaries unstripped");
    }
    let (parent, name) = match (dir.parent(), dir.file_name()) {
        (Some(parent), Some(name)) => (parent, name),
        _ => return Err(format!("{}: no parent folder to pack into", dir.display())),
    };
    let archive = parent.join(format!("{}.tar.xz", name.to_string_lossy()));
    run(Command::new("tar").env("XZ_OPT", "-6 -T0").arg("-cJf").arg(&archive).arg("-C").arg(parent).arg(name), "tar")?;
    let bytes = std::fs::metadata(&archive).map_err(|e| format!("{}: {e}", archive.display()))?.len();
    // Relative to the repository root, where commands on the GPU machine run.
    let root = repo_root();
    let rel = |p: &Path| p.strip_prefix(&root).unwrap_or(p).display().to_string();
    let (archive, parent) = (rel(&archive), rel(parent));
    println!("{:>8.1} MiB  {archive} (on the GPU machine: tar xJf {archive} -C {parent})", mib(bytes));
    Ok(bytes)
}

/// `rev` as a file name: every character but letters, digits, `-`, `_` and `.` becomes `-`.
fn file_name_of(rev: &str) -> String {
    rev.chars().map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '-' }).collect()
}

/// Builds the `kda` binary of git revision `rev` in a worktree of its own
/// (`target/bundle-worktrees/<rev>`, made afresh), with its own target directory.
fn build_revision(root: &Path, rev: &str) -> Result<PathBuf, String> {
    let tree = root.join("target/bundle-worktrees").join(file_name_of(rev));
    let git = |args: &[&str]| -> Result<(), String> {
        let status =
            Command::new("git").args(args).current_dir(root).status().map_err(|e| format!("cannot run git: {e}"))?;
        if status.success() { Ok(()) } else { Err(format!("git {} failed ({status})", args.join(" "))) }
    };
    if tree.exists() {
        git(&["worktree", "remove", "--force", &tree.to_string_lossy()])?;
    }
    git(&["worktree", "add", "--detach", &tree.to_string_lossy(), rev])?;
    build(&["build", "--release", "--bin", "kda"], &tree, |t| is(t, "kda", "bin"))
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

/// Whether a `compiler-artifact` message's `target` is the `kind` target `name`.
fn is(target: &Value, name: &str, kind: &str) -> bool {
    target["name"] == name && target["kind"].as_array().is_some_and(|k| k.iter().any(|x| x == kind))
}

/// Runs `cargo ARGS --message-format=json-render-diagnostics` in `root` (diagnostics and progress
/// on our stderr) and returns the executable of the artifact whose target `want` accepts.
fn build(args: &[&str], root: &Path, want: impl Fn(&Value) -> bool) -> Result<PathBuf, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    eprintln!("== cargo {}", args.join(" "));
    let out = Command::new(&cargo)
        .args(args)
        .arg("--message-format=json-render-diagnostics")
        .current_dir(root)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !out.status.success() {
        return Err(format!("cargo {} failed ({})", args.join(" "), out.status));
    }
    executable(&String::from_utf8_lossy(&out.stdout), want)
        .ok_or_else(|| format!("cargo {}: no executable in its output", args.join(" ")))
}

/// The last executable among cargo's JSON messages (one per line) whose target `want` accepts.
fn executable(json_lines: &str, want: impl Fn(&Value) -> bool) -> Option<PathBuf> {
    json_lines
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && want(&m["target"]))
        .filter_map(|m| m["executable"].as_str().map(PathBuf::from))
        .last()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revisions_become_file_names() {
        assert_eq!(file_name_of("narrow-four-stages"), "narrow-four-stages");
        assert_eq!(file_name_of("origin/main~2"), "origin-main-2");
        assert_eq!(file_name_of("v1.2_x"), "v1.2_x");
    }

    #[test]
    fn the_test_binary_from_cargo_messages() {
        let lines = r#"{"reason":"compiler-artifact","target":{"name":"kda","kind":["lib"]},"executable":null}
{"reason":"compiler-artifact","target":{"name":"gpu","kind":["test"]},"executable":"/t/release/deps/gpu-0a1b"}
{"reason":"compiler-artifact","target":{"name":"kda","kind":["bin"]},"executable":"/t/release/kda"}
not json
{"reason":"build-finished","success":true}"#;
        assert_eq!(executable(lines, |t| is(t, "gpu", "test")), Some("/t/release/deps/gpu-0a1b".into()));
        assert_eq!(executable(lines, |t| is(t, "kda", "bin")), Some("/t/release/kda".into()));
        assert_eq!(executable(lines, |t| is(t, "xtask", "bin")), None);
    }
}

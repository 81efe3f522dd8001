//! `cargo xtask bundle [--out DIR] [--with REV,...] [--pack]`: the binaries a GPU machine without
//! Rust runs, built here in release mode and copied into `target/gpu-bundle/` as `kda` (the CLI),
//! `xtask` (this program: bench, gpu-suite, profile, sanitize, ab, gpu-session) and `gpu` (the GPU
//! suite's test binary). `--with` also builds the `kda` of each git revision named (a branch, a
//! commit) in a worktree of its own under `target/bundle-worktrees/`, copied in as
//! `kda-<rev>`: the builds `xtask ab` compares on the GPU (a `kda-<rev>` of an earlier bundle that
//! this one does not name is removed). `--pack` strips the binaries and packs
//! the folder into `DIR.tar.xz` (a few MiB), for when the folder and the tracked tree together pass
//! what a device call carries; on the GPU machine `tar xJf target/gpu-bundle.tar.xz -C target`
//! unpacks it.
//!
//! `--candle` also builds the `candle` feature's examples (`candle_recurrence`, `candle_layer`,
//! `candle_decode`) into `DIR/candle/`, with a `run.sh` that finds the GPU machine's CUDA libraries
//! and runs them (see [`build_candle`] for what the build needs here); `--pack` packs that folder
//! into `DIR-candle.tar.xz` of its own (tens of MiB), which `tar xJf target/gpu-bundle-candle.tar.xz
//! -C target` unpacks next to the bundle. The main archive never holds `DIR/candle/`.

use crate::args::Args;
use crate::proc::{create_dir, repo_root};
use serde_json::Value;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// What the device machine accepts from one working tree (ignored paths carried along).
const CARRY_LIMIT: u64 = 64 << 20;

pub fn run(args: &[String]) -> Result<(), String> {
    let a = Args::parse("bundle", args, &["--out", "--with", "--cuda"], &["--pack", "--candle"])?;
    a.no_positional("bundle")?;
    let root = repo_root();
    let out = a.path("--out", root.join("target/gpu-bundle"));
    let revisions = a.list("--with", &[]);
    // Checked before the long builds start.
    let cuda = match (a.has("--candle"), a.value("--cuda")) {
        (true, given) => Some(candle_toolkit(&root, given)?),
        (false, Some(_)) => return Err("bundle: --cuda is for --candle".into()),
        (false, None) => None,
    };
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
    let candle = match &cuda {
        Some(cuda) => build_candle(&root, cuda)?,
        None => Vec::new(),
    };
    create_dir(&out)?;
    for stale in stale_builds(&out, &builds) {
        std::fs::remove_file(&stale).map_err(|e| format!("{}: {e}", stale.display()))?;
        println!("  removed  {} (an earlier --with build, not in this bundle)", stale.display());
    }
    let total = copy_into(&out, &builds)?;
    println!("{:>8.1} MiB  in all", mib(total));
    if !revisions.is_empty() {
        let dir = rel(&out);
        let others: Vec<String> = revisions.iter().map(|r| format!("{dir}/kda-{}", file_name_of(r))).collect();
        println!("compare on the GPU: {dir}/xtask ab {dir}/kda {}", others.join(" "));
    }
    let candle_dir = out.join(CANDLE_DIR);
    let candle_total = if candle.is_empty() {
        0
    } else {
        create_dir(&candle_dir)?;
        let bytes = copy_into(&candle_dir, &candle)?;
        let script = candle_dir.join("run.sh");
        write_executable(&script, RUN_SH)?;
        println!("{:>8.1} MiB  {} (runs them on the GPU machine)", mib(RUN_SH.len() as u64), script.display());
        println!("{:>8.1} MiB  candle examples in all", mib(bytes));
        bytes + RUN_SH.len() as u64
    };
    let tree = tracked_bytes(&root)?;
    let packed = a.has("--pack");
    let carried = if packed { pack_bundle(&out)? } else { total };
    println!("{:>8.1} MiB  carried with the tracked tree's {:.1} MiB", mib(carried), mib(tree));
    let candle_carried = match (candle.is_empty(), packed) {
        (true, _) => 0,
        (false, true) => pack_candle(&out, &candle)?,
        (false, false) => candle_total,
    };
    if !candle.is_empty() {
        let dir = rel(&candle_dir);
        println!("{:>8.1} MiB  candle examples carried; on the GPU machine: bash {dir}/run.sh", mib(candle_carried));
    }
    let hint = if packed { "" } else { "; --pack strips and compresses it" };
    for (what, bytes) in [("the bundle", carried), ("the candle examples", candle_carried)] {
        if tree + bytes > CARRY_LIMIT {
            return Err(format!(
                "{what} and the tracked tree are {:.1} MiB, over the {} MiB a device call carries{hint}",
                mib(tree + bytes),
                CARRY_LIMIT >> 20
            ));
        }
    }
    if tree + carried + candle_carried > CARRY_LIMIT {
        // Each fits alone: a warm machine keeps what an earlier call unpacked under target/.
        println!(
            "the bundle, the candle examples and the tracked tree are {:.1} MiB together, over the {} MiB a device \
             call carries: carry the two in calls of their own",
            mib(tree + carried + candle_carried),
            CARRY_LIMIT >> 20
        );
    }
    Ok(())
}

/// The `kda-<rev>` files in `dir` that `builds` does not name: earlier `--with` builds, which would
/// otherwise ride along in the archive, past what a device call carries.
fn stale_builds(dir: &Path, builds: &[(String, PathBuf)]) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let stale = |name: &str| name.starts_with("kda-") && !builds.iter().any(|(b, _)| b == name);
    let mut found: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.file_name().and_then(|n| n.to_str()).is_some_and(stale))
        .collect();
    found.sort();
    found
}

/// Copies each `(name, source)` of `builds` to `dir/name`, with a line for each; returns the bytes
/// copied.
fn copy_into(dir: &Path, builds: &[(String, PathBuf)]) -> Result<u64, String> {
    let mut total = 0;
    for (name, src) in builds {
        let dst = dir.join(name);
        // Removed first: a copy onto a running executable fails, an unlink does not.
        let _ = std::fs::remove_file(&dst);
        let bytes = std::fs::copy(src, &dst).map_err(|e| format!("{} -> {}: {e}", src.display(), dst.display()))?;
        println!("{:>8.1} MiB  {}  (from {})", mib(bytes), dst.display(), src.display());
        total += bytes;
    }
    Ok(total)
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

/// Strips the binaries in `dir` and packs `dir` (less its `candle/` folder, packed on its own)
/// into `dir.tar.xz`; returns the archive's bytes.
fn pack_bundle(dir: &Path) -> Result<u64, String> {
    let binaries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    let (parent, name) = parent_and_name(dir)?;
    let archive = parent.join(format!("{name}.tar.xz"));
    pack(&binaries, parent, &name, Some(&format!("{name}/{CANDLE_DIR}")), &archive)
}

/// Strips the candle examples in `dir/candle/` and packs that folder into `dir-candle.tar.xz`,
/// whose paths start with `dir`'s name (unpacked where the bundle is); returns the archive's bytes.
fn pack_candle(dir: &Path, candle: &[(String, PathBuf)]) -> Result<u64, String> {
    let binaries: Vec<PathBuf> = candle.iter().map(|(name, _)| dir.join(CANDLE_DIR).join(name)).collect();
    let (parent, name) = parent_and_name(dir)?;
    let archive = parent.join(format!("{name}-{CANDLE_DIR}.tar.xz"));
    pack(&binaries, parent, &format!("{name}/{CANDLE_DIR}"), None, &archive)
}

fn parent_and_name(dir: &Path) -> Result<(&Path, String), String> {
    match (dir.parent(), dir.file_name()) {
        (Some(parent), Some(name)) => Ok((parent, name.to_string_lossy().into_owned())),
        _ => Err(format!("{}: no parent folder to pack into", dir.display())),
    }
}

/// Strips `binaries` (where `strip` exists: symbols only, the code is the same) and packs `member`
/// (a path under `parent`), less `exclude`, into `archive`; returns the archive's bytes.
fn pack(
    binaries: &[PathBuf],
    parent: &Path,
    member: &str,
    exclude: Option<&str>,
    archive: &Path,
) -> Result<u64, String> {
    if run_to_end(Command::new("strip").args(binaries), "strip").is_err() {
        println!("strip failed or is missing: packing the binaries unstripped");
    }
    let mut tar = Command::new("tar");
    tar.env("XZ_OPT", "-6 -T0").arg("-cJf").arg(archive).arg("-C").arg(parent);
    if let Some(exclude) = exclude {
        tar.arg(format!("--exclude={exclude}"));
    }
    run_to_end(tar.arg(member), "tar")?;
    let bytes = std::fs::metadata(archive).map_err(|e| format!("{}: {e}", archive.display()))?.len();
    // Relative to the repository root, where commands on the GPU machine run.
    let (archive, parent) = (rel(archive), rel(parent));
    println!("{:>8.1} MiB  {archive} (on the GPU machine: tar xJf {archive} -C {parent})", mib(bytes));
    Ok(bytes)
}

/// Runs `cmd` (named `what` in errors) to its end; an error unless it succeeds.
fn run_to_end(cmd: &mut Command, what: &str) -> Result<(), String> {
    let status = cmd.status().map_err(|e| format!("cannot run {what}: {e}"))?;
    if status.success() { Ok(()) } else { Err(format!("{what} failed ({status})")) }
}

/// `p` relative to the repository root (where commands on the GPU machine run) where it lies
/// under it.
fn rel(p: &Path) -> String {
    let root = repo_root();
    p.strip_prefix(&root).unwrap_or(p).display().to_string()
}

/// `rev` as a file name: every character but letters, digits, `-`, `_` and `.` becomes `-`.
fn file_name_of(rev: &str) -> String {
    rev.chars().map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '-' }).collect()
}

/// Builds the `kda` binary of git revision `rev` in a worktree of its own
/// (`target/bundle-worktrees/<rev>`, made afresh), with its own target directory.
fn build_revision(root: &Path, rev: &str) -> Result<PathBuf, String> {
    let tree = root.join("target/bundle-worktrees").join(file_name_of(rev));
    let git = |args: &[&str]| {
        run_to_end(Command::new("git").args(args).current_dir(root), &format!("git {}", args.join(" ")))
    };
    if tree.exists() {
        git(&["worktree", "remove", "--force", &tree.to_string_lossy()])?;
    }
    git(&["worktree", "add", "--detach", &tree.to_string_lossy(), rev])?;
    build(&["build", "--release", "--bin", "kda"], &tree, |t| is(t, "kda", "bin"))
}

/// The folder of the bundle that holds the candle examples and their `run.sh`.
const CANDLE_DIR: &str = "candle";

/// The `candle` feature's examples (kda/Cargo.toml).
const CANDLE_EXAMPLES: [&str; 3] = ["candle_recurrence", "candle_layer", "candle_decode"];

/// The libraries candle's CUDA backend links besides the driver's `libcuda` (cudarc's
/// `dynamic-linking`, candle-kernels' `cudart`), and the PyPI package of CUDA 13 that ships each.
const CANDLE_LIBRARIES: [(&str, &str); 5] = [
    ("cublas", "nvidia-cublas"),
    ("cublasLt", "nvidia-cublas"),
    ("curand", "nvidia-curand"),
    ("nvrtc", "nvidia-cuda-nvrtc"),
    ("cudart", "nvidia-cuda-runtime"),
];

/// The GPU machine's side of `--candle`: finds its CUDA libraries, then runs each example.
const RUN_SH: &str = r#"#!/usr/bin/env bash
# Runs kda's candle examples, built by `cargo xtask bundle --candle` where Rust is. They need the
# driver's libcuda.so.1 and CUDA 13's libcublas.so.13, libcublasLt.so.13, libcurand.so.10,
# libnvrtc.so.13 and libcudart.so.13: found under the CUDA toolkit or PyTorch's CUDA wheels.
# Exits with the number of examples that failed.
set -u
here=$(cd "$(dirname "$0")" && pwd)
found=()
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
    /opt/torch/.venv/lib/python3.12/site-packages/nvidia/*/lib; do
    if [ -d "$d" ]; then found+=("$d"); fi
done
if [ ${#found[@]} -eq 0 ]; then
    echo "no CUDA library folder found; using LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-} alone"
else
    printf 'CUDA libraries from: %s\n' "${found[@]}"
fi
libs=$(IFS=:; echo "${found[*]}")
export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if command -v ldd >/dev/null; then
    echo "== resolved (ldd $here/candle_recurrence):"
    ldd "$here/candle_recurrence" | grep -E 'cuda|cublas|curand|nvrtc|not found'
fi
failed=0
for example in candle_recurrence candle_layer candle_decode; do
    echo "== $example"
    timeout 300 "$here/$example"
    rc=$?
    echo "== $example: exit status $rc"
    if [ "$rc" -ne 0 ]; then failed=$((failed + 1)); fi
done
echo "== $failed of 3 failed"
exit "$failed"
"#;

/// The CUDA toolkit the candle build uses (`--cuda`, else `$CUDA_ROOT`, else `$CUDA_PATH`, else the
/// `nvidia/cu13` folder of `.venv-nvcc`, where `.ci/setup` installs nvcc from PyPI): it must hold
/// `bin/nvcc`.
fn candle_toolkit(root: &Path, given: Option<&str>) -> Result<PathBuf, String> {
    let from_env = || ["CUDA_ROOT", "CUDA_PATH"].iter().find_map(std::env::var_os).map(PathBuf::from);
    let from_venv = || {
        let lib = root.join(".venv-nvcc/lib");
        let entries = std::fs::read_dir(&lib).ok()?;
        let mut found: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("python3")))
            .map(|p| p.join("site-packages/nvidia/cu13"))
            .filter(|p| p.is_dir())
            .collect();
        found.sort();
        found.pop()
    };
    let cuda = given.map(PathBuf::from).or_else(from_env).or_else(from_venv).ok_or(
        "bundle --candle: no CUDA toolkit: pass --cuda DIR (a folder with bin/nvcc and lib/), set CUDA_ROOT, or run \
         .ci/setup for .venv-nvcc",
    )?;
    if !cuda.join("bin/nvcc").is_file() {
        return Err(format!("bundle --candle: {} has no bin/nvcc (candle's CUDA kernels need it)", cuda.display()));
    }
    Ok(cuda)
}

/// Builds the candle examples (release) against the CUDA toolkit `cuda` and returns their
/// executables, named.
///
/// candle's CUDA backend compiles its kernels with `cuda`'s nvcc (for `CUDA_COMPUTE_CAP`, 90
/// unless set: the H100's and H200's) and links, through cudarc's `dynamic-linking`, `-lcuda
/// -lnvrtc -lcurand -lcublas -lcublasLt` and, for candle-kernels, `-lcudart`. PyPI's CUDA 13
/// wheels ship those libraries versioned only (`libcublas.so.13`) and the driver's `libcuda` not at
/// all, so `target/candle-link/lib/` gets an unversioned link to each and a stub `libcuda.so`
/// (SONAME `libcuda.so.1`, every driver entry point cudarc declares): the link then resolves
/// every symbol against CUDA 13's real libraries and the driver's at run time, on the GPU machine.
/// cudarc searches `lib/` under each of `CUDA_ROOT`, `CUDA_PATH` and `CUDA_TOOLKIT_ROOT_DIR`, the
/// last pointed at `target/candle-link`.
fn build_candle(root: &Path, cuda: &Path) -> Result<Vec<(String, PathBuf)>, String> {
    let link = root.join("target/candle-link");
    let lib = link.join("lib");
    create_dir(&lib)?;
    for (name, package) in CANDLE_LIBRARIES {
        let found = find_library(cuda, name).ok_or_else(|| {
            format!(
                "bundle --candle: no lib{name}.so* under {}/lib, lib64 or targets/x86_64-linux/lib: install {package} \
                 (CUDA 13) there, e.g. with the pip of the venv that holds nvcc",
                cuda.display()
            )
        })?;
        let dst = lib.join(format!("lib{name}.so"));
        let _ = std::fs::remove_file(&dst);
        std::os::unix::fs::symlink(&found, &dst)
            .map_err(|e| format!("{} -> {}: {e}", dst.display(), found.display()))?;
    }
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "90".into());
    eprintln!(
        "== candle: nvcc and CUDA libraries from {}, link folder {}, CUDA_COMPUTE_CAP={cap}",
        cuda.display(),
        lib.display()
    );
    let path = std::env::var_os("PATH").unwrap_or_default();
    let path = std::env::join_paths(std::iter::once(cuda.join("bin")).chain(std::env::split_paths(&path)))
        .map_err(|e| format!("PATH with {}: {e}", cuda.join("bin").display()))?;
    let env = [
        ("PATH", path),
        ("CUDA_ROOT", cuda.into()),
        ("CUDA_PATH", cuda.into()),
        ("CUDA_TOOLKIT_ROOT_DIR", link.clone().into()),
        ("CUDA_COMPUTE_CAP", cap.into()),
    ];
    // The library first (candle-kernels' nvcc work, cudarc): its messages name cudarc's source,
    // whose driver bindings the stub is made from; then the examples, linked against it.
    let mut args = vec!["build", "--release", "-p", "kda", "--features", "candle"];
    let library = cargo_messages(&[&args[..], &["--lib"]].concat(), root, &env)?;
    stub_libcuda(&link, &package_sources(&library, "cudarc"))?;
    for example in CANDLE_EXAMPLES {
        args.extend(["--example", example]);
    }
    let messages = cargo_messages(&args, root, &env)?;
    let mut built = Vec::new();
    for example in CANDLE_EXAMPLES {
        let exe = executable(&messages, |t| is(t, example, "example"))
            .ok_or_else(|| format!("cargo {}: no executable of {example} in its output", args.join(" ")))?;
        if let Some(needed) = needed_libraries(&exe) {
            // A name without a version is a development link, absent where only the runtime is.
            if let Some(bad) = needed.iter().find(|n| n.ends_with(".so")) {
                return Err(format!(
                    "{} needs {bad}, which has no SONAME: the GPU machine cannot find it",
                    exe.display()
                ));
            }
            eprintln!("== {example} needs {}", needed.join(" "));
        }
        built.push((example.to_string(), exe));
    }
    Ok(built)
}

/// The first of `cuda`'s library folders holding `lib{name}.so` or a versioned `lib{name}.so.N`.
fn find_library(cuda: &Path, name: &str) -> Option<PathBuf> {
    ["lib", "lib64", "targets/x86_64-linux/lib"].iter().map(|d| cuda.join(d)).find_map(|dir| {
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .ok()?
            .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
            .filter(|f| is_library(f, name))
            .collect();
        // The unversioned name first, then the shortest version (`.so.13` before `.so.13.0.2`).
        names.sort_by_key(|f| (f.len(), f.clone()));
        names.first().map(|f| dir.join(f))
    })
}

/// Whether file name `f` is library `name`: `libNAME.so` or `libNAME.so.` and a version of digits
/// and dots (not `libnvrtc.alt.so.13` nor `libnvrtc-builtins.so.13.0`).
fn is_library(f: &str, name: &str) -> bool {
    match f.strip_prefix(&format!("lib{name}.so")) {
        Some("") => true,
        Some(version) => {
            version.starts_with('.')
                && version[1..].split('.').all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        }
        None => false,
    }
}

/// Builds `link/lib/libcuda.so`, a stub of the driver library to link against (SONAME
/// `libcuda.so.1`, never run: every entry point returns CUDA_ERROR_UNKNOWN), from the entry points
/// that the driver bindings of the cudarc packages in `sources` declare.
fn stub_libcuda(link: &Path, sources: &[PathBuf]) -> Result<(), String> {
    let mut names = Vec::new();
    for dir in sources {
        let bindings = dir.join("src/driver/sys/mod.rs");
        let text = std::fs::read_to_string(&bindings).map_err(|e| format!("{}: {e}", bindings.display()))?;
        names.extend(driver_entry_points(&text));
    }
    names.sort();
    names.dedup();
    if names.is_empty() {
        let searched =
            if sources.is_empty() { "cudarc not among cargo's artifacts".into() } else { format!("{sources:?}") };
        return Err(format!(
            "no driver entry points (`pub unsafe fn cu...(`) in cudarc's bindings ({searched}): cannot stub libcuda"
        ));
    }
    let c = link.join("cuda_stub.c");
    std::fs::write(&c, stub_source(&names)).map_err(|e| format!("{}: {e}", c.display()))?;
    let so = link.join("lib/libcuda.so");
    let cc = std::env::var_os("CC").unwrap_or_else(|| "cc".into());
    let mut compile = Command::new(&cc);
    compile.args(["-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o"]).arg(&so).arg(&c);
    run_to_end(&mut compile, &format!("{} of the libcuda stub", cc.to_string_lossy()))?;
    eprintln!("== stub {} ({} driver entry points, to link against only)", so.display(), names.len());
    Ok(())
}

/// The source folders (of `Cargo.toml`) of package `name`'s library among cargo's JSON messages.
fn package_sources(json_lines: &str, name: &str) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = json_lines
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && is(&m["target"], name, "lib"))
        .filter_map(|m| m["manifest_path"].as_str().and_then(|p| Path::new(p).parent().map(Path::to_path_buf)))
        .collect();
    dirs.sort();
    dirs.dedup();
    dirs
}

/// The driver entry points a cudarc `driver/sys` source defines (`pub unsafe fn cuInit(`...).
fn driver_entry_points(source: &str) -> Vec<String> {
    source
        .lines()
        .filter_map(|l| l.strip_prefix("pub unsafe fn "))
        .filter_map(|l| l.split_once('(').map(|(name, _)| name))
        .filter(|n| n.starts_with("cu") && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
        .map(String::from)
        .collect()
}

/// C source of a library defining each of `names` as a function that returns 999
/// (CUDA_ERROR_UNKNOWN).
fn stub_source(names: &[String]) -> String {
    let mut c =
        String::from("/* A stub of libcuda.so.1 to link against, written by `cargo xtask bundle --candle`. */\n");
    for name in names {
        c += &format!("int {name}(void) {{ return 999; }}\n");
    }
    c
}

/// The NEEDED entries of ELF file `exe` (`readelf -d`), or `None` without readelf.
fn needed_libraries(exe: &Path) -> Option<Vec<String>> {
    let out = Command::new("readelf").arg("-d").arg(exe).stderr(Stdio::null()).output().ok()?;
    out.status.success().then(|| needed_of(&String::from_utf8_lossy(&out.stdout)))
}

/// The NEEDED libraries in `readelf -d` output (` 0x...1 (NEEDED)  Shared library: [libc.so.6]`).
fn needed_of(readelf: &str) -> Vec<String> {
    readelf
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| l.split_once('[').and_then(|(_, rest)| rest.split_once(']')).map(|(name, _)| name.to_string()))
        .collect()
}

/// Writes `text` to `path` with mode 0755.
fn write_executable(path: &Path, text: &str) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("{}: {e}", path.display()))
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
    let messages = cargo_messages(args, root, &[])?;
    executable(&messages, want).ok_or_else(|| format!("cargo {}: no executable in its output", args.join(" ")))
}

/// Runs `cargo ARGS --message-format=json-render-diagnostics` in `root` with the variables `env`
/// set (diagnostics and progress on our stderr) and returns its JSON messages, one a line.
fn cargo_messages(args: &[&str], root: &Path, env: &[(&str, OsString)]) -> Result<String, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    eprintln!("== cargo {}", args.join(" "));
    let out = Command::new(&cargo)
        .args(args)
        .arg("--message-format=json-render-diagnostics")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .current_dir(root)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !out.status.success() {
        return Err(format!("cargo {} failed ({})", args.join(" "), out.status));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
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
    fn earlier_with_builds_are_stale_and_this_bundles_are_not() {
        let dir = std::env::temp_dir().join(format!("kda-bundle-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for name in ["kda", "xtask", "gpu", "kda-aaa1111", "kda-bbb2222", "notes-kda-ccc"] {
            std::fs::write(dir.join(name), b"x").unwrap();
        }
        let builds: Vec<(String, PathBuf)> =
            ["kda", "xtask", "gpu", "kda-bbb2222"].iter().map(|n| (n.to_string(), PathBuf::new())).collect();
        assert_eq!(stale_builds(&dir, &builds), vec![dir.join("kda-aaa1111")]);
        assert!(stale_builds(&dir.join("missing"), &builds).is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn revisions_become_file_names() {
        assert_eq!(file_name_of("narrow-four-stages"), "narrow-four-stages");
        assert_eq!(file_name_of("origin/main~2"), "origin-main-2");
        assert_eq!(file_name_of("v1.2_x"), "v1.2_x");
    }

    #[test]
    fn library_names_and_versions() {
        assert!(is_library("libcublas.so", "cublas"));
        assert!(is_library("libcublas.so.13", "cublas"));
        assert!(is_library("libcublas.so.13.0.2", "cublas"));
        assert!(!is_library("libcublasLt.so.13", "cublas"));
        assert!(!is_library("libnvrtc.alt.so.13", "nvrtc"));
        assert!(!is_library("libnvrtc-builtins.so.13.0", "nvrtc"));
        assert!(!is_library("libcudart_static.a", "cudart"));
        assert!(!is_library("libcudart.so.", "cudart"));
        assert!(!is_library("libcudart.so.13.", "cudart"));
    }

    #[test]
    fn a_libcuda_stub_from_cudarc_bindings() {
        let source = "pub type CUresult = u32;
pub unsafe fn cuInit(Flags: ::core::ffi::c_uint) -> CUresult {
    #[cfg(not(feature = \"dynamic-loading\"))]
    {
        extern \"C\" {
            fn cuInit(Flags: ::core::ffi::c_uint) -> CUresult;
        }
        cuInit(Flags)
    }
}
pub unsafe fn cuCtxCreate_v2(pctx: *mut CUcontext) -> CUresult {
pub unsafe fn lib() -> &'static Lib {
";
        let names = driver_entry_points(source);
        assert_eq!(names, ["cuInit", "cuCtxCreate_v2"]);
        let c = stub_source(&names);
        assert!(c.contains("int cuInit(void) { return 999; }\nint cuCtxCreate_v2(void) { return 999; }\n"), "{c}");
    }

    #[test]
    fn needed_libraries_from_readelf() {
        let out = " 0x0000000000000001 (NEEDED)             Shared library: [libcuda.so.1]
 0x0000000000000001 (NEEDED)             Shared library: [libcublas.so.13]
 0x000000000000000e (SONAME)             Library soname: [x.so]
 0x000000000000000c (INIT)               0x4000";
        assert_eq!(needed_of(out), ["libcuda.so.1", "libcublas.so.13"]);
    }

    #[test]
    fn run_sh_runs_every_candle_example() {
        for example in CANDLE_EXAMPLES {
            assert!(RUN_SH.contains(example), "{example}");
        }
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

    #[test]
    fn cudarc_source_from_cargo_messages() {
        let lines = r#"{"reason":"compiler-artifact","manifest_path":"/r/cudarc-0.19.10/Cargo.toml","target":{"name":"cudarc","kind":["lib"]}}
{"reason":"compiler-artifact","manifest_path":"/r/cudarc-0.19.10/Cargo.toml","target":{"name":"build-script-build","kind":["custom-build"]}}
{"reason":"compiler-artifact","manifest_path":"/w/kda/Cargo.toml","target":{"name":"kda","kind":["lib"]}}"#;
        assert_eq!(package_sources(lines, "cudarc"), [PathBuf::from("/r/cudarc-0.19.10")]);
        assert!(package_sources(lines, "candle-core").is_empty());
    }
}

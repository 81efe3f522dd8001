//! The `kda` binary's file path on the CPU: `kda run --cpu` on the golden fixtures reproduces the
//! independent implementation's outputs, and bad input files fail with the tensor named.

use kda::{Plan, Problem, io, precision, rel_error};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const FIXTURES: [&str; 3] = ["tail_h2", "ragged_h3", "two_seq_no_h0"];

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(format!("{name}.safetensors"))
}

/// The generalized-recurrence fixtures (`tests/fixtures/models/`).
const MODEL_FIXTURES: [&str; 6] =
    ["gdn_gva_ragged", "kda_gva_vfirst", "g_and_gk", "kda_k64", "gdn_k256_v512", "plain_delta_k128_v256"];

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kda-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn kda(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kda")).args(args).output().expect("the kda binary runs")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[test]
fn run_cpu_reproduces_the_golden_fixtures() {
    for name in FIXTURES {
        let input = fixture(name);
        let out_path = scratch(&format!("{name}.out.safetensors"));
        let o = kda(&["run", "--cpu", "--inputs", input.to_str().unwrap(), "--out", out_path.to_str().unwrap()]);
        assert!(o.status.success(), "{name}: {}", text(&o));
        let (p, golden) = io::read_problem(&input).unwrap();
        let golden = golden.expect("fixtures hold outputs");
        let got = io::read_outputs(&out_path, &p.dims()).unwrap();
        let errs = [
            ("h", rel_error(&got.h, &golden.h)),
            ("v_new", rel_error(&got.v_new, &golden.v_new)),
            ("ht", rel_error(&got.ht, &golden.ht)),
        ];
        println!("{name}: {errs:?}");
        for (tensor, e) in errs {
            assert!(e < precision::ERROR_BOUND, "{name}: {tensor} relative error {e:.3e}");
        }
    }
}

#[test]
fn a_file_without_k_fails_naming_it() {
    let p = kda::inputs::random_problem(Plan::from_lengths(&[10]), 1, false, 3);
    let good = scratch("good.safetensors");
    io::write_problem(&good, &p, None).unwrap();
    // Rewrite the file without `k` by renaming it: the header is JSON, so the name is plain text.
    let bytes = std::fs::read(&good).unwrap();
    let needle = b"\"k\":";
    let at = bytes.windows(needle.len()).position(|w| w == needle).expect("k in the header");
    let mut renamed = bytes.clone();
    renamed[at + 1] = b'q';
    let bad = scratch("no_k.safetensors");
    std::fs::write(&bad, renamed).unwrap();
    let o = kda(&["run", "--cpu", "--inputs", bad.to_str().unwrap(), "--out", scratch("x").to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(text(&o).contains("required tensor `k` is missing"), "{}", text(&o));
}

#[test]
fn usage_errors_exit_with_2() {
    for args in [&["run"][..], &["run", "--inputs", "a", "--out", "b", "--repeat", "0"], &["frobnicate"]] {
        let o = kda(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(text(&o).contains("usage:"), "{args:?}");
    }
}

#[test]
fn every_subcommand_has_its_own_help() {
    let subcommands = ["demo", "run", "layer"];
    for command in subcommands {
        for flag in ["--help", "-h"] {
            let o = kda(&[command, "--inputs", "x", flag]);
            assert!(o.status.success(), "{command} {flag}: {}", text(&o));
            let out = String::from_utf8_lossy(&o.stdout);
            assert!(out.starts_with("usage:") && out.contains(&format!("kda {command} ")), "{command}: {out}");
            for other in subcommands.iter().filter(|c| **c != command) {
                assert!(!out.contains(&format!("kda {other} ")), "{command}'s help shows {other}'s");
            }
        }
    }
    let all = kda(&["--help"]);
    assert!(all.status.success());
    assert!(subcommands.iter().all(|c| String::from_utf8_lossy(&all.stdout).contains(&format!("kda {c} "))));
}

#[test]
fn json_puts_one_record_per_measurement_on_stdout_and_the_rest_on_stderr() {
    let o = kda(&["demo", "--json", "--cpu"]);
    assert!(o.status.success(), "{}", text(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "one record: {stdout}");
    let record: serde_json::Value = serde_json::from_str(lines[0]).expect("a JSON object");
    assert_eq!(record["command"], "demo");
    assert_eq!(record["reason"], "--cpu given");
    assert!(record["cold_start_ms"].as_f64().is_some_and(|ms| ms > 0.0) && record["reference_ms"].is_f64());
    assert!(String::from_utf8_lossy(&o.stderr).contains("no GPU run (--cpu given)"));
}

#[test]
fn demo_without_a_gpu_says_so_and_runs_the_reference() {
    let o = kda(&["demo", "--cpu"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("no GPU run (--cpu given)"), "{}", text(&o));
    assert!(text(&o).contains("ms from process start to the first result"), "{}", text(&o));
}

/// Without a GPU (CI) `kda run` fails with the typed reason and the way out, never a panic; with
/// one it runs.
#[test]
fn run_without_cpu_needs_a_gpu_or_says_why() {
    let p = kda::inputs::random_problem(Plan::from_lengths(&[3]), 1, false, 5);
    let input = scratch("gpu_or_not.safetensors");
    io::write_problem(&input, &p, None).unwrap();
    let out = scratch("gpu_or_not.out.safetensors");
    let o = kda(&["run", "--inputs", input.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    let t = text(&o);
    assert!(!t.contains("panicked"), "{t}");
    if o.status.success() {
        println!("ran on a GPU: {t}");
    } else {
        assert_eq!(o.status.code(), Some(1), "{t}");
        assert!(t.contains("pass --cpu"), "{t}");
        assert!(t.contains("CUDA driver library") || t.contains("no CUDA device"), "{t}");
        println!("no GPU: {t}");
    }
}

#[test]
fn a_written_problem_runs_and_matches_the_library_reference() {
    let p: Problem = kda::inputs::random_problem(Plan::from_lengths(&[0, 129, 1]), 2, true, 8);
    let input = scratch("lib.safetensors");
    let output = scratch("lib.out.safetensors");
    io::write_problem(&input, &p, None).unwrap();
    let o = kda(&["run", "--cpu", "--inputs", input.to_str().unwrap(), "--out", output.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let got = io::read_outputs(&output, &p.dims()).unwrap();
    assert_eq!(got, kda::reference::reference(&p).unwrap());
}

#[test]
fn run_cpu_computes_the_generalized_fixtures_and_the_gpu_path_names_what_it_lacks() {
    for name in MODEL_FIXTURES {
        let input = fixture(&format!("models/{name}"));
        let out_path = scratch(&format!("{name}.out.safetensors"));
        let o = kda(&["run", "--cpu", "--inputs", input.to_str().unwrap(), "--out", out_path.to_str().unwrap()]);
        assert!(o.status.success(), "{name}: {}", text(&o));
        let (p, golden) = io::read_model_problem(&input).unwrap();
        let golden = golden.expect("fixtures hold outputs");
        let got = io::read_model_outputs(&out_path, &p.view()).unwrap();
        let errs = [rel_error(&got.h, &golden.h), rel_error(&got.v_new, &golden.v_new), rel_error(&got.ht, &golden.ht)];
        println!("{name}: {errs:?}");
        assert!(errs.iter().all(|&e| e < precision::ERROR_BOUND), "{name}: {errs:?}");

        // Without --cpu: on a GPU the kernels run it (within the bound of the golden outputs) or
        // refuse it with the typed error and write nothing; without a GPU, the reason and the way
        // out.
        let gpu_out = scratch(&format!("{name}.gpu.safetensors"));
        let _ = std::fs::remove_file(&gpu_out);
        let o = kda(&["run", "--inputs", input.to_str().unwrap(), "--out", gpu_out.to_str().unwrap()]);
        let t = text(&o);
        assert!(!t.contains("panicked"), "{name}: {t}");
        if o.status.success() {
            let got = io::read_model_outputs(&gpu_out, &p.view()).unwrap();
            let errs =
                [rel_error(&got.h, &golden.h), rel_error(&got.v_new, &golden.v_new), rel_error(&got.ht, &golden.ht)];
            println!("{name} on the GPU: {errs:?}");
            assert!(errs.iter().all(|&e| e < precision::ERROR_BOUND), "{name}: {errs:?}");
        } else {
            assert_eq!(o.status.code(), Some(1), "{name}: {t}");
            assert!(t.contains("no GPU kernel runs this yet") || t.contains("pass --cpu"), "{name}: {t}");
            assert!(t.contains("--cpu"), "{name}: {t}");
            assert!(!gpu_out.exists(), "{name}: an output was written");
        }
    }
}

#[test]
fn an_output_that_names_the_input_is_refused_and_the_input_kept() {
    let dir = scratch("same");
    std::fs::create_dir_all(&dir).unwrap();
    let input = dir.join("in.safetensors");
    let p = kda::inputs::random_problem(Plan::from_lengths(&[10, 3]), 1, true, 5);
    io::write_problem(&input, &p, None).unwrap();
    let before = std::fs::read(&input).unwrap();
    let link = dir.join("link.safetensors");
    let hard = dir.join("hard.safetensors");
    let _ = std::fs::remove_file(&link);
    let _ = std::fs::remove_file(&hard);
    #[cfg(unix)]
    std::os::unix::fs::symlink(&input, &link).unwrap();
    std::fs::hard_link(&input, &hard).unwrap();
    let dotted = dir.join(".").join("in.safetensors");
    let up = dir.join("..").join(dir.file_name().unwrap()).join("in.safetensors");
    let mut names = vec![input.clone(), dotted, up, hard];
    if cfg!(unix) {
        names.push(link);
    }
    for out in &names {
        let o = kda(&["run", "--cpu", "--inputs", input.to_str().unwrap(), "--out", out.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(2), "{}: {}", out.display(), text(&o));
        assert!(text(&o).contains("names the input file"), "{}", text(&o));
        assert_eq!(std::fs::read(&input).unwrap(), before, "{}: the input changed", out.display());
    }
    // A distinct path in the same directory is fine.
    let o = kda(&[
        "run",
        "--cpu",
        "--inputs",
        input.to_str().unwrap(),
        "--out",
        dir.join("out.safetensors").to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
}

#[test]
fn a_failed_run_leaves_an_existing_output_untouched() {
    let out = scratch("kept.safetensors");
    std::fs::write(&out, b"previous results").unwrap();
    let bad = scratch("bad.safetensors");
    std::fs::write(&bad, b"not a safetensors file").unwrap();
    let o = kda(&["run", "--cpu", "--inputs", bad.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert!(!o.status.success(), "{}", text(&o));
    assert_eq!(std::fs::read(&out).unwrap(), b"previous results");
}

/// A layer file (`tests/fixtures/layer/`): `kda run --cpu` writes the f64 reference's `o` and
/// `ht` (the fixture's own reference); without `--cpu` it runs on the GPU, or, with none, fails
/// cleanly.
#[test]
fn run_cpu_computes_a_layer_file() {
    let input = fixture("layer/kda_layer_gate_in_kernel");
    let out_path = scratch("layer.out.safetensors");
    let o = kda(&["run", "--cpu", "--inputs", input.to_str().unwrap(), "--out", out_path.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("FLA's outputs in the file against this reference: o 4.06e-3"), "{}", text(&o));
    let (_, golden) = kda::layer::read_layer_fixture(&input).unwrap();
    let bytes = std::fs::read(&out_path).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let f32s = |name: &str| -> Vec<f64> {
        file.tensor(name).unwrap().data().as_chunks::<4>().0.iter().map(|&b| f32::from_le_bytes(b) as f64).collect()
    };
    assert!(rel_error(&f32s("o"), &golden.reference.o) < 1e-6);
    assert!(rel_error(&f32s("ht"), &golden.reference.ht) < 1e-6);

    let on_gpu = scratch("layer.gpu.safetensors");
    let o = kda(&["run", "--inputs", input.to_str().unwrap(), "--out", on_gpu.to_str().unwrap()]);
    assert_ran_on_the_gpu_or_failed_cleanly(&o, &on_gpu);
}

/// Without `--cpu` a layer file runs on the GPU: with one, the run writes its output; without
/// one (CI), it fails naming the CUDA driver or device, and writes nothing.
fn assert_ran_on_the_gpu_or_failed_cleanly(o: &std::process::Output, out: &std::path::Path) {
    if o.status.success() {
        assert!(out.exists(), "{}", text(o));
    } else {
        assert!(text(o).contains("CUDA") || text(o).contains("device"), "{}", text(o));
        assert!(!out.exists(), "{}", text(o));
    }
}

/// `kda layer` runs a layer file as `kda run` does: the f64 reference with `--cpu` (the same
/// bytes as `kda run --cpu`), the GPU without it, and a recurrence file is not a layer.
#[test]
fn the_layer_subcommand_computes_a_layer_file() {
    let input = fixture("layer/kda_layer_gate_in_kernel");
    let (by_layer, by_run) = (scratch("layer.sub.safetensors"), scratch("layer.run.safetensors"));
    let o = kda(&["layer", "--cpu", "--inputs", input.to_str().unwrap(), "--out", by_layer.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let o = kda(&["run", "--cpu", "--inputs", input.to_str().unwrap(), "--out", by_run.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(std::fs::read(&by_layer).unwrap(), std::fs::read(&by_run).unwrap());

    let on_gpu = scratch("layer.sub.gpu.safetensors");
    let o = kda(&["layer", "--inputs", input.to_str().unwrap(), "--out", on_gpu.to_str().unwrap()]);
    assert_ran_on_the_gpu_or_failed_cleanly(&o, &on_gpu);

    let recurrence = fixture("tail_h2");
    let not_layer = scratch("layer.not.safetensors");
    let o = kda(&["layer", "--cpu", "--inputs", recurrence.to_str().unwrap(), "--out", not_layer.to_str().unwrap()]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(!not_layer.exists());
    let o = kda(&["layer", "--cpu", "--inputs", input.to_str().unwrap(), "--out", input.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}

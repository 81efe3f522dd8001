//! `xtask ab KDA_A KDA_B ... [--shapes S,...] [--rounds N] [--repeat N] [--timeout S] [--out DIR]
//! [--time-unchecked] [--deadline S]`: several `kda` builds (each built from its commit and carried along) on the
//! same inputs. A shape `layer:NAME` is the whole layer on a peer shape (`kda layer --bench NAME`,
//! random inputs of a fixed seed, each build's first run checked for finite outputs); a shape
//! `decode:NAME` the decode step on a decode bench shape (`kda decode --bench NAME`, each build's
//! first call checked against the f64 reference).
//!
//! First each build's outputs are checked against the f64 reference (`kda run --cpu`, once per
//! input with the first build) on every timed shape and on `ragged_many`, to the contract's bound
//! `kda::precision::bound(e32)`; a build that fails is not timed. With `--time-unchecked` a build
//! after the first that fails is timed anyway and its failure reported, not fatal: for
//! speed-of-light experiments that skip part of the work on purpose (the first build, the
//! baseline, must still pass). Then, round by round
//! (the build order reversed every other round), each build times each shape with
//! `kda run --repeat N`. Prints a table of the median over rounds of each run's median and each
//! build's ratio to the first, and writes it all to `DIR/ab.json` (default `target/ab`), every
//! run's output to `DIR/ab.log`. With `--deadline S` no timed run starts once S seconds have passed
//! since the command began: the table then holds the rounds that ran (a GPU call of fixed length
//! keeps its results instead of losing them to its own time limit).

use crate::args::Args;
use crate::proc::{Combined, Finished, Scratch, create_dir, describe, run_logged, tail, write_json};
use crate::shapes;
use kda::model::ModelProblem;
use kda::{Outputs, io, precision, reference};
use kda_cli::Progress;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const DEFAULT_SHAPES: &[&str] = &["fixed_8192", "mixed_6", "many_short", "decode_like"];
const DEFAULT_ROUNDS: usize = 2;
const DEFAULT_REPEAT: usize = 100;
/// Limit of one GPU run of a build.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// Limit of one f64 reference run on the CPU.
const REFERENCE_TIMEOUT: Duration = Duration::from_secs(300);
/// Checked besides the timed shapes: ragged tails over 512 items.
const CHECK_SHAPE: &str = "ragged_many";
/// Scratch files: the f64 reference of the input under check, and a build's outputs on it.
const REFERENCE_FILE: &str = "reference.safetensors";
const CHECKED_FILE: &str = "gpu.safetensors";

#[derive(Debug, PartialEq)]
struct Options {
    builds: Vec<PathBuf>,
    shapes: Vec<String>,
    rounds: usize,
    repeat: usize,
    timeout: Duration,
    out: PathBuf,
    /// Time builds after the first that fail their check (`--time-unchecked`).
    time_unchecked: bool,
    /// Start no timed run after this long since the command began (`--deadline`).
    deadline: Option<Duration>,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let a = Args::parse(
        "ab",
        args,
        &["--shapes", "--rounds", "--repeat", "--timeout", "--out", "--deadline"],
        &["--time-unchecked"],
    )?;
    if a.positional.is_empty() {
        return Err("ab: name the kda binaries to compare (KDA_A KDA_B ...)".into());
    }
    let mut shapes = a.list("--shapes", DEFAULT_SHAPES);
    dedup(&mut shapes);
    if shapes.is_empty() {
        return Err("ab: --shapes names no shape".into());
    }
    for s in &shapes {
        match bench_shape(s) {
            Some(("layer", name)) => {
                if !kda_cli::layer_bench_shapes().iter().any(|l| l.name == name) {
                    return Err(format!("ab: unknown layer shape {name}"));
                }
            }
            Some((_, name)) => {
                if !kda_cli::decode_bench_shapes().iter().any(|d| d.name == name) {
                    return Err(format!("ab: unknown decode shape {name}"));
                }
            }
            None => {
                shapes::lookup(s)?;
            }
        }
    }
    Ok(Options {
        builds: a.positional.iter().map(PathBuf::from).collect(),
        shapes,
        rounds: a.count("--rounds", DEFAULT_ROUNDS)?,
        repeat: a.count("--repeat", DEFAULT_REPEAT)?,
        timeout: a.timeout("--timeout", DEFAULT_TIMEOUT)?,
        out: a.path("--out", "target/ab"),
        time_unchecked: a.has("--time-unchecked"),
        deadline: match a.value("--deadline") {
            None => None,
            Some(_) => Some(a.timeout("--deadline", DEFAULT_TIMEOUT)?),
        },
    })
}

/// The subcommand and shape a `layer:NAME` or `decode:NAME` shape names (`kda layer --bench
/// NAME`, `kda decode --bench NAME`), or `None` for a recurrence shape.
fn bench_shape(shape: &str) -> Option<(&'static str, &str)> {
    BENCH_PREFIXES.iter().find_map(|&command| Some((command, shape.strip_prefix(command)?.strip_prefix(':')?)))
}

/// The subcommands whose `--bench` shapes `--shapes` names as `COMMAND:NAME`.
const BENCH_PREFIXES: [&str; 2] = ["layer", "decode"];

/// Removes repeated names, keeping the first of each.
fn dedup(v: &mut Vec<String>) {
    let mut seen = std::collections::HashSet::new();
    v.retain(|s| seen.insert(s.clone()));
}

/// `A`, `B`, ... for build `i`.
fn label(i: usize) -> String {
    if i < 26 { char::from(b'A' + i as u8).to_string() } else { format!("#{}", i + 1) }
}

pub fn run(args: &[String]) -> Result<(), String> {
    let ab = Ab::new(parse(args)?)?;
    for (i, b) in ab.o.builds.iter().enumerate() {
        println!("{} = {}", label(i), b.display());
    }
    // Correctness first, on every timed shape and on ragged_many.
    let checks = ab.check()?;
    let timed: Vec<usize> =
        (0..ab.o.builds.len()).filter(|&i| checks.passed[i] || (ab.o.time_unchecked && i > 0)).collect();
    for i in (0..ab.o.builds.len()).filter(|i| !checks.passed[*i]) {
        let what = if timed.contains(&i) { "timed anyway (--time-unchecked)" } else { "not timed" };
        println!("{} failed its check: {what}", label(i));
    }
    let timing = ab.time(&timed)?;
    ab.report(&checks, &timing)?;
    // Under --time-unchecked only the baseline's check is binding.
    let binding: Vec<bool> =
        checks.passed.iter().enumerate().map(|(i, &ok)| ok || (ab.o.time_unchecked && i > 0)).collect();
    verdict(&binding, &timing.failures)
}

/// One comparison: its options, its scratch space (the inputs, outputs and the log of the run
/// under way) and the log book gathering every run's output.
struct Ab {
    o: Options,
    /// When the command began (`--deadline` counts from it).
    started: Instant,
    scratch: Scratch,
    book: Combined,
    run_log: PathBuf,
}

/// What the checks found: per build, whether it passed on every shape; a record per run.
struct Checks {
    passed: Vec<bool>,
    records: Vec<Value>,
}

/// The f64 reference outputs of one input (problem `problem`), the f32 rounding floor of each
/// output and the bound a build's error must stay under.
struct Expected {
    problem: ModelProblem,
    want: Outputs,
    f32_floor: [f64; 3],
    bounds: [f64; 3],
}

/// The timed runs: `times[shape][build]` holds each round's median; `failures` names the runs
/// that gave none.
struct Timing {
    times: Vec<Vec<Vec<f64>>>,
    failures: Vec<String>,
    /// The runs not started because the deadline had passed.
    skipped: usize,
}

impl Ab {
    /// Checks that the builds exist, then makes the output directory, the scratch space and the
    /// log book.
    fn new(o: Options) -> Result<Self, String> {
        for b in &o.builds {
            if !b.is_file() {
                return Err(format!("ab: {} is not a file", b.display()));
            }
        }
        create_dir(&o.out)?;
        let scratch = Scratch::new("ab")?;
        let book = Combined::create(o.out.join("ab.log"))?;
        let run_log = scratch.join("run.log");
        Ok(Self { o, started: Instant::now(), scratch, book, run_log })
    }

    /// Runs `cmd` under `limit` and adds its output to the book as run `name`.
    fn run(&self, name: &str, cmd: &mut Command, limit: Duration) -> Result<(Finished, String), String> {
        let (f, text) = run_logged(cmd, limit, &self.run_log)?;
        self.book.run(name, &describe(cmd), &f, &text)?;
        Ok((f, text))
    }

    /// The input file of `shape` in the scratch space.
    fn input(&self, shape: &str) -> PathBuf {
        self.scratch.join(&format!("{shape}.safetensors"))
    }

    /// Checks every build against the f64 reference on each timed shape and on [`CHECK_SHAPE`].
    fn check(&self) -> Result<Checks, String> {
        // Layer and decode shapes are checked by each build's own first run (`kda layer --bench`:
        // finite outputs; `kda decode --bench`: against the reference); the layer's accuracy is
        // the GPU suite's.
        let mut check_shapes: Vec<String> =
            self.o.shapes.iter().filter(|s| bench_shape(s).is_none()).cloned().collect();
        check_shapes.push(CHECK_SHAPE.into());
        dedup(&mut check_shapes);
        let mut checks = Checks { passed: vec![true; self.o.builds.len()], records: Vec::new() };
        for shape in &check_shapes {
            self.check_shape(shape, &mut checks)?;
        }
        Ok(checks)
    }

    /// Writes the input of `shape`, computes its reference and checks every build on it. The
    /// input stays only when `shape` is timed.
    fn check_shape(&self, shape: &str, checks: &mut Checks) -> Result<(), String> {
        let input = self.input(shape);
        println!("== check {shape}: inputs, f64 reference (--cpu, {}) ...", label(0));
        let expected = self.expect(shape, &input)?;
        for i in 0..self.o.builds.len() {
            let (ok, record) = self.check_build(i, shape, &input, &expected)?;
            checks.passed[i] &= ok;
            checks.records.push(record);
        }
        let _ = std::fs::remove_file(self.scratch.join(REFERENCE_FILE));
        if !self.o.shapes.iter().any(|s| s == shape) {
            let _ = std::fs::remove_file(&input);
        }
        Ok(())
    }

    /// Writes the input of `shape` to `input` and runs the f64 reference on it (`--cpu`, with the
    /// first build).
    fn expect(&self, shape: &str, input: &Path) -> Result<Expected, String> {
        let p = shapes::write(shape, input)?;
        let ref_path = self.scratch.join(REFERENCE_FILE);
        let mut cmd = Command::new(&self.o.builds[0]);
        cmd.args(["run", "--cpu", "--inputs"]).arg(input).arg("--out").arg(&ref_path);
        let (f, text) = self.run(&format!("reference {shape}"), &mut cmd, REFERENCE_TIMEOUT)?;
        if !f.ok() {
            return Err(format!("ab: the f64 reference of {shape} {}:\n{}", f.describe(), tail(&text, 10)));
        }
        let want = io::read_model_outputs(&ref_path, &p.view()).map_err(|e| e.to_string())?;
        // The f32 rounding floor e32 of this problem, which sets the bound on long sequences.
        let e32 = reference::model_reference_f32(&p.view()).map_err(|e| e.to_string())?.errors(&want);
        let (gated, key_dim) = (p.shape.gates.g || p.shape.gates.gk, p.shape.key_dim);
        Ok(Expected { problem: p, want, f32_floor: e32, bounds: e32.map(|f| precision::bound_for(gated, key_dim, f)) })
    }

    /// Runs build `i` on `input` (of `shape`) and judges its outputs: whether it passed, and the
    /// run's record.
    fn check_build(&self, i: usize, shape: &str, input: &Path, x: &Expected) -> Result<(bool, Value), String> {
        let got_path = self.scratch.join(CHECKED_FILE);
        let _ = std::fs::remove_file(&got_path);
        let mut cmd = Command::new(&self.o.builds[i]);
        cmd.arg("run").arg("--inputs").arg(input).arg("--out").arg(&got_path);
        let (f, text) = self.run(&format!("check {shape} {}", label(i)), &mut cmd, self.o.timeout)?;
        let errs = if f.ok() {
            io::read_model_outputs(&got_path, &x.problem.view()).ok().map(|got| got.errors(&x.want))
        } else {
            None
        };
        let ok = errs.is_some_and(|e| e.iter().zip(&x.bounds).all(|(e, b)| *e < *b));
        match errs {
            Some(e) => {
                let cols: Vec<String> =
                    (0..3).map(|k| format!("{} {:.2e} (< {:.2e})", Outputs::NAMES[k], e[k], x.bounds[k])).collect();
                println!("   {} {}: {}", label(i), if ok { "pass" } else { "FAIL" }, cols.join(", "));
            }
            None => println!("   {} FAIL: {}\n{}", label(i), f.describe(), tail(&text, 10)),
        }
        Ok((
            ok,
            json!({
                "shape": shape, "build": label(i), "pass": ok, "run": f.describe(),
                "rel_err": errs, "bound": x.bounds, "f32_floor": x.f32_floor,
            }),
        ))
    }

    /// Times the builds `timed` on every shape, round by round, the order reversed every other
    /// round.
    fn time(&self, timed: &[usize]) -> Result<Timing, String> {
        let mut timing = Timing {
            times: vec![vec![Vec::new(); self.o.builds.len()]; self.o.shapes.len()],
            failures: Vec::new(),
            skipped: 0,
        };
        let progress = Progress::new("ab", self.o.rounds * self.o.shapes.len() * timed.len());
        for round in 0..self.o.rounds {
            let order: Vec<usize> = if round % 2 == 0 { timed.to_vec() } else { timed.iter().rev().copied().collect() };
            for s in 0..self.o.shapes.len() {
                for &i in &order {
                    if past(self.o.deadline, self.started.elapsed()) {
                        timing.skipped += 1;
                        progress.skip(1);
                    } else {
                        self.time_run((round, s, i), &mut timing, &progress)?;
                    }
                }
            }
        }
        if timing.skipped > 0 {
            progress.out(&format!("--deadline passed: {} timed run(s) not started", timing.skipped));
        }
        Ok(timing)
    }

    /// One timed run (`kda run --repeat N`) of build `i` on shape `s` in `round`: its median, or
    /// a failure.
    fn time_run(
        &self,
        (round, s, i): (usize, usize, usize),
        timing: &mut Timing,
        progress: &Progress,
    ) -> Result<(), String> {
        let shape = &self.o.shapes[s];
        progress.show(&format!("round {}/{} {shape} {}", round + 1, self.o.rounds, label(i)));
        let mut cmd = Command::new(&self.o.builds[i]);
        match bench_shape(shape) {
            Some((command, name)) => {
                cmd.args([command, "--bench", name, "--repeat", &self.o.repeat.to_string()]);
            }
            None => {
                cmd.arg("run").arg("--inputs").arg(self.input(shape));
                cmd.arg("--out").arg(self.scratch.join("timed.safetensors"));
                cmd.args(["--repeat", &self.o.repeat.to_string()]);
            }
        }
        let (f, text) = self.run(&format!("round {} {shape} {}", round + 1, label(i)), &mut cmd, self.o.timeout)?;
        match parse_median(&text).filter(|_| f.ok()) {
            Some(us) => {
                progress.out(&format!("round {}/{} {shape:<18} {} {us:>10.2} us", round + 1, self.o.rounds, label(i)));
                timing.times[s][i].push(us);
            }
            None => {
                let last = tail(&text, 1);
                progress.out(&format!(
                    "round {}/{} {shape:<18} {} no median: {} {last}",
                    round + 1,
                    self.o.rounds,
                    label(i),
                    f.describe()
                ));
                timing.failures.push(format!("{shape} {}: {}", label(i), f.describe()));
            }
        }
        progress.skip(1);
        Ok(())
    }

    /// Prints the table of medians (into the book too) and writes `ab.json`.
    fn report(&self, checks: &Checks, timing: &Timing) -> Result<(), String> {
        let medians = summarize(&timing.times);
        let shape_names: Vec<&str> = self.o.shapes.iter().map(String::as_str).collect();
        println!(
            "\nmedian over {} rounds of each run's median of {} launches, us (ratio to A)\n",
            self.o.rounds, self.o.repeat
        );
        let table = table(&shape_names, self.o.builds.len(), &medians);
        println!("{table}");
        self.book.append(&format!("######## table\n{table}\n"))?;
        let doc = json!({
            "builds": self.build_records(&checks.passed), "rounds": self.o.rounds, "repeat": self.o.repeat,
            "seed": shapes::INPUT_SEED, "shapes": self.shape_records(&timing.times, &medians),
            "checks": checks.records, "failures": timing.failures, "skipped_at_deadline": timing.skipped,
        });
        let path = self.o.out.join("ab.json");
        write_json(&path, &doc)?;
        println!("\nwrote {} (every run's output in {})", path.display(), self.book.0.display());
        Ok(())
    }

    /// Per shape: its sizes, every round's median of each build, their medians and ratios.
    fn shape_records(&self, times: &[Vec<Vec<f64>>], medians: &[Vec<Option<f64>>]) -> Vec<Value> {
        let records = self.o.shapes.iter().enumerate().map(|(s, shape)| {
            let (lengths, heads, value_heads) =
                shapes::lookup(shape).map(|s| (s.lengths, s.shape.heads, s.shape.value_heads)).unwrap_or_default();
            json!({
                "shape": shape, "heads": heads, "value_heads": value_heads, "seqs": lengths.len(),
                "tokens": lengths.iter().sum::<usize>(),
                "runs_us": times[s], "median_us": medians[s], "ratio": ratios(&medians[s]),
            })
        });
        records.collect()
    }

    /// Per build: its label, path and whether it passed its check.
    fn build_records(&self, passed: &[bool]) -> Vec<Value> {
        let records = self.o.builds.iter().enumerate();
        records
            .map(|(i, b)| json!({ "label": label(i), "path": b.display().to_string(), "check": passed[i] }))
            .collect()
    }
}

/// Whether a `deadline` (none: never) has passed after `elapsed`.
fn past(deadline: Option<Duration>, elapsed: Duration) -> bool {
    deadline.is_some_and(|d| elapsed >= d)
}

/// The outcome: an error naming the builds that failed their check, else one naming the timed
/// runs that failed.
fn verdict(passed: &[bool], failures: &[String]) -> Result<(), String> {
    let failed_checks: Vec<String> = (0..passed.len()).filter(|&i| !passed[i]).map(label).collect();
    if !failed_checks.is_empty() {
        return Err(format!("ab: build(s) {} failed the check against the f64 reference", failed_checks.join(", ")));
    }
    if !failures.is_empty() {
        return Err(format!("ab: {} timed run(s) failed: {}", failures.len(), failures.join("; ")));
    }
    Ok(())
}

/// The time `kda run --repeat N` prints: the number in its last `median X us`, or in `X us
/// (median of N launches)` as `kda layer --bench` and `kda decode --bench` print it, or in `X us
/// (host time per call ...)` as `kda layer --bench` prints a short prompt's.
fn parse_median(output: &str) -> Option<f64> {
    output.lines().rev().find_map(|l| {
        let words: Vec<&str> = l.split_whitespace().collect();
        let before = words.windows(3).find(|w| w[0] == "median" && w[2] == "us").map(|w| w[1]);
        let after = || words.windows(3).find(|w| w[1] == "us" && (w[2] == "(median" || w[2] == "(host")).map(|w| w[0]);
        before.or_else(after).and_then(|x| x.parse().ok())
    })
}

/// The median (the mean of the middle two for an even count); `None` when empty.
fn median(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// Per shape and build, the median of the rounds' medians.
fn summarize(times: &[Vec<Vec<f64>>]) -> Vec<Vec<Option<f64>>> {
    times.iter().map(|per_build| per_build.iter().map(|r| median(r)).collect()).collect()
}

/// Each build's time over the first build's.
fn ratios(medians: &[Option<f64>]) -> Vec<Option<f64>> {
    let first = medians.first().copied().flatten();
    medians.iter().map(|m| Some((*m)? / first?)).collect()
}

/// A markdown table: one row per shape, one column per build, `time (ratio)` after the first.
fn table(shapes: &[&str], builds: usize, medians: &[Vec<Option<f64>>]) -> String {
    let mut lines = vec![
        format!("| shape |{}", (0..builds).map(|i| format!(" {} |", label(i))).collect::<String>()),
        format!("|---|{}", "---:|".repeat(builds)),
    ];
    for (shape, m) in shapes.iter().zip(medians) {
        let cells: String = m
            .iter()
            .zip(ratios(m))
            .enumerate()
            .map(|(i, (t, r))| match (t, r) {
                (Some(t), Some(r)) if i > 0 => format!(" {t:.1} ({r:.3}) |"),
                (Some(t), _) => format!(" {t:.1} |"),
                (None, _) => " - |".to_string(),
            })
            .collect();
        lines.push(format!("| {shape} |{cells}"));
    }
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::strings;

    #[test]
    fn options() {
        let o = parse(&strings(&["a/kda", "b/kda"])).unwrap();
        assert_eq!(o.builds, vec![PathBuf::from("a/kda"), PathBuf::from("b/kda")]);
        assert_eq!(o.shapes, strings(DEFAULT_SHAPES));
        assert_eq!((o.rounds, o.repeat, o.timeout), (2, 100, DEFAULT_TIMEOUT));
        assert_eq!(o.out, PathBuf::from("target/ab"));
        assert!(!o.time_unchecked);
        assert_eq!(o.deadline, None);
        assert!(parse(&strings(&["a/kda", "b/kda", "--time-unchecked"])).unwrap().time_unchecked);
        let o = parse(&strings(&["a/kda", "--deadline", "120"])).unwrap();
        assert_eq!(o.deadline, Some(Duration::from_secs(120)));
        assert!(parse(&strings(&["a/kda", "--deadline", "0"])).is_err());
        assert!(past(o.deadline, Duration::from_secs(120)) && !past(o.deadline, Duration::from_secs(119)));
        assert!(!past(None, Duration::from_secs(1 << 40)));
        let o = parse(&strings(&[
            "a/kda",
            "--shapes",
            "tiny,fixed_32k,tiny",
            "--rounds",
            "3",
            "--repeat=50",
            "--timeout",
            "90",
            "--out",
            "/o",
            "b/kda",
            "c/kda",
        ]))
        .unwrap();
        assert_eq!(o.builds.len(), 3);
        assert_eq!(o.shapes, strings(&["tiny", "fixed_32k"]));
        assert_eq!((o.rounds, o.repeat, o.timeout, o.out), (3, 50, Duration::from_secs(90), "/o".into()));
        assert!(parse(&[]).is_err());
        assert!(parse(&strings(&["a", "--shapes", "nope"])).unwrap_err().contains("unknown shape nope"));
        let o = parse(&strings(&["a", "--shapes", "layer:kda_fixed_8192,fixed_8192"])).unwrap();
        assert_eq!(o.shapes, strings(&["layer:kda_fixed_8192", "fixed_8192"]));
        assert_eq!(bench_shape(&o.shapes[0]), Some(("layer", "kda_fixed_8192")));
        assert_eq!(bench_shape("decode:decode_kda_64"), Some(("decode", "decode_kda_64")));
        assert_eq!(bench_shape("fixed_8192"), None);
        assert!(parse(&strings(&["a", "--shapes", "decode:verify_kda_64x4"])).is_ok());
        assert!(parse(&strings(&["a", "--shapes", "decode:nope"])).unwrap_err().contains("unknown decode shape nope"));
        assert!(parse(&strings(&["a", "--shapes", "layer:nope"])).unwrap_err().contains("unknown layer shape nope"));
        assert!(parse(&strings(&["a", "--rounds", "0"])).is_err());
    }

    #[test]
    fn the_median_that_kda_run_prints() {
        let out = "in.safetensors: N = 1, T = 8192, H = 64, NT = 128, h0 given\n\
                   kernel Hopper: median 207.90 us over 100 launches\n\
                   wrote h, v_new, ht to out.safetensors\n";
        assert_eq!(parse_median(out), Some(207.9));
        assert_eq!(parse_median("kernel Baseline: median 4747.31 us over 5 launches"), Some(4747.31));
        assert_eq!(parse_median("error: no CUDA device"), None);
        let layer = "layer kda_fixed_8192: 1328.8 us (median of 10 launches), IO floor 269.9 us (0.203 of it)";
        assert_eq!(parse_median(layer), Some(1328.8));
        // With the stages' times after it, as `kda layer --bench` prints them now.
        let staged = format!("{layer}; stages (us, device) prepare 1001.2, recurrence 327.6");
        assert_eq!(parse_median(&staged), Some(1328.8));
        let short = "layer kda_short_128: 60.5 us (host time per call of 100, planning included (29.8 us with \
                     the plan reused)), IO floor 2.8 us (0.046 of it)";
        assert_eq!(parse_median(short), Some(60.5));
        let planned = "layer kda_short_128: 27.4 us (host time per call of 100, re-planned in place (25.3 us \
                       with the plan reused; a new plan per call 53.8 us; planning alone 8.8 us)), IO floor 2.8 us \
                       (0.060 of it)";
        assert_eq!(parse_median(planned), Some(27.4));
        assert_eq!(parse_median("median nan-ish us"), None);
    }

    #[test]
    fn medians_ratios_and_the_table() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0]), Some(2.5));
        // Two shapes, three builds, two rounds; build C never ran on the second shape.
        let times = vec![
            vec![vec![200.0, 202.0], vec![190.0, 192.0], vec![210.0, 230.0]],
            vec![vec![100.0, 100.0], vec![110.0, 110.0], vec![]],
        ];
        let m = summarize(&times);
        assert_eq!(m, vec![vec![Some(201.0), Some(191.0), Some(220.0)], vec![Some(100.0), Some(110.0), None]]);
        let r = ratios(&m[0]);
        assert_eq!(r[0], Some(1.0));
        assert!((r[1].unwrap() - 191.0 / 201.0).abs() < 1e-12);
        assert_eq!(ratios(&[None, Some(1.0)]), vec![None, None]);
        let t = table(&["fixed_8192", "mixed_6"], 3, &m);
        assert_eq!(
            t,
            "| shape | A | B | C |\n|---|---:|---:|---:|\n\
             | fixed_8192 | 201.0 | 191.0 (0.950) | 220.0 (1.095) |\n\
             | mixed_6 | 100.0 | 110.0 (1.100) | - |"
        );
        assert_eq!((label(0), label(25), label(26)), ("A".into(), "Z".into(), "#27".into()));
    }

    #[test]
    fn the_verdict_names_failed_checks_first() {
        assert_eq!(verdict(&[true, true], &[]), Ok(()));
        let timed = strings(&["tiny B: rc=1 in 0.1 s"]);
        assert_eq!(verdict(&[true, true], &timed).unwrap_err(), "ab: 1 timed run(s) failed: tiny B: rc=1 in 0.1 s");
        assert_eq!(
            verdict(&[true, false, false], &timed).unwrap_err(),
            "ab: build(s) B, C failed the check against the f64 reference"
        );
    }
}

//! `xtask sanitize [--out DIR] [--bundle DIR] [--tools A,B] [--only SUBSTRING,...]`:
//! compute-sanitizer's memcheck, racecheck, synccheck and initcheck over every kernel variant, on
//! ragged inputs with tails, empty sequences, and initial states given and not:
//!
//! - the Hopper kernel (`kda run`) in wide and in narrow column blocks on the golden fixtures
//!   `ragged_h3` (one item per CTA) and `two_seq_no_h0` (no `h0`), the generated `ragged_many`
//!   (512 items, so CTAs of the persistent grid run several back to back), and the model fixtures
//!   the GPU runs (the scalar gate with grouped value heads, value-first states, both gates
//!   without `h0`, no gate at V = 256, K = 64; K = 256 narrow only);
//! - the same kernel and the portable one (`_portable_split`) with sequences forced into segments
//!   (`--split N`): the pre-scan, the segments and the merge kernel, on `ragged_h3`,
//!   `ragged_many` and the generated `split_tails` (sequences of hundreds of tokens with tails,
//!   no `h0`);
//! - the portable kernel (`KDA_KERNEL=portable`) on those inputs, once each as the launcher
//!   plans it, and on KDA's inputs in CTAs of two consumer groups (`_portable_groups2`,
//!   `--columns wide`), and the baseline (`KDA_KERNEL=baseline`) on KDA's slice (`ragged_h3`,
//!   `two_seq_no_h0`, `ragged_many`);
//! - the whole layer (`kda layer`: its prepare and output kernels around the recurrence) on four
//!   layer fixtures, on the device's module and on the portable one (`KDA_MODULE=portable`);
//! - what has no CLI (the decode step on f32 and bf16 pools, speculative verify as a chain and as
//!   a tree, the pooled prefill with its pool copy kernel, a launch without final states): the GPU
//!   suite's test `sanitizer_workload`, alone.
//!
//! `--tools` runs a subset of the tools, `--only` the cases whose name contains one of the
//! SUBSTRINGs (the names are in the table and the log files: `_wide`, `_narrow`, `_split`,
//! `_portable_kernel`, `_portable_groups2`, `_baseline`, `_layer`, `gpu_` pick the groups above), so the matrix can be
//! split across shorter calls.
//! Prints each run's summary line, and the log of a run that reports an error or hazard, fails or
//! times out (the first and last 60 lines); then a table of every case's summary under each tool;
//! fails if any run does. Each run's whole log is in DIR (default `target/sanitize`), one file
//! per tool and case: `sanitizer_TOOL_CASE.txt`.

use crate::args::Args;
use crate::proc::{Finished, Scratch, abridge, bundle_bin, bundle_dir, create_dir, cuda_cli, repo_root, run_logged};
use crate::shapes;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// compute-sanitizer's tools, in the order they run.
const TOOLS: [&str; 4] = ["memcheck", "racecheck", "synccheck", "initcheck"];
/// The limit of one run under memcheck, synccheck or initcheck: a `kda` run or the test under
/// them takes seconds to tens of seconds on the H200; a hang is cut off well before a device
/// call's 10 minutes run out.
const RUN_TIMEOUT: Duration = Duration::from_secs(120);
/// The limit of one run under racecheck, which tracks every shared memory access and runs
/// several times slower than the others.
const RACECHECK_TIMEOUT: Duration = Duration::from_secs(300);

/// The model fixtures the Hopper kernel runs in both column widths (`tests/fixtures/models/`).
const MODEL_FIXTURES: [&str; 5] = ["gdn_gva_ragged", "kda_gva_vfirst", "g_and_gk", "plain_delta_k128_v256", "kda_k64"];
/// The model fixtures the Hopper kernel runs in narrow blocks only.
const NARROW_FIXTURES: [&str; 1] = ["gdn_k256_v512"];
/// The golden KDA fixtures (`tests/fixtures/`): ragged with an empty sequence and `h0`, and two
/// sequences with tails and no `h0`. Every kernel runs them, the baseline included.
const KDA_FIXTURES: [&str; 2] = ["ragged_h3", "two_seq_no_h0"];
/// The generated inputs (`shapes`): KDA's slice, so the baseline runs them too.
const RAGGED_MANY: &str = "ragged_many";
/// See [`RAGGED_MANY`]; long sequences with tails for the forced split.
const SPLIT_TAILS: &str = "split_tails";
/// The layer fixtures (`tests/fixtures/layer/`): KDA ragged with tails, the gate activated
/// inside, Gated DeltaNet with grouped value heads, and KDA dense without `h0`.
const LAYER_FIXTURES: [&str; 4] =
    ["kda_layer_ragged", "kda_layer_gate_in_kernel", "gdn_layer_gva_ragged", "kda_layer_dense_no_h0"];
/// The forced splits, in chunks per segment, with their inputs: one chunk per segment splits
/// even `ragged_h3`'s 130 tokens (3 segments, the last a 2-token tail); two on `split_tails`
/// give segments of two chunks and partial last ones.
const SPLITS: [(&str, &str); 3] = [("ragged_h3", "1"), (RAGGED_MANY, "1"), (SPLIT_TAILS, "2")];
/// The GPU suite's test that runs what has no CLI (`tests/tests/gpu.rs`).
const WORKLOAD_TEST: &str = "sanitizer_workload";

/// The environment variable choosing what `Kernel::Auto` runs (`kda::KERNEL_VAR`).
const KERNEL_VAR: &str = "KDA_KERNEL";
/// The environment variable choosing the module (`kda::MODULE_VAR`).
const MODULE_VAR: &str = "KDA_MODULE";

/// Which bundled program a case runs.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Program {
    /// The `kda` CLI.
    Kda,
    /// The GPU suite's test binary.
    Gpu,
}

/// One program run, sanitized once per tool.
#[derive(Debug)]
struct Case {
    /// Unique; in the table, the log file names and what `--only` matches.
    name: String,
    program: Program,
    args: Vec<OsString>,
    /// Variables set for the run.
    env: Vec<(&'static str, &'static str)>,
}

/// Where a case's files are: each named input's path, and where `kda` writes its outputs.
struct Files<'a> {
    input: &'a dyn Fn(&str) -> PathBuf,
    output: &'a Path,
}

impl Files<'_> {
    /// `kda COMMAND --inputs INPUT --out OUTPUT EXTRA...`, named `NAME`, with `env`.
    fn kda(
        &self,
        name: String,
        command: &str,
        input: &str,
        extra: &[&str],
        env: &[(&'static str, &'static str)],
    ) -> Case {
        let mut args: Vec<OsString> = vec![command.into(), "--inputs".into(), (self.input)(input).into()];
        args.extend(["--out".into(), self.output.into()]);
        args.extend(extra.iter().map(OsString::from));
        Case { name, program: Program::Kda, args, env: env.to_vec() }
    }
}

/// Every case, in the order they run. `input` names the inputs as `ragged_h3`,
/// `models/kda_k64`, `layer/kda_layer_ragged`, or a generated shape (`ragged_many`).
fn cases(files: &Files) -> Vec<Case> {
    let models = |names: &[&'static str]| names.iter().map(|n| (*n, format!("models/{n}"))).collect::<Vec<_>>();
    let kda_inputs: Vec<(&str, String)> =
        KDA_FIXTURES.iter().chain(&[RAGGED_MANY]).map(|n| (*n, n.to_string())).collect();
    let mut v = Vec::new();
    // The Hopper kernel: every variant, both column widths (K = 256 narrow only).
    for (name, input) in kda_inputs.iter().chain(&models(&MODEL_FIXTURES)) {
        for width in ["wide", "narrow"] {
            v.push(files.kda(format!("{name}_{width}"), "run", input, &["--columns", width], &[]));
        }
    }
    for (name, input) in models(&NARROW_FIXTURES) {
        v.push(files.kda(format!("{name}_narrow"), "run", &input, &["--columns", "narrow"], &[]));
    }
    for (input, chunks) in SPLITS {
        v.push(files.kda(format!("{input}_split{chunks}"), "run", input, &["--split", chunks], &[]));
        let portable = [(KERNEL_VAR, "portable")];
        v.push(files.kda(format!("{input}_portable_split{chunks}"), "run", input, &["--split", chunks], &portable));
    }
    let all_models: Vec<&'static str> = MODEL_FIXTURES.iter().chain(&NARROW_FIXTURES).copied().collect();
    for (name, input) in kda_inputs.iter().chain(&models(&all_models)) {
        v.push(files.kda(format!("{name}_portable_kernel"), "run", input, &[], &[(KERNEL_VAR, "portable")]));
    }
    // The portable kernel's two-group CTAs, which these small batches take only when forced.
    for (name, input) in &kda_inputs {
        let portable = [(KERNEL_VAR, "portable")];
        v.push(files.kda(format!("{name}_portable_groups2"), "run", input, &["--columns", "wide"], &portable));
    }
    for (name, input) in &kda_inputs {
        v.push(files.kda(format!("{name}_baseline"), "run", input, &[], &[(KERNEL_VAR, "baseline")]));
    }
    for name in LAYER_FIXTURES {
        let input = format!("layer/{name}");
        v.push(files.kda(format!("{name}_layer"), "layer", &input, &[], &[]));
        v.push(files.kda(format!("{name}_layer_portable_module"), "layer", &input, &[], &[(MODULE_VAR, "portable")]));
    }
    let args = ["--exact", "--test-threads", "1", WORKLOAD_TEST].map(OsString::from).to_vec();
    v.push(Case { name: format!("gpu_{WORKLOAD_TEST}"), program: Program::Gpu, args, env: Vec::new() });
    v
}

/// The tools `--tools` names (all when absent), each once, in [`TOOLS`]' order.
fn select_tools(named: &[String]) -> Result<Vec<&'static str>, String> {
    if let Some(bad) = named.iter().find(|t| !TOOLS.contains(&t.as_str())) {
        return Err(format!("sanitize: unknown tool {bad} (tools: {})", TOOLS.join(", ")));
    }
    let tools: Vec<_> = TOOLS.into_iter().filter(|t| named.iter().any(|n| n == t)).collect();
    if tools.is_empty() { Err("sanitize: --tools names no tool".into()) } else { Ok(tools) }
}

/// The cases whose name contains one of `only` (all when it is empty); an error when one of
/// them matches no case, so a misspelt filter does not pass as a clean run of nothing.
fn select_cases(all: Vec<Case>, only: &[String]) -> Result<Vec<Case>, String> {
    let names: Vec<&str> = all.iter().map(|c| c.name.as_str()).collect();
    if let Some(none) = only.iter().find(|o| !names.iter().any(|n| n.contains(o.as_str()))) {
        return Err(format!("sanitize: no case matches --only {none} (cases: {})", names.join(", ")));
    }
    Ok(all.into_iter().filter(|c| only.is_empty() || only.iter().any(|o| c.name.contains(o.as_str()))).collect())
}

/// How one tool's run of one case ended.
struct Outcome {
    tool: &'static str,
    case: String,
    /// The summary line without its `=========` prefix.
    summary: Option<String>,
    finished: Finished,
}

impl Outcome {
    /// Exited 0 in time with a summary of nothing but zeros.
    fn clean(&self) -> bool {
        self.finished.ok() && self.summary.as_deref().is_some_and(reports_nothing)
    }

    /// The table's cell: the counts after `SUMMARY:`, or how the run ended without one; `FAIL`
    /// after anything not clean.
    fn cell(&self) -> String {
        let said = match &self.summary {
            Some(s) => s.split_once("SUMMARY:").map_or(s.as_str(), |(_, rest)| rest.trim()).to_string(),
            None => format!("no summary, {}", self.finished.describe()),
        };
        if self.clean() { said } else { format!("FAIL: {said}") }
    }
}

/// A Markdown table of `outcomes`: one row per case, one column per tool (`-` where the tool
/// did not run the case).
fn table(tools: &[&str], outcomes: &[Outcome]) -> String {
    let mut cases: Vec<&str> = Vec::new();
    for o in outcomes {
        if !cases.contains(&o.case.as_str()) {
            cases.push(&o.case);
        }
    }
    let mut text = format!("| case | {} |\n|---|{}\n", tools.join(" | "), "---|".repeat(tools.len()));
    for case in cases {
        let cells: Vec<String> = tools
            .iter()
            .map(|t| outcomes.iter().find(|o| o.tool == *t && o.case == case).map_or("-".into(), Outcome::cell))
            .collect();
        text += &format!("| {case} | {} |\n", cells.join(" | "));
    }
    text
}

pub fn run(args: &[String]) -> Result<(), String> {
    let a = Args::parse("sanitize", args, &["--out", "--bundle", "--tools", "--only"], &[])?;
    a.no_positional("sanitize")?;
    let out = a.path("--out", "target/sanitize");
    let tools = select_tools(&a.list("--tools", &TOOLS))?;
    let bundle = bundle_dir(a.value("--bundle"))?;
    let scratch = Scratch::new("sanitize")?;
    let fixtures = repo_root().join("tests/fixtures");
    let generated = [RAGGED_MANY, SPLIT_TAILS];
    let input = |name: &str| {
        if generated.contains(&name) {
            scratch.join(&format!("{name}.safetensors"))
        } else {
            fixtures.join(format!("{name}.safetensors"))
        }
    };
    let output = scratch.join("sanitized.safetensors");
    let cases = select_cases(cases(&Files { input: &input, output: &output }), &a.list("--only", &[]))?;
    // Only the programs the chosen cases run need be in the bundle.
    let mut programs = Vec::new();
    for (program, file) in [(Program::Kda, "kda"), (Program::Gpu, "gpu")] {
        if cases.iter().any(|c| c.program == program) {
            programs.push((program, bundle_bin(&bundle, file)?));
        }
    }
    let sanitizer = cuda_cli("compute-sanitizer");
    create_dir(&out)?;
    for name in generated {
        shapes::write(name, &input(name))?;
    }

    let mut outcomes = Vec::new();
    let progress = kda_cli::Progress::new("sanitize", tools.len() * cases.len());
    for tool in &tools {
        let limit = if *tool == "racecheck" { RACECHECK_TIMEOUT } else { RUN_TIMEOUT };
        for case in &cases {
            let log = out.join(format!("sanitizer_{tool}_{}.txt", case.name));
            let Some((_, program)) = programs.iter().find(|(p, _)| *p == case.program) else { unreachable!() };
            let mut cmd = Command::new(&sanitizer);
            cmd.args(["--tool", tool]).arg(program).args(&case.args);
            cmd.envs(case.env.iter().copied());
            if case.program == Program::Gpu {
                cmd.env("KDA_FIXTURES", &fixtures);
            }
            progress.out(&format!("== {tool} on {} ...", case.name));
            progress.show(&format!("{tool} on {}", case.name));
            let (finished, text) = run_logged(&mut cmd, limit, &log)?;
            let o = Outcome { tool, case: case.name.clone(), summary: summary_line(&text).map(String::from), finished };
            progress.out(&format!(
                "   {tool:<9} {:<36} {}; {}",
                o.case,
                o.summary.as_deref().unwrap_or("no summary line"),
                finished.describe()
            ));
            if !o.clean() {
                progress.out(&abridge(&text, 60, 60));
            }
            progress.skip(1);
            outcomes.push(o);
        }
    }
    drop(progress);
    println!("\n{}", table(&tools, &outcomes));
    let failed: Vec<String> =
        outcomes.iter().filter(|o| !o.clean()).map(|o| format!("{} on {}", o.tool, o.case)).collect();
    if failed.is_empty() {
        println!("sanitize: {} runs, no errors or hazards (logs in {})", outcomes.len(), out.display());
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

    fn all_cases() -> Vec<Case> {
        let input = |name: &str| PathBuf::from(format!("/in/{name}"));
        cases(&Files { input: &input, output: Path::new("/out.st") })
    }

    fn names(cases: &[Case]) -> Vec<&str> {
        cases.iter().map(|c| c.name.as_str()).collect()
    }

    #[test]
    fn every_kernel_variant_is_a_case() {
        let all = all_cases();
        let names = names(&all);
        let unique: std::collections::BTreeSet<_> = names.iter().collect();
        assert_eq!(unique.len(), names.len(), "case names are unique: {names:?}");
        // Hopper: 3 KDA inputs and 5 models in two widths, K = 256 narrow; 3 splits on both
        // kernels; portable on the 3 KDA inputs and 6 models, and on the 3 KDA inputs in two
        // groups; baseline on the 3 KDA inputs; 4 layers on two modules; the test.
        assert_eq!(all.len(), 8 * 2 + 1 + 3 * 2 + 9 + 3 + 3 + 4 * 2 + 1);
        for name in ["ragged_h3_wide", "ragged_many_narrow", "gdn_k256_v512_narrow", "split_tails_split2"] {
            assert!(names.contains(&name), "{name} in {names:?}");
        }
        assert!(!names.contains(&"gdn_k256_v512_wide"));
        let find = |name: &str| all.iter().find(|c| c.name == name).unwrap();
        let args = |c: &Case| c.args.iter().map(|a| a.to_string_lossy().into_owned()).collect::<Vec<_>>().join(" ");
        let c = find("kda_k64_wide");
        assert_eq!(
            (c.program, args(c), c.env.clone()),
            (Program::Kda, "run --inputs /in/models/kda_k64 --out /out.st --columns wide".into(), vec![])
        );
        let c = find("ragged_h3_split1");
        assert_eq!(args(c), "run --inputs /in/ragged_h3 --out /out.st --split 1");
        let c = find("ragged_h3_portable_split1");
        assert_eq!(
            (args(c), c.env.clone()),
            ("run --inputs /in/ragged_h3 --out /out.st --split 1".into(), vec![(KERNEL_VAR, "portable")])
        );
        let c = find("gdn_k256_v512_portable_kernel");
        assert_eq!(
            (args(c), c.env.clone()),
            ("run --inputs /in/models/gdn_k256_v512 --out /out.st".into(), vec![(KERNEL_VAR, "portable")])
        );
        let c = find("ragged_many_portable_groups2");
        assert_eq!(
            (args(c), c.env.clone()),
            ("run --inputs /in/ragged_many --out /out.st --columns wide".into(), vec![(KERNEL_VAR, "portable")])
        );
        let c = find("two_seq_no_h0_baseline");
        assert_eq!(c.env, [(KERNEL_VAR, "baseline")]);
        let c = find("kda_layer_dense_no_h0_layer_portable_module");
        assert_eq!(
            (args(c), c.env.clone()),
            ("layer --inputs /in/layer/kda_layer_dense_no_h0 --out /out.st".into(), vec![(MODULE_VAR, "portable")])
        );
        let c = find("gpu_sanitizer_workload");
        assert_eq!((c.program, args(c)), (Program::Gpu, "--exact --test-threads 1 sanitizer_workload".into()));
        // The baseline runs KDA's slice only.
        let baseline: Vec<_> =
            all.iter().filter(|c| c.env.contains(&(KERNEL_VAR, "baseline"))).map(|c| c.name.as_str()).collect();
        assert_eq!(baseline, ["ragged_h3_baseline", "two_seq_no_h0_baseline", "ragged_many_baseline"]);
    }

    #[test]
    fn tools_and_cases_are_selected() {
        let strings = crate::args::strings;
        assert_eq!(select_tools(&strings(&TOOLS)).unwrap(), TOOLS);
        assert_eq!(select_tools(&strings(&["initcheck", "memcheck", "memcheck"])).unwrap(), ["memcheck", "initcheck"]);
        let e = select_tools(&strings(&["memcheck", "leakcheck"])).unwrap_err();
        assert!(e.contains("unknown tool leakcheck") && e.contains("initcheck"), "{e}");
        assert!(select_tools(&[]).is_err());
        let only = |o: &[&str]| select_cases(all_cases(), &strings(o));
        assert_eq!(only(&[]).unwrap().len(), all_cases().len());
        let split = only(&["_split"]).unwrap();
        assert_eq!(
            names(&split),
            [
                "ragged_h3_split1",
                "ragged_h3_portable_split1",
                "ragged_many_split1",
                "ragged_many_portable_split1",
                "split_tails_split2",
                "split_tails_portable_split2"
            ]
        );
        assert_eq!(only(&["layer_portable"]).unwrap().len(), LAYER_FIXTURES.len());
        // The groups the module docs name cover every case once.
        let groups =
            ["_wide", "_narrow", "_split", "_portable_kernel", "_portable_groups2", "_baseline", "_layer", "gpu_"];
        let sizes: Vec<usize> = groups.iter().map(|g| only(&[g]).unwrap().len()).collect();
        assert_eq!(sizes, [8, 9, 6, 9, 3, 3, 8, 1]);
        assert_eq!(sizes.iter().sum::<usize>(), all_cases().len());
        assert_eq!(only(&["_split", "_baseline", "gpu_"]).unwrap().len(), 10);
        let e = only(&["_wide", "hoper"]).unwrap_err();
        assert!(e.contains("no case matches --only hoper") && e.contains("ragged_h3_wide"), "{e}");
    }

    #[test]
    fn the_table_has_a_row_per_case_and_a_column_per_tool() {
        let done = |code, secs| Finished { code: Some(code), timed_out: false, secs };
        let o = |tool, case: &str, summary: Option<&str>, finished| Outcome {
            tool,
            case: case.into(),
            summary: summary.map(String::from),
            finished,
        };
        let outcomes = [
            o("memcheck", "a", Some("ERROR SUMMARY: 0 errors"), done(0, 1.0)),
            o("memcheck", "b", Some("ERROR SUMMARY: 2 errors"), done(1, 1.0)),
            o("racecheck", "a", Some("RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)"), done(0, 9.0)),
            o("racecheck", "b", None, Finished { code: None, timed_out: true, secs: 300.0 }),
        ];
        let t = table(&["memcheck", "racecheck", "initcheck"], &outcomes);
        assert_eq!(
            t,
            "| case | memcheck | racecheck | initcheck |\n|---|---|---|---|\n\
             | a | 0 errors | 0 hazards displayed (0 errors, 0 warnings) | - |\n\
             | b | FAIL: 2 errors | FAIL: no summary, timed out after 300.0 s | - |\n"
        );
        // A clean summary from a run that failed is no pass.
        assert!(!o("memcheck", "c", Some("ERROR SUMMARY: 0 errors"), done(1, 1.0)).clean());
    }
}

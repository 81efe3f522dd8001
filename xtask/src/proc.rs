//! Child processes under a timeout, and where things are: the repository root, the bundle's
//! binaries, CUDA tools, scratch space, files written whole.
//!
//! A timed child runs in its own process group, so that on timeout the whole group (ncu or
//! compute-sanitizer and the `kda` process under it) is killed and a hang is reported instead of
//! using up the device time.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How often a waiting parent looks at its child.
const POLL: Duration = Duration::from_millis(50);

/// How a timed child ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Finished {
    /// Exit status; `None` when a signal ended it (or the timeout did).
    pub code: Option<i32>,
    /// Killed at the timeout.
    pub timed_out: bool,
    /// Wall time in seconds.
    pub secs: f64,
}

impl Finished {
    /// Exited with status 0 in time.
    pub fn ok(&self) -> bool {
        !self.timed_out && self.code == Some(0)
    }

    /// The exit status to pass on: the child's, 124 on timeout (as `timeout(1)`), 128 on a signal.
    pub fn exit_code(&self) -> u8 {
        match (self.timed_out, self.code) {
            (true, _) => 124,
            (false, Some(c)) => u8::try_from(c).unwrap_or(1),
            (false, None) => 128,
        }
    }

    /// `rc=0 in 1.2 s`, `timed out after 60.0 s`, `killed by a signal after 3.0 s`.
    pub fn describe(&self) -> String {
        match (self.timed_out, self.code) {
            (true, _) => format!("timed out after {:.1} s", self.secs),
            (false, Some(c)) => format!("rc={c} in {:.1} s", self.secs),
            (false, None) => format!("killed by a signal after {:.1} s", self.secs),
        }
    }
}

/// Runs `cmd` for at most `limit`. Its stdout and stderr go to `log` (created afresh, both
/// streams into the one file) or, without one, to ours. On timeout the child's process group is
/// killed.
pub fn run_timed(cmd: &mut Command, limit: Duration, log: Option<&Path>) -> Result<Finished, String> {
    let what = describe(cmd);
    if let Some(log) = log {
        if let Some(dir) = log.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        let out = File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
        let err = out.try_clone().map_err(|e| format!("{}: {e}", log.display()))?;
        cmd.stdout(out).stderr(err);
    }
    cmd.stdin(Stdio::null()).process_group(0);
    let t0 = Instant::now();
    let mut child = cmd.spawn().map_err(|e| format!("cannot start {what}: {e}"))?;
    loop {
        if let Some(status) = child.try_wait().map_err(|e| format!("{what}: {e}"))? {
            return Ok(Finished { code: status.code(), timed_out: false, secs: t0.elapsed().as_secs_f64() });
        }
        if t0.elapsed() >= limit {
            // The group's id is the child's pid (process_group(0)).
            let _ = Command::new("kill")
                .args(["-s", "KILL", "--", &format!("-{}", child.id())])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            let _ = child.kill();
            let _ = child.wait();
            return Ok(Finished { code: None, timed_out: true, secs: t0.elapsed().as_secs_f64() });
        }
        std::thread::sleep(POLL);
    }
}

/// Runs `cmd` under `limit` with its output in `log`, and returns the finish and the log's text.
pub fn run_logged(cmd: &mut Command, limit: Duration, log: &Path) -> Result<(Finished, String), String> {
    let f = run_timed(cmd, limit, Some(log))?;
    let bytes = std::fs::read(log).map_err(|e| format!("{}: {e}", log.display()))?;
    Ok((f, String::from_utf8_lossy(&bytes).into_owned()))
}

/// One log file gathering the logs of many runs, appended to as each run ends (so a session cut
/// short still leaves what ran). A device call returns at most 8 files, so commands leave one
/// combined log rather than a file per run.
pub struct Combined(pub PathBuf);

impl Combined {
    /// Starts `path` afresh.
    pub fn create(path: PathBuf) -> Result<Self, String> {
        std::fs::write(&path, "").map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(Self(path))
    }

    /// Appends `text`.
    pub fn append(&self, text: &str) -> Result<(), String> {
        use std::io::Write;
        let mut f =
            std::fs::OpenOptions::new().append(true).open(&self.0).map_err(|e| format!("{}: {e}", self.0.display()))?;
        f.write_all(text.as_bytes()).map_err(|e| format!("{}: {e}", self.0.display()))
    }

    /// Appends the log of run `name` (command `what`, ended as `f`) between two marker lines.
    pub fn run(&self, name: &str, what: &str, f: &Finished, log: &str) -> Result<(), String> {
        let nl = if log.is_empty() || log.ends_with('\n') { "" } else { "\n" };
        self.append(&format!("######## {name}: {what}\n{log}{nl}######## {name}: {}\n", f.describe()))
    }
}

/// The program and arguments of `cmd`, for progress lines.
pub fn describe(cmd: &Command) -> String {
    std::iter::once(cmd.get_program()).chain(cmd.get_args()).map(|a| a.to_string_lossy()).collect::<Vec<_>>().join(" ")
}

/// `text` if it has at most `head + tail` lines, else its first `head` and last `tail` lines
/// around a line saying how many were left out.
pub fn abridge(text: &str, head: usize, tail: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    if lines.len() <= head + tail {
        return lines.join("\n");
    }
    let cut = lines.len() - head - tail;
    format!("{}\n[... {cut} lines ...]\n{}", lines[..head].join("\n"), lines[lines.len() - tail..].join("\n"))
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The repository root: the current directory when it holds `tests/fixtures` (a GPU machine
/// runs the bundle from there), else the workspace this binary was built in.
pub fn repo_root() -> PathBuf {
    let cwd = std::env::current_dir().unwrap_or_else(|_| ".".into());
    if cwd.join("tests/fixtures").is_dir() {
        return cwd;
    }
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    if built.join("tests/fixtures").is_dir() { built } else { cwd }
}

/// The bundle directory: `--bundle DIR`, else the directory of this executable.
pub fn bundle_dir(given: Option<&str>) -> Result<PathBuf, String> {
    match given {
        Some(d) => Ok(d.into()),
        None => {
            let exe = std::env::current_exe().map_err(|e| format!("cannot locate this executable: {e}"))?;
            Ok(exe.parent().map(Path::to_path_buf).unwrap_or_else(|| ".".into()))
        }
    }
}

/// Binary `name` of the bundle in `dir`, which must exist.
pub fn bundle_bin(dir: &Path, name: &str) -> Result<PathBuf, String> {
    let p = dir.join(name);
    if p.is_file() {
        Ok(p)
    } else {
        Err(format!(
            "{} not found: build the bundle with `cargo xtask bundle` where Rust is and carry target/gpu-bundle \
             here, or pass --bundle DIR",
            p.display()
        ))
    }
}

/// A CUDA command-line tool (`ncu`, `compute-sanitizer`): on `PATH`, else under
/// `/usr/local/cuda/bin`, else the bare name (the error then names it).
pub fn cuda_cli(name: &str) -> PathBuf {
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).map(|d| d.join(name)).find(|c| c.is_file()))
        .unwrap_or_default();
    let cuda = Path::new("/usr/local/cuda/bin").join(name);
    on_path.or_else(|| cuda.is_file().then_some(cuda)).unwrap_or_else(|| name.into())
}

/// A scratch directory for large input and output files, removed when dropped (they never land
/// in the output directory, whose files travel back from the GPU machine).
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Result<Self, String> {
        let dir = std::env::temp_dir().join(format!("kda-xtask-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        Ok(Self(dir))
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Creates `dir` (and its parents).
pub fn create_dir(dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))
}

/// Writes `text` to `path`, replacing it atomically (`kda_kernel::builder::replace_atomically`):
/// an interrupted run never leaves a truncated record where a good one was.
pub fn write_text(path: &Path, text: &str) -> Result<(), String> {
    kda_kernel::builder::replace_atomically(path, |temp| {
        std::fs::write(temp, text).map_err(|e| format!("{}: {e}", temp.display()))
    })
}

/// Writes `doc` to `path` as pretty-printed JSON with a final newline.
pub fn write_json(path: &Path, doc: &serde_json::Value) -> Result<(), String> {
    let text = serde_json::to_string_pretty(doc).map_err(|e| e.to_string())? + "\n";
    write_text(path, &text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hang_is_killed_at_the_timeout() {
        let f = run_timed(Command::new("sleep").arg("5"), Duration::from_secs(1), None).unwrap();
        assert!(f.timed_out && !f.ok(), "{f:?}");
        assert!(f.secs >= 1.0 && f.secs < 3.0, "{f:?}");
        assert_eq!(f.exit_code(), 124);
        assert!(f.describe().starts_with("timed out"));
    }

    #[test]
    fn the_whole_process_group_is_killed() {
        // A shell that starts a grandchild (as ncu starts `kda`): killing only the shell would
        // leave `sleep` running.
        let dir = Scratch::new("test-group").unwrap();
        let log = dir.join("log.txt");
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "sleep 30 & echo $!; wait; echo never"]);
        let (f, text) = run_logged(&mut cmd, Duration::from_secs(1), &log).unwrap();
        assert!(f.timed_out);
        let pid: u32 = text.trim().parse().unwrap_or_else(|_| panic!("log: {text:?}"));
        std::thread::sleep(Duration::from_millis(200));
        // Gone, or a zombie waiting for a reaper.
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat.rsplit_once(')').map(|(_, rest)| rest.trim_start().chars().next());
        assert!(matches!(state, None | Some(Some('Z' | 'X'))), "grandchild {pid} still alive: {stat}");
    }

    #[test]
    fn status_and_output_come_back() {
        let dir = Scratch::new("test-status").unwrap();
        let log = dir.join("sub/log.txt");
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo out; echo err >&2; exit 3"]);
        let (f, text) = run_logged(&mut cmd, Duration::from_secs(10), &log).unwrap();
        assert_eq!((f.code, f.timed_out, f.exit_code()), (Some(3), false, 3));
        assert_eq!(f.describe().split(' ').next(), Some("rc=3"));
        assert!(text.contains("out") && text.contains("err"), "{text}");
        assert!(run_timed(&mut Command::new("/nonexistent/x"), Duration::from_secs(1), None).is_err());
    }

    #[test]
    fn tail_keeps_the_last_lines() {
        assert_eq!(tail("a\nb\nc\n", 2), "b\nc");
        assert_eq!(tail("a", 5), "a");
        assert_eq!(abridge("1\n2\n3\n4\n5\n", 1, 2), "1\n[... 2 lines ...]\n4\n5");
        assert_eq!(abridge("1\n2\n3\n", 1, 2), "1\n2\n3");
    }

    #[test]
    fn a_combined_log_gathers_runs() {
        let dir = Scratch::new("test-combined").unwrap();
        let c = Combined::create(dir.join("all.log")).unwrap();
        let f = Finished { code: Some(0), timed_out: false, secs: 1.0 };
        c.run("one", "echo 1", &f, "1\n").unwrap();
        c.run("two", "printf 2", &f, "2").unwrap();
        let text = std::fs::read_to_string(dir.join("all.log")).unwrap();
        assert_eq!(
            text,
            "######## one: echo 1\n1\n######## one: rc=0 in 1.0 s\n######## two: printf 2\n2\n######## two: rc=0 in 1.0 s\n"
        );
    }
}

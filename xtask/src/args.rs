//! A small command-line parser: `--flag VALUE` (or `--flag=VALUE`), `--switch`, positional
//! arguments, and everything after `--` passed through as positional.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

/// Parsed arguments of one subcommand.
#[derive(Debug, Default)]
pub struct Args {
    /// `(flag, value)` in the order given; a switch has no value.
    flags: Vec<(String, Option<String>)>,
    /// Arguments that are not flags, in order.
    pub positional: Vec<String>,
}

impl Args {
    /// Parses `args` of subcommand `cmd`, which accepts the flags `valued` (each takes a value)
    /// and `switches` (none); any other `--name` is an error.
    pub fn parse(cmd: &str, args: &[String], valued: &[&str], switches: &[&str]) -> Result<Self, String> {
        let mut out = Args::default();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            if a == "--" {
                out.positional.extend(it.by_ref().cloned());
                break;
            }
            if !a.starts_with("--") {
                out.positional.push(a.clone());
                continue;
            }
            let (name, inline) = match a.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (a.as_str(), None),
            };
            if valued.contains(&name) {
                let value = match inline {
                    Some(v) => v,
                    None => it.next().cloned().ok_or_else(|| format!("{cmd}: {name} needs a value"))?,
                };
                out.flags.push((name.to_string(), Some(value)));
            } else if switches.contains(&name) && inline.is_none() {
                out.flags.push((name.to_string(), None));
            } else {
                return Err(format!("{cmd}: unexpected argument {a}"));
            }
        }
        Ok(out)
    }

    /// Fails, as subcommand `cmd`, when a positional argument was given (for a command that takes
    /// none).
    pub fn no_positional(&self, cmd: &str) -> Result<(), String> {
        match self.positional.first() {
            Some(p) => Err(format!("{cmd}: unexpected argument {p}")),
            None => Ok(()),
        }
    }

    /// The value of the last `flag` given.
    pub fn value(&self, flag: &str) -> Option<&str> {
        self.flags.iter().rev().find(|(f, _)| f == flag).and_then(|(_, v)| v.as_deref())
    }

    /// Whether switch `flag` was given.
    pub fn has(&self, flag: &str) -> bool {
        self.flags.iter().any(|(f, _)| f == flag)
    }

    /// The value of `flag` parsed as `T`, or `default` when absent.
    pub fn parsed<T: FromStr>(&self, flag: &str, default: T) -> Result<T, String> {
        match self.value(flag) {
            None => Ok(default),
            Some(v) => v.parse().map_err(|_| format!("{flag} {v}: not a valid value")),
        }
    }

    /// A count of at least 1.
    pub fn count(&self, flag: &str, default: usize) -> Result<usize, String> {
        match self.parsed(flag, default)? {
            0 => Err(format!("{flag} needs a count >= 1")),
            n => Ok(n),
        }
    }

    /// A path, or `default`.
    pub fn path(&self, flag: &str, default: impl Into<PathBuf>) -> PathBuf {
        self.value(flag).map(PathBuf::from).unwrap_or_else(|| default.into())
    }

    /// A timeout in whole seconds (at least 1), or `default`.
    pub fn timeout(&self, flag: &str, default: Duration) -> Result<Duration, String> {
        match self.value(flag) {
            None => Ok(default),
            Some(_) => Ok(Duration::from_secs(self.count(flag, 1)? as u64)),
        }
    }

    /// The comma-separated list of `flag`, or `default`.
    pub fn list(&self, flag: &str, default: &[&str]) -> Vec<String> {
        match self.value(flag) {
            None => default.iter().map(|s| s.to_string()).collect(),
            Some(v) => v.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect(),
        }
    }
}

/// Owned arguments, for the tests of every command's parser.
#[cfg(test)]
pub fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_values_switches_and_positional() {
        let a = Args::parse(
            "ab",
            &strings(&["a/kda", "--rounds", "3", "b/kda", "--shapes=tiny,mixed_6", "--quick", "--", "--x", "y"]),
            &["--rounds", "--shapes"],
            &["--quick"],
        )
        .unwrap();
        assert_eq!(a.positional, strings(&["a/kda", "b/kda", "--x", "y"]));
        assert_eq!(a.count("--rounds", 2).unwrap(), 3);
        assert_eq!(a.list("--shapes", &["fixed_8192"]), strings(&["tiny", "mixed_6"]));
        assert!(a.has("--quick"));
        assert_eq!(a.count("--repeat", 100).unwrap(), 100);
        assert_eq!(a.list("--other", &["fixed_8192"]), strings(&["fixed_8192"]));
    }

    #[test]
    fn the_last_value_wins() {
        let a = Args::parse("x", &strings(&["--out", "a", "--out", "b"]), &["--out"], &[]).unwrap();
        assert_eq!(a.path("--out", "c"), PathBuf::from("b"));
    }

    #[test]
    fn errors_name_the_argument() {
        let e = Args::parse("bench", &strings(&["--nope"]), &["--out"], &[]).unwrap_err();
        assert!(e.contains("--nope"), "{e}");
        let e = Args::parse("bench", &strings(&["--out"]), &["--out"], &[]).unwrap_err();
        assert!(e.contains("needs a value"), "{e}");
        let e = Args::parse("x", &strings(&["--quick=1"]), &[], &["--quick"]).unwrap_err();
        assert!(e.contains("--quick=1"), "{e}");
        let a = Args::parse("bench", &strings(&["extra"]), &[], &[]).unwrap();
        assert_eq!(a.no_positional("bench").unwrap_err(), "bench: unexpected argument extra");
        assert!(Args::parse("bench", &[], &[], &[]).unwrap().no_positional("bench").is_ok());
        let a =
            Args::parse("x", &strings(&["--repeat", "0", "--timeout", "z"]), &["--repeat", "--timeout"], &[]).unwrap();
        assert!(a.count("--repeat", 1).is_err());
        assert!(a.timeout("--timeout", Duration::from_secs(5)).is_err());
    }

    #[test]
    fn timeouts_in_seconds() {
        let a = Args::parse("x", &strings(&["--timeout", "90"]), &["--timeout"], &[]).unwrap();
        assert_eq!(a.timeout("--timeout", Duration::from_secs(5)).unwrap(), Duration::from_secs(90));
        let a = Args::parse("x", &[], &["--timeout"], &[]).unwrap();
        assert_eq!(a.timeout("--timeout", Duration::from_secs(5)).unwrap(), Duration::from_secs(5));
    }
}

//! Progress of a long run over a known number of items (a bench's shapes, an A/B's runs, the
//! sanitizer's cases): on a terminal an `indicatif` bar (items done, elapsed time, estimate of
//! what is left, the current item and its stage) with each finished item's line printed above
//! it; in a log (stderr not a terminal) the same lines as plain text, each stage appended to the
//! item's line as it starts, so a log read later shows where a run stopped.

use indicatif::{ProgressBar, ProgressStyle};
use std::cell::RefCell;
use std::io::IsTerminal;

/// The bar's layout: what it counts, the bar, items done of all, elapsed, estimate, message.
const BAR_TEMPLATE: &str = "{prefix} [{bar:28}] {pos}/{len} {elapsed_precise} (about {eta} left) {msg}";

/// A run's progress over its items ([module docs](self)).
pub struct Progress {
    bar: Option<ProgressBar>,
    /// The item under way.
    current: RefCell<String>,
}

impl Progress {
    /// Progress over `items` items of a run called `what` (the bar's prefix): a bar when stderr
    /// is a terminal, plain lines otherwise.
    pub fn new(what: &str, items: usize) -> Self {
        Self::with_bar(std::io::stderr().is_terminal(), what, items)
    }

    /// [`Progress::new`], a bar or plain lines as `bar` says.
    fn with_bar(bar: bool, what: &str, items: usize) -> Self {
        let bar = bar.then(|| {
            let b = ProgressBar::new(items as u64);
            if let Ok(style) = ProgressStyle::with_template(BAR_TEMPLATE) {
                b.set_style(style.progress_chars("=> "));
            }
            b.set_prefix(what.to_string());
            b
        });
        Self { bar, current: RefCell::new(String::new()) }
    }

    /// Starts item `name`.
    pub fn start(&self, name: &str) {
        *self.current.borrow_mut() = name.to_string();
        match &self.bar {
            Some(b) => b.set_message(name.to_string()),
            None => eprint!("[{name}]"),
        }
    }

    /// The current item reached `stage` (`generating inputs`, `reference`, ..).
    pub fn stage(&self, stage: &str) {
        match &self.bar {
            Some(b) => b.set_message(format!("{}: {stage}", self.current.borrow())),
            None => eprint!(" {stage} ..."),
        }
    }

    /// Ends the current item with `outcome` (`done in 5.3 s`), a line in both forms.
    pub fn finish(&self, outcome: &str) {
        match &self.bar {
            Some(b) => {
                b.println(format!("[{}] {outcome}", self.current.borrow()));
                b.inc(1);
            }
            None => eprintln!(" {outcome}"),
        }
    }

    /// Item `name` as one step: started, at `stage` while `work` runs, finished with its time
    /// or its error; `work`'s result returned.
    pub fn item<T, E: std::fmt::Display>(
        &self,
        name: &str,
        stage: &str,
        work: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        let t0 = std::time::Instant::now();
        self.start(name);
        self.stage(stage);
        let result = work();
        self.finish(&match &result {
            Ok(_) => format!("done in {:.1} s", t0.elapsed().as_secs_f64()),
            Err(e) => format!("failed: {e}"),
        });
        result
    }

    /// A line of its own (above the bar on a terminal).
    pub fn line(&self, text: &str) {
        match &self.bar {
            Some(b) => b.println(text),
            None => eprintln!("{text}"),
        }
    }

    /// `message` beside the bar (what runs now), nothing in plain lines: for runs that print
    /// their own line per item ([`Progress::out`]) and count it with [`Progress::skip`].
    pub fn show(&self, message: &str) {
        if let Some(b) = &self.bar {
            b.set_message(message.to_string());
        }
    }

    /// `text` on stdout (a table, a result), the bar set aside while it prints.
    pub fn out(&self, text: &str) {
        match &self.bar {
            Some(b) => b.suspend(|| println!("{text}")),
            None => println!("{text}"),
        }
    }

    /// Counts `n` items done that took no [`Progress::start`] (skipped, or counted in bulk).
    pub fn skip(&self, n: usize) {
        if let Some(b) = &self.bar {
            b.inc(n as u64);
        }
    }

    /// Items counted so far (0 without a bar: nothing is counted then).
    #[cfg(test)]
    fn done(&self) -> u64 {
        self.bar.as_ref().map_or(0, ProgressBar::position)
    }
}

impl Drop for Progress {
    /// The bar leaves the terminal; the lines printed above it stay.
    fn drop(&mut self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bar_counts_finished_and_skipped_items() {
        let p = Progress::with_bar(true, "bench", 5);
        p.start("fixed_8192");
        p.stage("reference");
        assert_eq!(p.done(), 0, "a stage counts nothing");
        p.finish("done in 1.0 s");
        p.skip(2);
        assert_eq!(p.done(), 3);
        assert_eq!(*p.current.borrow(), "fixed_8192");
        assert_eq!(p.item("tiny", "timing", || Ok::<_, String>(7)), Ok(7));
        assert_eq!(p.item("huge", "timing", || Err::<u8, _>("refused".to_string())), Err("refused".into()));
        assert_eq!(p.done(), 5, "an item counts whether it succeeds or fails");
        assert_eq!(*p.current.borrow(), "huge");
    }

    #[test]
    fn plain_lines_count_nothing() {
        let p = Progress::with_bar(false, "bench", 5);
        p.start("tiny");
        p.finish("done in 0.1 s");
        assert_eq!(p.done(), 0);
    }
}

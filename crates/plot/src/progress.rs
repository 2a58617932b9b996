//! Progress on long work (solves, sweeps, calibration, demo and benchmark
//! runs): an indicatif spinner or bar on stderr with the elapsed time, shown
//! only when stdout is a terminal, so piped and scripted runs (and `--json`,
//! and benchmark tables redirected into a file) print exactly what they did
//! before. The `sidecore` binary and the benchmarks share it.

use std::io::IsTerminal as _;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

/// How often a shown bar redraws itself.
const TICK: Duration = Duration::from_millis(120);

/// A spinner or bar, or nothing when stdout is not a terminal.
pub struct Progress(Option<ProgressBar>);

impl Progress {
    /// A spinner for work whose length is unknown.
    pub fn spinner(message: impl Into<String>) -> Progress {
        Self::make(
            || {
                let p = ProgressBar::new_spinner();
                p.set_style(
                    ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
                        .unwrap_or_else(|_| ProgressStyle::default_spinner()),
                );
                p
            },
            message,
        )
    }

    /// A bar over `len` steps.
    pub fn bar(len: u64, message: impl Into<String>) -> Progress {
        Self::make(
            || {
                let p = ProgressBar::new(len);
                p.set_style(
                    ProgressStyle::with_template(
                        "{msg} [{bar:30}] {pos}/{len} ({elapsed}, {eta} left)",
                    )
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> "),
                );
                p
            },
            message,
        )
    }

    fn make(new: impl FnOnce() -> ProgressBar, message: impl Into<String>) -> Progress {
        if !std::io::stdout().is_terminal() {
            return Progress(None);
        }
        let p = new();
        p.set_message(message.into());
        p.enable_steady_tick(TICK);
        Progress(Some(p))
    }

    /// True when it is drawn (stdout is a terminal).
    pub fn shown(&self) -> bool {
        self.0.is_some()
    }

    /// What is being done now (the count stays).
    pub fn say(&self, message: impl Into<String>) {
        if let Some(p) = &self.0 {
            p.set_message(message.into());
        }
    }

    /// One step done, with what comes next.
    pub fn step(&self, message: impl Into<String>) {
        if let Some(p) = &self.0 {
            p.inc(1);
            p.set_message(message.into());
        }
    }

    /// Runs `f` (which prints) with the bar hidden meanwhile.
    pub fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        match &self.0 {
            Some(p) => p.suspend(f),
            None => f(),
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(p) = &self.0 {
            p.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_the_terminal_it_draws_nothing_and_still_runs_what_it_wraps() {
        // Test output is captured: stdout is not a terminal here.
        let b = Progress::bar(3, "x");
        assert!(!b.shown());
        b.say("y");
        b.step("z");
        assert_eq!(b.suspend(|| 7), 7);
    }
}

//! Progress on long work (solves, sweeps, calibration, demo rows): an
//! indicatif spinner or bar on stderr with the elapsed time, shown only when
//! stdout is a terminal, so piped and scripted runs (and `--json`) print
//! exactly what they did before.

use std::io::IsTerminal as _;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

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
        p.enable_steady_tick(Duration::from_millis(120));
        Progress(Some(p))
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

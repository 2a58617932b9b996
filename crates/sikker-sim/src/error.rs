//! What can go wrong when a simulator is asked to run: an option out of range
//! (named as the command line spells it) or a plot that cannot be written.

use std::path::PathBuf;

/// An error of a simulator run.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// An option is out of range; `option` is its command-line name (`--checks`).
    #[error("{option}: {message}")]
    BadOption {
        /// The option, as `sidecore sim` spells it.
        option: &'static str,
        /// What is wrong with its value.
        message: String,
    },
    /// A plot could not be drawn or written.
    #[error("plotting {}: {message}", path.display())]
    Plot {
        /// The file being written.
        path: PathBuf,
        /// The drawing back end's error.
        message: String,
    },
    /// The plot directory could not be created.
    #[error("--plots {}: {source}", path.display())]
    PlotDir {
        /// The directory.
        path: PathBuf,
        /// Why it could not be created.
        source: std::io::Error,
    },
}

/// A [`SimError::BadOption`].
pub(crate) fn bad(option: &'static str, message: impl Into<String>) -> SimError {
    SimError::BadOption {
        option,
        message: message.into(),
    }
}

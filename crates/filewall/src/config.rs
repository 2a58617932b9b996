//! The error every configuration file reader returns: `file:line: message`.

/// A configuration file error: `file:line: message` (line 0: the file as a whole).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}{}: {message}", if *line == 0 { String::new() } else { format!(":{line}") })]
pub struct ConfigError {
    pub file: String,
    pub line: usize,
    pub message: String,
}

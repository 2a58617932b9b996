//! Orion's error type: every variant says what went wrong and where (box, sensor, file).

use std::path::PathBuf;

/// What can go wrong in a Sensor Box, a monitor, a lock or a repair.
#[derive(Debug, thiserror::Error)]
pub enum OrionError {
    /// A sensor registration the box refuses (bad name, kind or size).
    #[error("sensor box `{sb}`: malformed sensor registration `{name}`: {why}")]
    BadSensor {
        /// The box.
        sb: String,
        /// The name as given (lossy).
        name: String,
        /// What is wrong with it.
        why: String,
    },
    /// Every sensor slot of the box is taken.
    #[error(
        "sensor box `{sb}` is full: all {capacity} sensor slots are registered (remove one or create the box with more sensors)"
    )]
    TooManySensors {
        /// The box.
        sb: String,
        /// Its sensor capacity.
        capacity: u32,
    },
    /// The event log of the box holds `capacity` records the monitor has not flushed.
    #[error(
        "sensor box `{sb}` is full: its event log holds {capacity} records not yet flushed by a monitor; update of sensor {sensor} dropped"
    )]
    BoxFull {
        /// The box.
        sb: String,
        /// The sensor whose update was dropped.
        sensor: u32,
        /// The log's capacity.
        capacity: u32,
    },
    /// A sensor handle that no longer names a live sensor (removed, or from another box).
    #[error("sensor box `{sb}`: sensor {sensor} is not registered (removed, or never added)")]
    NoSuchSensor {
        /// The box.
        sb: String,
        /// The sensor id.
        sensor: u32,
    },
    /// A value of the wrong shape for its sensor's kind.
    #[error("sensor box `{sb}`: sensor {sensor} is a {kind} sensor; {why}")]
    WrongValue {
        /// The box.
        sb: String,
        /// The sensor id.
        sensor: u32,
        /// The sensor's kind.
        kind: &'static str,
        /// What is wrong.
        why: String,
    },
    /// Bad parameters to `sbcreate`.
    #[error("sbcreate `{sb}`: {why}")]
    BadParams {
        /// The box.
        sb: String,
        /// What is wrong.
        why: String,
    },
    /// Memory that is not a Sensor Box of this version.
    #[error("{what}: not a sensor box: {why}")]
    NotABox {
        /// Where it came from.
        what: String,
        /// Why it is refused.
        why: String,
    },
    /// No exported box of that name.
    #[error("sbdiscover: no sensor box `{name}` exported in {dir}{why}")]
    NotExported {
        /// The name asked for.
        name: String,
        /// The export directory.
        dir: PathBuf,
        /// Extra detail (the exporting process is gone, …).
        why: String,
    },
    /// A file could not be read, written or parsed.
    #[error("{path}: {why}")]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        why: String,
    },
    /// A system call failed.
    #[error("{what}: {source}")]
    Sys {
        /// What was being done.
        what: String,
        /// The error.
        source: std::io::Error,
    },
    /// The cgroup did not report `frozen 1` in time.
    #[error("{cgroup}: not frozen within {timeout_ms} ms (thawed again)")]
    FreezeTimeout {
        /// The cgroup directory.
        cgroup: PathBuf,
        /// The timeout.
        timeout_ms: u64,
    },
    /// A setting out of range (thresholds, periods, ring parameters).
    #[error("{what}: {why}")]
    Config {
        /// The setting.
        what: String,
        /// What is wrong.
        why: String,
    },
}

impl OrionError {
    /// A failed system call, with what was being done.
    pub fn sys(what: impl Into<String>, source: impl Into<std::io::Error>) -> Self {
        OrionError::Sys {
            what: what.into(),
            source: source.into(),
        }
    }

    /// A file error, with the path.
    pub fn file(path: impl Into<PathBuf>, why: impl std::fmt::Display) -> Self {
        OrionError::File {
            path: path.into(),
            why: why.to_string(),
        }
    }
}

//! The small types every part of the offcode model speaks: the error an
//! offcode reports, port indices, and what a turn achieved. The ground floor
//! of this crate.

/// Errors an offcode reports to the runtime.
#[derive(Debug, thiserror::Error)]
pub enum OffcodeError {
    #[error("parameter error: {0}")]
    Params(String),
    #[error("no {direction} port named `{port}` (this offcode has: {known})")]
    UnknownPort {
        direction: &'static str,
        port: String,
        known: String,
    },
    #[error("cannot send before start (peers may not exist yet)")]
    NotStarted,
    #[error(transparent)]
    Send(#[from] sidecore_channel::SendError),
    #[error("channel: {0}")]
    Channel(String),
    #[error("call: {0}")]
    Call(#[from] sidecore_channel::call::CallError),
    #[error("{0}")]
    Failed(String),
}

impl OffcodeError {
    /// A free-form failure.
    pub fn failed(msg: impl Into<String>) -> Self {
        OffcodeError::Failed(msg.into())
    }
}

/// Index of an input port, resolved from its name at initialize time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct InputId(pub usize);

/// Index of an output port, resolved from its name at initialize time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OutputId(pub usize);

/// What a turn of [`Offcode::poll`] achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Did work; call again soon.
    Busy,
    /// Nothing to do now.
    Idle,
    /// Finished for good: the runtime stops it.
    Done,
}

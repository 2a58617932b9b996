//! The offcode programming model (HYDRA §4.1, §5.2), in Rust.
//!
//! An offcode has state, ports and its own thread of control, which the
//! runtime drives through the [`Offcode`] trait:
//!
//! 1. [`Offcode::initialize`] as it lands on its PE: local resources only
//!    (parameters, memory, port names); peers may not exist yet.
//! 2. [`Offcode::start`] once every related offcode is in place: channels are
//!    connected and sending is allowed.
//! 3. [`Offcode::handle`] for each message on an input, and [`Offcode::poll`]
//!    on every turn of the run-to-completion loop (sources produce here).
//! 4. [`Offcode::stop`] when it is taken down.
//!
//! HYDRA's COM-style vtables, `AddRef`/`Release` and `QueryInterface` become a
//! trait object, `Arc` and typed contexts; its pseudo-offcodes (heap, channel
//! executive, runtime) become the capabilities the contexts hand out.
//! Implementations are found by name in a [`Registry`] (HYDRA's offcode
//! library), per PE kind.

mod context;
mod ports;
mod registry;

pub use context::parse_params;
pub use context::{InitCx, Metric, Metrics, OffcodeInfo, RunCx};
pub use ports::{Drained, Inlet, Outlet};
pub use registry::{BuildSpec, Factory, ImplError, Implementation, Registry, Validator};

use sidecore_channel::oob::OobMessage;

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

/// A unit of offloaded functionality.
pub trait Offcode: Send {
    /// Phase 1: acquire local resources. Peers may not be placed yet.
    fn initialize(&mut self, cx: &mut InitCx<'_>) -> Result<(), OffcodeError>;

    /// Phase 2: every related offcode is in place and channels are connected.
    fn start(&mut self, _cx: &mut RunCx<'_>) -> Result<(), OffcodeError> {
        Ok(())
    }

    /// One message arrived on `input` (read in place: zero copy).
    fn handle(
        &mut self,
        _cx: &mut RunCx<'_>,
        input: InputId,
        _msg: &[u8],
    ) -> Result<(), OffcodeError> {
        Err(OffcodeError::failed(format!(
            "got a message on input {} but handles none",
            input.0
        )))
    }

    /// A burst of up to `max` messages is waiting on `input`: the runtime hands the
    /// inlet over so an offcode that works on batches can take them as one (read in
    /// place, in order). The default calls [`Offcode::handle`] per message.
    fn handle_burst(
        &mut self,
        cx: &mut RunCx<'_>,
        input: InputId,
        inlet: &mut Inlet,
        max: usize,
    ) -> Result<Drained, OffcodeError> {
        inlet.drain(max, |m| self.handle(cx, input, m))
    }

    /// A turn of the run-to-completion loop; sources produce here.
    fn poll(&mut self, _cx: &mut RunCx<'_>) -> Result<Progress, OffcodeError> {
        Ok(Progress::Idle)
    }

    /// A message on the out-of-band channel; may answer with a value.
    fn control(
        &mut self,
        _cx: &mut RunCx<'_>,
        _msg: &OobMessage,
    ) -> Result<Option<serde_json::Value>, OffcodeError> {
        Ok(None)
    }

    /// Taken down: release what `initialize` acquired.
    fn stop(&mut self, _cx: &mut RunCx<'_>) -> Result<(), OffcodeError> {
        Ok(())
    }
}

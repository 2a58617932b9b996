//! The [`Offcode`] trait: the life cycle the runtime drives an offcode
//! through (initialize, start, handle, serve, poll, control, stop).

use sidecore_channel::oob::OobMessage;

use crate::basics::{InputId, OffcodeError, Progress};
use crate::calls::{CallFault, IncomingCall};
use crate::context::{InitCx, RunCx};
use crate::ports::{Drained, Inlet};

/// Messages the runtime hands an offcode from one input in one turn, at most.
pub const TURN_BURST: usize = 256;

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

    /// A call on an interface this offcode provides (HYDRA §5.5). Return the
    /// encoded result ([`crate::encode_result`]; empty for a method with no
    /// return value) or the fault the caller gets. The runtime moves the call
    /// to ACKED before this runs (for an extended call) and to FINISHED with
    /// what it returns.
    fn serve(
        &mut self,
        _cx: &mut RunCx<'_>,
        _call: &IncomingCall<'_>,
    ) -> Result<Vec<u8>, CallFault> {
        Err(CallFault::NOT_SERVED)
    }

    /// The worst-case time of its next turn, ns, if it knows it (a Wasm
    /// handler's static bound times the burst): the ticket a shared core's
    /// <EDF>++ dispatcher fits into the slack (HYDRA §6.3.3). `None` lets the
    /// runtime use the manifest's `wcet_us` or what it has measured.
    fn ticket_ns(&self) -> Option<u64> {
        None
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

//! The provider's side of calls (HYDRA §5.5): each request on a serve port is
//! parsed, moved to ACKED (for an extended call) before the offcode's
//! [`Offcode::serve`] runs, and to FINISHED with what it returned. Both status
//! changes travel back on the binding's reply channel, where the caller's
//! [`sidecore_offcode::Calls`] applies them to its call table.

use sidecore_channel::call::{
    CallId, CallStatus, Invocation, REPLY_HEADER, Reply, parse_request, write_reply,
};
use sidecore_channel::{SendError, SendOutcome};
use sidecore_offcode::{
    CallFault, Drained, IncomingCall, Inlet, Offcode, OffcodeError, OutputId, RunCx,
};
use sidecore_types::calls::CallPortSpec;

/// Serves up to `room / 2` requests waiting on `inlet` (each sends up to two
/// replies, and `room` is what the outputs can take this turn).
pub fn serve_burst(
    offcode: &mut dyn Offcode,
    cx: &mut RunCx<'_>,
    spec: &CallPortSpec,
    inlet: &mut Inlet,
    room: usize,
) -> Result<Drained, OffcodeError> {
    let out = OutputId(spec.output);
    inlet.drain(room / 2, |msg| {
        if msg.is_empty() {
            // Abandoned by its caller: the arguments did not encode.
            return Ok(());
        }
        let req = parse_request(msg).map_err(|e| {
            OffcodeError::Channel(format!(
                "call from `{}` on `{}`: {e}",
                spec.peer, spec.interface
            ))
        })?;
        let Some(m) = spec.method_by_id(req.method) else {
            return reply(cx, out, spec, req.id, CallFault::UNKNOWN_METHOD.0, &[]);
        };
        if req.invocation == Invocation::Extended {
            send(
                cx,
                out,
                spec,
                &Reply {
                    id: req.id,
                    status: CallStatus::Acked,
                    code: 0,
                    result: &[],
                },
            )?;
            // ACKED goes out at once: the caller may reuse what it lent now,
            // not at the end of this turn.
            cx.publish(out)?;
        }
        let call = IncomingCall {
            interface: &spec.interface,
            method: &m.name,
            method_id: m.id,
            caller: &spec.peer,
            args: req.args,
        };
        match offcode.serve(cx, &call) {
            Ok(result) => reply(cx, out, spec, req.id, 0, &result),
            Err(fault) => reply(cx, out, spec, req.id, fault.0, &[]),
        }
    })
}

/// Sends FINISHED with `code` and `result`; a result too large for the reply
/// slot finishes the call with [`CallFault::BAD_RESULT`] instead of losing it.
fn reply(
    cx: &mut RunCx<'_>,
    out: OutputId,
    spec: &CallPortSpec,
    id: CallId,
    code: u16,
    result: &[u8],
) -> Result<(), OffcodeError> {
    let r = Reply {
        id,
        status: CallStatus::Finished,
        code,
        result,
    };
    send(cx, out, spec, &r)
}

fn send(
    cx: &mut RunCx<'_>,
    out: OutputId,
    spec: &CallPortSpec,
    r: &Reply<'_>,
) -> Result<(), OffcodeError> {
    let sent = match cx.send(out, |slot| {
        write_reply(slot, r).unwrap_or_else(|_| {
            let failed = Reply {
                code: CallFault::BAD_RESULT.0,
                result: &[],
                ..*r
            };
            write_reply(slot, &failed).unwrap_or(0)
        })
    }) {
        Ok(s) => s,
        // The caller is gone: no one is left to tell.
        Err(OffcodeError::Send(SendError::Disconnected)) => return Ok(()),
        Err(e) => return Err(e),
    };
    match sent {
        SendOutcome::Sent => Ok(()),
        _ => Err(OffcodeError::Channel(format!(
            "the reply channel to `{}` on `{}` has no room for a {REPLY_HEADER}-byte reply",
            spec.peer, spec.interface
        ))),
    }
}

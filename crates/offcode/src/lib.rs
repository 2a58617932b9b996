//! The offcode programming model (HYDRA §4.1, §5.2), in Rust.
//!
//! An offcode has state, ports and its own thread of control, which the
//! runtime drives through the [`Offcode`] trait:
//!
//! 1. [`Offcode::initialize`] as it lands on its PE: local resources only
//!    (parameters, memory, port names); peers may not exist yet.
//! 2. [`Offcode::start`] once every related offcode is in place: channels are
//!    connected and sending is allowed.
//! 3. [`Offcode::handle`] for each message on an input, [`Offcode::serve`]
//!    for each call on an interface it provides, and [`Offcode::poll`] on
//!    every turn of the run-to-completion loop (sources produce here). Its
//!    [`RunCx`] lets it call the interfaces it uses, synchronously or not.
//! 4. [`Offcode::stop`] when it is taken down.
//!
//! HYDRA's COM-style vtables, `AddRef`/`Release` and `QueryInterface` become a
//! trait object, `Arc` and typed contexts; its pseudo-offcodes (heap, channel
//! executive, runtime) become the capabilities the contexts hand out.
//! Implementations are found by name in a [`Registry`] (HYDRA's offcode
//! library), per PE kind.

mod basics;
mod calls;
mod context;
mod offcode;
mod ports;
mod registry;

pub use basics::{InputId, OffcodeError, OutputId, Progress};
pub use calls::{CALLS_IN_FLIGHT, CallFault, Calls, IncomingCall, encode_result};
pub use offcode::{Offcode, TURN_BURST};
pub use sidecore_channel::call::{CallError, CallStatus, Invocation, PendingCall};

pub use context::parse_params;
pub use context::{InitCx, Metric, Metrics, OffcodeInfo, RunCx};
pub use ports::{Drained, Inlet, Outlet, STREAM_MESSAGE_BYTES};
pub use registry::{
    BuildSpec, Factory, ImplError, Implementation, InterfaceSig, Interfaces, MethodSig, Registry,
    Validator, is_call_port, signature,
};

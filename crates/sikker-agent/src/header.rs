//! The NMU's trusted message header and its form in the node protocol
//! ([`sidecore_wire::WireHeader`]), both ways: what one agent writes for the
//! next when it forwards a message.

use sidecore_sikker_nmu::{Address, Header, OtpBlock, Triple};
use sidecore_wire::{WireHeader, WireOtp};

/// The trusted header as the node protocol carries it.
pub fn to_wire(h: &Header) -> WireHeader {
    WireHeader {
        src: [h.src.0, h.src.1],
        dst: [h.dst.svc, h.dst.proc, h.dst.dom],
        otp: h.otp.map(|o| WireOtp {
            recipient: [o.recipient.svc, o.recipient.proc, o.recipient.dom],
            recipient_addr: o.recipient_addr.0,
            requester: o.requester.map(|(s, p)| [s, p]),
        }),
    }
}

pub fn from_wire(h: &WireHeader) -> Header {
    Header {
        src: (h.src[0], h.src[1]),
        dst: Triple::new(h.dst[0], h.dst[1], h.dst[2]),
        otp: h.otp.map(|o| OtpBlock {
            recipient: Triple::new(o.recipient[0], o.recipient[1], o.recipient[2]),
            recipient_addr: Address(o.recipient_addr),
            requester: o.requester.map(|r| (r[0], r[1])),
        }),
    }
}

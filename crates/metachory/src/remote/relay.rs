//! A relay: a node that opens a session on a node its client cannot reach
//! and forwards the session's frames both ways, by their destination
//! endpoint (seed §4.1, §9.7: a client cannot tell a relay from a large
//! server). The `mx-open`'s `route` names the hops still to cross.

use std::time::Duration;

use sidecore_wire::mx_msg::MxOpen;
use sidecore_wire::session::{OriginGrammar, PeerGrammar};
use sidecore_wire::{Hello, Link, LinkError, Message, Received};

/// How long connecting onwards may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How often each direction looks at the other's end.
const POLL: Duration = Duration::from_millis(200);

/// Forwards one session from `client` to the next hop of `open.route`.
pub fn relay(client: &Link<PeerGrammar>, open: &MxOpen, me: &str) -> Result<(), LinkError> {
    let mut onward = open.clone();
    let next = onward.route.remove(0);
    let hello = Hello {
        origin: format!("relay {me}"),
        software: sidecore_wire::SOFTWARE_VERSION.to_string(),
    };
    let label = format!("node {next} (relayed by {me})");
    let server = Link::connect(&next, &label, hello, CONNECT_TIMEOUT)?;
    match server.expect(CONNECT_TIMEOUT)? {
        Message::Welcome(_) => {}
        Message::Error { error } => {
            client.send(&Message::Error {
                error: format!("{label}: {error}"),
            })?;
            return Ok(());
        }
        _ => {}
    }
    server.send(&Message::MxOpen(onward))?;
    std::thread::scope(|s| {
        s.spawn(|| downstream(&server, client));
        upstream(client, &server)
    })
}

/// Client → server.
fn upstream(client: &Link<PeerGrammar>, server: &Link<OriginGrammar>) -> Result<(), LinkError> {
    loop {
        match client.recv(Some(POLL)) {
            Ok(Received::Message(Message::Mx(mut f))) => {
                f.hops = f.hops.saturating_add(1);
                server.send(&Message::Mx(f))?;
            }
            Ok(Received::TimedOut) => continue,
            Ok(_) | Err(_) => {
                server.shutdown_write();
                return Ok(());
            }
        }
    }
}

/// Server → client.
fn downstream(server: &Link<OriginGrammar>, client: &Link<PeerGrammar>) {
    loop {
        match server.recv(Some(POLL)) {
            Ok(Received::Message(Message::Mx(mut f))) => {
                f.hops = f.hops.saturating_add(1);
                if client.send(&Message::Mx(f)).is_err() {
                    return;
                }
            }
            Ok(Received::TimedOut) => continue,
            Ok(Received::Message(Message::Error { error })) => {
                let _ = client.send(&Message::Error { error });
                return;
            }
            Ok(_) => {
                client.shutdown_write();
                return;
            }
            Err(e) => {
                let _ = client.send(&Message::Error {
                    error: e.to_string(),
                });
                return;
            }
        }
    }
}

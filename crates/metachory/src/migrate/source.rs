//! The source server's migration of one guest: freeze it, connect to the
//! target's page-stream listener, send the image and the pages, and wait
//! for the target to say the guest runs there. Any failure before that
//! thaws the guest where it was. Lazily, the frozen guest stays as the
//! image until the target has every page.

use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use sidecore_wire::mx_image::Record;

use super::Error;
use super::checkpoint::Frozen;
use super::stream::{PageReader, PageWriter, STREAM_TIMEOUT};
use super::transfer;

/// How long connecting to the target may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// What the source sent.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sent {
    pub image_bytes: u64,
    pub pages_bytes: u64,
    /// From the freeze to the target's `restored`.
    pub freeze: Duration,
}

/// The rest of a lazy migration: serve pages until every one is resident,
/// then end the frozen guest.
pub struct LazyServe {
    frozen: Frozen,
    writer: PageWriter,
    reader: PageReader,
}

impl LazyServe {
    /// Serves pages; the bytes sent.
    pub fn run(self) -> Result<u64, Error> {
        let r = transfer::serve_lazy(&self.frozen, self.writer, self.reader);
        self.frozen.kill();
        r
    }
}

fn connect(to: &str) -> Result<TcpStream, Error> {
    let peer = format!("the target's page stream at {to}");
    let addr = to
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| Error::Peer {
            peer: peer.clone(),
            what: "is not an address".into(),
        })?;
    let s = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT).map_err(|e| Error::Peer {
        peer: peer.clone(),
        what: format!("unreachable: {e}"),
    })?;
    let _ = s.set_nodelay(true);
    s.set_read_timeout(Some(STREAM_TIMEOUT))
        .and_then(|()| s.set_write_timeout(Some(STREAM_TIMEOUT)))
        .map_err(|e| Error::Peer {
            peer,
            what: e.to_string(),
        })?;
    Ok(s)
}

/// Sends the frozen guest to `to`. On success the guest runs there: an
/// eager migration has ended the frozen one; a lazy one returns the rest
/// to run. On failure the frozen guest comes back with the error (thaw it).
pub fn send(
    frozen: Frozen,
    to: &str,
    ticket: u64,
    frozen_at: Instant,
) -> Result<(Sent, Option<LazyServe>), (Box<Frozen>, Error)> {
    let mut sent = Sent::default();
    let r = (|| {
        let sock = connect(to)?;
        let peer = format!("the target {to}");
        let mut w = PageWriter::new(
            sock.try_clone().map_err(|source| Error::Os {
                what: "clone a socket".into(),
                source,
            })?,
            &peer,
        )?;
        w.send(&Record::Hello {
            ticket,
            session: frozen.image.session,
        })?;
        let json = serde_json::to_vec(&frozen.image).unwrap_or_default();
        sent.image_bytes = json.len() as u64;
        w.send(&Record::Image(Box::new(frozen.image.clone())))?;
        sent.pages_bytes = transfer::send_pages(&frozen, &mut w)?;
        let mut r = PageReader::new(sock, &peer)?;
        match r.next_record()? {
            Record::Restored => Ok((w, r)),
            other => Err(Error::Peer {
                peer,
                what: format!("answered the image with `{}`", other.kind().name()),
            }),
        }
    })();
    match r {
        Ok((w, r)) => {
            sent.freeze = frozen_at.elapsed();
            if frozen.image.lazy {
                Ok((
                    sent,
                    Some(LazyServe {
                        frozen,
                        writer: w,
                        reader: r,
                    }),
                ))
            } else {
                frozen.kill();
                Ok((sent, None))
            }
        }
        Err(e) => Err((Box::new(frozen), e)),
    }
}

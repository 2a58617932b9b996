//! The page stream over a TCP socket ([`sidecore_wire::mx_image`]): a
//! blocking reader that checks each record before it is used, and a writer
//! that sends pages straight from their buffer; errors name the peer.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use sidecore_wire::mx_image::{
    PAGE_PREAMBLE_BYTES, RECORD_HEADER_BYTES, Record, RecordChecker, RecordEncoder, RecordKind,
    check_preamble, page_preamble,
};

use super::Error;

/// How long a peer may stay silent in the middle of a migration.
pub const STREAM_TIMEOUT: Duration = Duration::from_secs(30);

/// Receives records.
pub struct PageReader {
    sock: TcpStream,
    checker: RecordChecker,
    pub peer: String,
}

impl PageReader {
    /// Reads and checks the peer's preamble.
    pub fn new(sock: TcpStream, peer: &str) -> Result<PageReader, Error> {
        let mut r = PageReader {
            sock,
            checker: RecordChecker::default(),
            peer: peer.to_string(),
        };
        let mut p = [0u8; PAGE_PREAMBLE_BYTES];
        r.read_exact(&mut p, "the preamble")?;
        check_preamble(&p).map_err(|source| Error::Stream {
            peer: r.peer.clone(),
            source,
        })?;
        Ok(r)
    }

    fn read_exact(&mut self, buf: &mut [u8], what: &str) -> Result<(), Error> {
        self.sock.read_exact(buf).map_err(|e| Error::Peer {
            peer: self.peer.clone(),
            what: if e.kind() == std::io::ErrorKind::UnexpectedEof {
                format!("closed the page stream before {what}")
            } else {
                format!("page stream: {e}")
            },
        })
    }

    /// The next record (an `error` record from the peer is an error).
    pub fn next_record(&mut self) -> Result<Record, Error> {
        let mut h = [0u8; RECORD_HEADER_BYTES];
        self.read_exact(&mut h, "the next record")?;
        let peer = self.peer.clone();
        let stream = |source| Error::Stream {
            peer: peer.clone(),
            source,
        };
        let head = self.checker.header(&h).map_err(stream)?;
        let mut payload = vec![0u8; head.len];
        self.read_exact(
            &mut payload,
            &format!("the end of a {} record", head.kind.name()),
        )?;
        match self.checker.payload(&head, payload).map_err(stream)? {
            Record::Error(what) => Err(Error::Peer { peer, what }),
            r => Ok(r),
        }
    }

    /// The socket, for timeouts and shutdowns.
    pub fn socket(&self) -> &TcpStream {
        &self.sock
    }
}

/// Sends records.
pub struct PageWriter {
    sock: TcpStream,
    enc: RecordEncoder,
    peer: String,
}

impl PageWriter {
    /// Sends the preamble.
    pub fn new(sock: TcpStream, peer: &str) -> Result<PageWriter, Error> {
        let mut w = PageWriter {
            sock,
            enc: RecordEncoder::default(),
            peer: peer.to_string(),
        };
        let p = page_preamble();
        w.write(&[&p])?;
        Ok(w)
    }

    fn write(&mut self, parts: &[&[u8]]) -> Result<(), Error> {
        for p in parts {
            self.sock.write_all(p).map_err(|e| Error::Peer {
                peer: self.peer.clone(),
                what: format!("page stream: {e}"),
            })?;
        }
        Ok(())
    }

    /// Sends one record.
    pub fn send(&mut self, r: &Record) -> Result<(), Error> {
        let mut out = Vec::new();
        self.enc.encode(r, &mut out);
        self.write(&[&out])
    }

    /// Sends `data` (whole pages) for address `addr`, without copying it.
    pub fn send_pages(&mut self, addr: u64, data: &[u8]) -> Result<(), Error> {
        let a = addr.to_le_bytes();
        let h = self.enc.header(RecordKind::Pages, &[&a, data]);
        self.write(&[&h, &a, data])
    }
}

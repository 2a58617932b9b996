//! The stream protocol (§6.4): one active writer pushes bytes into the
//! buffer of one active reader, never more than the window the reader
//! granted (`STREAMPUSH`, answered by `STREAMSTAT` as the reader consumes).
//! A new active reader takes the buffer over (`STREAMREQBUF`,
//! `STREAMPUSHBUF`); the old holder then forwards late pushes to it. Each
//! endpoint tells the stream's manager when its first reader or writer
//! appears and its last goes (`STREAMPRESENT`, `STREAMABSENT`).

use std::collections::VecDeque;

use crate::msg::{MAX_PAYLOAD_BYTES, Msg};
use crate::types::{Endpoint, VnodeId};

/// Bytes one push carries at most.
pub const PUSH_BYTES: usize = 64 * 1024;

/// A push the window did not allow, or a stream message out of place.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    #[error("stream {vnode:?}: the writer pushed {got} bytes into a window of {window}")]
    Overrun {
        vnode: VnodeId,
        got: u64,
        window: u64,
    },
    #[error("stream {vnode:?}: bytes arrived after the end of the stream")]
    AfterEof { vnode: VnodeId },
    #[error("stream {vnode:?}: the window grew past the buffer ({window} > {capacity} bytes)")]
    WindowTooLarge {
        vnode: VnodeId,
        window: u64,
        capacity: u64,
    },
}

/// The active writer's side.
#[derive(Debug, Clone)]
pub struct Writer {
    vnode: VnodeId,
    reader: Endpoint,
    window: u64,
    capacity: u64,
    pending: VecDeque<u8>,
    eof: bool,
    eof_sent: bool,
}

impl Writer {
    /// A writer to `reader`, whose buffer holds `capacity` bytes.
    #[must_use]
    pub fn new(vnode: VnodeId, reader: Endpoint, capacity: u64) -> Self {
        Writer {
            vnode,
            reader,
            window: capacity,
            capacity,
            pending: VecDeque::new(),
            eof: false,
            eof_sent: false,
        }
    }

    /// Queues bytes; the pushes the window allows now.
    pub fn write(&mut self, bytes: &[u8]) -> Vec<(Endpoint, Msg)> {
        self.pending.extend(bytes);
        self.pump()
    }

    /// The end of the stream, after what is queued.
    pub fn close(&mut self) -> Vec<(Endpoint, Msg)> {
        self.eof = true;
        self.pump()
    }

    /// Bytes queued and not yet pushed.
    #[must_use]
    pub fn backlog(&self) -> usize {
        self.pending.len()
    }

    /// Whether everything, the end included, went out.
    #[must_use]
    pub fn done(&self) -> bool {
        self.eof_sent
    }

    /// The reader consumed `delta` bytes (`STREAMSTAT`).
    pub fn on_stat(&mut self, delta: u64) -> Result<Vec<(Endpoint, Msg)>, StreamError> {
        let window = self.window.saturating_add(delta);
        if window > self.capacity {
            return Err(StreamError::WindowTooLarge {
                vnode: self.vnode,
                window,
                capacity: self.capacity,
            });
        }
        self.window = window;
        Ok(self.pump())
    }

    /// Takes the bytes queued and not yet pushed, and whether the end was
    /// asked for and not yet pushed (a stream whose writer moves to another
    /// reader: they go to the new one).
    pub fn take_pending(&mut self) -> (Vec<u8>, bool) {
        let eof = self.eof && !self.eof_sent;
        self.eof = self.eof_sent;
        (self.pending.drain(..).collect(), eof)
    }

    /// The active reader moved to `reader`.
    pub fn reader_moved(&mut self, reader: Endpoint) {
        self.reader = reader;
    }

    fn pump(&mut self) -> Vec<(Endpoint, Msg)> {
        let mut out = Vec::new();
        while !self.eof_sent {
            let n = (self.window as usize)
                .min(self.pending.len())
                .min(PUSH_BYTES);
            let last = self.eof && n == self.pending.len();
            if n == 0 && !last {
                break;
            }
            let data: Vec<u8> = self.pending.drain(..n).collect();
            self.window -= n as u64;
            self.eof_sent = last;
            out.push((
                self.reader,
                Msg::Streampush {
                    vnode: self.vnode,
                    data,
                    eof: last,
                },
            ));
        }
        out
    }
}

/// The active reader's side (the endpoint holding the buffer).
#[derive(Debug, Clone)]
pub struct Reader {
    vnode: VnodeId,
    writer: Endpoint,
    capacity: u64,
    buf: VecDeque<u8>,
    consumed: u64,
    eof: bool,
    /// After a buffer move: where late pushes go.
    moved_to: Option<Endpoint>,
}

impl Reader {
    /// The reader of a buffer of `capacity` bytes fed by `writer`.
    #[must_use]
    pub fn new(vnode: VnodeId, writer: Endpoint, capacity: u64) -> Self {
        Reader {
            vnode,
            writer,
            capacity: capacity.min(MAX_PAYLOAD_BYTES as u64),
            buf: VecDeque::new(),
            consumed: 0,
            eof: false,
            moved_to: None,
        }
    }

    /// A `STREAMPUSH` arrived; when the buffer moved away, the push to forward.
    pub fn on_push(&mut self, data: &[u8], eof: bool) -> Result<Vec<(Endpoint, Msg)>, StreamError> {
        if let Some(to) = self.moved_to {
            let m = Msg::Streampush {
                vnode: self.vnode,
                data: data.to_vec(),
                eof,
            };
            return Ok(vec![(to, m)]);
        }
        if self.eof && (!data.is_empty() || eof) {
            return Err(StreamError::AfterEof { vnode: self.vnode });
        }
        let room = self.capacity - self.buf.len() as u64 - self.consumed;
        if data.len() as u64 > room {
            return Err(StreamError::Overrun {
                vnode: self.vnode,
                got: data.len() as u64,
                window: room,
            });
        }
        self.buf.extend(data);
        self.eof |= eof;
        Ok(Vec::new())
    }

    /// Takes up to `max` bytes; a `STREAMSTAT` once half the buffer was
    /// consumed (window updates are batched, as the seed suggests).
    pub fn read(&mut self, max: usize) -> (Vec<u8>, Option<(Endpoint, Msg)>) {
        let n = max.min(self.buf.len());
        let data: Vec<u8> = self.buf.drain(..n).collect();
        self.consumed += n as u64;
        let stat = (self.consumed * 2 >= self.capacity
            || (self.buf.is_empty() && self.consumed > 0))
            .then(|| {
                let delta = std::mem::take(&mut self.consumed);
                (
                    self.writer,
                    Msg::Streamstat {
                        vnode: self.vnode,
                        delta,
                    },
                )
            });
        (data, stat)
    }

    /// Bytes buffered and not yet read.
    #[must_use]
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Whether the stream ended and the buffer is empty.
    #[must_use]
    pub fn at_eof(&self) -> bool {
        self.eof && self.buf.is_empty()
    }

    /// `STREAMREQBUF` from `to`: the buffer, as `STREAMPUSHBUF`; this side
    /// forwards late pushes from now on.
    pub fn give_buffer(&mut self, to: Endpoint) -> (Endpoint, Msg) {
        self.moved_to = Some(to);
        let data: Vec<u8> = self.buf.drain(..).collect();
        (
            to,
            Msg::Streampushbuf {
                vnode: self.vnode,
                data,
                eof: self.eof,
            },
        )
    }

    /// The new active reader, from a `STREAMPUSHBUF`. Bytes consumed but not
    /// yet reported by the old holder are lost to the window: they are
    /// reported here as consumed at once, in the returned `STREAMSTAT`.
    #[must_use]
    pub fn from_buffer(
        vnode: VnodeId,
        writer: Endpoint,
        capacity: u64,
        data: Vec<u8>,
        eof: bool,
        unreported: u64,
    ) -> (Self, Option<(Endpoint, Msg)>) {
        let r = Reader {
            vnode,
            writer,
            capacity,
            buf: data.into(),
            consumed: 0,
            eof,
            moved_to: None,
        };
        let stat = (unreported > 0).then_some((
            writer,
            Msg::Streamstat {
                vnode,
                delta: unreported,
            },
        ));
        (r, stat)
    }

    /// Bytes consumed here and not yet reported to the writer.
    #[must_use]
    pub fn unreported(&self) -> u64 {
        self.consumed
    }
}

/// Readers and writers of a stream on one endpoint, and what to tell the
/// manager when the first appears or the last goes.
#[derive(Debug, Clone, Default)]
pub struct Presence {
    readers: u32,
    writers: u32,
}

impl Presence {
    /// One more reader (`writer` false) or writer on `me`.
    pub fn add(&mut self, vnode: VnodeId, me: Endpoint, writer: bool) -> Option<Msg> {
        let c = if writer {
            &mut self.writers
        } else {
            &mut self.readers
        };
        *c += 1;
        (*c == 1).then_some(Msg::Streampresent {
            vnode,
            from: me,
            writer,
        })
    }

    /// One fewer; `STREAMABSENT` when it was the last.
    pub fn remove(&mut self, vnode: VnodeId, me: Endpoint, writer: bool) -> Option<Msg> {
        let c = if writer {
            &mut self.writers
        } else {
            &mut self.readers
        };
        if *c == 0 {
            return None;
        }
        *c -= 1;
        (*c == 0).then_some(Msg::Streamabsent {
            vnode,
            from: me,
            writer,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_moving_writer_hands_over_what_it_did_not_push() {
        let mut w = Writer::new(VnodeId(0), Endpoint(2), 4);
        assert_eq!(w.write(b"abcdef").len(), 1);
        w.close();
        assert_eq!(w.take_pending(), (b"ef".to_vec(), true));
        assert_eq!(w.backlog(), 0);
        assert!(
            w.write(b"").is_empty(),
            "nothing is left to push, not even the end"
        );
        let mut w = Writer::new(VnodeId(0), Endpoint(2), 4);
        w.close();
        assert_eq!(
            w.take_pending(),
            (vec![], false),
            "the end already went out"
        );
    }

    #[test]
    fn the_window_bounds_what_is_in_flight() {
        let (w_ep, r_ep, v) = (Endpoint(1), Endpoint(2), VnodeId(3));
        let mut w = Writer::new(v, r_ep, 8);
        let mut r = Reader::new(v, w_ep, 8);
        let out = w.write(b"0123456789");
        assert_eq!(out.len(), 1);
        assert_eq!(w.backlog(), 2);
        for (_, m) in out {
            let Msg::Streampush { data, eof, .. } = m else {
                panic!()
            };
            r.on_push(&data, eof).unwrap();
        }
        // A writer that ignores the window is caught.
        let e = r.on_push(b"x", false).unwrap_err();
        assert!(e.to_string().contains("into a window of 0"), "{e}");
        let (got, stat) = r.read(5);
        assert_eq!(got, b"01234");
        let Some((_, Msg::Streamstat { delta, .. })) = stat else {
            panic!()
        };
        let more = w.on_stat(delta).unwrap();
        assert_eq!(more.len(), 1);
        assert!(w.on_stat(100).is_err());
        let mut p = Presence::default();
        assert!(p.add(v, r_ep, false).is_some());
        assert!(p.add(v, r_ep, false).is_none());
        assert!(p.remove(v, r_ep, false).is_none());
        assert!(matches!(
            p.remove(v, r_ep, false),
            Some(Msg::Streamabsent { .. })
        ));
    }
}

//! ONC RPC record marking over TCP (RFC 5531 §11): each record is a sequence of
//! fragments, each preceded by a 4-byte header whose top bit marks the last fragment
//! and whose low 31 bits give its length. [`RecordReader`] reassembles records from a
//! byte stream (sans-IO: the caller feeds what it read) and refuses any record larger
//! than its limit before buffering it. Over UDP a datagram is one whole message and
//! needs no marking.

use crate::xdr::Encoder;

/// The last-fragment bit.
pub const LAST_FRAGMENT: u32 = 0x8000_0000;
/// The default record limit: a 1 MiB WRITE plus headers.
pub const DEFAULT_MAX_RECORD: usize = (1 << 20) + 4096;

/// A stream that cannot be reassembled; the connection should be closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error(
        "record of at least {size} bytes (fragment at stream byte {at}) exceeds the limit {max}"
    )]
    TooLarge { size: usize, max: usize, at: u64 },
}

/// Reassembles records from a TCP byte stream.
#[derive(Debug)]
pub struct RecordReader {
    max_record: usize,
    /// Bytes received but not yet consumed.
    buf: Vec<u8>,
    /// Start of unconsumed bytes in `buf`.
    start: usize,
    /// The record being assembled from earlier fragments.
    record: Vec<u8>,
    /// Stream offset of `buf[start]`, for errors.
    consumed: u64,
}

impl RecordReader {
    pub fn new(max_record: usize) -> Self {
        Self {
            max_record,
            buf: Vec::new(),
            start: 0,
            record: Vec::new(),
            consumed: 0,
        }
    }

    /// Appends bytes read from the stream.
    pub fn push(&mut self, data: &[u8]) {
        if self.start > 0 && self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        }
        self.buf.extend_from_slice(data);
    }

    /// Bytes buffered and not yet part of a returned record.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start + self.record.len()
    }

    /// The next complete record, `None` if more bytes are needed, or an error if the
    /// record would exceed the limit (the stream cannot be resynchronised after that).
    pub fn next_record(&mut self) -> Result<Option<Vec<u8>>, RecordError> {
        loop {
            let avail = &self.buf[self.start..];
            if avail.len() < 4 {
                self.compact();
                return Ok(None);
            }
            let header = u32::from_be_bytes([avail[0], avail[1], avail[2], avail[3]]);
            let len = (header & !LAST_FRAGMENT) as usize;
            let size = self.record.len().saturating_add(len);
            if size > self.max_record {
                return Err(RecordError::TooLarge {
                    size,
                    max: self.max_record,
                    at: self.consumed,
                });
            }
            if avail.len() - 4 < len {
                self.compact();
                return Ok(None);
            }
            self.record.extend_from_slice(&avail[4..4 + len]);
            self.start += 4 + len;
            self.consumed += 4 + len as u64;
            if header & LAST_FRAGMENT != 0 {
                return Ok(Some(std::mem::take(&mut self.record)));
            }
        }
    }

    fn compact(&mut self) {
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
    }
}

/// Frames `payload` as one record of fragments of at most `max_fragment` bytes
/// (at least 1; lengths above 2^31 - 1 are capped).
pub fn encode_record(payload: &[u8], max_fragment: usize) -> Vec<u8> {
    let max_fragment = max_fragment.clamp(1, (!LAST_FRAGMENT) as usize);
    let mut out = Vec::with_capacity(payload.len() + 4 * (payload.len() / max_fragment + 1));
    let mut chunks = payload.chunks(max_fragment).peekable();
    if chunks.peek().is_none() {
        out.extend_from_slice(&LAST_FRAGMENT.to_be_bytes());
        return out;
    }
    while let Some(chunk) = chunks.next() {
        // `chunk.len() <= max_fragment < 2^31`, so the cast cannot truncate.
        let mut header = chunk.len() as u32;
        if chunks.peek().is_none() {
            header |= LAST_FRAGMENT;
        }
        out.extend_from_slice(&header.to_be_bytes());
        out.extend_from_slice(chunk);
    }
    out
}

/// Appends to `out` the record that `write` encodes, marked as
/// [`encode_record`] would mark it, without a buffer of its own: the
/// message is encoded in place behind a header patched once its length is
/// known (split into fragments only when it is longer than `max_fragment`).
pub fn encode_record_into(
    out: &mut Vec<u8>,
    max_fragment: usize,
    write: impl FnOnce(&mut Encoder),
) {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    let mut enc = Encoder {
        buf: std::mem::take(out),
    };
    write(&mut enc);
    *out = enc.buf;
    let len = out.len() - start - 4;
    let max_fragment = max_fragment.clamp(1, (!LAST_FRAGMENT) as usize);
    if len <= max_fragment {
        // `len <= max_fragment < 2^31`, so the cast cannot truncate.
        out[start..start + 4].copy_from_slice(&(len as u32 | LAST_FRAGMENT).to_be_bytes());
    } else {
        let payload = out.split_off(start + 4);
        out.truncate(start);
        out.extend_from_slice(&encode_record(&payload, max_fragment));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn reassembles_fragments_split_anywhere() {
        let a = encode_record(b"hello world", 3);
        let b = encode_record(b"", 3);
        let stream: Vec<u8> = [a, b].concat();
        for split in 0..stream.len() {
            let mut r = RecordReader::new(64);
            r.push(&stream[..split]);
            let mut got = Vec::new();
            while let Some(rec) = r.next_record().unwrap() {
                got.push(rec);
            }
            r.push(&stream[split..]);
            while let Some(rec) = r.next_record().unwrap() {
                got.push(rec);
            }
            assert_eq!(
                got,
                vec![b"hello world".to_vec(), Vec::new()],
                "split at {split}"
            );
            assert_eq!(r.buffered(), 0);
        }
    }

    #[test]
    fn oversized_record_is_refused_from_its_header() {
        let mut r = RecordReader::new(100);
        r.push(&(LAST_FRAGMENT | 0x7FFF_FFFF).to_be_bytes());
        assert_eq!(
            r.next_record(),
            Err(RecordError::TooLarge {
                size: 0x7FFF_FFFF,
                max: 100,
                at: 0
            })
        );
    }

    #[test]
    fn fragments_adding_up_beyond_the_limit_are_refused() {
        let mut r = RecordReader::new(10);
        r.push(&encode_record(&[7u8; 12], 6));
        assert_eq!(
            r.next_record(),
            Err(RecordError::TooLarge {
                size: 12,
                max: 10,
                at: 10
            })
        );
    }

    #[test]
    fn truncated_record_waits_for_more() {
        let rec = encode_record(b"abcdef", 100);
        let mut r = RecordReader::new(100);
        r.push(&rec[..rec.len() - 1]);
        assert_eq!(r.next_record(), Ok(None));
    }

    proptest! {
        #[test]
        fn a_record_encoded_in_place_is_the_one_encode_record_makes(
            before in prop::collection::vec(any::<u8>(), 0..20),
            payload in prop::collection::vec(any::<u8>(), 0..300),
            frag in 1usize..400,
        ) {
            let mut out = before.clone();
            encode_record_into(&mut out, frag, |e| e.buf.extend_from_slice(&payload));
            let mut want = before;
            want.extend_from_slice(&encode_record(&payload, frag));
            prop_assert_eq!(out, want);
        }

        #[test]
        fn records_round_trip(payloads in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..300), 1..5),
                              frag in 1usize..64, chunk in 1usize..50) {
            let stream: Vec<u8> = payloads.iter().flat_map(|p| encode_record(p, frag)).collect();
            let mut r = RecordReader::new(300);
            let mut got = Vec::new();
            for piece in stream.chunks(chunk) {
                r.push(piece);
                while let Some(rec) = r.next_record().unwrap() {
                    got.push(rec);
                }
            }
            prop_assert_eq!(got, payloads);
        }

        #[test]
        fn arbitrary_streams_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
            let mut r = RecordReader::new(256);
            r.push(&bytes);
            while let Ok(Some(_)) = r.next_record() {}
        }
    }
}

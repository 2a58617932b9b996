//! The one framing of the node protocol, sans-IO.
//!
//! Each side opens with an 8-byte preamble, [`MAGIC`] then the protocol
//! version ([`VERSION`], `u16` little-endian), and then sends frames:
//!
//! ```text
//! u32 LE  payload length (at most MAX_FRAME_BYTES)
//! u32 LE  sequence number (0, 1, 2 … per direction)
//! u32 LE  CRC-32 of the sequence number's 4 bytes and the payload
//! payload (one message, JSON)
//! ```
//!
//! TCP already checksums and orders bytes; the sequence number and CRC are here
//! so that a broken middlebox, a bug in a driver, or a test that drops and
//! reorders bytes gets a precise error ("frame #7 corrupted", "frame #9 where
//! #8 was due") instead of a different message. Both cost nothing next to the
//! JSON they protect.

/// First bytes each side sends.
pub const MAGIC: &[u8; 6] = b"SCNODE";
/// Version of the node protocol. Version 1 was the JSON-lines exchange this
/// framing replaced; a version-1 peer fails the preamble with a clear error.
pub const VERSION: u16 = 2;
/// Bytes of the preamble: the magic and the version.
pub const PREAMBLE_BYTES: usize = MAGIC.len() + 2;
/// Bytes of a frame header: length, sequence number, CRC.
pub const HEADER_BYTES: usize = 12;
/// Largest payload either side accepts: a deploy request of
/// [`MAX_PART_ITEMS`](crate::part::MAX_PART_ITEMS) items fits with room.
pub const MAX_FRAME_BYTES: usize = 1 << 20;

/// What is wrong with the bytes a peer sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error(
        "not a sidecore node: it opened with {got:?}, expected {:?}",
        String::from_utf8_lossy(MAGIC)
    )]
    BadMagic { got: String },
    #[error("speaks node protocol version {got}; this side speaks {VERSION}")]
    Version { got: u16 },
    #[error("frame #{seq} announces {len} bytes, more than the {MAX_FRAME_BYTES}-byte limit")]
    TooLarge { seq: u32, len: usize },
    #[error("frame #{got} arrived where #{expected} was due (frames lost or out of order)")]
    OutOfOrder { expected: u32, got: u32 },
    #[error("frame #{seq} is corrupted (CRC {got:#010x}, computed {computed:#010x})")]
    Corrupted { seq: u32, got: u32, computed: u32 },
    #[error("the connection closed in the middle of a frame ({buffered} bytes of it received)")]
    Truncated { buffered: usize },
}

/// The CRC of a frame: over its sequence number and payload.
fn crc(seq: u32, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&seq.to_le_bytes());
    h.update(payload);
    h.finalize()
}

/// The preamble this side sends.
pub fn preamble() -> [u8; PREAMBLE_BYTES] {
    let mut p = [0u8; PREAMBLE_BYTES];
    p[..MAGIC.len()].copy_from_slice(MAGIC);
    p[MAGIC.len()..].copy_from_slice(&VERSION.to_le_bytes());
    p
}

/// Turns payloads into frames, numbering them.
#[derive(Debug, Default)]
pub struct FrameEncoder {
    next_seq: u32,
}

impl FrameEncoder {
    /// Appends one frame carrying `payload` to `out`.
    ///
    /// # Panics
    /// If `payload` is over [`MAX_FRAME_BYTES`]: every message this side builds
    /// is bounded, so a larger one is a bug here, not a peer's fault.
    pub fn encode(&mut self, payload: &[u8], out: &mut Vec<u8>) {
        assert!(
            payload.len() <= MAX_FRAME_BYTES,
            "an outgoing node-protocol message of {} bytes exceeds MAX_FRAME_BYTES",
            payload.len()
        );
        let seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1);
        #[allow(clippy::cast_possible_truncation)] // bounded by MAX_FRAME_BYTES above
        let len = payload.len() as u32;
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&seq.to_le_bytes());
        out.extend_from_slice(&crc(seq, payload).to_le_bytes());
        out.extend_from_slice(payload);
    }
}

/// Splits the bytes a peer sent into checked payloads. Feed bytes with
/// [`feed`](Self::feed) in any chunks; take payloads with
/// [`next_frame`](Self::next_frame). After an error the decoder stays failed: a stream
/// whose framing broke cannot be trusted again.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    buf: Vec<u8>,
    /// Start of the bytes not yet consumed.
    start: usize,
    preamble_seen: bool,
    next_seq: u32,
    failed: Option<FrameError>,
}

impl FrameDecoder {
    /// A decoder expecting the preamble first.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends received bytes.
    pub fn feed(&mut self, bytes: &[u8]) {
        if self.start > 0 && self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        } else if self.start > 64 * 1024 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes received and not yet returned as a payload.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }

    /// Whether the peer's preamble has been read.
    pub fn preamble_seen(&self) -> bool {
        self.preamble_seen
    }

    /// The next payload and its sequence number, `Ok(None)` if more bytes are
    /// needed.
    pub fn next_frame(&mut self) -> Result<Option<(u32, &[u8])>, FrameError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        match self.step() {
            Ok(Some((seq, from, to))) => Ok(Some((seq, &self.buf[from..to]))),
            Ok(None) => Ok(None),
            Err(e) => {
                self.failed = Some(e.clone());
                Err(e)
            }
        }
    }

    /// One step of decoding: the payload's sequence number and range in `buf`.
    /// Reads the preamble if it is due: `Ok(false)` while more bytes are needed.
    fn preamble(&mut self) -> Result<bool, FrameError> {
        if self.preamble_seen {
            return Ok(true);
        }
        let avail = &self.buf[self.start..];
        let have = avail.len().min(MAGIC.len());
        if avail[..have] != MAGIC[..have] {
            return Err(FrameError::BadMagic {
                got: String::from_utf8_lossy(&avail[..have]).into_owned(),
            });
        }
        if avail.len() < PREAMBLE_BYTES {
            return Ok(false);
        }
        let version = u16::from_le_bytes([avail[MAGIC.len()], avail[MAGIC.len() + 1]]);
        if version != VERSION {
            return Err(FrameError::Version { got: version });
        }
        self.start += PREAMBLE_BYTES;
        self.preamble_seen = true;
        Ok(true)
    }

    /// One step of decoding: the payload's sequence number and range in `buf`.
    fn step(&mut self) -> Result<Option<(u32, usize, usize)>, FrameError> {
        if !self.preamble()? {
            return Ok(None);
        }
        let avail = &self.buf[self.start..];
        if avail.len() < HEADER_BYTES {
            return Ok(None);
        }
        let word =
            |i: usize| u32::from_le_bytes([avail[i], avail[i + 1], avail[i + 2], avail[i + 3]]);
        let (len, seq, sum) = (word(0) as usize, word(4), word(8));
        if len > MAX_FRAME_BYTES {
            return Err(FrameError::TooLarge { seq, len });
        }
        if avail.len() < HEADER_BYTES + len {
            return Ok(None);
        }
        let payload = &avail[HEADER_BYTES..HEADER_BYTES + len];
        let computed = crc(seq, payload);
        if computed != sum {
            return Err(FrameError::Corrupted {
                seq,
                got: sum,
                computed,
            });
        }
        if seq != self.next_seq {
            return Err(FrameError::OutOfOrder {
                expected: self.next_seq,
                got: seq,
            });
        }
        self.next_seq = self.next_seq.wrapping_add(1);
        let from = self.start + HEADER_BYTES;
        self.start = from + len;
        debug_assert!(
            self.start <= self.buf.len(),
            "frame decoder overran its buffer"
        );
        Ok(Some((seq, from, from + len)))
    }

    /// The peer closed its side: an error if it stopped in the middle of the
    /// preamble or a frame.
    pub fn finish(&mut self) -> Result<(), FrameError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if let Err(e) = self.preamble() {
            self.failed = Some(e.clone());
            return Err(e);
        }
        match self.buffered() {
            0 => Ok(()),
            buffered => Err(FrameError::Truncated { buffered }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(payloads: &[&[u8]]) -> Vec<u8> {
        let mut out = preamble().to_vec();
        let mut enc = FrameEncoder::default();
        for p in payloads {
            enc.encode(p, &mut out);
        }
        out
    }

    fn decode_all(bytes: &[u8], chunk: usize) -> Result<Vec<Vec<u8>>, FrameError> {
        let mut d = FrameDecoder::new();
        let mut got = Vec::new();
        for c in bytes.chunks(chunk.max(1)) {
            d.feed(c);
            while let Some((_, p)) = d.next_frame()? {
                got.push(p.to_vec());
            }
        }
        d.finish()?;
        Ok(got)
    }

    #[test]
    fn frames_survive_any_chunking() {
        let bytes = stream(&[b"one", b"", b"three", &[7u8; 3000]]);
        for chunk in [1, 2, 5, 13, 4096] {
            let got = decode_all(&bytes, chunk).unwrap();
            assert_eq!(got.len(), 4);
            assert_eq!(got[0], b"one");
            assert_eq!(got[1], b"");
            assert_eq!(got[3], vec![7u8; 3000]);
        }
    }

    #[test]
    fn each_kind_of_damage_has_its_error() {
        let good = stream(&[b"alpha", b"beta"]);
        // Not sidecore at all.
        let e = decode_all(b"HTTP/1.1 400 Bad Request\r\n", 64).unwrap_err();
        assert!(matches!(e, FrameError::BadMagic { .. }), "{e}");
        assert!(e.to_string().contains("not a sidecore node"), "{e}");
        // Another version.
        let mut v = good.clone();
        v[6] = 1;
        v[7] = 0;
        assert_eq!(
            decode_all(&v, 64).unwrap_err(),
            FrameError::Version { got: 1 }
        );
        // A flipped payload byte.
        let mut c = good.clone();
        let last = c.len() - 1;
        c[last] ^= 0x40;
        assert!(matches!(
            decode_all(&c, 64).unwrap_err(),
            FrameError::Corrupted { seq: 1, .. }
        ));
        // A lost frame: drop the first one whole.
        let first = HEADER_BYTES + 5;
        let mut l = good[..PREAMBLE_BYTES].to_vec();
        l.extend_from_slice(&good[PREAMBLE_BYTES + first..]);
        assert_eq!(
            decode_all(&l, 64).unwrap_err(),
            FrameError::OutOfOrder {
                expected: 0,
                got: 1
            }
        );
        // Cut short.
        assert_eq!(
            decode_all(&good[..good.len() - 2], 64).unwrap_err(),
            FrameError::Truncated {
                buffered: HEADER_BYTES + 2
            }
        );
        // Announcing more than the limit.
        let mut big = preamble().to_vec();
        big.extend_from_slice(&u32::MAX.to_le_bytes());
        big.extend_from_slice(&[0u8; 8]);
        let e = decode_all(&big, 64).unwrap_err();
        assert!(matches!(e, FrameError::TooLarge { seq: 0, .. }), "{e}");
    }

    #[test]
    fn a_failed_decoder_stays_failed() {
        let mut d = FrameDecoder::new();
        d.feed(b"XXXXXXXX");
        assert!(d.next_frame().is_err());
        d.feed(&stream(&[b"late"]));
        assert!(
            d.next_frame().is_err(),
            "no message may be read after the framing broke"
        );
        assert!(d.finish().is_err());
    }
}

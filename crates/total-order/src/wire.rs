//! The datagram format every node of the total order speaks, one UDP payload
//! each: a header (`magic`, version, kind, sender) and one of four bodies.
//! Little-endian throughout; a datagram is decoded completely or refused with
//! the field and offset that are wrong, never half-applied.
//!
//! ```text
//! u16 magic "TO" | u8 version | u8 kind | u16 from | body
//! Data   (1): u64 seq | u64 stamp | u16 len | payload[len]
//! Nack   (2): u16 sender | u16 count | u64 seq[count]
//! Beat   (3): u64 sent | u64 clock | u16 count | u64 next[count]
//! Submit (4): u64 id | u16 len | payload[len]
//! ```

/// The first two bytes of every datagram ("TO", little-endian).
pub const MAGIC: u16 = 0x4f54;
/// The format's version.
pub const VERSION: u8 = 1;
/// Most nodes a group may have.
pub const MAX_NODES: usize = 64;
/// Largest application payload, bytes: one datagram stays under a 1500-byte MTU.
pub const MAX_PAYLOAD_BYTES: usize = 1400;
/// Most sequence numbers one NACK asks for.
pub const MAX_NACK_SEQS: usize = 128;
/// Header bytes: magic, version, kind, sender.
pub const HEADER_BYTES: usize = 6;

/// A node's index in the group, `0..n`.
pub type NodeId = u16;

/// One decoded datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Datagram {
    /// Message `seq` of sender `from`, with its orderer's stamp (α's Lamport
    /// timestamp; 0 where no orderer stamps).
    Data {
        from: NodeId,
        seq: u64,
        stamp: u64,
        payload: Vec<u8>,
    },
    /// `from` asks `sender` to send these of its messages again.
    Nack {
        from: NodeId,
        sender: NodeId,
        seqs: Vec<u64>,
    },
    /// `from` has sent `sent` messages, its orderer's clock is `clock`, and it
    /// has received every message below `next[j]` of each node `j`.
    Beat {
        from: NodeId,
        sent: u64,
        clock: u64,
        next: Vec<u64>,
    },
    /// The fixed sequencer's baseline: `from` asks the sequencer to order its
    /// message `id`.
    Submit {
        from: NodeId,
        id: u64,
        payload: Vec<u8>,
    },
}

/// Why a datagram was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("datagram ends at byte {offset} inside field `{field}`")]
    Short { field: &'static str, offset: usize },
    #[error("bad magic {0:#06x} (want {MAGIC:#06x})")]
    Magic(u16),
    #[error("version {0} (this node speaks {VERSION})")]
    Version(u8),
    #[error("unknown kind {0}")]
    Kind(u8),
    #[error("field `{field}` at byte {offset} is {value}, over the limit {max}")]
    TooLarge {
        field: &'static str,
        offset: usize,
        value: usize,
        max: usize,
    },
    #[error("{extra} bytes after the end of the datagram")]
    Trailing { extra: usize },
}

/// A cursor over a datagram that names what it failed to read.
struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], DecodeError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.buf.len());
        let Some(end) = end else {
            return Err(DecodeError::Short {
                field,
                offset: self.buf.len(),
            });
        };
        let s = &self.buf[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self, field: &'static str) -> Result<u8, DecodeError> {
        Ok(self.take(1, field)?[0])
    }
    fn u16(&mut self, field: &'static str) -> Result<u16, DecodeError> {
        let b = self.take(2, field)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u64(&mut self, field: &'static str) -> Result<u64, DecodeError> {
        let b = self.take(8, field)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    /// A `u16` count checked against `max` before anything is allocated.
    fn count(&mut self, field: &'static str, max: usize) -> Result<usize, DecodeError> {
        let offset = self.at;
        let value = usize::from(self.u16(field)?);
        if value > max {
            return Err(DecodeError::TooLarge {
                field,
                offset,
                value,
                max,
            });
        }
        Ok(value)
    }
    fn payload(&mut self) -> Result<Vec<u8>, DecodeError> {
        let len = self.count("len", MAX_PAYLOAD_BYTES)?;
        Ok(self.take(len, "payload")?.to_vec())
    }
    fn seqs(&mut self, max: usize) -> Result<Vec<u64>, DecodeError> {
        let count = self.count("count", max)?;
        (0..count).map(|_| self.u64("seq")).collect()
    }
}

impl Datagram {
    /// The sender of the datagram.
    pub fn from(&self) -> NodeId {
        match self {
            Datagram::Data { from, .. }
            | Datagram::Nack { from, .. }
            | Datagram::Beat { from, .. }
            | Datagram::Submit { from, .. } => *from,
        }
    }

    /// Decodes one datagram.
    pub fn decode(buf: &[u8]) -> Result<Datagram, DecodeError> {
        let mut r = Reader { buf, at: 0 };
        let magic = r.u16("magic")?;
        if magic != MAGIC {
            return Err(DecodeError::Magic(magic));
        }
        let version = r.u8("version")?;
        if version != VERSION {
            return Err(DecodeError::Version(version));
        }
        let kind = r.u8("kind")?;
        let from = r.u16("from")?;
        let d = match kind {
            1 => Datagram::Data {
                from,
                seq: r.u64("seq")?,
                stamp: r.u64("stamp")?,
                payload: r.payload()?,
            },
            2 => Datagram::Nack {
                from,
                sender: r.u16("sender")?,
                seqs: r.seqs(MAX_NACK_SEQS)?,
            },
            3 => Datagram::Beat {
                from,
                sent: r.u64("sent")?,
                clock: r.u64("clock")?,
                next: r.seqs(MAX_NODES)?,
            },
            4 => Datagram::Submit {
                from,
                id: r.u64("id")?,
                payload: r.payload()?,
            },
            k => return Err(DecodeError::Kind(k)),
        };
        if r.at != buf.len() {
            return Err(DecodeError::Trailing {
                extra: buf.len() - r.at,
            });
        }
        Ok(d)
    }

    /// Encodes the datagram.
    ///
    /// # Panics
    /// If a payload, NACK or beat is over its limit: the state machines
    /// never build one, so that would be a bug here, not bad input.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(64);
        let kind = match self {
            Datagram::Data { .. } => 1u8,
            Datagram::Nack { .. } => 2,
            Datagram::Beat { .. } => 3,
            Datagram::Submit { .. } => 4,
        };
        b.extend_from_slice(&MAGIC.to_le_bytes());
        b.push(VERSION);
        b.push(kind);
        b.extend_from_slice(&self.from().to_le_bytes());
        let put_list = |b: &mut Vec<u8>, v: &[u64], max: usize| {
            assert!(
                v.len() <= max,
                "a list of {} entries (limit {max})",
                v.len()
            );
            b.extend_from_slice(&(v.len() as u16).to_le_bytes());
            for x in v {
                b.extend_from_slice(&x.to_le_bytes());
            }
        };
        let put_payload = |b: &mut Vec<u8>, p: &[u8]| {
            assert!(
                p.len() <= MAX_PAYLOAD_BYTES,
                "a payload of {} bytes",
                p.len()
            );
            b.extend_from_slice(&(p.len() as u16).to_le_bytes());
            b.extend_from_slice(p);
        };
        match self {
            Datagram::Data {
                seq,
                stamp,
                payload,
                ..
            } => {
                b.extend_from_slice(&seq.to_le_bytes());
                b.extend_from_slice(&stamp.to_le_bytes());
                put_payload(&mut b, payload);
            }
            Datagram::Nack { sender, seqs, .. } => {
                b.extend_from_slice(&sender.to_le_bytes());
                put_list(&mut b, seqs, MAX_NACK_SEQS);
            }
            Datagram::Beat {
                sent, clock, next, ..
            } => {
                b.extend_from_slice(&sent.to_le_bytes());
                b.extend_from_slice(&clock.to_le_bytes());
                put_list(&mut b, next, MAX_NODES);
            }
            Datagram::Submit { id, payload, .. } => {
                b.extend_from_slice(&id.to_le_bytes());
                put_payload(&mut b, payload);
            }
        }
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_round_trips() {
        let all = [
            Datagram::Data {
                from: 2,
                seq: 7,
                stamp: 99,
                payload: b"hello".to_vec(),
            },
            Datagram::Nack {
                from: 1,
                sender: 3,
                seqs: vec![4, 5, 9],
            },
            Datagram::Beat {
                from: 0,
                sent: 10,
                clock: 42,
                next: vec![1, 2, 3],
            },
            Datagram::Submit {
                from: 4,
                id: 1,
                payload: vec![],
            },
        ];
        for d in all {
            assert_eq!(Datagram::decode(&d.encode()).unwrap(), d);
        }
    }

    #[test]
    fn bad_datagrams_name_what_is_wrong() {
        let good = Datagram::Data {
            from: 1,
            seq: 1,
            stamp: 1,
            payload: vec![1, 2, 3],
        }
        .encode();
        assert_eq!(
            Datagram::decode(&[]),
            Err(DecodeError::Short {
                field: "magic",
                offset: 0
            })
        );
        assert_eq!(Datagram::decode(b"XXXXXX"), Err(DecodeError::Magic(0x5858)));
        let mut v = good.clone();
        v[2] = 9;
        assert_eq!(Datagram::decode(&v), Err(DecodeError::Version(9)));
        let mut k = good.clone();
        k[3] = 77;
        assert_eq!(Datagram::decode(&k), Err(DecodeError::Kind(77)));
        assert_eq!(
            Datagram::decode(&good[..good.len() - 1]),
            Err(DecodeError::Short {
                field: "payload",
                offset: good.len() - 1
            })
        );
        let mut t = good.clone();
        t.push(0);
        assert_eq!(
            Datagram::decode(&t),
            Err(DecodeError::Trailing { extra: 1 })
        );
        let mut big = good[..HEADER_BYTES + 16].to_vec();
        big.extend_from_slice(&u16::MAX.to_le_bytes());
        assert!(matches!(
            Datagram::decode(&big),
            Err(DecodeError::TooLarge {
                field: "len",
                offset: 22,
                ..
            })
        ));
    }
}

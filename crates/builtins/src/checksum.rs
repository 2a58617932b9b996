//! `inet-checksum`: the RFC 1071 Internet checksum of every record, read in
//! place from the input slot. Publishes the count, the bytes, the wrapping sum
//! of all checksums (so a test can check every record was summed) and the
//! number of sequence gaps seen (records are numbered by `record-source`).

use serde::Deserialize;
use sidecore_offcode::{
    InitCx, InputId, Metric, Offcode, OffcodeError, OutputId, Progress, RunCx, parse_params,
};

/// RFC 1071 Internet checksum: the ones' complement of the ones' complement
/// sum of the data as big-endian 16-bit words (an odd final byte is padded
/// with zero).
#[inline]
pub fn inet_checksum(data: &[u8]) -> u16 {
    // Sum 32-bit big-endian words into a 64-bit accumulator: carries fold
    // later, as RFC 1071 §2(B) allows (deferred carries).
    let mut sum: u64 = 0;
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        sum += u32::from_be_bytes([c[0], c[1], c[2], c[3]]) as u64;
    }
    let rest = chunks.remainder();
    let mut i = 0;
    while i + 1 < rest.len() {
        sum += u16::from_be_bytes([rest[i], rest[i + 1]]) as u64;
        i += 2;
    }
    if i < rest.len() {
        sum += (rest[i] as u64) << 8;
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Params {
    /// Check that records arrive numbered 0, 1, 2, ... and count gaps.
    #[serde(default = "yes")]
    check_sequence: bool,
}

fn yes() -> bool {
    true
}

/// The checksum offcode. Counters are kept locally and published to the
/// metrics once per turn of the loop (in `poll`), so the per-record path does
/// no atomic read-modify-write.
pub struct InetChecksum {
    check_sequence: bool,
    expect: u64,
    n_records: u64,
    n_bytes: u64,
    n_sum: u64,
    n_gaps: u64,
    n_last: u64,
    input: InputId,
    out: Option<OutputId>,
    records: Metric,
    bytes: Metric,
    sum: Metric,
    gaps: Metric,
    last: Metric,
}

impl InetChecksum {
    pub fn new(params: &toml::Table) -> Result<Self, OffcodeError> {
        let p: Params = parse_params(params)?;
        Ok(InetChecksum {
            check_sequence: p.check_sequence,
            expect: 0,
            n_records: 0,
            n_bytes: 0,
            n_sum: 0,
            n_gaps: 0,
            n_last: 0,
            input: InputId(0),
            out: None,
            records: Metric::default(),
            bytes: Metric::default(),
            sum: Metric::default(),
            gaps: Metric::default(),
            last: Metric::default(),
        })
    }
}

impl Offcode for InetChecksum {
    fn initialize(&mut self, cx: &mut InitCx<'_>) -> Result<(), OffcodeError> {
        self.input = cx.input("in")?;
        self.out = cx.output("out").ok();
        self.records = cx.metric("records");
        self.bytes = cx.metric("bytes");
        self.sum = cx.metric("checksum_sum");
        self.gaps = cx.metric("sequence_gaps");
        self.last = cx.metric("last_checksum");
        Ok(())
    }

    #[inline]
    fn handle(
        &mut self,
        cx: &mut RunCx<'_>,
        input: InputId,
        msg: &[u8],
    ) -> Result<(), OffcodeError> {
        debug_assert_eq!(input, self.input);
        let c = inet_checksum(msg);
        self.n_records += 1;
        self.n_bytes += msg.len() as u64;
        self.n_sum = self.n_sum.wrapping_add(c as u64);
        self.n_last = c as u64;
        if self.check_sequence && msg.len() >= 8 {
            let seq = u64::from_le_bytes(msg[..8].try_into().expect("8 bytes"));
            if seq != self.expect {
                self.n_gaps += 1;
            }
            self.expect = seq + 1;
        }
        if let Some(out) = self.out {
            let seq = msg
                .get(..8)
                .map(|s| u64::from_le_bytes(s.try_into().expect("8 bytes")))
                .unwrap_or(0);
            cx.send(out, |slot| {
                slot[..8].copy_from_slice(&seq.to_le_bytes());
                slot[8..10].copy_from_slice(&c.to_be_bytes());
                10
            })?;
        }
        Ok(())
    }

    fn poll(&mut self, _cx: &mut RunCx<'_>) -> Result<Progress, OffcodeError> {
        self.publish_metrics();
        Ok(Progress::Idle)
    }

    fn stop(&mut self, _cx: &mut RunCx<'_>) -> Result<(), OffcodeError> {
        self.publish_metrics();
        Ok(())
    }
}

impl InetChecksum {
    /// Publishes the local counters (only this offcode writes them: plain stores).
    fn publish_metrics(&self) {
        self.records.set(self.n_records);
        self.bytes.set(self.n_bytes);
        self.sum.set(self.n_sum);
        self.gaps.set(self.n_gaps);
        self.last.set(self.n_last);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The worked example of RFC 1071 §3: bytes 00 01 f2 03 f4 f5 f6 f7 sum to
    /// ddf2 (one's complement), so the checksum is 220d.
    #[test]
    fn rfc1071_example() {
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(inet_checksum(&data), !0xddf2u16);
        assert_eq!(inet_checksum(&data), 0x220d);
    }

    /// A checksum inserted into the data makes it verify to zero.
    #[test]
    fn verifies_to_zero_and_handles_odd_lengths() {
        for len in [1usize, 2, 3, 5, 7, 63, 64, 1500] {
            let mut data: Vec<u8> = (0..len).map(|i| (i * 37 + 11) as u8).collect();
            if data.len() % 2 == 1 {
                data.push(0);
            }
            let c = inet_checksum(&data);
            data.extend_from_slice(&c.to_be_bytes());
            assert_eq!(inet_checksum(&data), 0, "len {len}");
        }
    }

    /// Compare with a straightforward 16-bit implementation.
    #[test]
    fn matches_the_reference_on_random_data() {
        fn reference(d: &[u8]) -> u16 {
            let mut s: u32 = 0;
            for c in d.chunks(2) {
                let w = if c.len() == 2 {
                    u16::from_be_bytes([c[0], c[1]])
                } else {
                    (c[0] as u16) << 8
                };
                s += w as u32;
                s = (s & 0xffff) + (s >> 16);
            }
            !(s as u16)
        }
        let mut x = 12345u64;
        for len in 0..300 {
            let d: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            assert_eq!(inet_checksum(&d), reference(&d), "len {len}");
        }
    }
}

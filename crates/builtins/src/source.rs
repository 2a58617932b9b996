//! `record-source`: generates numbered, fixed-size records straight into its
//! output channel's slots (zero copy). Record `n` starts with `n` as a
//! little-endian u64 and is filled with bytes derived from `n` by
//! [`fill_record`], so a receiver (or a test) can recompute it.

use std::time::{Duration, Instant};

use serde::Deserialize;
use sidecore_channel::SendOutcome;
use sidecore_offcode::{
    InitCx, Metric, Offcode, OffcodeError, OutputId, Progress, RunCx, parse_params,
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Params {
    /// Bytes per record (at least 8).
    #[serde(default = "default_size")]
    record_size: u32,
    /// Records to send; 0 = until stopped.
    #[serde(default)]
    records: u64,
    /// Records per second; 0 = as fast as the output accepts.
    #[serde(default)]
    rate: u64,
    /// Records written per turn of the loop before publishing.
    #[serde(default = "default_batch")]
    batch: u32,
}

fn default_size() -> u32 {
    64
}
fn default_batch() -> u32 {
    128
}

/// Fills `buf` as record number `seq`.
#[inline]
pub fn fill_record(seq: u64, buf: &mut [u8]) {
    let n = buf.len().min(8);
    buf[..n].copy_from_slice(&seq.to_le_bytes()[..n]);
    let mut x = seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for chunk in buf[n..].chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        chunk.copy_from_slice(&b[..chunk.len()]);
    }
}

/// The record source offcode.
pub struct RecordSource {
    size: usize,
    limit: u64,
    rate: u64,
    batch: u32,
    next: u64,
    out: OutputId,
    started: Option<Instant>,
    records: Metric,
    bytes: Metric,
    waits: Metric,
}

impl RecordSource {
    /// Builds a source from its parameters (validated here).
    pub fn new(params: &toml::Table) -> Result<Self, OffcodeError> {
        let p: Params = parse_params(params)?;
        if p.record_size < 8 {
            return Err(OffcodeError::Params(format!(
                "record_size must be at least 8 bytes, got {}",
                p.record_size
            )));
        }
        if p.batch == 0 {
            return Err(OffcodeError::Params("batch must be at least 1".into()));
        }
        Ok(RecordSource {
            size: p.record_size as usize,
            limit: p.records,
            rate: p.rate,
            batch: p.batch,
            next: 0,
            out: OutputId(0),
            started: None,
            records: Metric::default(),
            bytes: Metric::default(),
            waits: Metric::default(),
        })
    }

    fn allowed_now(&self, now: Instant) -> u64 {
        let Some(t0) = self.started else { return 0 };
        if self.rate == 0 {
            return u64::MAX;
        }
        let due = (now.duration_since(t0).as_secs_f64() * self.rate as f64) as u64 + 1;
        due.saturating_sub(self.next)
    }
}

impl Offcode for RecordSource {
    fn initialize(&mut self, cx: &mut InitCx<'_>) -> Result<(), OffcodeError> {
        self.out = cx.output("out")?;
        self.records = cx.metric("records");
        self.bytes = cx.metric("bytes");
        self.waits = cx.metric("backpressure");
        Ok(())
    }

    fn start(&mut self, cx: &mut RunCx<'_>) -> Result<(), OffcodeError> {
        let cap = cx.capacity(self.out)?;
        if cap < self.size {
            return Err(OffcodeError::Params(format!(
                "record_size {} does not fit the output channel's {cap}-byte slots",
                self.size
            )));
        }
        self.started = Some(cx.now());
        Ok(())
    }

    fn poll(&mut self, cx: &mut RunCx<'_>) -> Result<Progress, OffcodeError> {
        // The executor publishes what a turn sent right after `poll` returns.
        if self.limit != 0 && self.next >= self.limit {
            return Ok(Progress::Done);
        }
        let mut budget = (self.batch as u64).min(self.allowed_now(cx.now()));
        if self.limit != 0 {
            budget = budget.min(self.limit - self.next);
        }
        let mut sent = 0u64;
        let mut failed = None;
        while sent < budget {
            let seq = self.next;
            let size = self.size;
            match cx.send(self.out, |slot| {
                fill_record(seq, &mut slot[..size]);
                size
            }) {
                Ok(SendOutcome::Sent | SendOutcome::Dropped) => {
                    self.next += 1;
                    sent += 1;
                }
                Ok(SendOutcome::Full) => {
                    self.waits.add(1);
                    break;
                }
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        // Count before any error returns: what was sent is already in the channel
        // (a full batch publishes itself), and the receiver counts it even when the
        // app stops halfway through a batch.
        self.records.add(sent);
        self.bytes.add(sent * self.size as u64);
        if let Some(e) = failed {
            return Err(e);
        }
        if sent > 0 {
            Ok(Progress::Busy)
        } else {
            if self.rate > 0 {
                std::hint::spin_loop();
            }
            Ok(Progress::Idle)
        }
    }
}

/// Time for `n` records at `rate` per second (for tests and the demo).
pub fn duration_for(n: u64, rate: u64) -> Duration {
    Duration::from_secs_f64(n as f64 / rate.max(1) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_numbered_and_deterministic() {
        let mut a = [0u8; 64];
        let mut b = [0u8; 64];
        fill_record(42, &mut a);
        fill_record(42, &mut b);
        assert_eq!(a, b);
        assert_eq!(u64::from_le_bytes(a[..8].try_into().unwrap()), 42);
        fill_record(43, &mut b);
        assert_ne!(a[8..], b[8..]);
    }

    #[test]
    fn bad_parameters_are_named() {
        let t: toml::Table = toml::from_str("record_size = 4").unwrap();
        assert!(
            RecordSource::new(&t)
                .err()
                .unwrap()
                .to_string()
                .contains("at least 8")
        );
        let t: toml::Table = toml::from_str("recordsize = 64").unwrap();
        assert!(
            RecordSource::new(&t)
                .err()
                .unwrap()
                .to_string()
                .contains("unknown field `recordsize`")
        );
        let t: toml::Table = toml::from_str("records = -1").unwrap();
        assert!(RecordSource::new(&t).is_err());
    }
}

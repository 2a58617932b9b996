//! The `traffic-analyser` offcode: receives the generator's datagrams on UDP
//! sockets bound to its ports (in the receiving host's namespace), stamped by
//! the kernel on arrival, and keeps the figures HYDRA's Tables 8.6–8.7 report:
//! what arrived, how fast, the mean and standard deviation of the
//! inter-arrival times, and the delay from the send time in each datagram.
//!
//! Parameters: `addr` (the address to bind), `dports`, `netns`. Metrics:
//! `received`, `bytes` (payload), `gaps` (sequence numbers skipped),
//! `reordered`, `iat_mean_ns`, `iat_std_ns`, `delay_mean_ns`, `first_ns` and
//! `last_ns` (arrival times of the first and last datagram).

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};

use serde::Deserialize;
use sidecore_offcode::{
    BuildSpec, InitCx, Metric, Offcode, OffcodeError, Progress, RunCx, parse_params,
};
use sidecore_packetio::frame::STAMP_BYTES;
use sidecore_packetio::{RecvBatch, enable_timestamps, recv_batch, set_receive_buffer};

use crate::util::{bad, ipv4};

/// Datagrams taken per receive.
const BATCH: usize = 64;
/// Receive buffer asked for each socket: about half a second of 64-byte
/// datagrams at 20k pps (each costs ~1 KB of buffer), so a measurement is
/// not cut short when the analyser's thread is descheduled for a while on
/// a busy machine. Forced past `net.core.rmem_max` when running as root.
const RCVBUF_BYTES: libc::c_int = 16 << 20;

fn default_dports() -> Vec<u16> {
    vec![5000]
}

/// The analyser's parameters.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    #[serde(default)]
    pub netns: Option<String>,
    pub addr: String,
    #[serde(default = "default_dports")]
    pub dports: Vec<u16>,
}

impl Params {
    /// Reads and checks the parameters.
    pub fn parse(t: &toml::Table) -> Result<Params, OffcodeError> {
        let p: Params = parse_params(t)?;
        ipv4("addr", &p.addr)?;
        if p.dports.is_empty() {
            return Err(bad("dports", "give at least one port"));
        }
        Ok(p)
    }
}

/// Running statistics of the inter-arrival times (Welford's algorithm).
#[derive(Debug, Default, Clone, Copy)]
pub struct Welford {
    n: u64,
    mean: f64,
    m2: f64,
}

impl Welford {
    pub fn add(&mut self, x: f64) {
        self.n += 1;
        #[allow(clippy::cast_precision_loss)] // counts far below 2^53
        let n = self.n as f64;
        let d = x - self.mean;
        self.mean += d / n;
        self.m2 += d * (x - self.mean);
    }
    pub fn mean(&self) -> f64 {
        self.mean
    }
    pub fn std(&self) -> f64 {
        if self.n < 2 {
            return 0.0;
        }
        #[allow(clippy::cast_precision_loss)]
        let n = (self.n - 1) as f64;
        (self.m2 / n).sqrt()
    }
}

/// The analyser.
pub struct Analyser {
    p: Params,
    socks: Vec<UdpSocket>,
    batch: RecvBatch,
    next_seq: Option<u64>,
    last_ns: u64,
    iat: Welford,
    delay: Welford,
    m: [Metric; 9],
}

/// Builds an analyser.
pub fn build(spec: &BuildSpec<'_>) -> Result<Box<dyn Offcode>, OffcodeError> {
    Ok(Box::new(Analyser {
        p: Params::parse(spec.params)?,
        socks: Vec::new(),
        batch: RecvBatch::new(BATCH),
        next_seq: None,
        last_ns: 0,
        iat: Welford::default(),
        delay: Welford::default(),
        m: Default::default(),
    }))
}

const NAMES: [&str; 9] = [
    "received",
    "bytes",
    "gaps",
    "reordered",
    "iat_mean_ns",
    "iat_std_ns",
    "delay_mean_ns",
    "first_ns",
    "last_ns",
];

impl Analyser {
    fn take(&mut self, payload: &[u8], stamp_ns: u64) {
        let [received, bytes, gaps, reordered, ..] = &self.m;
        received.add(1);
        bytes.add(payload.len() as u64);
        if payload.len() >= STAMP_BYTES {
            let seq = u64::from_be_bytes(payload[..8].try_into().unwrap_or([0; 8]));
            let sent = u64::from_be_bytes(payload[8..16].try_into().unwrap_or([0; 8]));
            match self.next_seq {
                Some(n) if seq > n => gaps.add(seq - n),
                Some(n) if seq < n => reordered.add(1),
                _ => {}
            }
            self.next_seq = Some(self.next_seq.map_or(seq + 1, |n| n.max(seq + 1)));
            if stamp_ns >= sent && sent > 0 {
                #[allow(clippy::cast_precision_loss)]
                self.delay.add((stamp_ns - sent) as f64);
            }
        }
        if stamp_ns > 0 {
            if self.last_ns > 0 && stamp_ns >= self.last_ns {
                #[allow(clippy::cast_precision_loss)]
                self.iat.add((stamp_ns - self.last_ns) as f64);
            } else if self.last_ns == 0 {
                self.m[7].set(stamp_ns);
            }
            self.last_ns = stamp_ns;
        }
    }

    fn publish(&self) {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // ns, non-negative
        let ns = |x: f64| x.round() as u64;
        self.m[4].set(ns(self.iat.mean()));
        self.m[5].set(ns(self.iat.std()));
        self.m[6].set(ns(self.delay.mean()));
        self.m[8].set(self.last_ns);
    }
}

impl Offcode for Analyser {
    fn initialize(&mut self, cx: &mut InitCx<'_>) -> Result<(), OffcodeError> {
        for (m, n) in self.m.iter_mut().zip(NAMES) {
            *m = cx.metric(n);
        }
        let addr = Ipv4Addr::from(ipv4("addr", &self.p.addr)?);
        for &port in &self.p.dports {
            let s = sidecore_testbed::within(self.p.netns.as_deref(), || {
                UdpSocket::bind(SocketAddrV4::new(addr, port))
            })
            .map_err(|e| OffcodeError::Failed(e.to_string()))?
            .map_err(|e| bad("addr", format!("cannot bind {addr}:{port}: {e}")))?;
            enable_timestamps(&s)
                .map_err(|e| OffcodeError::Failed(format!("SO_TIMESTAMPNS: {e}")))?;
            // Not fatal: the default buffer works, it only tolerates
            // shorter stalls.
            let _ = set_receive_buffer(&s, RCVBUF_BYTES);
            s.set_nonblocking(true)
                .map_err(|e| OffcodeError::Failed(e.to_string()))?;
            self.socks.push(s);
        }
        Ok(())
    }

    fn poll(&mut self, _cx: &mut RunCx<'_>) -> Result<Progress, OffcodeError> {
        let mut got = 0;
        for i in 0..self.socks.len() {
            let n = recv_batch(&self.socks[i], &mut self.batch)
                .map_err(|e| OffcodeError::Failed(e.to_string()))?;
            for k in 0..n {
                let (len, stamp) = (self.batch.lens[k], self.batch.stamps_ns[k]);
                let payload = self.batch.frame(k)[..len].to_vec();
                self.take(&payload, stamp);
            }
            got += n;
        }
        if got > 0 {
            self.publish();
            Ok(Progress::Busy)
        } else {
            Ok(Progress::Idle)
        }
    }

    fn stop(&mut self, _cx: &mut RunCx<'_>) -> Result<(), OffcodeError> {
        self.publish();
        self.socks.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn welford_matches_the_textbook() {
        let mut w = Welford::default();
        for x in [2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0] {
            w.add(x);
        }
        assert!((w.mean() - 5.0).abs() < 1e-9);
        // Sample standard deviation of the classic example.
        assert!((w.std() - 2.138_089_935).abs() < 1e-6, "{}", w.std());
    }
}

//! The `stream-receiver` offcode (HYDRA's TiVoPC client, §8.1): receives the
//! streamer's datagrams on a UDP socket (in the client's namespace), stamped
//! by the kernel on arrival (`SO_TIMESTAMPNS`, so its own scheduling does not
//! colour the figures), and keeps the inter-arrival times Table 8.2 reports
//! (the seed calls them "jitter"): median, mean, standard deviation, p99.
//! Mean and deviation come from the analyser's running [`Welford`]; the
//! quantiles from the kept samples ([`IatStats`], sans-IO).
//!
//! Each datagram is forwarded on `out` (to the `decoder`) when that output is
//! connected; a full ring drops it there and counts it, so decoding never
//! holds up reception.
//!
//! Parameters: `addr`, `port` (default 5000), `netns`, `max_samples` (kept
//! inter-arrival times for the quantiles, default 1,048,576; the mean and
//! deviation cover every arrival). Metrics: `received`, `bytes`,
//! `iat_count`, `iat_median_ns`, `iat_mean_ns`, `iat_std_ns`, `iat_p99_ns`,
//! `iat_max_ns`, `first_ns`, `last_ns` (arrival times, ns since the epoch),
//! `forwarded`, `forward_dropped`.

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::time::{Duration, Instant};

use serde::Deserialize;
use sidecore_channel::SendOutcome;
use sidecore_offcode::{
    BuildSpec, InitCx, Metric, Offcode, OffcodeError, OutputId, Progress, RunCx, parse_params,
};
use sidecore_packetio::{RecvBatch, enable_timestamps, recv_batch};

use crate::analyser::Welford;
use crate::util::{bad, ipv4};

/// Datagrams taken per receive.
const BATCH: usize = 64;
/// Most samples kept for the quantiles.
pub const MAX_SAMPLES: usize = 1 << 24;
/// How often the quantiles are recomputed while running.
const PUBLISH_EVERY: Duration = Duration::from_millis(250);

fn default_port() -> u16 {
    5000
}
fn default_samples() -> usize {
    1 << 20
}

/// The receiver's parameters.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    #[serde(default)]
    pub netns: Option<String>,
    pub addr: String,
    #[serde(default = "default_port")]
    pub port: u16,
    #[serde(default = "default_samples")]
    pub max_samples: usize,
}

impl Params {
    /// Reads and checks the parameters.
    pub fn parse(t: &toml::Table) -> Result<Params, OffcodeError> {
        let p: Params = parse_params(t)?;
        ipv4("addr", &p.addr)?;
        if p.port == 0 {
            return Err(bad("port", "0 is not a port to listen on"));
        }
        if !(1..=MAX_SAMPLES).contains(&p.max_samples) {
            return Err(bad(
                "max_samples",
                format!("{} is outside 1..={MAX_SAMPLES}", p.max_samples),
            ));
        }
        Ok(p)
    }
}

/// A summary of inter-arrival times, ns.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct IatSummary {
    pub count: u64,
    pub median_ns: f64,
    pub mean_ns: f64,
    pub std_ns: f64,
    pub p99_ns: f64,
    pub max_ns: f64,
}

/// Inter-arrival statistics (sans-IO): every gap in the running mean and
/// deviation, the first `max` gaps kept for the quantiles.
#[derive(Debug, Clone)]
pub struct IatStats {
    w: Welford,
    samples: Vec<u64>,
    max: usize,
    max_ns: u64,
    last_ns: Option<u64>,
}

impl IatStats {
    pub fn new(max: usize) -> IatStats {
        IatStats {
            w: Welford::default(),
            samples: Vec::with_capacity(max.min(1 << 16)),
            max,
            max_ns: 0,
            last_ns: None,
        }
    }

    /// One arrival at `t_ns`; an arrival earlier than the last is skipped.
    pub fn arrival(&mut self, t_ns: u64) {
        if let Some(last) = self.last_ns {
            if t_ns < last {
                return;
            }
            let gap = t_ns - last;
            #[allow(clippy::cast_precision_loss)] // gaps far below 2^53 ns
            self.w.add(gap as f64);
            self.max_ns = self.max_ns.max(gap);
            if self.samples.len() < self.max {
                self.samples.push(gap);
            }
        }
        self.last_ns = Some(t_ns);
    }

    /// The summary so far (quantiles by nearest rank over the kept gaps).
    pub fn summary(&self) -> IatSummary {
        let mut v = self.samples.clone();
        let q = |v: &mut Vec<u64>, p: f64| -> f64 {
            if v.is_empty() {
                return 0.0;
            }
            #[allow(
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss,
                clippy::cast_precision_loss
            )]
            let k = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
            #[allow(clippy::cast_precision_loss)]
            let x = *v.select_nth_unstable(k).1 as f64;
            x
        };
        #[allow(clippy::cast_precision_loss)]
        IatSummary {
            count: self.samples.len() as u64,
            median_ns: q(&mut v, 0.5),
            mean_ns: self.w.mean(),
            std_ns: self.w.std(),
            p99_ns: q(&mut v, 0.99),
            max_ns: self.max_ns as f64,
        }
    }
}

/// The receiver.
pub struct Receiver {
    p: Params,
    sock: Option<UdpSocket>,
    batch: RecvBatch,
    iat: IatStats,
    out: Option<OutputId>,
    first_ns: u64,
    last_ns: u64,
    published: Option<Instant>,
    /// On the host, an empty socket blocks it in `poll(2)` for up to
    /// [`HOST_WAIT_MS`], as an ordinary receiver blocks in `recv` (arrival
    /// times come from the kernel's stamps, so this costs no precision).
    host: bool,
    m: [Metric; 12],
}

/// How long a host-placed receiver blocks on an empty socket, ms.
const HOST_WAIT_MS: i32 = 2;

const NAMES: [&str; 12] = [
    "received",
    "bytes",
    "iat_count",
    "iat_median_ns",
    "iat_mean_ns",
    "iat_std_ns",
    "iat_p99_ns",
    "iat_max_ns",
    "first_ns",
    "last_ns",
    "forwarded",
    "forward_dropped",
];

/// Builds a receiver.
pub fn build(spec: &BuildSpec<'_>) -> Result<Box<dyn Offcode>, OffcodeError> {
    let p = Params::parse(spec.params)?;
    Ok(Box::new(Receiver {
        iat: IatStats::new(p.max_samples),
        p,
        sock: None,
        batch: RecvBatch::new(BATCH),
        out: None,
        first_ns: 0,
        last_ns: 0,
        published: None,
        host: spec.kind == sidecore_types::PeKind::Host,
        m: Default::default(),
    }))
}

impl Receiver {
    fn publish(&mut self) {
        let s = self.iat.summary();
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // ns, non-negative
        let ns = |x: f64| x.round() as u64;
        self.m[2].set(s.count);
        self.m[3].set(ns(s.median_ns));
        self.m[4].set(ns(s.mean_ns));
        self.m[5].set(ns(s.std_ns));
        self.m[6].set(ns(s.p99_ns));
        self.m[7].set(ns(s.max_ns));
        self.m[8].set(self.first_ns);
        self.m[9].set(self.last_ns);
        self.published = Some(Instant::now());
    }

    fn forward(&self, cx: &mut RunCx<'_>, payload: &[u8]) -> Result<(), OffcodeError> {
        let Some(out) = self.out else { return Ok(()) };
        let n = payload.len();
        match cx.send(out, |slot| {
            let k = n.min(slot.len());
            slot[..k].copy_from_slice(&payload[..k]);
            k
        })? {
            SendOutcome::Sent => self.m[10].add(1),
            _ => self.m[11].add(1),
        }
        Ok(())
    }
}

impl Offcode for Receiver {
    fn initialize(&mut self, cx: &mut InitCx<'_>) -> Result<(), OffcodeError> {
        for (m, n) in self.m.iter_mut().zip(NAMES) {
            *m = cx.metric(n);
        }
        self.out = cx.output("out").ok();
        let addr = SocketAddrV4::new(Ipv4Addr::from(ipv4("addr", &self.p.addr)?), self.p.port);
        let s = sidecore_testbed::within(self.p.netns.as_deref(), || UdpSocket::bind(addr))
            .map_err(|e| OffcodeError::failed(format!("entering the namespace: {e}")))?
            .map_err(|e| bad("addr", format!("cannot bind {addr}: {e}")))?;
        enable_timestamps(&s).map_err(|e| OffcodeError::failed(format!("SO_TIMESTAMPNS: {e}")))?;
        s.set_nonblocking(true)
            .map_err(|e| OffcodeError::failed(e.to_string()))?;
        self.sock = Some(s);
        Ok(())
    }

    fn poll(&mut self, cx: &mut RunCx<'_>) -> Result<Progress, OffcodeError> {
        let Some(sock) = self.sock.take() else {
            return Ok(Progress::Idle);
        };
        let r = recv_batch(&sock, &mut self.batch);
        self.sock = Some(sock);
        let n =
            r.map_err(|e| OffcodeError::failed(format!("receiving on {}: {e}", self.p.addr)))?;
        for k in 0..n {
            let (len, stamp) = (self.batch.lens[k], self.batch.stamps_ns[k]);
            self.m[0].add(1);
            self.m[1].add(len as u64);
            if stamp > 0 {
                if self.first_ns == 0 {
                    self.first_ns = stamp;
                }
                self.last_ns = stamp;
                self.iat.arrival(stamp);
            }
            self.forward(cx, &self.batch.frame(k)[..len])?;
        }
        if n == 0
            && self.host
            && let Some(sock) = &self.sock
        {
            let mut fd = libc::pollfd {
                fd: std::os::fd::AsRawFd::as_raw_fd(sock),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one pollfd that lives across the call; the socket is open.
            unsafe { libc::poll(&raw mut fd, 1, HOST_WAIT_MS) };
        }
        if n > 0 && self.published.is_none_or(|t| t.elapsed() >= PUBLISH_EVERY) {
            self.publish();
        }
        Ok(if n > 0 {
            Progress::Busy
        } else {
            Progress::Idle
        })
    }

    fn stop(&mut self, _cx: &mut RunCx<'_>) -> Result<(), OffcodeError> {
        self.publish();
        self.sock = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_mean_and_deviation() {
        let mut s = IatStats::new(1000);
        let mut t = 1_000_000u64;
        s.arrival(t);
        // 99 gaps of 5 ms and one of 15 ms.
        for i in 0..100 {
            t += if i == 50 { 15_000_000 } else { 5_000_000 };
            s.arrival(t);
        }
        s.arrival(t - 1); // earlier than the last: skipped
        let x = s.summary();
        assert_eq!(x.count, 100);
        assert!((x.median_ns - 5e6).abs() < 1.0, "{x:?}");
        assert!((x.mean_ns - 5.1e6).abs() < 1.0, "{x:?}");
        assert!((x.p99_ns - 5e6).abs() < 1.0, "{x:?}");
        assert!((x.max_ns - 15e6).abs() < 1.0, "{x:?}");
        assert!((x.std_ns - 1e6).abs() < 1e3, "{x:?}");
    }

    #[test]
    fn bad_parameters_are_named() {
        let t = |s: &str| -> toml::Table { toml::from_str(s).unwrap() };
        let e = Params::parse(&t("addr = \"here\"")).unwrap_err();
        assert!(e.to_string().contains("`addr`: `here`"), "{e}");
        let e = Params::parse(&t("addr = \"10.0.0.1\"\nport = 0")).unwrap_err();
        assert!(e.to_string().contains("`port`"), "{e}");
        let e = Params::parse(&t("addr = \"10.0.0.1\"\nmax_samples = 0")).unwrap_err();
        assert!(e.to_string().contains("`max_samples`: 0"), "{e}");
        Params::parse(&t("addr = \"10.0.0.1\"")).unwrap();
    }
}

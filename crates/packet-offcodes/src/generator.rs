//! The `traffic-generator` offcode (HYDRA §8.3): fixed-size UDP frames to
//! one destination, at a target rate or flat out, each carrying a sequence
//! number and its send time for the analyser.
//!
//! * `mode = "packet"` (the default on a dedicated core): whole frames built
//!   in place and sent in batches, no IP stack on the way out. `path` says
//!   how: `af_xdp` builds them in an AF_XDP socket's UMEM and queues them on
//!   its TX ring (zero-copy where the driver has it, copy mode on veth);
//!   `af_packet` sends them through an AF_PACKET socket that bypasses the
//!   qdisc, one `sendmmsg` per batch; `auto` (the default) tries AF_XDP and
//!   falls back to AF_PACKET when the kernel refuses, with a warning naming
//!   the refusal (and `xdp_refused_errno` set). `xdp_queue` is the queue to
//!   bind (default 0), `xdp_bind` `auto`, `copy` or `zerocopy`.
//! * `mode = "socket"` (the default on the host): a plain UDP socket loop, one
//!   `send_to` per datagram — what an ordinary program does.
//!
//! Parameters: `src`, `dst` (IPv4), `sport`, `dports` (cycled frame by frame,
//! e.g. one allowed and one denied port for a 50% discard), `frame_bytes`
//! (the Ethernet frame without FCS; 64 to 1514), `rate_pps` (0: flat out),
//! `count` (0: until stopped), `batch`, `netns`, and for packet mode `iface`
//! and `dst_mac` (default: from the route to `dst` and its neighbour entry).
//! Metrics (issue 11 item 4), cumulative since start so that a reader can
//! take differences over any window: `sent`, `bytes` (whole frames),
//! `cpu_ns` (the sending thread's CPU time), `elapsed_ms`, `send_errors`;
//! and the report: `rate_pps`, `rate_bps` (frame bits, without preamble and
//! FCS), `cpu_busy_ppm` (the thread's CPU time per elapsed time, parts per
//! million of one CPU), the departures' inter-arrival times `iat_mean_ns` and
//! `iat_std_ns` (each frame leaves when its batch's send returns, so frames of
//! one batch are 0 ns apart: burstiness shows in the deviation) with their
//! sums `iat_n`, `iat_sum_ns`, `iat_sumsq_ns2` for windows ([`Departures`]);
//! `io_socket`, `io_af_packet`, `io_af_xdp` or `io_af_xdp_zerocopy` is 1 for
//! the path the frames take.

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::time::Instant;

use serde::Deserialize;
use sidecore_firewall::Packet;
use sidecore_firewall::rule::PROTO_UDP;
use sidecore_offcode::{
    BuildSpec, InitCx, Metric, Offcode, OffcodeError, Progress, RunCx, parse_params,
};
use sidecore_packetio::frame::{self, FrameSpec, MAX_FRAME_BYTES, STAMP_BYTES};
use sidecore_packetio::{RawOptions, RawSocket, XskBind, XskOptions, XskSocket};
use sidecore_types::PeKind;

use crate::report::Departures;
use crate::util::{bad, ipv4, mac, next_hop_mac, realtime_ns, thread_cpu_ns};

/// Ethernet, IPv4 and UDP headers: what a socket does not send itself.
const HEADERS_BYTES: usize = 42;
/// Largest batch.
const MAX_BATCH: usize = 1024;

fn default_sport() -> u16 {
    4000
}
fn default_dports() -> Vec<u16> {
    vec![5000]
}
fn default_frame() -> usize {
    64
}
fn default_batch() -> usize {
    64
}

/// The generator's parameters.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    #[serde(default)]
    pub netns: Option<String>,
    pub src: String,
    pub dst: String,
    #[serde(default = "default_sport")]
    pub sport: u16,
    #[serde(default = "default_dports")]
    pub dports: Vec<u16>,
    #[serde(default = "default_frame")]
    pub frame_bytes: usize,
    #[serde(default)]
    pub rate_pps: u64,
    #[serde(default)]
    pub count: u64,
    #[serde(default = "default_batch")]
    pub batch: usize,
    #[serde(default)]
    pub mode: Option<String>,
    #[serde(default)]
    pub iface: Option<String>,
    #[serde(default)]
    pub dst_mac: Option<String>,
    /// (packet mode) `auto`, `af_xdp` or `af_packet`.
    #[serde(default)]
    pub path: Option<String>,
    #[serde(default)]
    pub xdp_queue: u32,
    /// `auto`, `copy` or `zerocopy`.
    #[serde(default)]
    pub xdp_bind: Option<String>,
}

impl Params {
    /// Reads and checks the parameters.
    pub fn parse(t: &toml::Table) -> Result<Params, OffcodeError> {
        let p: Params = parse_params(t)?;
        ipv4("src", &p.src)?;
        ipv4("dst", &p.dst)?;
        let min = frame::min_bytes(PROTO_UDP);
        if !(min..=MAX_FRAME_BYTES).contains(&p.frame_bytes) {
            return Err(bad(
                "frame_bytes",
                format!("{} is outside {min}..={MAX_FRAME_BYTES}", p.frame_bytes),
            ));
        }
        if p.dports.is_empty() {
            return Err(bad("dports", "give at least one port"));
        }
        if !(1..=MAX_BATCH).contains(&p.batch) {
            return Err(bad(
                "batch",
                format!("{} is outside 1..={MAX_BATCH}", p.batch),
            ));
        }
        if let Some(m) = &p.mode
            && m != "packet"
            && m != "socket"
        {
            return Err(bad(
                "mode",
                format!("`{m}` is neither `packet` nor `socket`"),
            ));
        }
        if let Some(m) = &p.dst_mac {
            mac("dst_mac", m)?;
        }
        if let Some(x) = &p.path
            && !["auto", "af_xdp", "af_packet"].contains(&x.as_str())
        {
            return Err(bad(
                "path",
                format!("`{x}` is not one of auto, af_xdp, af_packet"),
            ));
        }
        p.bind()?;
        Ok(p)
    }

    /// How to bind an AF_XDP socket.
    fn bind(&self) -> Result<XskBind, OffcodeError> {
        match self.xdp_bind.as_deref() {
            None | Some("auto") => Ok(XskBind::Auto),
            Some("copy") => Ok(XskBind::Copy),
            Some("zerocopy") => Ok(XskBind::ZeroCopy),
            Some(x) => Err(bad(
                "xdp_bind",
                format!("`{x}` is not one of auto, copy, zerocopy"),
            )),
        }
    }
}

/// How frames leave.
enum Out {
    Xdp {
        sock: Box<XskSocket>,
        spec: FrameSpec,
    },
    Packet {
        sock: RawSocket,
        spec: FrameSpec,
        buf: Vec<u8>,
    },
    Socket {
        sock: UdpSocket,
        payload: Vec<u8>,
    },
}

impl Out {
    /// How frames leave, as the `io_*` metric names it.
    fn path(&self) -> &'static str {
        match self {
            Out::Xdp { sock, .. } if sock.zerocopy() => "af_xdp_zerocopy",
            Out::Xdp { .. } => "af_xdp",
            Out::Packet { .. } => "af_packet",
            Out::Socket { .. } => "socket",
        }
    }
}

/// The generator.
pub struct Generator {
    p: Params,
    packet_mode: bool,
    out: Option<Out>,
    /// Frames numbered and handed to the kernel (on an AF_XDP ring, some may
    /// not have left yet).
    queued: u64,
    /// Frames that have left.
    next: u64,
    started: Option<(Instant, u64)>,
    departures: Departures,
    sent: Metric,
    bytes: Metric,
    cpu_ns: Metric,
    elapsed_ms: Metric,
    errors: Metric,
    xdp_refused: Metric,
    report: Report,
}

/// The report's metrics (see the module's documentation).
#[derive(Default)]
struct Report {
    rate_pps: Metric,
    rate_bps: Metric,
    cpu_busy_ppm: Metric,
    iat_mean_ns: Metric,
    iat_std_ns: Metric,
    iat_n: Metric,
    iat_sum_ns: Metric,
    iat_sumsq_ns2: Metric,
}

impl Report {
    fn new(cx: &InitCx<'_>) -> Report {
        Report {
            rate_pps: cx.metric("rate_pps"),
            rate_bps: cx.metric("rate_bps"),
            cpu_busy_ppm: cx.metric("cpu_busy_ppm"),
            iat_mean_ns: cx.metric("iat_mean_ns"),
            iat_std_ns: cx.metric("iat_std_ns"),
            iat_n: cx.metric("iat_n"),
            iat_sum_ns: cx.metric("iat_sum_ns"),
            iat_sumsq_ns2: cx.metric("iat_sumsq_ns2"),
        }
    }
}

/// Builds a generator for the PE it landed on.
pub fn build(spec: &BuildSpec<'_>) -> Result<Box<dyn Offcode>, OffcodeError> {
    let p = Params::parse(spec.params)?;
    let packet_mode = match p.mode.as_deref() {
        Some(m) => m == "packet",
        None => spec.kind == PeKind::Core,
    };
    Ok(Box::new(Generator {
        p,
        packet_mode,
        out: None,
        queued: 0,
        next: 0,
        started: None,
        departures: Departures::default(),
        sent: Metric::default(),
        bytes: Metric::default(),
        cpu_ns: Metric::default(),
        elapsed_ms: Metric::default(),
        errors: Metric::default(),
        xdp_refused: Metric::default(),
        report: Report::default(),
    }))
}

fn failed(e: impl std::fmt::Display) -> OffcodeError {
    OffcodeError::Failed(e.to_string())
}

impl Generator {
    fn open(&self) -> Result<Out, OffcodeError> {
        let p = &self.p;
        let (src, dst) = (ipv4("src", &p.src)?, ipv4("dst", &p.dst)?);
        if !self.packet_mode {
            let sock = sidecore_testbed::within(p.netns.as_deref(), || {
                UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::from(src), p.sport))
            })
            .map_err(failed)?
            .map_err(|e| bad("src", format!("cannot bind {}:{}: {e}", p.src, p.sport)))?;
            return Ok(Out::Socket {
                sock,
                payload: vec![0; p.frame_bytes - HEADERS_BYTES],
            });
        }
        let (hop, dev) = match (&p.dst_mac, &p.iface) {
            (Some(m), Some(i)) => (mac("dst_mac", m)?, i.clone()),
            _ => next_hop_mac(p.netns.as_deref(), dst)?,
        };
        let iface = p.iface.clone().unwrap_or(dev);
        let spec = |src_mac| FrameSpec {
            src_mac,
            dst_mac: hop,
            packet: Packet {
                proto: PROTO_UDP,
                src,
                sport: p.sport,
                dst,
                dport: p.dports[0],
            },
            frame_bytes: p.frame_bytes,
        };
        let path = p.path.as_deref().unwrap_or("auto");
        if path != "af_packet" {
            let o = XskOptions {
                queue: p.xdp_queue,
                bind: p.bind()?,
                ..XskOptions::tx(p.netns.clone(), &iface)
            };
            match XskSocket::open(&o) {
                Ok(sock) => {
                    let spec = spec(sock.mac());
                    return Ok(Out::Xdp {
                        sock: Box::new(sock),
                        spec,
                    });
                }
                Err(e) if path == "auto" => {
                    tracing::warn!(
                        "traffic-generator: the kernel refused AF_XDP, sending through AF_PACKET instead: {e}"
                    );
                    self.xdp_refused
                        .set(e.errno().map_or(1, |n| u64::try_from(n).unwrap_or(1)));
                }
                Err(e) => return Err(failed(format!("`path = \"af_xdp\"`: {e}"))),
            }
        }
        let sock = RawSocket::open(&RawOptions {
            netns: p.netns.clone(),
            iface,
            qdisc_bypass: true,
            ..RawOptions::default()
        })
        .map_err(failed)?;
        let spec = spec(sock.mac());
        Ok(Out::Packet {
            sock,
            spec,
            buf: vec![0; p.batch * p.frame_bytes],
        })
    }

    /// Frames allowed now: the batch, capped by the rate and the count.
    fn budget(&self, now: Instant) -> u64 {
        let mut b = self.p.batch as u64;
        if let (Some((t0, _)), r) = (self.started, self.p.rate_pps)
            && r > 0
        {
            #[allow(
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss,
                clippy::cast_precision_loss
            )]
            let due = (now.duration_since(t0).as_secs_f64() * r as f64) as u64 + 1;
            b = b.min(due.saturating_sub(self.queued));
        }
        if self.p.count > 0 {
            b = b.min(self.p.count - self.queued.min(self.p.count));
        }
        b
    }

    /// Hands up to `n` frames to the kernel; returns how many it took now
    /// (numbered from `queued`) and how many left now (on AF_XDP they leave
    /// when the kernel takes them off the TX ring, possibly a later turn).
    fn send(&mut self, n: usize) -> Result<(usize, usize), OffcodeError> {
        let dports = &self.p.dports;
        let port = |seq: u64| dports[usize::try_from(seq % dports.len() as u64).unwrap_or(0)];
        let t = realtime_ns();
        let first = self.queued;
        match self.out.as_mut() {
            Some(Out::Xdp { sock, spec }) => {
                let s = sock
                    .send(n, |i, chunk| {
                        let seq = first + i as u64;
                        spec.packet.dport = port(seq);
                        frame::build(spec, seq, t, chunk)
                    })
                    .map_err(|e| failed(format!("sending on {} (AF_XDP): {e}", sock.iface())))?;
                Ok((s.queued, s.left))
            }
            Some(Out::Packet { sock, spec, buf }) => {
                let size = spec.frame_bytes;
                for i in 0..n {
                    let seq = first + i as u64;
                    spec.packet.dport = port(seq);
                    frame::build(spec, seq, t, &mut buf[i * size..(i + 1) * size]);
                }
                let frames: Vec<&[u8]> = buf[..n * size].chunks(size).collect();
                match sock.send(&frames) {
                    Ok(k) => Ok((k, k)),
                    Err(e)
                        if e.raw_os_error() == Some(libc::ENOBUFS)
                            || e.kind() == std::io::ErrorKind::WouldBlock =>
                    {
                        self.errors.add(1);
                        Ok((0, 0))
                    }
                    Err(e) => Err(failed(format!("sending on {}: {e}", sock.iface()))),
                }
            }
            Some(Out::Socket { sock, payload }) => {
                let dst = Ipv4Addr::from(ipv4("dst", &self.p.dst)?);
                let mut k = 0;
                for i in 0..n {
                    let seq = first + i as u64;
                    payload[..8].copy_from_slice(&seq.to_be_bytes());
                    payload[8..STAMP_BYTES].copy_from_slice(&t.to_be_bytes());
                    match sock.send_to(payload, SocketAddrV4::new(dst, port(seq))) {
                        Ok(_) => k += 1,
                        Err(_) => {
                            self.errors.add(1);
                            break;
                        }
                    }
                }
                Ok((k, k))
            }
            None => Ok((0, 0)),
        }
    }

    /// Frames handed to the kernel that have not left yet.
    fn in_flight(&self) -> u64 {
        self.queued - self.next
    }
}

impl Generator {
    /// Publishes the cumulative counters and the report since the start.
    fn publish(&self, now: Instant) {
        let Some((t0, cpu0)) = self.started else {
            return;
        };
        let elapsed_ns = u64::try_from(now.duration_since(t0).as_nanos()).unwrap_or(u64::MAX);
        let cpu_ns = thread_cpu_ns().saturating_sub(cpu0);
        self.cpu_ns.set(cpu_ns);
        self.elapsed_ms.set(elapsed_ns / 1_000_000);
        let per_s = |x: u64| {
            u64::try_from(u128::from(x) * 1_000_000_000 / u128::from(elapsed_ns.max(1)))
                .unwrap_or(u64::MAX)
        };
        let r = &self.report;
        r.rate_pps.set(per_s(self.next));
        r.rate_bps
            .set(per_s(self.next * self.p.frame_bytes as u64 * 8));
        r.cpu_busy_ppm.set(
            u64::try_from(u128::from(cpu_ns) * 1_000_000 / u128::from(elapsed_ns.max(1)))
                .unwrap_or(u64::MAX),
        );
        let (mean, std) = self.departures.mean_std_ns();
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // ns, non-negative
        let ns = |x: f64| x.round() as u64;
        r.iat_mean_ns.set(ns(mean));
        r.iat_std_ns.set(ns(std));
        r.iat_n.set(self.departures.n());
        r.iat_sum_ns.set(self.departures.sum_ns());
        r.iat_sumsq_ns2.set(self.departures.sumsq_ns2());
    }
}

impl Offcode for Generator {
    fn initialize(&mut self, cx: &mut InitCx<'_>) -> Result<(), OffcodeError> {
        self.sent = cx.metric("sent");
        self.bytes = cx.metric("bytes");
        self.cpu_ns = cx.metric("cpu_ns");
        self.elapsed_ms = cx.metric("elapsed_ms");
        self.errors = cx.metric("send_errors");
        self.report = Report::new(cx);
        self.xdp_refused = cx.metric("xdp_refused_errno");
        let out = self.open()?;
        cx.metric(&format!("io_{}", out.path())).set(1);
        self.out = Some(out);
        Ok(())
    }

    fn start(&mut self, cx: &mut RunCx<'_>) -> Result<(), OffcodeError> {
        self.started = Some((cx.now(), thread_cpu_ns()));
        Ok(())
    }

    fn poll(&mut self, cx: &mut RunCx<'_>) -> Result<Progress, OffcodeError> {
        if self.p.count > 0 && self.next >= self.p.count {
            return Ok(Progress::Done);
        }
        let n = usize::try_from(self.budget(cx.now())).unwrap_or(0);
        let (queued, k) = if n > 0 || self.in_flight() > 0 {
            self.send(n)?
        } else {
            (0, 0)
        };
        self.queued += queued as u64;
        let now = Instant::now();
        if let Some((t0, _)) = self.started {
            let t_ns = u64::try_from(now.duration_since(t0).as_nanos()).unwrap_or(u64::MAX);
            self.departures.record(t_ns, k as u64);
        }
        self.next += k as u64;
        debug_assert!(
            self.next <= self.queued,
            "more frames left than were queued"
        );
        self.sent.add(k as u64);
        self.bytes.add((k * self.p.frame_bytes) as u64);
        if self.next % 4096 < k as u64 || k == 0 {
            self.publish(now);
        }
        Ok(if k > 0 || queued > 0 {
            Progress::Busy
        } else {
            Progress::Idle
        })
    }

    fn stop(&mut self, _cx: &mut RunCx<'_>) -> Result<(), OffcodeError> {
        self.publish(Instant::now());
        self.out = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_parameters_are_named() {
        let t = |s: &str| -> toml::Table { toml::from_str(s).unwrap() };
        let e = Params::parse(&t("src = \"10.0.0.1\"\ndst = \"x\"")).unwrap_err();
        assert!(
            e.to_string().contains("`dst`: `x` is not an IPv4 address"),
            "{e}"
        );
        let e = Params::parse(&t(
            "src = \"10.0.0.1\"\ndst = \"10.0.0.2\"\nframe_bytes = 9000",
        ))
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("`frame_bytes`: 9000 is outside 60..=1514"),
            "{e}"
        );
        let e = Params::parse(&t(
            "src = \"10.0.0.1\"\ndst = \"10.0.0.2\"\nmode = \"warp\"",
        ))
        .unwrap_err();
        assert!(e.to_string().contains("`mode`: `warp`"), "{e}");
        let e =
            Params::parse(&t("src = \"10.0.0.1\"\ndst = \"10.0.0.2\"\ndports = []")).unwrap_err();
        assert!(e.to_string().contains("`dports`"), "{e}");
        Params::parse(&t(
            "src = \"10.0.0.1\"\ndst = \"10.0.0.2\"\ndports = [5000, 5001]",
        ))
        .unwrap();
    }
}

//! The `firewall` offcode: one rule file, three PEs, the same decisions.
//!
//! * **kernel** ([`XdpOffcode`]): the XDP classifier of `sidecore-kernel`
//!   attached at the ingress interface; its counters become metrics and its
//!   ring buffer of log records is drained into the `log` output.
//! * **core** ([`CoreOffcode`]): a user-space forwarder on a dedicated core.
//!   It takes every IPv4 frame arriving on `ingress`, classifies it with the
//!   same tuple-space classifier, and sends accepted frames out of `egress`
//!   to the next hop (the kernel's forwarding is turned off in the namespace
//!   while it runs, so it is the only path). `path = "af_xdp"` receives
//!   through an AF_XDP socket fed by an XDP redirect program on the ingress
//!   and sends through another on the egress; `af_packet` uses AF_PACKET
//!   sockets (`recvmmsg`/`sendmmsg`); `auto`, the default, is AF_XDP with
//!   AF_PACKET where the kernel refuses it (a warning says why). The
//!   `io_af_xdp` or `io_af_packet` metric says which ran.
//! * **host** ([`NftOffcode`]): the baseline — the same rules as an nftables
//!   ruleset on the forward hook of the namespace.
//!
//! Parameters: `rules` (a rule file, TOML or the table layout), `netns`,
//! `ingress`, and for the core PE `egress` and optionally `next_hop_mac`; for
//! the kernel PE optionally `xdp_mode` (`auto`, `generic`, `native`). A control
//! message `{"rules": "PATH"}` reloads the rules live on every PE.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::Deserialize;
use sidecore_channel::oob::OobMessage;
use sidecore_firewall::{Action, Classifier, Packet, RuleSet, nft};
use sidecore_kernel::{XdpFirewall, XdpMode, XskRedirect};
use sidecore_offcode::{
    BuildSpec, InitCx, Metric, Offcode, OffcodeError, OutputId, Progress, RunCx, parse_params,
};
use sidecore_packetio::raw::RecvBatch;
use sidecore_packetio::{RawOptions, RawSocket, XskOptions, XskSocket, parse};
use sidecore_types::PeKind;

use crate::util::{bad, mac};

/// How often counters kept outside the offcode (BPF maps, nftables) are read.
const STATS_EVERY: Duration = Duration::from_millis(200);
/// How often the (slow to list) nftables counters are read.
const NFT_STATS_EVERY: Duration = Duration::from_secs(1);
/// Frames a core forwarder takes per receive.
const BATCH: usize = 64;

/// The firewall's parameters.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// The rule file.
    pub rules: String,
    /// The network namespace of the interfaces.
    #[serde(default)]
    pub netns: Option<String>,
    /// Where the traffic to filter arrives.
    pub ingress: String,
    /// (core) Where accepted traffic leaves.
    #[serde(default)]
    pub egress: Option<String>,
    /// (core) The MAC of the next hop on `egress`; default: its neighbour entry.
    #[serde(default)]
    pub next_hop_mac: Option<String>,
    /// (kernel, and core with AF_XDP) `auto`, `generic` or `native`.
    #[serde(default)]
    pub xdp_mode: Option<String>,
    /// (core) `auto` (AF_XDP, AF_PACKET where refused), `af_xdp` or `af_packet`.
    #[serde(default)]
    pub path: Option<String>,
}

impl Params {
    /// Reads the parameters and the rule file they name.
    pub fn parse(t: &toml::Table) -> Result<(Params, RuleSet), OffcodeError> {
        let p: Params = parse_params(t)?;
        let rules =
            sidecore_firewall::load(std::path::Path::new(&p.rules)).map_err(|e| bad("rules", e))?;
        if let Some(m) = &p.xdp_mode {
            m.parse::<XdpMode>().map_err(|e| bad("xdp_mode", e))?;
        }
        if let Some(m) = &p.next_hop_mac {
            mac("next_hop_mac", m)?;
        }
        if let Some(x) = &p.path
            && !["auto", "af_xdp", "af_packet"].contains(&x.as_str())
        {
            return Err(bad(
                "path",
                format!("`{x}` is not one of auto, af_xdp, af_packet"),
            ));
        }
        Ok((p, rules))
    }
}

/// Builds the firewall for the PE it landed on.
pub fn build(spec: &BuildSpec<'_>) -> Result<Box<dyn Offcode>, OffcodeError> {
    let (p, rules) = Params::parse(spec.params)?;
    let classifier = Classifier::compile(&rules).map_err(|e| bad("rules", e))?;
    let common = Common::new(p, rules);
    Ok(match spec.kind {
        PeKind::Kernel => Box::new(XdpOffcode {
            common,
            classifier,
            fw: None,
            last: Instant::now(),
        }),
        PeKind::Core => {
            if common.p.egress.is_none() {
                return Err(bad(
                    "egress",
                    "a firewall on a core forwards: give the egress interface",
                ));
            }
            Box::new(CoreOffcode {
                common,
                classifier,
                io: None,
                next_hop: [0; 6],
                batch: RecvBatch::new(BATCH),
                out: Vec::with_capacity(BATCH * sidecore_packetio::frame::MAX_FRAME_BYTES),
                lens: Vec::with_capacity(BATCH),
                logs: Vec::new(),
                tx_dropped: Metric::default(),
            })
        }
        _ => Box::new(NftOffcode {
            common,
            applied: false,
            last: Instant::now(),
        }),
    })
}

/// What every variant keeps: parameters, rules, metrics, the log output.
struct Common {
    p: Params,
    rules: RuleSet,
    log_out: Option<OutputId>,
    accepted: Metric,
    denied: Metric,
    default_denied: Metric,
    logged: Metric,
    log_lost: Metric,
    reloads: Metric,
    reload_errors: Metric,
}

impl Common {
    fn new(p: Params, rules: RuleSet) -> Common {
        Common {
            p,
            rules,
            log_out: None,
            accepted: Metric::default(),
            denied: Metric::default(),
            default_denied: Metric::default(),
            logged: Metric::default(),
            log_lost: Metric::default(),
            reloads: Metric::default(),
            reload_errors: Metric::default(),
        }
    }

    fn init(&mut self, cx: &InitCx<'_>) {
        self.log_out = cx.output("log").ok();
        self.accepted = cx.metric("accepted");
        self.denied = cx.metric("denied");
        self.default_denied = cx.metric("default_denied");
        self.logged = cx.metric("logged");
        self.log_lost = cx.metric("log_lost");
        self.reloads = cx.metric("reloads");
        self.reload_errors = cx.metric("reload_errors");
        cx.metric("rules").set(self.rules.rules.len() as u64);
    }

    /// Reports a matching packet of a log rule on the `log` output, as a line.
    fn log(
        &self,
        cx: &mut RunCx<'_>,
        rule: u32,
        p: &Packet,
        accept: bool,
    ) -> Result<(), OffcodeError> {
        self.logged.add(1);
        let Some(out) = self.log_out else {
            return Ok(());
        };
        let line = format!(
            "rule {} (line {}): proto {} {}:{} -> {}:{} {}",
            rule + 1,
            self.rules.rules.get(rule as usize).map_or(0, |r| r.line),
            p.proto,
            std::net::Ipv4Addr::from(p.src),
            p.sport,
            std::net::Ipv4Addr::from(p.dst),
            p.dport,
            if accept { "accept" } else { "deny" }
        );
        match cx.send_bytes(out, line.as_bytes())? {
            sidecore_channel::SendOutcome::Sent => {}
            _ => self.log_lost.add(1),
        }
        Ok(())
    }

    /// The rule file named by a `{"rules": PATH}` control message.
    fn reload_request(msg: &OobMessage) -> Option<String> {
        match msg {
            OobMessage::Control { body, .. } => body.get("rules")?.as_str().map(str::to_string),
            _ => None,
        }
    }

    /// Loads and compiles a new rule file.
    fn reload(&mut self, path: &str) -> Result<Classifier, ReloadError> {
        let rules = sidecore_firewall::load(std::path::Path::new(path))?;
        let c = Classifier::compile(&rules)?;
        self.rules = rules;
        Ok(c)
    }

    fn answer(&self, r: Result<(), ReloadError>) -> Option<serde_json::Value> {
        match r {
            Ok(()) => {
                self.reloads.add(1);
                Some(serde_json::json!({"reloaded": self.rules.rules.len()}))
            }
            Err(e) => {
                self.reload_errors.add(1);
                Some(serde_json::json!({"error": e.to_string()}))
            }
        }
    }
}

/// Why a `{"rules": PATH}` reload was refused (answered as `{"error": MESSAGE}`; the
/// rules in force stay).
#[derive(Debug, thiserror::Error)]
enum ReloadError {
    #[error(transparent)]
    Rules(#[from] sidecore_firewall::RulesError),
    #[error(transparent)]
    Compile(#[from] sidecore_firewall::CompileError),
    #[error("not loaded")]
    NotLoaded,
    #[error(transparent)]
    Kernel(#[from] sidecore_kernel::KernelError),
    #[error(transparent)]
    Apply(OffcodeError),
}

fn failed(e: impl std::fmt::Display) -> OffcodeError {
    OffcodeError::Failed(e.to_string())
}

/// The firewall on the kernel PE: an XDP program.
pub struct XdpOffcode {
    common: Common,
    classifier: Classifier,
    fw: Option<XdpFirewall>,
    last: Instant,
}

impl XdpOffcode {
    fn refresh(&mut self) -> Result<(), OffcodeError> {
        if let Some(fw) = &mut self.fw {
            let s = fw.stats().map_err(failed)?;
            self.common.accepted.set(s.accepted);
            self.common.denied.set(s.denied + s.malformed);
            self.common.default_denied.set(s.default_denied);
            self.common.log_lost.set(s.log_lost);
        }
        Ok(())
    }
}

impl Offcode for XdpOffcode {
    fn initialize(&mut self, cx: &mut InitCx<'_>) -> Result<(), OffcodeError> {
        self.common.init(cx);
        let mode = self
            .common
            .p
            .xdp_mode
            .as_deref()
            .map_or(Ok(XdpMode::Auto), str::parse)
            .map_err(|e| bad("xdp_mode", e))?;
        let mut fw = XdpFirewall::load().map_err(failed)?;
        fw.install(&self.classifier).map_err(failed)?;
        fw.attach(self.common.p.netns.as_deref(), &self.common.p.ingress, mode)
            .map_err(failed)?;
        cx.metric("shapes")
            .set(self.classifier.shapes().len() as u64);
        self.fw = Some(fw);
        Ok(())
    }

    fn poll(&mut self, cx: &mut RunCx<'_>) -> Result<Progress, OffcodeError> {
        let mut events = Vec::new();
        if let Some(fw) = &mut self.fw {
            fw.drain_log(|e| events.push(e));
        }
        for e in &events {
            let p = Packet {
                proto: e.proto,
                src: e.src,
                sport: e.sport,
                dst: e.dst,
                dport: e.dport,
            };
            self.common.log(cx, e.rule, &p, e.action == 1)?;
        }
        if cx.now().duration_since(self.last) >= STATS_EVERY {
            self.last = cx.now();
            self.refresh()?;
        }
        Ok(if events.is_empty() {
            Progress::Idle
        } else {
            Progress::Busy
        })
    }

    fn control(
        &mut self,
        _cx: &mut RunCx<'_>,
        msg: &OobMessage,
    ) -> Result<Option<serde_json::Value>, OffcodeError> {
        let Some(path) = Common::reload_request(msg) else {
            return Ok(None);
        };
        let r = self.common.reload(&path).and_then(|c| {
            let fw = self.fw.as_mut().ok_or(ReloadError::NotLoaded)?;
            Ok(fw.install(&c)?)
        });
        Ok(self.common.answer(r))
    }

    fn stop(&mut self, _cx: &mut RunCx<'_>) -> Result<(), OffcodeError> {
        self.refresh()?;
        if let Some(mut fw) = self.fw.take() {
            fw.detach();
        }
        Ok(())
    }
}

/// The kernel's IPv4 forwarding switch in a namespace.
fn ip_forward(netns: Option<&str>, on: bool) -> Result<(), OffcodeError> {
    let cmd = format!("echo {} > /proc/sys/net/ipv4/ip_forward", u8::from(on));
    let r = match netns {
        Some(ns) => {
            sidecore_testbed::topology::ip(&["netns", "exec", ns, "sh", "-c", &cmd]).map(drop)
        }
        None => std::fs::write("/proc/sys/net/ipv4/ip_forward", if on { "1" } else { "0" })
            .map_err(|e| sidecore_testbed::TestbedError::Command {
                command: cmd,
                stderr: e.to_string(),
            }),
    };
    r.map_err(failed)
}

/// The MAC of the (first) neighbour on `dev`.
fn neighbour_mac(netns: Option<&str>, dev: &str) -> Result<[u8; 6], OffcodeError> {
    let mut args: Vec<&str> = Vec::new();
    if let Some(ns) = netns {
        args.extend(["-n", ns]);
    }
    args.extend(["neigh", "show", "dev", dev]);
    let out = sidecore_testbed::topology::ip(&args).map_err(failed)?;
    let lladdr = out
        .split_whitespace()
        .skip_while(|w| *w != "lladdr")
        .nth(1)
        .ok_or_else(|| {
            bad(
                "next_hop_mac",
                format!("no neighbour on {dev}; give `next_hop_mac`"),
            )
        })?;
    mac("next_hop_mac", lladdr)
}

/// How a running core forwarder's frames come in and go out.
enum CoreIo {
    /// AF_PACKET sockets: `recvmmsg` on the ingress, `sendmmsg` on the egress.
    Packet { rx: RawSocket, tx: RawSocket },
    /// AF_XDP: the redirect program hands IPv4 frames from the ingress
    /// queue to `rx`'s ring; accepted frames are copied into `tx`'s UMEM on
    /// the egress.
    Xdp {
        rx: Box<XskSocket>,
        tx: Box<XskSocket>,
        /// Kept loaded and attached while the sockets live.
        _redirect: Box<XskRedirect>,
    },
}

impl CoreIo {
    /// The `io_*` metric naming the path.
    fn path(&self) -> &'static str {
        match self {
            CoreIo::Packet { .. } => "af_packet",
            CoreIo::Xdp { rx, .. } if rx.zerocopy() => "af_xdp_zerocopy",
            CoreIo::Xdp { .. } => "af_xdp",
        }
    }

    fn egress_mac(&self) -> [u8; 6] {
        match self {
            CoreIo::Packet { tx, .. } => tx.mac(),
            CoreIo::Xdp { tx, .. } => tx.mac(),
        }
    }
}

/// The firewall on a dedicated core: a user-space forwarder over AF_XDP
/// (AF_PACKET where the kernel refuses it, or where `path` asks).
pub struct CoreOffcode {
    common: Common,
    classifier: Classifier,
    io: Option<CoreIo>,
    next_hop: [u8; 6],
    batch: RecvBatch,
    /// Accepted frames of this turn, back to back, and their lengths.
    out: Vec<u8>,
    lens: Vec<usize>,
    /// Log records of this turn.
    logs: Vec<(u32, Packet, bool)>,
    /// Accepted frames the egress had no room for.
    tx_dropped: Metric,
}

/// Rewrites a forwarded frame: new Ethernet addresses, TTL one less with the
/// header checksum updated (RFC 1624). False if the TTL has run out.
fn forward(frame: &mut [u8], src: [u8; 6], dst: [u8; 6]) -> bool {
    const ETH: usize = sidecore_packetio::frame::ETH_BYTES;
    if frame.len() < ETH + 20 || frame[ETH + 8] <= 1 {
        return false;
    }
    frame[0..6].copy_from_slice(&dst);
    frame[6..12].copy_from_slice(&src);
    frame[ETH + 8] -= 1;
    // TTL is the high byte of its 16-bit word: the checksum rises by 0x0100.
    let old = u16::from_be_bytes([frame[ETH + 10], frame[ETH + 11]]);
    let sum = u32::from(old) + 0x0100;
    #[allow(clippy::cast_possible_truncation)] // folded to 16 bits
    let new = ((sum & 0xffff) + (sum >> 16)) as u16;
    frame[ETH + 10..ETH + 12].copy_from_slice(&new.to_be_bytes());
    true
}

/// What a turn of the forwarder decided, frame by frame: accepted frames
/// (rewritten for the next hop) appended to `out`, their lengths to `lens`,
/// log records to `logs`; the counters of `common` updated.
struct Decider<'a> {
    common: &'a Common,
    classifier: &'a Classifier,
    src_mac: [u8; 6],
    next_hop: [u8; 6],
    out: &'a mut Vec<u8>,
    lens: &'a mut Vec<usize>,
    logs: &'a mut Vec<(u32, Packet, bool)>,
}

impl Decider<'_> {
    fn take(&mut self, frame: &[u8]) {
        let Some(parsed) = parse(frame) else { return }; // not IPv4: not ours to route
        let v = self.classifier.decide(&parsed.packet);
        if v.log
            && let Some(r) = v.rule
        {
            self.logs.push((
                u32::try_from(r).unwrap_or(u32::MAX),
                parsed.packet,
                v.action == Action::Accept,
            ));
        }
        match (v.action, v.rule) {
            (Action::Accept, _) => {
                let start = self.out.len();
                self.out.extend_from_slice(frame);
                if forward(&mut self.out[start..], self.src_mac, self.next_hop) {
                    self.lens.push(frame.len());
                    self.common.accepted.add(1);
                } else {
                    self.out.truncate(start);
                }
            }
            (Action::Deny, Some(_)) => self.common.denied.add(1),
            (Action::Deny, None) => self.common.default_denied.add(1),
        }
    }
}

impl CoreOffcode {
    /// Opens the path `path` asks for: AF_XDP (redirect program at the
    /// ingress, a socket on each side) or AF_PACKET.
    fn open(&self, path: &str) -> Result<CoreIo, OffcodeError> {
        let p = &self.common.p;
        let egress = p.egress.clone().unwrap_or_default();
        if path == "af_packet" {
            let rx = RawSocket::open(&RawOptions {
                netns: p.netns.clone(),
                iface: p.ingress.clone(),
                receive: true,
                ..RawOptions::default()
            })
            .map_err(failed)?;
            let tx = RawSocket::open(&RawOptions {
                netns: p.netns.clone(),
                iface: egress,
                qdisc_bypass: true,
                ..RawOptions::default()
            })
            .map_err(failed)?;
            return Ok(CoreIo::Packet { rx, tx });
        }
        let xdp_err = |e: &dyn std::fmt::Display| failed(format!("AF_XDP: {e}"));
        let mut ro = XskOptions::tx(p.netns.clone(), &p.ingress);
        (ro.rx, ro.tx) = (true, false);
        let rx = XskSocket::open(&ro).map_err(|e| xdp_err(&e))?;
        let tx =
            XskSocket::open(&XskOptions::tx(p.netns.clone(), &egress)).map_err(|e| xdp_err(&e))?;
        let mut redirect = XskRedirect::load().map_err(|e| xdp_err(&e))?;
        redirect
            .insert(rx.queue(), rx.fd())
            .map_err(|e| xdp_err(&e))?;
        redirect
            .attach(p.netns.as_deref(), &p.ingress, self.xdp_mode()?)
            .map_err(|e| xdp_err(&e))?;
        Ok(CoreIo::Xdp {
            rx: Box::new(rx),
            tx: Box::new(tx),
            _redirect: Box::new(redirect),
        })
    }

    fn xdp_mode(&self) -> Result<XdpMode, OffcodeError> {
        self.common
            .p
            .xdp_mode
            .as_deref()
            .map_or(Ok(XdpMode::Auto), str::parse)
            .map_err(|e| bad("xdp_mode", e))
    }

    /// Receives a batch, decides, sends the accepted frames; how many came in.
    fn forward_batch(&mut self) -> Result<usize, OffcodeError> {
        let Some(io) = self.io.as_mut() else {
            return Ok(0);
        };
        let src_mac = io.egress_mac();
        self.out.clear();
        self.lens.clear();
        let mut d = Decider {
            common: &self.common,
            classifier: &self.classifier,
            src_mac,
            next_hop: self.next_hop,
            out: &mut self.out,
            lens: &mut self.lens,
            logs: &mut self.logs,
        };
        let n = match io {
            CoreIo::Packet { rx, .. } => {
                let n = rx.recv(&mut self.batch).map_err(failed)?;
                for i in 0..n {
                    d.take(self.batch.frame(i));
                }
                n
            }
            CoreIo::Xdp { rx, .. } => rx.recv(BATCH, |f| d.take(f)),
        };
        if self.lens.is_empty() {
            return Ok(n);
        }
        let mut frames = Vec::with_capacity(self.lens.len());
        let mut at = 0;
        for &l in &self.lens {
            frames.push(&self.out[at..at + l]);
            at += l;
        }
        let taken = match io {
            CoreIo::Packet { tx, .. } => tx.send(&frames).map_err(failed)?,
            CoreIo::Xdp { tx, .. } => {
                tx.send(frames.len(), |i, chunk| {
                    chunk[..frames[i].len()].copy_from_slice(frames[i]);
                    frames[i].len()
                })
                .map_err(failed)?
                .queued
            }
        };
        self.tx_dropped.add((frames.len() - taken) as u64);
        Ok(n)
    }
}

impl Offcode for CoreOffcode {
    fn initialize(&mut self, cx: &mut InitCx<'_>) -> Result<(), OffcodeError> {
        self.common.init(cx);
        self.tx_dropped = cx.metric("tx_dropped");
        let p = &self.common.p;
        let netns = p.netns.clone();
        let egress = p.egress.clone().unwrap_or_default();
        self.next_hop = match &p.next_hop_mac {
            Some(m) => mac("next_hop_mac", m)?,
            None => neighbour_mac(netns.as_deref(), &egress)?,
        };
        let path = p.path.clone().unwrap_or_else(|| "auto".into());
        let io = match self.open(if path == "auto" { "af_xdp" } else { &path }) {
            Ok(io) => io,
            Err(e) if path == "auto" => {
                tracing::warn!(
                    "firewall: the kernel refused AF_XDP, forwarding through AF_PACKET instead: {e}"
                );
                cx.metric("xdp_refused").set(1);
                self.open("af_packet")?
            }
            Err(e) => return Err(e),
        };
        cx.metric(&format!("io_{}", io.path())).set(1);
        // This forwarder is now the only way through.
        ip_forward(netns.as_deref(), false)?;
        self.io = Some(io);
        Ok(())
    }

    fn poll(&mut self, cx: &mut RunCx<'_>) -> Result<Progress, OffcodeError> {
        let n = self.forward_batch()?;
        for (rule, p, accept) in std::mem::take(&mut self.logs) {
            self.common.log(cx, rule, &p, accept)?;
        }
        Ok(if n > 0 {
            Progress::Busy
        } else {
            Progress::Idle
        })
    }

    fn control(
        &mut self,
        _cx: &mut RunCx<'_>,
        msg: &OobMessage,
    ) -> Result<Option<serde_json::Value>, OffcodeError> {
        let Some(path) = Common::reload_request(msg) else {
            return Ok(None);
        };
        let r = self.common.reload(&path).map(|c| self.classifier = c);
        Ok(self.common.answer(r))
    }

    fn stop(&mut self, _cx: &mut RunCx<'_>) -> Result<(), OffcodeError> {
        if self.io.take().is_some() {
            ip_forward(self.common.p.netns.as_deref(), true)?;
        }
        Ok(())
    }
}

/// Runs `nft` (in the namespace) with `stdin` as its input.
fn nft(netns: Option<&str>, args: &[&str], stdin: Option<&str>) -> Result<String, OffcodeError> {
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, "nft"]);
            c
        }
        None => Command::new("nft"),
    };
    cmd.args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .map_err(|e| failed(format!("cannot run nft (install nftables): {e}")))?;
    if let (Some(text), Some(mut w)) = (stdin, child.stdin.take()) {
        use std::io::Write as _;
        w.write_all(text.as_bytes())
            .map_err(|e| failed(format!("nft: {e}")))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| failed(format!("nft: {e}")))?;
    if !out.status.success() {
        return Err(failed(format!(
            "nft {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The firewall on the host: the same rules as nftables.
pub struct NftOffcode {
    common: Common,
    applied: bool,
    last: Instant,
}

impl NftOffcode {
    fn apply(&mut self) -> Result<(), OffcodeError> {
        let text = nft::render(&self.common.rules, nft::Hook::Forward);
        nft(self.common.p.netns.as_deref(), &["-f", "-"], Some(&text))?;
        self.applied = true;
        Ok(())
    }

    /// Reads the rules' counters: packets per rule comment.
    fn refresh(&mut self) -> Result<(), OffcodeError> {
        let json = nft(
            self.common.p.netns.as_deref(),
            &["-j", "list", "table", "inet", nft::TABLE],
            None,
        )?;
        let v: serde_json::Value =
            serde_json::from_str(&json).map_err(|e| failed(format!("nft -j: {e}")))?;
        let (mut accepted, mut denied, mut default_denied) = (0, 0, 0);
        for item in v["nftables"].as_array().into_iter().flatten() {
            let rule = &item["rule"];
            let Some(comment) = rule["comment"].as_str() else {
                continue;
            };
            let packets: u64 = rule["expr"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|e| e["counter"]["packets"].as_u64())
                .sum();
            if comment == "default deny" {
                default_denied += packets;
            } else if rule["expr"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|e| e.get("accept").is_some())
            {
                accepted += packets;
            } else {
                denied += packets;
            }
        }
        self.common.accepted.set(accepted);
        self.common.denied.set(denied);
        self.common.default_denied.set(default_denied);
        Ok(())
    }
}

impl Offcode for NftOffcode {
    fn initialize(&mut self, cx: &mut InitCx<'_>) -> Result<(), OffcodeError> {
        self.common.init(cx);
        self.apply()
    }

    fn poll(&mut self, cx: &mut RunCx<'_>) -> Result<Progress, OffcodeError> {
        if self.applied && cx.now().duration_since(self.last) >= NFT_STATS_EVERY {
            self.last = cx.now();
            self.refresh()?;
        }
        Ok(Progress::Idle)
    }

    fn control(
        &mut self,
        _cx: &mut RunCx<'_>,
        msg: &OobMessage,
    ) -> Result<Option<serde_json::Value>, OffcodeError> {
        let Some(path) = Common::reload_request(msg) else {
            return Ok(None);
        };
        let r = self
            .common
            .reload(&path)
            .and_then(|_| self.apply().map_err(ReloadError::Apply));
        Ok(self.common.answer(r))
    }

    fn stop(&mut self, _cx: &mut RunCx<'_>) -> Result<(), OffcodeError> {
        if self.applied {
            let _ = self.refresh();
            nft(
                self.common.p.netns.as_deref(),
                &["delete", "table", "inet", nft::TABLE],
                None,
            )?;
            self.applied = false;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwarding_rewrites_addresses_and_the_ttl_checksum() {
        let spec = sidecore_packetio::FrameSpec {
            src_mac: [1; 6],
            dst_mac: [2; 6],
            packet: Packet {
                proto: 17,
                src: 0x0a00_0001,
                sport: 1,
                dst: 0x0a00_0102,
                dport: 2,
            },
            frame_bytes: 64,
        };
        let mut buf = [0u8; 64];
        let n = sidecore_packetio::frame::build(&spec, 1, 2, &mut buf);
        let ttl = buf[14 + 8];
        assert!(forward(&mut buf[..n], [3; 6], [4; 6]));
        assert_eq!(buf[14 + 8], ttl - 1);
        assert_eq!(&buf[0..6], &[4; 6]);
        assert_eq!(&buf[6..12], &[3; 6]);
        assert_eq!(
            sidecore_packetio::frame::checksum(&buf[14..34], 0),
            0,
            "header checksum still valid"
        );
        buf[14 + 8] = 1;
        assert!(!forward(&mut buf[..n], [3; 6], [4; 6]), "TTL exhausted");
    }

    #[test]
    fn bad_parameters_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let rules = dir.path().join("r.rules");
        std::fs::write(&rules, "1 udp any any any 53 accept\n").unwrap();
        let t = |s: String| -> toml::Table { toml::from_str(&s).unwrap() };
        let r = rules.display();
        let e = Params::parse(&t(format!(
            "rules = \"{r}\"\ningress = \"x\"\nxdp_mode = \"fast\""
        )))
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("`xdp_mode`: `fast` is not an XDP mode"),
            "{e}"
        );
        let e = Params::parse(&t("rules = \"/nonexistent.rules\"\ningress = \"x\"".into()))
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("`rules`: cannot read rule file /nonexistent.rules"),
            "{e}"
        );
        std::fs::write(&rules, "1 udp any any any 99999 accept\n").unwrap();
        let e = Params::parse(&t(format!("rules = \"{r}\"\ningress = \"x\""))).unwrap_err();
        assert!(e.to_string().contains("r.rules:1:"), "{e}");
        let e = Params::parse(&t(format!("rules = \"{r}\"\ningres = \"x\""))).unwrap_err();
        assert!(e.to_string().contains("unknown field `ingres`"), "{e}");
    }

    /// A live reload of a bad file is answered with the rule loader's own
    /// message, and the rules in force stay.
    #[test]
    fn a_bad_reload_is_answered_with_its_reason_and_keeps_the_rules() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good.rules");
        std::fs::write(&good, "1 udp any any any 53 accept\n").unwrap();
        let t: toml::Table =
            toml::from_str(&format!("rules = \"{}\"\ningress = \"x\"", good.display())).unwrap();
        let (p, rules) = Params::parse(&t).unwrap();
        let mut c = Common::new(p, rules);
        let bad = dir.path().join("bad.rules");
        std::fs::write(&bad, "1 udp any any any 99999 accept\n").unwrap();
        let want = sidecore_firewall::load(&bad).unwrap_err().to_string();
        assert!(want.contains("bad.rules:1"), "{want}");
        let r = c.reload(bad.to_str().unwrap()).map(drop);
        assert!(matches!(r, Err(ReloadError::Rules(_))));
        assert_eq!(c.answer(r), Some(serde_json::json!({ "error": want })));
        assert_eq!(c.rules.rules.len(), 1, "the rules in force stay");
        let r = c.reload(good.to_str().unwrap()).map(drop);
        assert_eq!(c.answer(r), Some(serde_json::json!({ "reloaded": 1 })));
    }
}

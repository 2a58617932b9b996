//! The `streamer` offcode (HYDRA's TiVoPC server, §8.1): takes the `file`
//! offcode's chunks from its input ring and sends each as one UDP datagram to
//! the client, paced at `rate` chunks a second (the seed: 1 KB every 5 ms,
//! `rate = 200`), on an absolute schedule (chunk k is due at t0 + k/rate, so
//! lateness does not accumulate).
//!
//! How it waits depends on the PE it landed on:
//!
//! * on a dedicated core it busy-waits for each deadline on its pinned CPU
//!   ([`Pacing::Spin`]), as HYDRA's NIC offcode owned its processor;
//! * on the host it sleeps until each deadline ([`Pacing::Sleep`]), as an
//!   ordinary program's send loop does.
//!
//! How it sends is the `send` parameter:
//!
//! * `socket` (default): `send(2)` on a connected UDP socket, from the ring
//!   slot in place;
//! * `sendfile`: `sendfile(2)` of the chunk's range of `file` (the offset
//!   comes in the ring message) — the kernel copies from the page cache,
//!   the bytes in the ring are not used;
//! * `io_uring`: one submission per chunk of an `IORING_OP_TIMEOUT` for the
//!   time left to the deadline, linked to an `IORING_OP_SEND` of the slot, so
//!   the wait and the send cost one `io_uring_enter` (its own pacing: the
//!   `pacing` parameter does not apply).
//!
//! There is no kernel-PE streamer: an XDP or tc program runs when a packet
//! passes, never on a clock, so it has nothing to pace with (see the README).
//!
//! Parameters: `dst`, `dport` (default 5000), `src` (bind address, default
//! any), `sport` (0: any), `netns`, `rate` (chunks/s, 1..=[`MAX_RATE`]),
//! `send`, `file` (for `sendfile`), `pacing` (`spin`|`sleep`, to override the
//! PE's default), `realtime` (when busy-waiting, run its thread under
//! `SCHED_FIFO` priority 1 while it streams: on a core that is dedicated by affinity only, as on a
//! shared machine without `isolcpus`, ordinary threads that land on the CPU
//! would otherwise take turns with the busy-wait and delay chunks by whole
//! time slices; it then sleeps until [`SPIN_LEAD`] before each deadline and
//! busy-waits the rest; needs `CAP_SYS_NICE`). Metrics: `sent`, `bytes`, `send_errors`, `late_max_ns` and
//! `late_mean_ns` (send time past the deadline), `cpu_ns` (the thread's CPU
//! time since start), `elapsed_ms`.

use std::fs::File;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use io_uring::{IoUring, opcode, squeue, types};
use serde::Deserialize;
use sidecore_offcode::{
    BuildSpec, Drained, InitCx, Inlet, InputId, Metric, Offcode, OffcodeError, Progress, RunCx,
    parse_params,
};
use sidecore_types::PeKind;

use crate::file_source::{HEADER_BYTES, MAX_CHUNK_BYTES};
use crate::util::{bad, ipv4, thread_cpu_ns};

/// Highest rate accepted, chunks per second.
pub const MAX_RATE: u64 = 10_000_000;
/// How far ahead a spinning streamer waits inside one turn.
const SPIN_WINDOW: Duration = Duration::from_millis(1);
/// Under `realtime`, the busy-wait covers only this much before each
/// deadline; the thread sleeps before it, so it never holds its CPU long
/// enough for the kernel's real-time throttling (by default 950 ms of each
/// second) to stall it for the rest of the second. A SCHED_FIFO thread's
/// wake-up preempts any ordinary thread at once, well within the lead.
const SPIN_LEAD: Duration = Duration::from_micros(300);
/// Under `realtime`, when chunks come faster than [`SPIN_LEAD`] (so the
/// thread never sleeps to a deadline), it still rests [`REST`] every
/// [`REST_EVERY`]: under the throttling's share, at the cost of a short
/// burst after each rest instead of a stall of tens of milliseconds.
const REST_EVERY: Duration = Duration::from_millis(1);
const REST: Duration = Duration::from_micros(100);
/// How far ahead a sleeping streamer waits inside one turn (so a stop
/// request is seen within this).
const SLEEP_WINDOW: Duration = Duration::from_millis(20);

/// How the streamer waits for a deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pacing {
    /// Busy-wait (a dedicated core).
    Spin,
    /// Sleep (the host).
    Sleep,
}

/// How a chunk leaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendMode {
    Socket,
    Sendfile,
    IoUring,
}

/// The streamer's parameters.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    #[serde(default)]
    pub netns: Option<String>,
    #[serde(default)]
    pub src: Option<String>,
    #[serde(default)]
    pub sport: u16,
    pub dst: String,
    #[serde(default = "default_dport")]
    pub dport: u16,
    pub rate: u64,
    #[serde(default)]
    pub send: Option<String>,
    #[serde(default)]
    pub file: Option<PathBuf>,
    #[serde(default)]
    pub pacing: Option<String>,
    #[serde(default)]
    pub realtime: bool,
}

fn default_dport() -> u16 {
    5000
}

impl Params {
    /// Reads and checks the parameters.
    pub fn parse(t: &toml::Table) -> Result<Params, OffcodeError> {
        let p: Params = parse_params(t)?;
        ipv4("dst", &p.dst)?;
        if let Some(s) = &p.src {
            ipv4("src", s)?;
        }
        if p.dport == 0 {
            return Err(bad("dport", "0 is not a destination port"));
        }
        if !(1..=MAX_RATE).contains(&p.rate) {
            return Err(bad(
                "rate",
                format!(
                    "{} chunks/s is outside 1..={MAX_RATE} (1 KB every 5 ms is rate = 200)",
                    p.rate
                ),
            ));
        }
        let mode = p.send_mode()?;
        if mode == SendMode::Sendfile {
            let Some(f) = &p.file else {
                return Err(bad(
                    "file",
                    "`send = \"sendfile\"` needs the file to send from",
                ));
            };
            File::open(f).map_err(|e| bad("file", format!("{}: {e}", f.display())))?;
        }
        p.pacing(PeKind::Host)?;
        Ok(p)
    }

    /// The send mode named by `send`.
    pub fn send_mode(&self) -> Result<SendMode, OffcodeError> {
        match self.send.as_deref() {
            None | Some("socket") => Ok(SendMode::Socket),
            Some("sendfile") => Ok(SendMode::Sendfile),
            Some("io_uring") => Ok(SendMode::IoUring),
            Some(o) => Err(bad(
                "send",
                format!("`{o}` is not one of socket, sendfile, io_uring"),
            )),
        }
    }

    /// The pacing on a PE of `kind`: `pacing` if given, else spin on a core
    /// and sleep elsewhere.
    pub fn pacing(&self, kind: PeKind) -> Result<Pacing, OffcodeError> {
        match self.pacing.as_deref() {
            Some("spin") => Ok(Pacing::Spin),
            Some("sleep") => Ok(Pacing::Sleep),
            None if kind == PeKind::Core => Ok(Pacing::Spin),
            None => Ok(Pacing::Sleep),
            Some(o) => Err(bad(
                "pacing",
                format!("`{o}` is neither `spin` nor `sleep`"),
            )),
        }
    }
}

/// The absolute schedule (sans-IO): chunk `k` is due at `t0 + k / chunks_per_s`.
#[derive(Debug, Clone, Copy)]
pub struct Pacer {
    t0: Instant,
    chunks_per_s: u64,
    /// Chunks sent so far (the next one's index).
    pub sent: u64,
}

impl Pacer {
    pub fn new(t0: Instant, chunks_per_s: u64) -> Pacer {
        Pacer {
            t0,
            chunks_per_s: chunks_per_s.max(1),
            sent: 0,
        }
    }

    /// When chunk `k` is due.
    pub fn deadline(&self, k: u64) -> Instant {
        let ns = u128::from(k) * 1_000_000_000 / u128::from(self.chunks_per_s);
        self.t0 + Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
    }

    /// The next chunk's deadline.
    pub fn next(&self) -> Instant {
        self.deadline(self.sent)
    }

    /// How many unsent chunks are due by `t`.
    pub fn due_by(&self, t: Instant) -> u64 {
        let Some(since) = t.checked_duration_since(self.t0) else {
            return 0;
        };
        let due = since.as_nanos() * u128::from(self.chunks_per_s) / 1_000_000_000 + 1;
        u64::try_from(due)
            .unwrap_or(u64::MAX)
            .saturating_sub(self.sent)
    }
}

/// Waits until `t`: spinning (after sleeping to `lead` before `t`, when
/// given), or sleeping.
fn wait_until(t: Instant, pacing: Pacing, lead: Option<Duration>) {
    match pacing {
        Pacing::Spin => {
            if let Some(lead) = lead {
                let now = Instant::now();
                if t > now + lead {
                    std::thread::sleep(t - now - lead);
                }
            }
            while Instant::now() < t {
                std::hint::spin_loop();
            }
        }
        Pacing::Sleep => {
            let now = Instant::now();
            if t > now {
                std::thread::sleep(t - now);
            }
        }
    }
}

/// The socket and what else the send mode needs.
struct Wire {
    sock: UdpSocket,
    file: Option<File>,
    uring: Option<IoUring>,
}

/// The streamer.
pub struct Streamer {
    p: Params,
    mode: SendMode,
    pacing: Pacing,
    wire: Option<Wire>,
    pacer: Option<Pacer>,
    cpu0: u64,
    late_sum_ns: u64,
    input_closed: bool,
    /// The thread's scheduling policy before `realtime` changed it.
    was_fifo: Option<bool>,
    /// Under `realtime`, how long before a deadline the busy-wait starts.
    spin_lead: Option<Duration>,
    /// Under `realtime`, when the thread last slept.
    rested: Option<Instant>,
    m: [Metric; 7],
}

const NAMES: [&str; 7] = [
    "sent",
    "bytes",
    "send_errors",
    "late_max_ns",
    "late_mean_ns",
    "cpu_ns",
    "elapsed_ms",
];

/// Builds a streamer for the PE it landed on.
pub fn build(spec: &BuildSpec<'_>) -> Result<Box<dyn Offcode>, OffcodeError> {
    let p = Params::parse(spec.params)?;
    Ok(Box::new(Streamer {
        mode: p.send_mode()?,
        pacing: p.pacing(spec.kind)?,
        p,
        wire: None,
        pacer: None,
        cpu0: 0,
        late_sum_ns: 0,
        input_closed: false,
        was_fifo: None,
        spin_lead: None,
        rested: None,
        m: Default::default(),
    }))
}

/// Puts the calling thread under `SCHED_FIFO` priority 1 (`fifo`) or back
/// under `SCHED_OTHER`.
fn set_fifo(fifo: bool) -> std::io::Result<()> {
    let p = libc::sched_param {
        sched_priority: i32::from(fifo),
    };
    let policy = if fifo {
        libc::SCHED_FIFO
    } else {
        libc::SCHED_OTHER
    };
    // SAFETY: pid 0 is the calling thread; `p` lives across the call.
    let r = unsafe { libc::sched_setscheduler(0, policy, &raw const p) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn failed(what: &str, e: impl std::fmt::Display) -> OffcodeError {
    OffcodeError::failed(format!("{what}: {e}"))
}

impl Streamer {
    fn open(&self) -> Result<Wire, OffcodeError> {
        let p = &self.p;
        let src = match &p.src {
            Some(s) => Ipv4Addr::from(ipv4("src", s)?),
            None => Ipv4Addr::UNSPECIFIED,
        };
        let dst = SocketAddrV4::new(Ipv4Addr::from(ipv4("dst", &p.dst)?), p.dport);
        let sock = sidecore_testbed::within(p.netns.as_deref(), || {
            let s = UdpSocket::bind(SocketAddrV4::new(src, p.sport))?;
            s.connect(dst)?;
            Ok::<_, std::io::Error>(s)
        })
        .map_err(|e| failed("entering the namespace", e))?
        .map_err(|e| {
            bad(
                "dst",
                format!("cannot connect a UDP socket from {src} to {dst}: {e}"),
            )
        })?;
        let file = match (&p.file, self.mode) {
            (Some(f), SendMode::Sendfile) => {
                Some(File::open(f).map_err(|e| bad("file", format!("{}: {e}", f.display())))?)
            }
            _ => None,
        };
        let uring = match self.mode {
            SendMode::IoUring => Some(IoUring::new(8).map_err(|e| failed("io_uring_setup", e))?),
            _ => None,
        };
        Ok(Wire { sock, file, uring })
    }

    /// Sends one ring message (offset + chunk) once it is due.
    fn send_one(&mut self, msg: &[u8]) -> Result<(), OffcodeError> {
        let (Some(wire), Some(pacer)) = (self.wire.as_mut(), self.pacer.as_mut()) else {
            return Ok(());
        };
        if msg.len() < HEADER_BYTES || msg.len() > HEADER_BYTES + MAX_CHUNK_BYTES {
            return Err(OffcodeError::failed(format!(
                "input: a {}-byte message is not an 8-byte offset and a chunk of 1..={MAX_CHUNK_BYTES} bytes (is `file` feeding it?)",
                msg.len()
            )));
        }
        let deadline = pacer.next();
        if let (Some(lead), Some(rested)) = (self.spin_lead, self.rested.as_mut()) {
            let now = Instant::now();
            if deadline > now + lead {
                *rested = now;
            } else if now.duration_since(*rested) >= REST_EVERY {
                std::thread::sleep(REST);
                *rested = Instant::now();
            }
        }
        let chunk = &msg[HEADER_BYTES..];
        let r = if self.mode == SendMode::IoUring {
            uring_send(wire, chunk, deadline)
        } else {
            wait_until(deadline, self.pacing, self.spin_lead);
            match (&wire.file, self.mode) {
                (Some(f), SendMode::Sendfile) => {
                    let off = u64::from_le_bytes(msg[..HEADER_BYTES].try_into().unwrap_or([0; 8]));
                    sendfile(&wire.sock, f, off, chunk.len())
                }
                _ => wire.sock.send(chunk),
            }
        };
        let late = u64::try_from(
            Instant::now()
                .saturating_duration_since(deadline)
                .as_nanos(),
        )
        .unwrap_or(u64::MAX);
        pacer.sent += 1;
        match r {
            Ok(_) => {
                self.m[0].add(1);
                self.m[1].add(chunk.len() as u64);
            }
            // UDP is unreliable: a full queue or a refused port drops the chunk.
            Err(_) => self.m[2].add(1),
        }
        self.late_sum_ns = self.late_sum_ns.saturating_add(late);
        if late > self.m[3].get() {
            self.m[3].set(late);
        }
        self.m[4].set(self.late_sum_ns / pacer.sent);
        Ok(())
    }

    fn account(&self) {
        self.m[5].set(thread_cpu_ns().saturating_sub(self.cpu0));
        if let Some(p) = &self.pacer {
            self.m[6].set(u64::try_from(p.t0.elapsed().as_millis()).unwrap_or(u64::MAX));
        }
    }
}

/// `sendfile(2)` of `len` bytes at `off` of `f` to the connected socket.
fn sendfile(sock: &UdpSocket, f: &File, off: u64, len: usize) -> std::io::Result<usize> {
    let mut o = libc::off_t::try_from(off).map_err(|_| std::io::ErrorKind::InvalidInput)?;
    // SAFETY: both descriptors are open for the call; `o` lives across it.
    let n = unsafe { libc::sendfile(sock.as_raw_fd(), f.as_raw_fd(), &raw mut o, len) };
    usize::try_from(n).map_err(|_| std::io::Error::last_os_error())
}

/// A timeout for the time left to `deadline` linked to a send of `chunk`: one
/// `io_uring_enter` that waits for both.
fn uring_send(wire: &mut Wire, chunk: &[u8], deadline: Instant) -> std::io::Result<usize> {
    let Some(ring) = wire.uring.as_mut() else {
        return Err(std::io::ErrorKind::NotConnected.into());
    };
    let fd = types::Fd(wire.sock.as_raw_fd());
    let len = u32::try_from(chunk.len()).map_err(|_| std::io::ErrorKind::InvalidInput)?;
    let send = opcode::Send::new(fd, chunk.as_ptr(), len)
        .build()
        .user_data(2);
    let left = deadline.saturating_duration_since(Instant::now());
    let ts;
    let want = if left.is_zero() {
        // SAFETY: the chunk outlives the submission: we wait for its completion below.
        unsafe { ring.submission().push(&send) }.map_err(|_| std::io::ErrorKind::WouldBlock)?;
        1
    } else {
        ts = types::Timespec::from(left);
        let timeout = opcode::Timeout::new(&raw const ts)
            .flags(types::TimeoutFlags::ETIME_SUCCESS)
            .build()
            .flags(squeue::Flags::IO_LINK)
            .user_data(1);
        // SAFETY: `ts` and the chunk outlive the submissions: we wait for both
        // completions below before returning.
        unsafe { ring.submission().push_multiple(&[timeout, send]) }
            .map_err(|_| std::io::ErrorKind::WouldBlock)?;
        2
    };
    ring.submit_and_wait(want)?;
    let mut result = Ok(0);
    for cqe in ring.completion() {
        if cqe.user_data() == 2 {
            result = usize::try_from(cqe.result())
                .map_err(|_| std::io::Error::from_raw_os_error(-cqe.result()));
        }
    }
    result
}

impl Offcode for Streamer {
    fn initialize(&mut self, cx: &mut InitCx<'_>) -> Result<(), OffcodeError> {
        cx.input("in")?;
        for (m, n) in self.m.iter_mut().zip(NAMES) {
            *m = cx.metric(n);
        }
        self.wire = Some(self.open()?);
        Ok(())
    }

    fn start(&mut self, _cx: &mut RunCx<'_>) -> Result<(), OffcodeError> {
        if self.p.realtime && self.pacing == Pacing::Spin {
            // SAFETY: sched_getscheduler only reads the calling thread's policy.
            let before = unsafe { libc::sched_getscheduler(0) };
            set_fifo(true).map_err(|e| {
                bad(
                    "realtime",
                    format!("sched_setscheduler(SCHED_FIFO, 1): {e} (needs CAP_SYS_NICE)"),
                )
            })?;
            self.was_fifo = Some(before == libc::SCHED_FIFO);
            self.spin_lead = Some(SPIN_LEAD);
            self.rested = Some(Instant::now());
        }
        self.cpu0 = thread_cpu_ns();
        self.pacer = Some(Pacer::new(Instant::now(), self.p.rate));
        Ok(())
    }

    fn handle_burst(
        &mut self,
        _cx: &mut RunCx<'_>,
        _input: InputId,
        inlet: &mut Inlet,
        max: usize,
    ) -> Result<Drained, OffcodeError> {
        let Some(pacer) = self.pacer else {
            return Ok(Drained::default());
        };
        let window = match (self.pacing, self.spin_lead) {
            (Pacing::Spin, None) => SPIN_WINDOW,
            _ => SLEEP_WINDOW,
        };
        let due = usize::try_from(pacer.due_by(Instant::now() + window)).unwrap_or(usize::MAX);
        let n = due.min(max);
        if n == 0 {
            return Ok(Drained::default());
        }
        let d = inlet.drain(n, |m| self.send_one(m))?;
        self.input_closed |= d.closed;
        if self.m[0].get().is_multiple_of(1024) {
            self.account();
        }
        Ok(d)
    }

    fn poll(&mut self, _cx: &mut RunCx<'_>) -> Result<Progress, OffcodeError> {
        if self.input_closed {
            self.account();
            return Ok(Progress::Done);
        }
        // On a dedicated core the loop stays hot (the executor would back off
        // to sleeps after a run of idle turns); on the host it may rest.
        Ok(match self.pacing {
            Pacing::Spin => Progress::Busy,
            Pacing::Sleep => Progress::Idle,
        })
    }

    fn stop(&mut self, _cx: &mut RunCx<'_>) -> Result<(), OffcodeError> {
        self.account();
        if self.was_fifo == Some(false) {
            set_fifo(false).map_err(|e| failed("sched_setscheduler(SCHED_OTHER)", e))?;
        }
        self.wire = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> toml::Table {
        toml::from_str(s).unwrap()
    }

    #[test]
    fn bad_parameters_are_named() {
        let e = Params::parse(&t("dst = \"10.0.0.2\"\nrate = 0")).unwrap_err();
        assert!(
            e.to_string().contains("`rate`: 0 chunks/s is outside"),
            "{e}"
        );
        let e = Params::parse(&t("dst = \"10.0.0.2\"")).unwrap_err();
        assert!(e.to_string().contains("rate"), "{e}");
        let e = Params::parse(&t("dst = \"nowhere\"\nrate = 200")).unwrap_err();
        assert!(e.to_string().contains("`dst`: `nowhere`"), "{e}");
        let e = Params::parse(&t(
            "dst = \"10.0.0.2\"\nrate = 200\nsend = \"carrier-pigeon\"",
        ))
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("`send`: `carrier-pigeon` is not one of"),
            "{e}"
        );
        let e =
            Params::parse(&t("dst = \"10.0.0.2\"\nrate = 200\nsend = \"sendfile\"")).unwrap_err();
        assert!(
            e.to_string()
                .contains("`file`: `send = \"sendfile\"` needs"),
            "{e}"
        );
        let e = Params::parse(&t(
            "dst = \"10.0.0.2\"\nrate = 200\nsend = \"sendfile\"\nfile = \"/nonexistent/m\"",
        ))
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("`file`: /nonexistent/m: No such file"),
            "{e}"
        );
        let e = Params::parse(&t("dst = \"10.0.0.2\"\nrate = 200\npacing = \"lazy\"")).unwrap_err();
        assert!(e.to_string().contains("`pacing`: `lazy`"), "{e}");
        let e = Params::parse(&t("dst = \"10.0.0.2\"\nrate = 200\ndport = 0")).unwrap_err();
        assert!(e.to_string().contains("`dport`"), "{e}");
        let p = Params::parse(&t("dst = \"10.0.0.2\"\nrate = 200")).unwrap();
        assert_eq!(p.pacing(PeKind::Core).unwrap(), Pacing::Spin);
        assert_eq!(p.pacing(PeKind::Host).unwrap(), Pacing::Sleep);
    }

    #[test]
    fn the_schedule_is_absolute() {
        let t0 = Instant::now();
        let mut p = Pacer::new(t0, 200);
        assert_eq!(p.deadline(0), t0);
        assert_eq!(p.deadline(3), t0 + Duration::from_millis(15));
        assert_eq!(p.due_by(t0), 1);
        assert_eq!(p.due_by(t0 + Duration::from_micros(4_999)), 1);
        assert_eq!(p.due_by(t0 + Duration::from_millis(5)), 2);
        // Late by 12 ms: three chunks are due at once, and the next deadline
        // stays on the grid.
        p.sent = 1;
        assert_eq!(p.due_by(t0 + Duration::from_millis(17)), 3);
        p.sent = 4;
        assert_eq!(p.next(), t0 + Duration::from_millis(20));
    }
}

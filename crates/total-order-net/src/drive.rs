//! One node's threads on a real network. A node has a UDP socket made in its
//! namespace and, for the Lamport order, two threads joined by channels:
//!
//! * the application thread: the TO service (`to_broadcast`, `to_receive`)
//!   and a load that broadcasts as fast as flow control lets it;
//! * the "NIC" thread: the socket and β, with α beside it
//!   ([`Placement::Beside`], the offloaded orderer: the application only sees
//!   payloads and the order) or α in the application thread
//!   ([`Placement::Host`]: β hands every delivery up and α's clock comes down).
//!
//! The same state machines in both; only where α runs differs — the layout
//! swap of the seed. The fixed sequencer runs in one plain thread per node.
//! An idle thread sleeps in `ppoll` on its socket (100 µs) or on its channel.

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use sidecore_total_order::{
    Dest, GroupError, LamportOrderer, MsgId, NodeId, RbConfig, RbEvent, RbStats, ReliableBroadcast,
    SeqNode, ToService, Transmit,
};

/// How long an idle thread waits for its socket or channel, ns.
pub const IDLE_WAIT_NS: u64 = 100_000;
/// Datagrams taken from the socket per turn.
const RECV_BURST: usize = 64;
/// Socket buffer asked for, bytes.
const SOCKET_BUFFER_BYTES: i32 = 4 << 20;
/// Bytes of the send time at the head of every payload.
pub const STAMP_BYTES: usize = 8;

/// Where α runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// On the NIC thread, beside β: the offloaded orderer.
    Beside,
    /// On the application's thread: the host orderer.
    Host,
}

/// The run's shared clock (one process: every namespace reads the same one).
#[derive(Debug, Clone, Copy)]
pub struct Clock(pub Instant);

impl Clock {
    pub fn now_ns(&self) -> u64 {
        u64::try_from(self.0.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// What every node is asked to do.
#[derive(Debug, Clone, Copy)]
pub struct Load {
    pub per_node: usize,
    pub payload_bytes: usize,
    pub window: usize,
    pub deadline_ns: u64,
}

/// What one node saw.
#[derive(Debug, Default, Clone)]
pub struct NodeLog {
    pub order: Vec<MsgId>,
    pub latencies_ns: Vec<u64>,
    pub done_ns: Option<u64>,
    pub stats: RbStats,
    pub send_errors: u64,
}

/// A node's socket and where the others are.
pub struct Net {
    sock: UdpSocket,
    peers: Vec<SocketAddr>,
    me: usize,
    pub send_errors: u64,
}

impl Net {
    /// Binds `port` inside namespace `netns`; `peers[j]` is node `j`'s address.
    pub fn bind(
        netns: &str,
        port: u16,
        me: usize,
        peers: Vec<SocketAddr>,
    ) -> Result<Net, std::io::Error> {
        let sock = sidecore_testbed::within(Some(netns), || UdpSocket::bind(("0.0.0.0", port)))
            .map_err(std::io::Error::other)??;
        sock.set_nonblocking(true)?;
        for opt in [libc::SO_RCVBUF, libc::SO_SNDBUF] {
            let v = SOCKET_BUFFER_BYTES;
            // SAFETY: a valid socket, a valid int option and its size; the
            // kernel only reads `v`. Failure leaves the default size.
            unsafe {
                libc::setsockopt(
                    sock.as_raw_fd(),
                    libc::SOL_SOCKET,
                    opt,
                    (&raw const v).cast(),
                    std::mem::size_of::<i32>() as libc::socklen_t,
                );
            }
        }
        Ok(Net {
            sock,
            peers,
            me,
            send_errors: 0,
        })
    }

    pub fn send(&mut self, t: &Transmit) {
        let one = |to: SocketAddr, errs: &mut u64| {
            if self.sock.send_to(&t.bytes, to).is_err() {
                *errs += 1;
            }
        };
        let mut errs = 0;
        match t.dest {
            Dest::All => {
                for (j, a) in self.peers.iter().enumerate() {
                    if j != self.me {
                        one(*a, &mut errs);
                    }
                }
            }
            Dest::To(j) => match self.peers.get(usize::from(j)) {
                Some(a) => one(*a, &mut errs),
                None => errs += 1,
            },
        }
        self.send_errors += errs;
    }

    /// One datagram if one is waiting.
    pub fn recv(&self, buf: &mut [u8]) -> Option<usize> {
        self.sock.recv(buf).ok()
    }

    /// Sleeps until a datagram arrives or `timeout_ns` passes.
    pub fn wait(&self, timeout_ns: u64) {
        let mut fd = libc::pollfd {
            fd: self.sock.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: i64::try_from(timeout_ns.min(999_999_999)).unwrap_or(0),
        };
        // SAFETY: one valid pollfd, a valid timespec, no signal mask; the
        // result (ready, timeout or EINTR) needs no handling: the caller loops.
        unsafe {
            libc::ppoll(&raw mut fd, 1, &raw const ts, std::ptr::null());
        }
    }
}

/// A payload stamped with its send time.
pub fn payload(now_ns: u64, bytes: usize) -> Vec<u8> {
    let mut p = vec![0u8; bytes.max(STAMP_BYTES)];
    p[..STAMP_BYTES].copy_from_slice(&now_ns.to_le_bytes());
    p
}

/// The send time at the head of a payload (0 if it is too short).
pub fn sent_at(p: &[u8]) -> u64 {
    p.get(..STAMP_BYTES)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

/// Application → NIC.
pub enum Down {
    /// A message for α to stamp (α is on the NIC).
    Payload(Vec<u8>),
    /// A message α already stamped (α is on the host).
    Stamped(u64, Vec<u8>),
    /// α's clock (α is on the host), for β's beats.
    Clock(u64),
}

/// NIC → application.
pub enum Up {
    /// A payload, before its order is known (β hands it up at once).
    Payload(MsgId, Vec<u8>),
    /// The next message in the order (α on the NIC: the seed's Call).
    Order(MsgId),
    /// α is on the host: a delivery with its stamp, and stability notices.
    Delivered(MsgId, u64, Vec<u8>),
    Stable(NodeId, u64),
}

/// The application thread: the TO service, a load, and α if it is on the host.
#[allow(clippy::too_many_arguments)] // one node's wiring, named at the one call site
pub fn app(
    me: usize,
    n: usize,
    place: Placement,
    load: Load,
    clock: Clock,
    down: &Sender<Down>,
    up: &Receiver<Up>,
    done: &AtomicUsize,
) -> Result<NodeLog, GroupError> {
    let mut svc = ToService::new(me, n, load.window)?;
    let mut alpha = match place {
        Placement::Host => Some(LamportOrderer::new(me, n)?),
        Placement::Beside => None,
    };
    let (mut log, mut sent, mut told) = (NodeLog::default(), 0, 0);
    let mut stamped = 0u64;
    let total = n * load.per_node;
    loop {
        while sent < load.per_node && svc.can_broadcast() {
            if svc
                .to_broadcast(payload(clock.now_ns(), load.payload_bytes))
                .is_err()
            {
                break;
            }
            sent += 1;
        }
        while let Some(p) = svc.take_outgoing() {
            let cmd = match &mut alpha {
                Some(a) => {
                    stamped += 1;
                    Down::Stamped(a.stamp(stamped - 1), p)
                }
                None => Down::Payload(p),
            };
            let _ = down.send(cmd);
        }
        let mut ev = match up.recv_timeout(Duration::from_millis(1)) {
            Ok(e) => Some(e),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => break,
        };
        while let Some(e) = ev {
            match e {
                Up::Payload(id, p) => svc.on_payload(id, p),
                Up::Order(id) => svc.on_order(id),
                Up::Delivered(id, stamp, p) => {
                    svc.on_payload(id, p);
                    if let Some(a) = &mut alpha {
                        a.on_delivered(id.sender, id.seq, stamp);
                    }
                }
                Up::Stable(s, c) => {
                    if let Some(a) = &mut alpha {
                        a.on_stable(s, c);
                    }
                }
            }
            ev = up.try_recv().ok();
        }
        if let Some(a) = &mut alpha {
            while let Some(id) = a.poll_order() {
                svc.on_order(id);
            }
            if a.clock() > told {
                told = a.clock();
                let _ = down.send(Down::Clock(told));
            }
        }
        let now = clock.now_ns();
        while let Some(d) = svc.to_receive() {
            log.order.push(d.id);
            log.latencies_ns
                .push(now.saturating_sub(sent_at(&d.payload)));
        }
        if log.order.len() >= total {
            log.done_ns = Some(now);
            break;
        }
        if now > load.deadline_ns {
            break;
        }
    }
    done.fetch_add(1, Ordering::SeqCst);
    Ok(log)
}

/// The NIC thread: the socket and β, with α if it is placed here. Runs until `stop`.
#[allow(clippy::too_many_arguments)] // one node's wiring, named at the one call site
pub fn nic(
    mut net: Net,
    me: usize,
    n: usize,
    place: Placement,
    cfg: RbConfig,
    clock: Clock,
    down: &Receiver<Down>,
    up: &Sender<Up>,
    stop: &AtomicBool,
) -> Result<NodeLog, GroupError> {
    let mut rb = ReliableBroadcast::new(me, n, cfg)?;
    let mut alpha = match place {
        Placement::Beside => Some(LamportOrderer::new(me, n)?),
        Placement::Host => None,
    };
    let mut buf = vec![0u8; 2048];
    while !stop.load(Ordering::Relaxed) {
        let now = clock.now_ns();
        let mut busy = false;
        while let Ok(cmd) = down.try_recv() {
            busy = true;
            let _ = match cmd {
                Down::Payload(p) => {
                    let seq = rb.sent();
                    let stamp = alpha.as_mut().map_or(0, |a| a.stamp(seq));
                    rb.broadcast(stamp, p)
                }
                Down::Stamped(s, p) => rb.broadcast(s, p),
                Down::Clock(c) => {
                    rb.set_clock(c);
                    Ok(0)
                }
            };
        }
        for _ in 0..RECV_BURST {
            let Some(len) = net.recv(&mut buf) else { break };
            rb.on_datagram(&buf[..len], now);
            busy = true;
        }
        rb.tick(now);
        while let Some(e) = rb.poll_event() {
            let msg = match (e, &mut alpha) {
                (
                    RbEvent::Delivered {
                        sender,
                        seq,
                        stamp,
                        payload,
                    },
                    Some(a),
                ) => {
                    a.on_delivered(sender, seq, stamp);
                    Some(Up::Payload(MsgId { sender, seq }, payload))
                }
                (
                    RbEvent::Delivered {
                        sender,
                        seq,
                        stamp,
                        payload,
                    },
                    None,
                ) => Some(Up::Delivered(MsgId { sender, seq }, stamp, payload)),
                (RbEvent::Stable { sender, clock }, Some(a)) => {
                    a.on_stable(sender, clock);
                    None
                }
                (RbEvent::Stable { sender, clock }, None) => Some(Up::Stable(sender, clock)),
            };
            if let Some(m) = msg {
                let _ = up.send(m);
            }
        }
        if let Some(a) = &mut alpha {
            while let Some(id) = a.poll_order() {
                let _ = up.send(Up::Order(id));
            }
            rb.set_clock(a.clock());
        }
        rb.flush(now);
        while let Some(t) = rb.poll_transmit() {
            net.send(&t);
        }
        if !busy {
            net.wait(IDLE_WAIT_NS);
        }
    }
    Ok(NodeLog {
        stats: rb.stats(),
        send_errors: net.send_errors,
        ..NodeLog::default()
    })
}

/// The fixed sequencer's node, one plain thread. Runs until `stop` (node 0
/// keeps ordering for the others after its own messages are done).
#[allow(clippy::too_many_arguments)] // one node's wiring, named at the one call site
pub fn sequencer(
    mut net: Net,
    me: usize,
    n: usize,
    load: Load,
    cfg: RbConfig,
    clock: Clock,
    done: &AtomicUsize,
    stop: &AtomicBool,
) -> Result<NodeLog, GroupError> {
    let mut node = SeqNode::new(me, n, load.window, cfg)?;
    let (mut log, mut sent) = (NodeLog::default(), 0);
    let total = n * load.per_node;
    let mut buf = vec![0u8; 2048];
    while !stop.load(Ordering::Relaxed) {
        let now = clock.now_ns();
        let mut busy = false;
        while sent < load.per_node && node.can_broadcast() {
            if node
                .to_broadcast(payload(now, load.payload_bytes), now)
                .is_err()
            {
                break;
            }
            sent += 1;
            busy = true;
        }
        for _ in 0..RECV_BURST {
            let Some(len) = net.recv(&mut buf) else { break };
            node.on_datagram(&buf[..len], now);
            busy = true;
        }
        node.tick(now);
        while let Some(t) = node.poll_transmit() {
            net.send(&t);
        }
        let now = clock.now_ns();
        while let Some(d) = node.to_receive() {
            log.order.push(d.id);
            log.latencies_ns
                .push(now.saturating_sub(sent_at(&d.payload)));
        }
        if log.done_ns.is_none() && (log.order.len() >= total || now > load.deadline_ns) {
            log.done_ns = (log.order.len() >= total).then_some(now);
            done.fetch_add(1, Ordering::SeqCst);
        }
        if !busy {
            net.wait(IDLE_WAIT_NS);
        }
    }
    log.stats = node.stats();
    log.send_errors = net.send_errors;
    Ok(log)
}

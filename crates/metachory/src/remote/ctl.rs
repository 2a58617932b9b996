//! How `sidecore migrate PID --to NODE` reaches the session: every
//! `sidecore exec --on` client listens on the abstract Unix socket
//! `sidecore-mx-exec.PID` (its own PID), takes one JSON line asking to move
//! its guest, and answers with one JSON line once the guest runs on the
//! target and every page is there (or with the reason it stayed). Only the
//! client's own user (or root) may ask: the peer's credentials are checked.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::mpsc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Longest request or reply line.
pub const MAX_LINE_BYTES: usize = 64 * 1024;
/// How long a migration may take from the asking side.
pub const MIGRATE_TIMEOUT: Duration = Duration::from_secs(600);

/// Move the guest to `to` (`host:port` of its daemon; `node` names it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigrateRequest {
    pub to: String,
    pub node: String,
    pub lazy: bool,
}

/// How a migration went.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigrateReply {
    /// Why the guest did not move (it runs where it was).
    pub error: Option<String>,
    pub node: String,
    pub lazy: bool,
    /// From the freeze until the guest ran on the target.
    pub freeze_us: u64,
    /// From the request until every page was on the target.
    pub total_us: u64,
    pub image_bytes: u64,
    /// Bytes of pages sent before the guest resumed.
    pub pages_bytes: u64,
    /// Bytes of pages on the target in all.
    pub resident_bytes: u64,
    /// Faults the target served lazily.
    pub faults: u64,
}

/// Why asking a session failed.
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    #[error("no `sidecore exec --on` session runs as PID {pid} (for this user): {source}")]
    NoSession {
        pid: u32,
        #[source]
        source: std::io::Error,
    },
    #[error("the session of PID {pid}: {what}")]
    Io { pid: u32, what: String },
}

/// The socket's name for the client with PID `pid`.
#[must_use]
pub fn name(pid: u32) -> String {
    format!("sidecore-mx-exec.{pid}")
}

/// A request and where its answer goes.
pub type Asked = (MigrateRequest, mpsc::Sender<MigrateReply>);

/// Listens for this process's session; each request goes to `tx`.
pub fn serve(tx: mpsc::Sender<Asked>) -> std::io::Result<()> {
    let addr = SocketAddr::from_abstract_name(name(std::process::id()).as_bytes())?;
    let l = UnixListener::bind_addr(&addr)?;
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            let tx = tx.clone();
            std::thread::spawn(move || answer(s, &tx));
        }
    });
    Ok(())
}

fn peer_allowed(s: &UnixStream) -> bool {
    // SAFETY: ucred is plain data; getsockopt fills it.
    let mut c: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED into a ucred of the given length.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut c).cast(),
            &raw mut len,
        )
    };
    // SAFETY: geteuid has no preconditions.
    r == 0 && (c.uid == 0 || c.uid == unsafe { libc::geteuid() })
}

fn answer(mut s: UnixStream, tx: &mpsc::Sender<Asked>) {
    let reply = |s: &mut UnixStream, r: &MigrateReply| {
        let mut line = serde_json::to_vec(r).unwrap_or_default();
        line.push(b'\n');
        let _ = s.write_all(&line);
    };
    let fail = |what: String| MigrateReply {
        error: Some(what),
        ..MigrateReply::default()
    };
    if !peer_allowed(&s) {
        reply(&mut s, &fail("only this session's user may move it".into()));
        return;
    }
    let mut line = String::new();
    let read = s
        .try_clone()
        .map(|c| BufReader::new(c.take(MAX_LINE_BYTES as u64)).read_line(&mut line));
    let req = match read {
        Ok(Ok(_)) => serde_json::from_str::<MigrateRequest>(&line),
        _ => {
            reply(&mut s, &fail("no request arrived".into()));
            return;
        }
    };
    let req = match req {
        Ok(r) => r,
        Err(e) => {
            reply(&mut s, &fail(format!("bad request: {e}")));
            return;
        }
    };
    let (rtx, rrx) = mpsc::channel();
    if tx.send((req, rtx)).is_err() {
        reply(&mut s, &fail("the session is ending".into()));
        return;
    }
    let r = rrx
        .recv_timeout(MIGRATE_TIMEOUT)
        .unwrap_or_else(|_| fail("the session gave no answer".into()));
    reply(&mut s, &r);
}

/// Asks the session of client `pid` to migrate its guest.
pub fn request(pid: u32, req: &MigrateRequest) -> Result<MigrateReply, CtlError> {
    let addr = SocketAddr::from_abstract_name(name(pid).as_bytes())
        .map_err(|source| CtlError::NoSession { pid, source })?;
    let mut s =
        UnixStream::connect_addr(&addr).map_err(|source| CtlError::NoSession { pid, source })?;
    let io = |e: std::io::Error| CtlError::Io {
        pid,
        what: e.to_string(),
    };
    let mut line = serde_json::to_vec(req).unwrap_or_default();
    line.push(b'\n');
    s.write_all(&line).map_err(io)?;
    s.set_read_timeout(Some(MIGRATE_TIMEOUT + Duration::from_secs(10)))
        .map_err(io)?;
    let mut got = String::new();
    BufReader::new(s.take(MAX_LINE_BYTES as u64))
        .read_line(&mut got)
        .map_err(io)?;
    serde_json::from_str(&got).map_err(|e| CtlError::Io {
        pid,
        what: format!("bad answer {got:?}: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_checked_and_answered_by_name() {
        let (tx, rx) = mpsc::channel::<Asked>();
        serve(tx).unwrap();
        let me = std::process::id();
        // A request that is not one gets an error, and reaches no session.
        let addr = SocketAddr::from_abstract_name(name(me).as_bytes()).unwrap();
        let mut s = UnixStream::connect_addr(&addr).unwrap();
        s.write_all(b"{\"to\": 5}\n").unwrap();
        let mut got = String::new();
        BufReader::new(s).read_line(&mut got).unwrap();
        let r: MigrateReply = serde_json::from_str(&got).unwrap();
        assert!(r.error.unwrap().starts_with("bad request: "), "{got}");
        assert!(rx.try_recv().is_err());
        // A good one reaches the session and its answer comes back.
        let t = std::thread::spawn(move || {
            let (req, reply) = rx.recv().unwrap();
            assert_eq!(req.node, "b");
            reply
                .send(MigrateReply {
                    node: req.node,
                    freeze_us: 5,
                    ..MigrateReply::default()
                })
                .unwrap();
        });
        let req = MigrateRequest {
            to: "10.0.0.2:7430".into(),
            node: "b".into(),
            lazy: true,
        };
        let r = request(me, &req).unwrap();
        assert_eq!((r.error, r.freeze_us), (None, 5));
        t.join().unwrap();
        // No session under another PID.
        let e = request(u32::MAX, &req).unwrap_err().to_string();
        assert!(
            e.contains("no `sidecore exec --on` session runs as PID"),
            "{e}"
        );
    }
}

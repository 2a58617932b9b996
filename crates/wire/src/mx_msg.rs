//! Metachory's sessions on the node protocol (issue 16): `sidecore exec --on
//! NODE` opens one with [`MxOpen`] after the welcome; from then on every
//! message is an [`MxFrame`] addressed from one numbered endpoint of the
//! session to another (never to an IP address), carrying an [`MxBody`]:
//! the projection's lookups, DisCo's coherence and stream messages
//! (`sidecore-disco`), signals, the terminal size, the guest's exit and the
//! write-back overlay the client approves.
//!
//! ```text
//! client (endpoint 1)                         server (endpoint 2)
//!   hello ─────────────────────────────────▶  welcome
//!   mx-open {session, argv, env, cwd, dirs}─▶  (namespaces, projection, supervisor)
//!        ◀── mx {lookup/readdir/readlink, DisCo REQUEST for file regions}
//!   mx {attr/entries/target, DisCo GRANT} ─▶
//!        ◀── mx started {supervision, projection}
//!   mx {STREAMPUSH stdin, signal, winch} ◀─▶ mx {STREAMPUSH stdout/stderr, STREAMSTAT}
//!        ◀── mx exit {code, signal}
//!        ◀── mx overlay {changes}, VNODEWRITE…, overlay-end
//!   mx verdict {applied} ──────────────────▶  (overlay dropped), close
//! ```
//!
//! A relay node that receives an `mx-open` whose `route` is not empty
//! connects to the next hop, opens the session there with the rest of the
//! route, and forwards frames by their destination endpoint.

use serde::{Deserialize, Serialize};
use sidecore_disco::Msg as DiscoMsg;

/// Largest argument vector, environment or projection list an `mx-open` may carry.
pub const MAX_MX_ITEMS: usize = 4096;
/// Longest path or argument, in bytes.
pub const MAX_MX_STRING_BYTES: usize = 64 * 1024;
/// Directories a session may project.
pub const MAX_PROJECTED_DIRS: usize = 16;
/// Relay hops an `mx-open` may name.
pub const MAX_ROUTE_HOPS: usize = 8;

/// The client's request to run a program here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MxOpen {
    /// The session's number (chosen by the client, or `--session`).
    pub session: u64,
    /// The client's endpoint number in the session.
    pub client: u32,
    /// The endpoint number the guest's server takes.
    pub server: u32,
    /// The program and its arguments.
    pub argv: Vec<String>,
    /// The environment, as the client has it.
    pub env: Vec<(String, String)>,
    /// The working directory (absolute, on the client).
    pub cwd: String,
    /// Directories of the client projected at the same paths (absolute);
    /// their index is their number in lookups.
    pub project: Vec<String>,
    /// The client's terminal size (rows, columns) when stdin is a terminal:
    /// the guest gets a pseudo-terminal of that size.
    pub tty: Option<(u16, u16)>,
    /// Run the guest in a user namespace (the unprivileged server mode).
    pub userns: bool,
    /// Supervise with PTRACE_SYSEMU instead of seccomp user notification.
    pub ptrace: bool,
    /// Relays still to cross (`host:port` of each next hop); empty here.
    pub route: Vec<String>,
    /// Take a migrating guest in (`sidecore migrate`) instead of starting
    /// `argv`: the server builds the same container, then waits for the
    /// source's image on a page stream ([`crate::mx_image`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<MxResume>,
    /// Run the guest's container and its seccomp supervisor on this CPU of
    /// the server (`sidecore exec --cpu`): every trapped call is then a
    /// hand-off on one CPU instead of two cross-CPU wake-ups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<u32>,
}

/// How a guest migrates in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MxResume {
    /// The endpoint the guest leaves (the source server).
    pub from: u32,
    /// Anonymous memory follows on demand (userfaultfd) after the guest
    /// resumes, instead of before.
    pub lazy: bool,
}

/// Why an `mx-open` was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MxOpenError {
    #[error("no program given")]
    NoProgram,
    #[error("session 0 is reserved")]
    ZeroSession,
    #[error("the client and the server must be different endpoints (both {0})")]
    SameEndpoint(u32),
    #[error("`{field}` has {got} entries, more than the {limit} allowed")]
    TooMany {
        field: &'static str,
        got: usize,
        limit: usize,
    },
    #[error("`{field}`: {what:?} is not an absolute path without `.`, `..` or empty parts")]
    BadPath { field: &'static str, what: String },
    #[error(
        "`{field}`: an entry of {got} bytes is longer than the {MAX_MX_STRING_BYTES}-byte limit"
    )]
    TooLong { field: &'static str, got: usize },
    #[error("a guest with a terminal, under --ptrace or --userns cannot migrate (not yet)")]
    NotMigratable,
}

/// Whether `p` is absolute and names no `.`/`..`/empty component.
#[must_use]
pub fn clean_absolute(p: &str) -> bool {
    p == "/"
        || (p.starts_with('/')
            && !p.ends_with('/')
            && p[1..]
                .split('/')
                .all(|c| !c.is_empty() && c != "." && c != ".." && !c.contains('\0')))
}

impl MxOpen {
    /// Checks limits and paths before anything is built from it.
    pub fn validate(&self) -> Result<(), MxOpenError> {
        if self.argv.is_empty() || self.argv[0].is_empty() {
            return Err(MxOpenError::NoProgram);
        }
        if self.session == 0 {
            return Err(MxOpenError::ZeroSession);
        }
        if self.client == self.server {
            return Err(MxOpenError::SameEndpoint(self.client));
        }
        if let Some(r) = &self.resume {
            if r.from == self.server || r.from == self.client {
                return Err(MxOpenError::SameEndpoint(r.from));
            }
            if self.tty.is_some() || self.ptrace || self.userns {
                return Err(MxOpenError::NotMigratable);
            }
        }
        let counts = [
            ("argv", self.argv.len(), MAX_MX_ITEMS),
            ("env", self.env.len(), MAX_MX_ITEMS),
            ("project", self.project.len(), MAX_PROJECTED_DIRS),
            ("route", self.route.len(), MAX_ROUTE_HOPS),
        ];
        for (field, got, limit) in counts {
            if got > limit {
                return Err(MxOpenError::TooMany { field, got, limit });
            }
        }
        let strings = self
            .argv
            .iter()
            .map(|s| ("argv", s))
            .chain(self.env.iter().flat_map(|(k, v)| [("env", k), ("env", v)]))
            .chain(self.project.iter().map(|s| ("project", s)))
            .chain(std::iter::once(("cwd", &self.cwd)));
        for (field, s) in strings {
            if s.len() > MAX_MX_STRING_BYTES {
                return Err(MxOpenError::TooLong {
                    field,
                    got: s.len(),
                });
            }
        }
        for (field, p) in
            std::iter::once(("cwd", &self.cwd)).chain(self.project.iter().map(|p| ("project", p)))
        {
            if !clean_absolute(p) {
                return Err(MxOpenError::BadPath {
                    field,
                    what: p.clone(),
                });
            }
        }
        Ok(())
    }
}

/// One message of a session, between two of its endpoints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MxFrame {
    pub session: u64,
    pub src: u32,
    pub dst: u32,
    /// Relays crossed so far.
    pub hops: u8,
    pub body: MxBody,
}

/// A file's attributes as the projection presents them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MxAttr {
    /// `S_IFMT` bits and permissions, as `st_mode`.
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub atime_ns: i64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    pub rdev: u64,
    /// The vnode of a regular file, and the physical address of its first
    /// region (its data is fetched region by region through DisCo).
    pub vnode: u64,
    pub base: u64,
}

/// One directory entry: name and `S_IFMT` type bits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MxDirent {
    pub name: String,
    pub kind: u32,
}

/// One change in the write-back overlay, in the order to apply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case", deny_unknown_fields)]
pub enum MxChange {
    /// A file written or created: its contents follow as `VNODEWRITE`s to
    /// vnode `vnode`.
    Write {
        path: String,
        mode: u32,
        size: u64,
        vnode: u64,
        mtime_ns: i64,
    },
    Mkdir {
        path: String,
        mode: u32,
    },
    Symlink {
        path: String,
        target: String,
    },
    /// Removed (a whiteout), or a directory replaced whole (opaque).
    Delete {
        path: String,
    },
}

/// What a frame carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum MxBody {
    /// Server → client: the guest runs, and how.
    Started {
        guest_pid: u32,
        supervision: String,
        projection: String,
        namespaces: String,
    },
    /// Server → client: the attributes of `path` (projected root number,
    /// then the path inside it: `"0/src/main.c"`).
    Lookup {
        req: u64,
        path: String,
    },
    Attr {
        req: u64,
        attr: Option<MxAttr>,
        errno: i32,
    },
    ReadDir {
        req: u64,
        path: String,
    },
    Entries {
        req: u64,
        entries: Vec<MxDirent>,
        errno: i32,
    },
    ReadLink {
        req: u64,
        path: String,
    },
    Target {
        req: u64,
        target: String,
        errno: i32,
    },
    /// DisCo: coherence of file regions, and the stdio streams
    /// (`STREAMPUSH`/`STREAMSTAT` on vnodes 0, 1 and 2).
    Disco(DiscoMsg),
    /// Client → server: deliver this signal to the guest.
    Signal {
        sig: i32,
    },
    /// Client → server: the terminal's new size.
    Winch {
        rows: u16,
        cols: u16,
    },
    /// Server → client: a fault the guest hit and was stopped at (an
    /// attempted escape), for the client's stderr.
    Denied {
        what: String,
    },
    /// Server → client: the guest ended (`signal` 0: it exited with `code`).
    Exit {
        code: i32,
        signal: i32,
        summary: String,
    },
    /// Server → client: the overlay's changes; contents follow.
    Overlay {
        changes: Vec<MxChange>,
    },
    OverlayEnd,
    /// Client → server: the overlay was applied (or not); the session ends.
    Verdict {
        applied: bool,
    },
    /// Target server → client, while it sets up a migrating guest: the
    /// container waits; the source may send the image to `pages` (a page
    /// stream listener for this migration) opening with `ticket`.
    ResumeReady {
        pages: String,
        ticket: u64,
    },
    /// Client → source server: freeze the guest and send it to the target
    /// (endpoint `target`) at `to`, opening with `ticket`.
    MigrateOut {
        to: String,
        ticket: u64,
        target: u32,
        lazy: bool,
    },
    /// Source server → client: the guest runs on the target now; this
    /// server's part in the session is over (its stdout and stderr were all
    /// pushed before this).
    Migrated {
        freeze_us: u64,
        image_bytes: u64,
        pages_bytes: u64,
    },
    /// Source server → client: the migration failed; the guest runs here still.
    MigrateFailed {
        reason: String,
    },
    /// Target server → client: every page of a migrated guest is here (at
    /// once when eager; when the background copy ended when lazy).
    Resident {
        bytes: u64,
        faults: u64,
        elapsed_us: u64,
    },
}

impl MxBody {
    /// Whether the server's end sends it (else the client's).
    #[must_use]
    pub fn from_server(&self) -> bool {
        match self {
            MxBody::Started { .. }
            | MxBody::Lookup { .. }
            | MxBody::ReadDir { .. }
            | MxBody::ReadLink { .. }
            | MxBody::Denied { .. }
            | MxBody::Exit { .. }
            | MxBody::Overlay { .. }
            | MxBody::OverlayEnd
            | MxBody::ResumeReady { .. }
            | MxBody::Migrated { .. }
            | MxBody::MigrateFailed { .. }
            | MxBody::Resident { .. } => true,
            MxBody::MigrateOut { .. }
            | MxBody::Attr { .. }
            | MxBody::Entries { .. }
            | MxBody::Target { .. }
            | MxBody::Signal { .. }
            | MxBody::Winch { .. }
            | MxBody::Verdict { .. } => false,
            // Both ends speak DisCo.
            MxBody::Disco(_) => true,
        }
    }

    /// Whether the client's end sends it.
    #[must_use]
    pub fn from_client(&self) -> bool {
        matches!(self, MxBody::Disco(_)) || !self.from_server()
    }

    /// The body's name, for errors.
    #[must_use]
    pub fn kind(&self) -> &'static str {
        match self {
            MxBody::Started { .. } => "started",
            MxBody::Lookup { .. } => "lookup",
            MxBody::Attr { .. } => "attr",
            MxBody::ReadDir { .. } => "readdir",
            MxBody::Entries { .. } => "entries",
            MxBody::ReadLink { .. } => "readlink",
            MxBody::Target { .. } => "target",
            MxBody::Disco(_) => "disco",
            MxBody::Signal { .. } => "signal",
            MxBody::Winch { .. } => "winch",
            MxBody::Denied { .. } => "denied",
            MxBody::Exit { .. } => "exit",
            MxBody::Overlay { .. } => "overlay",
            MxBody::OverlayEnd => "overlay-end",
            MxBody::Verdict { .. } => "verdict",
            MxBody::ResumeReady { .. } => "resume-ready",
            MxBody::MigrateOut { .. } => "migrate-out",
            MxBody::Migrated { .. } => "migrated",
            MxBody::MigrateFailed { .. } => "migrate-failed",
            MxBody::Resident { .. } => "resident",
        }
    }
}

/// Where a session stands, on either end (the grammars of
/// [`crate::session`] keep one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MxPhase {
    /// `mx-open` sent or received; the server sets the guest up (it may
    /// already ask for the projection's files).
    Opening,
    /// The guest runs.
    Running,
    /// The guest ended; the overlay follows.
    Exited,
    /// The overlay was sent; the client's verdict is due.
    Approving,
    /// The verdict was given.
    Done,
    /// The guest migrated away (`migrated`): this server's part is over;
    /// late answers and window updates may still cross.
    Moved,
}

impl MxPhase {
    /// In words, for errors.
    #[must_use]
    pub fn describe(self) -> &'static str {
        match self {
            MxPhase::Opening => "the guest is being set up",
            MxPhase::Running => "the guest runs",
            MxPhase::Exited => "the guest ended and its overlay is being sent",
            MxPhase::Approving => "the overlay awaits the client's verdict",
            MxPhase::Done => "the session is over",
            MxPhase::Moved => "the guest migrated away",
        }
    }

    /// The phase after `body` passes, if it may pass now. `server_sent`:
    /// the server's end sends it.
    #[must_use]
    pub fn next(self, body: &MxBody, server_sent: bool) -> Option<MxPhase> {
        use MxPhase as P;
        if server_sent != body.from_server() && !matches!(body, MxBody::Disco(_)) {
            return None;
        }
        match (self, body) {
            (P::Opening, MxBody::Started { .. }) => Some(P::Running),
            (P::Running, MxBody::Exit { .. }) => Some(P::Exited),
            (P::Running, MxBody::Migrated { .. }) => Some(P::Moved),
            (
                P::Moved,
                MxBody::Disco(_)
                | MxBody::Attr { .. }
                | MxBody::Entries { .. }
                | MxBody::Target { .. }
                | MxBody::Signal { .. }
                | MxBody::Winch { .. },
            ) => Some(P::Moved),
            (P::Exited, MxBody::Overlay { .. }) => Some(P::Exited),
            (P::Exited | P::Approving, MxBody::Disco(_)) => Some(self),
            (P::Exited, MxBody::OverlayEnd) => Some(P::Approving),
            (P::Approving, MxBody::Verdict { .. }) => Some(P::Done),
            (P::Opening | P::Running, b) if !Self::phase_marker(b) => Some(self),
            // Stdio still draining after the exit, and late window updates.
            (P::Exited | P::Approving, MxBody::Signal { .. } | MxBody::Winch { .. }) => Some(self),
            // A migration asked for as the guest ended: refused, not an error.
            (
                P::Exited | P::Approving,
                MxBody::MigrateOut { .. } | MxBody::MigrateFailed { .. },
            ) => Some(self),
            _ => None,
        }
    }

    fn phase_marker(b: &MxBody) -> bool {
        matches!(
            b,
            MxBody::Started { .. }
                | MxBody::Exit { .. }
                | MxBody::Overlay { .. }
                | MxBody::OverlayEnd
                | MxBody::Verdict { .. }
                | MxBody::Migrated { .. }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open() -> MxOpen {
        MxOpen {
            session: 7,
            client: 1,
            server: 2,
            argv: vec!["python3".into(), "x.py".into()],
            env: vec![("HOME".into(), "/root".into())],
            cwd: "/home/u/proj".into(),
            project: vec!["/home/u/proj".into()],
            tty: None,
            userns: false,
            ptrace: false,
            route: vec![],
            resume: None,
            cpu: None,
        }
    }

    #[test]
    fn opens_are_checked_before_anything_is_built() {
        open().validate().unwrap();
        let mut o = open();
        o.project.push("/home/u/../../etc".into());
        assert_eq!(
            o.validate().unwrap_err().to_string(),
            "`project`: \"/home/u/../../etc\" is not an absolute path without `.`, `..` or empty parts"
        );
        let mut o = open();
        o.argv.clear();
        assert_eq!(o.validate().unwrap_err(), MxOpenError::NoProgram);
        let mut o = open();
        o.cwd = "relative".into();
        assert!(o.validate().is_err());
        let mut o = open();
        o.project = vec!["/x".into(); MAX_PROJECTED_DIRS + 1];
        assert!(matches!(
            o.validate(),
            Err(MxOpenError::TooMany {
                field: "project",
                ..
            })
        ));
        assert!(clean_absolute("/"));
        assert!(!clean_absolute("/a//b"));
    }

    #[test]
    fn phases_admit_only_their_bodies() {
        use MxPhase as P;
        let exit = MxBody::Exit {
            code: 0,
            signal: 0,
            summary: String::new(),
        };
        assert_eq!(P::Opening.next(&exit, true), None, "no exit before started");
        let started = MxBody::Started {
            guest_pid: 1,
            supervision: "s".into(),
            projection: "fuse".into(),
            namespaces: "mnt".into(),
        };
        assert_eq!(P::Opening.next(&started, true), Some(P::Running));
        assert_eq!(
            P::Opening.next(&started, false),
            None,
            "a client cannot say started"
        );
        assert_eq!(P::Running.next(&exit, true), Some(P::Exited));
        assert_eq!(
            P::Exited.next(&MxBody::OverlayEnd, true),
            Some(P::Approving)
        );
        assert_eq!(
            P::Approving.next(&MxBody::Verdict { applied: true }, false),
            Some(P::Done)
        );
        assert_eq!(
            P::Running.next(&MxBody::Verdict { applied: true }, false),
            None
        );
        assert_eq!(P::Running.next(&MxBody::Signal { sig: 2 }, true), None);
    }

    #[test]
    fn migration_bodies_go_their_way() {
        use MxPhase as P;
        let out = MxBody::MigrateOut {
            to: "10.0.0.3:4000".into(),
            ticket: 1,
            target: 3,
            lazy: false,
        };
        assert_eq!(P::Running.next(&out, false), Some(P::Running));
        assert_eq!(
            P::Running.next(&out, true),
            None,
            "a server cannot ask to migrate"
        );
        let ready = MxBody::ResumeReady {
            pages: "10.0.0.3:4000".into(),
            ticket: 1,
        };
        assert_eq!(P::Opening.next(&ready, true), Some(P::Opening));
        let moved = MxBody::Migrated {
            freeze_us: 1,
            image_bytes: 2,
            pages_bytes: 3,
        };
        assert_eq!(P::Running.next(&moved, true), Some(P::Moved));
        assert_eq!(P::Opening.next(&moved, true), None);
        // Window updates that crossed the `migrated` still pass; a verdict does not.
        assert_eq!(
            P::Moved.next(&MxBody::Signal { sig: 2 }, false),
            Some(P::Moved)
        );
        assert_eq!(
            P::Moved.next(&MxBody::Verdict { applied: true }, false),
            None
        );
        let mut o = open();
        o.resume = Some(MxResume {
            from: 2,
            lazy: false,
        });
        assert_eq!(o.validate(), Err(MxOpenError::SameEndpoint(2)));
        o.server = 3;
        o.validate().unwrap();
        o.tty = Some((24, 80));
        assert_eq!(o.validate(), Err(MxOpenError::NotMigratable));
        // Old clients' opens (no `resume`) still decode.
        let json = r#"{"type":"mx-open","session":1,"client":1,"server":2,"argv":["true"],"env":[],"cwd":"/","project":[],"tty":null,"userns":false,"ptrace":false,"route":[]}"#;
        assert!(matches!(
            crate::Message::decode(json.as_bytes()),
            Ok(crate::Message::MxOpen(MxOpen { resume: None, .. }))
        ));
    }

    fn frame(body: MxBody, src: u32, dst: u32) -> crate::Message {
        crate::Message::Mx(Box::new(MxFrame {
            session: 7,
            src,
            dst,
            hops: 0,
            body,
        }))
    }

    #[test]
    fn a_session_through_both_grammars() {
        use crate::msg::{Hello, NodeInfo};
        use crate::session::{Origin, Peer};
        let mut o = Origin::new(
            "node b",
            Hello {
                origin: "a".into(),
                software: "0".into(),
            },
        );
        let mut p = Peer::new(
            "origin a",
            NodeInfo {
                name: "b".into(),
                software: "0".into(),
                cpus: 1,
                memory_bytes: 1,
            },
        );
        let pump = |o: &mut Origin, p: &mut Peer| {
            let b = o.take_output();
            p.handle_input(&b);
            let b = p.take_output();
            o.handle_input(&b);
        };
        pump(&mut o, &mut p);
        p.poll().unwrap();
        pump(&mut o, &mut p);
        o.poll().unwrap();
        o.send(&crate::Message::MxOpen(open())).unwrap();
        pump(&mut o, &mut p);
        assert!(matches!(p.poll().unwrap(), Some(crate::Message::MxOpen(_))));
        // The server asks for files while it sets the guest up.
        p.send(&frame(
            MxBody::Lookup {
                req: 1,
                path: "0".into(),
            },
            2,
            1,
        ))
        .unwrap();
        // A client may not claim the guest started.
        let started = MxBody::Started {
            guest_pid: 3,
            supervision: "seccomp-user-notif".into(),
            projection: "fuse".into(),
            namespaces: "mnt,pid,net".into(),
        };
        let e = o.send(&frame(started.clone(), 1, 2)).unwrap_err();
        assert!(e.to_string().contains("may not send `started`"), "{e}");
        p.send(&frame(started, 2, 1)).unwrap();
        pump(&mut o, &mut p);
        o.poll().unwrap();
        o.poll().unwrap();
        o.send(&frame(MxBody::Signal { sig: 2 }, 1, 2)).unwrap();
        pump(&mut o, &mut p);
        p.poll().unwrap();
        // The client vanishing while the guest runs is an error for the server.
        let e = p.handle_eof().unwrap_err();
        assert_eq!(
            e.to_string(),
            "origin a: closed the connection while the guest runs"
        );
    }
}

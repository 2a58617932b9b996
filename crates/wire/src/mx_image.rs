//! Metachory's migration image (issue 16, `sidecore migrate`): what a
//! source server captured of a frozen guest ([`MxImage`]: registers, memory
//! map, descriptors, signals, the mm fields) and the **page stream** that
//! carries it, with the guest's memory, from the source server to the
//! target server.
//!
//! The session's control messages (`migrate-out`, `resume-ready`,
//! `migrated`…) are [`crate::mx_msg::MxBody`] frames on the node protocol.
//! The image itself travels on a connection of its own, from the source to a
//! listener the target opened for this one migration: gigabytes of pages as
//! base64 inside JSON frames would cost twice the CPU on each end, and a
//! migration's freeze time is that CPU. The stream is framed like the node
//! protocol (a preamble, then records with a length, a sequence number and a
//! CRC) but its payloads are binary:
//!
//! ```text
//! preamble  "SCMXPG" u16 LE version
//! record    u32 LE payload length, u32 LE sequence number, u8 kind,
//!           3 zero bytes, u32 LE CRC-32 of the kind byte and the payload
//! source → target: hello {ticket, session}, image (JSON MxImage),
//!                  pages {addr, bytes}…, end
//! target → source: restored | error {text};  lazily: want {addr, pages}…,
//!                  resident
//! ```
//!
//! [`RecordDecoder`] is sans-IO (bytes in, checked records out); every
//! record and every image is checked before anything is built from it, and
//! errors name the record (`record #7 (pages): …`).

use serde::{Deserialize, Serialize};
use sidecore_disco::b64;

/// Bytes of a page.
pub const PAGE_BYTES: u64 = 4096;
/// The highest user address a region may reach (x86-64 with five-level paging).
pub const USER_END: u64 = 0x00ff_ffff_ffff_f000;
/// Regions an image may hold.
pub const MAX_IMAGE_REGIONS: usize = 65_536;
/// Runs of pages one region may list.
pub const MAX_REGION_RUNS: usize = 1 << 20;
/// Descriptors an image may hold, and the highest descriptor number.
pub const MAX_IMAGE_FDS: usize = 4096;
pub const MAX_FD_NUMBER: i32 = 1 << 20;
/// Bytes of the extended FPU state (`NT_X86_XSTATE`).
pub const MAX_XSTATE_BYTES: usize = 64 * 1024;
/// Words of the auxiliary vector.
pub const MAX_AUXV_WORDS: usize = 256;
/// Words of `user_regs_struct` on x86-64.
pub const REGS_WORDS: usize = 27;
/// Bytes of stdin the source had received but the guest had not read.
pub const MAX_STDIN_PENDING_BYTES: usize = 16 << 20;
/// Longest path in an image.
pub const MAX_IMAGE_PATH_BYTES: usize = 4096;

/// What a region of the guest's address space is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum MxRegionKind {
    /// Private anonymous memory (the heap, the stack, `mmap(MAP_ANONYMOUS)`).
    Anon { stack: bool },
    /// A private mapping of a file, reopened by its path in the guest's root
    /// on the target; only the pages the guest changed travel. `size` and
    /// `mtime_ns` must match the target's file.
    File {
        path: String,
        offset: u64,
        size: u64,
        mtime_ns: i64,
    },
    /// The kernel's own (`[vdso]`, `[vvar]`, `[vvar_vclock]`): moved, never copied.
    Special { name: String },
}

/// One region of the guest's address space.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MxRegion {
    pub start: u64,
    pub end: u64,
    /// `PROT_READ` 1, `PROT_WRITE` 2, `PROT_EXEC` 4.
    pub prot: u8,
    pub what: MxRegionKind,
    /// Runs of pages (first page index inside the region, count) whose
    /// contents the source holds: they follow in the page stream (or are
    /// fetched on demand in a lazy migration); other pages are zero (or the
    /// file's).
    pub pages: Vec<(u64, u64)>,
}

impl MxRegion {
    /// Pages in the region.
    #[must_use]
    pub fn len_pages(&self) -> u64 {
        (self.end - self.start) / PAGE_BYTES
    }

    /// Pages the source holds contents for.
    #[must_use]
    pub fn held_pages(&self) -> u64 {
        self.pages.iter().map(|(_, n)| n).sum()
    }
}

/// The kernel's memory-map fields (`PR_SET_MM_MAP`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MxMm {
    pub start_code: u64,
    pub end_code: u64,
    pub start_data: u64,
    pub end_data: u64,
    pub start_brk: u64,
    pub brk: u64,
    pub start_stack: u64,
    pub arg_start: u64,
    pub arg_end: u64,
    pub env_start: u64,
    pub env_end: u64,
    pub auxv: Vec<u64>,
}

/// What a descriptor refers to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum MxFdKind {
    /// The session's stdin (0), stdout (1) or stderr (2) pipe.
    Stdio { stream: u8 },
    /// A file or device, reopened by path in the guest's root with `flags`
    /// (`O_CREAT`/`O_TRUNC`/`O_EXCL` dropped) at offset `pos`.
    File { path: String, flags: i32, pos: u64 },
}

/// One descriptor of the guest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MxFd {
    pub fd: i32,
    pub cloexec: bool,
    pub what: MxFdKind,
}

/// One signal's disposition, as the kernel's `struct sigaction` has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MxSigaction {
    pub sig: i32,
    pub handler: u64,
    pub flags: u64,
    pub restorer: u64,
    pub mask: u64,
}

/// The guest's signal state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MxSignals {
    pub blocked: u64,
    pub actions: Vec<MxSigaction>,
    /// `sigaltstack`: (sp, flags, size).
    pub altstack: (u64, i32, u64),
}

/// A registered restartable-sequence area (`rseq`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MxRseq {
    pub addr: u64,
    pub len: u32,
    pub sig: u32,
}

/// The rest of the task's state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MxTask {
    /// The working directory, as the guest sees it.
    pub cwd: String,
    /// The executable (`/proc/PID/exe`), as the guest sees it.
    pub exe: String,
    pub umask: u32,
    pub personality: u32,
    /// The task's name (`comm`, at most 15 bytes).
    pub comm: String,
    /// `set_robust_list`: (head, length).
    pub robust_list: (u64, u64),
    pub rseq: Option<MxRseq>,
}

/// A frozen guest, as the source captured it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MxImage {
    pub session: u64,
    /// Anonymous pages follow on demand (userfaultfd) instead of before
    /// the guest resumes.
    pub lazy: bool,
    /// `user_regs_struct`, word by word (a call the guest was stopped in
    /// is already rewound to restart).
    pub regs: Vec<u64>,
    #[serde(with = "b64")]
    pub xstate: Vec<u8>,
    pub regions: Vec<MxRegion>,
    pub mm: MxMm,
    pub fds: Vec<MxFd>,
    pub signals: MxSignals,
    pub task: MxTask,
    /// Bytes for the guest's stdin that it had not read yet, and whether
    /// the client's stdin had ended.
    #[serde(with = "b64")]
    pub stdin_pending: Vec<u8>,
    pub stdin_eof: bool,
}

/// What is wrong with an image.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    #[error("`{field}` has {got} entries, more than the {limit} allowed")]
    TooMany {
        field: &'static str,
        got: usize,
        limit: usize,
    },
    #[error("`regs` has {0} words, not {REGS_WORDS}")]
    Regs(usize),
    #[error(
        "region {index} ({start:#x}-{end:#x}) is not page-aligned, empty, beyond user space or overlaps the one before"
    )]
    Region { index: usize, start: u64, end: u64 },
    #[error(
        "region {index}: page run ({first}, {count}) lies outside its {pages} pages or out of order"
    )]
    Run {
        index: usize,
        first: u64,
        count: u64,
        pages: u64,
    },
    #[error("region {index}: {what}")]
    RegionKind { index: usize, what: String },
    #[error("descriptor {fd}: {what}")]
    Fd { fd: i32, what: String },
    #[error("signal {sig}: cannot be restored")]
    Signal { sig: i32 },
    #[error("`{field}`: {what:?} is not a clean absolute path")]
    Path { field: &'static str, what: String },
}

fn path_ok(p: &str) -> bool {
    p.len() <= MAX_IMAGE_PATH_BYTES && crate::mx_msg::clean_absolute(p)
}

impl MxImage {
    /// Checks every bound before a target builds anything from the image.
    pub fn validate(&self) -> Result<(), ImageError> {
        let counts = [
            ("regions", self.regions.len(), MAX_IMAGE_REGIONS),
            ("fds", self.fds.len(), MAX_IMAGE_FDS),
            ("xstate", self.xstate.len(), MAX_XSTATE_BYTES),
            ("mm.auxv", self.mm.auxv.len(), MAX_AUXV_WORDS),
            (
                "stdin_pending",
                self.stdin_pending.len(),
                MAX_STDIN_PENDING_BYTES,
            ),
            ("signals.actions", self.signals.actions.len(), 64),
        ];
        for (field, got, limit) in counts {
            if got > limit {
                return Err(ImageError::TooMany { field, got, limit });
            }
        }
        if self.regs.len() != REGS_WORDS {
            return Err(ImageError::Regs(self.regs.len()));
        }
        self.validate_regions()?;
        self.validate_fds()?;
        for a in &self.signals.actions {
            if !(1..=64).contains(&a.sig) || a.sig == 9 || a.sig == 19 {
                return Err(ImageError::Signal { sig: a.sig });
            }
        }
        for (field, p) in [("task.cwd", &self.task.cwd), ("task.exe", &self.task.exe)] {
            if !p.is_empty() && !path_ok(p) {
                return Err(ImageError::Path {
                    field,
                    what: p.clone(),
                });
            }
        }
        Ok(())
    }

    fn validate_regions(&self) -> Result<(), ImageError> {
        let mut prev_end = 0;
        for (index, r) in self.regions.iter().enumerate() {
            let bad = !r.start.is_multiple_of(PAGE_BYTES)
                || !r.end.is_multiple_of(PAGE_BYTES)
                || r.start >= r.end
                || r.end > USER_END
                || r.start < prev_end;
            if bad {
                return Err(ImageError::Region {
                    index,
                    start: r.start,
                    end: r.end,
                });
            }
            prev_end = r.end;
            if r.pages.len() > MAX_REGION_RUNS {
                return Err(ImageError::TooMany {
                    field: "region pages",
                    got: r.pages.len(),
                    limit: MAX_REGION_RUNS,
                });
            }
            let pages = r.len_pages();
            let mut next = 0;
            for &(first, count) in &r.pages {
                if count == 0 || first < next || first.checked_add(count).is_none_or(|e| e > pages)
                {
                    return Err(ImageError::Run {
                        index,
                        first,
                        count,
                        pages,
                    });
                }
                next = first + count;
            }
            match &r.what {
                MxRegionKind::File { path, offset, .. } => {
                    if !path_ok(path) || !offset.is_multiple_of(PAGE_BYTES) {
                        return Err(ImageError::RegionKind {
                            index,
                            what: format!("file {path:?} at offset {offset} cannot be mapped"),
                        });
                    }
                }
                MxRegionKind::Special { name } => {
                    if !SPECIAL_REGIONS.contains(&name.as_str()) || !r.pages.is_empty() {
                        return Err(ImageError::RegionKind {
                            index,
                            what: format!("special region {name:?} is not one the kernel makes"),
                        });
                    }
                }
                MxRegionKind::Anon { .. } => {}
            }
        }
        Ok(())
    }

    fn validate_fds(&self) -> Result<(), ImageError> {
        let mut seen = std::collections::BTreeSet::new();
        for f in &self.fds {
            let err = |what: &str| ImageError::Fd {
                fd: f.fd,
                what: what.to_string(),
            };
            if !(0..MAX_FD_NUMBER).contains(&f.fd) {
                return Err(err("is out of range"));
            }
            if !seen.insert(f.fd) {
                return Err(err("appears twice"));
            }
            match &f.what {
                MxFdKind::Stdio { stream } if *stream > 2 => {
                    return Err(err("names a stdio stream other than 0, 1 or 2"));
                }
                MxFdKind::File { path, .. } if !path_ok(path) => {
                    return Err(err("has no clean absolute path"));
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The region holding page address `addr`, if any.
    #[must_use]
    pub fn region_of(&self, addr: u64) -> Option<&MxRegion> {
        let i = self.regions.partition_point(|r| r.end <= addr);
        self.regions.get(i).filter(|r| r.start <= addr)
    }

    /// Bytes of page contents the source holds.
    #[must_use]
    pub fn held_bytes(&self) -> u64 {
        self.regions.iter().map(MxRegion::held_pages).sum::<u64>() * PAGE_BYTES
    }
}

/// Regions the kernel maps into every process, moved as they are.
pub const SPECIAL_REGIONS: &[&str] = &["[vdso]", "[vvar]", "[vvar_vclock]"];

/// First bytes of a page stream.
pub const PAGE_STREAM_MAGIC: &[u8; 6] = b"SCMXPG";
/// Version of the page stream.
pub const PAGE_STREAM_VERSION: u16 = 1;
/// Bytes of the preamble.
pub const PAGE_PREAMBLE_BYTES: usize = 8;
/// Bytes of a record header.
pub const RECORD_HEADER_BYTES: usize = 16;
/// Largest image record (the JSON).
pub const MAX_IMAGE_RECORD_BYTES: usize = 64 << 20;
/// Largest pages record: its address and up to this many bytes of pages.
pub const MAX_PAGES_RECORD_BYTES: usize = 1 << 20;
/// Most pages one `want` may ask for.
pub const MAX_WANT_PAGES: u32 = 256;
/// Longest error text.
pub const MAX_ERROR_RECORD_BYTES: usize = 64 * 1024;

/// The kinds of record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum RecordKind {
    Hello = 1,
    Image = 2,
    Pages = 3,
    End = 4,
    Want = 5,
    Restored = 6,
    Resident = 7,
    Error = 8,
}

impl RecordKind {
    fn from_byte(b: u8) -> Option<RecordKind> {
        Some(match b {
            1 => RecordKind::Hello,
            2 => RecordKind::Image,
            3 => RecordKind::Pages,
            4 => RecordKind::End,
            5 => RecordKind::Want,
            6 => RecordKind::Restored,
            7 => RecordKind::Resident,
            8 => RecordKind::Error,
            _ => return None,
        })
    }

    /// The kind's name, for errors.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            RecordKind::Hello => "hello",
            RecordKind::Image => "image",
            RecordKind::Pages => "pages",
            RecordKind::End => "end",
            RecordKind::Want => "want",
            RecordKind::Restored => "restored",
            RecordKind::Resident => "resident",
            RecordKind::Error => "error",
        }
    }

    fn max_payload(self) -> usize {
        match self {
            RecordKind::Hello => 16,
            RecordKind::Image => MAX_IMAGE_RECORD_BYTES,
            RecordKind::Pages => 8 + MAX_PAGES_RECORD_BYTES,
            RecordKind::Want => 12,
            RecordKind::Error => MAX_ERROR_RECORD_BYTES,
            RecordKind::End | RecordKind::Restored | RecordKind::Resident => 0,
        }
    }
}

/// One record of the page stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// Source → target, first: the ticket the target handed out, and the session.
    Hello { ticket: u64, session: u64 },
    /// Source → target: the image (checked).
    Image(Box<MxImage>),
    /// Source → target: contents of whole pages from `addr`.
    Pages { addr: u64, data: Vec<u8> },
    /// Source → target: every page due now was sent.
    End,
    /// Target → source (lazy): send these pages first.
    Want { addr: u64, pages: u32 },
    /// Target → source: the guest runs on the target.
    Restored,
    /// Target → source (lazy): every page arrived; the source may let go.
    Resident,
    /// Either way: what failed; the sender closes.
    Error(String),
}

impl Record {
    /// The record's kind.
    #[must_use]
    pub fn kind(&self) -> RecordKind {
        match self {
            Record::Hello { .. } => RecordKind::Hello,
            Record::Image(_) => RecordKind::Image,
            Record::Pages { .. } => RecordKind::Pages,
            Record::End => RecordKind::End,
            Record::Want { .. } => RecordKind::Want,
            Record::Restored => RecordKind::Restored,
            Record::Resident => RecordKind::Resident,
            Record::Error(_) => RecordKind::Error,
        }
    }
}

/// What is wrong with a page stream.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PageStreamError {
    #[error("not a Metachory page stream: it opened with {got:?}")]
    BadMagic { got: String },
    #[error("speaks page-stream version {got}; this side speaks {PAGE_STREAM_VERSION}")]
    Version { got: u16 },
    #[error("record #{seq} has unknown kind {kind}")]
    UnknownKind { seq: u32, kind: u8 },
    #[error("record #{seq} ({kind}) announces {len} bytes, more than the {limit} allowed")]
    TooLarge {
        seq: u32,
        kind: &'static str,
        len: usize,
        limit: usize,
    },
    #[error("record #{got} arrived where #{expected} was due")]
    OutOfOrder { expected: u32, got: u32 },
    #[error("record #{seq} ({kind}) is corrupted (CRC {got:#010x}, computed {computed:#010x})")]
    Corrupted {
        seq: u32,
        kind: &'static str,
        got: u32,
        computed: u32,
    },
    #[error("record #{seq} ({kind}): {what}")]
    BadPayload {
        seq: u32,
        kind: &'static str,
        what: String,
    },
    #[error("the stream ended in the middle of a record ({buffered} bytes of it received)")]
    Truncated { buffered: usize },
}

/// The preamble each side sends first.
#[must_use]
pub fn page_preamble() -> [u8; PAGE_PREAMBLE_BYTES] {
    let mut p = [0u8; PAGE_PREAMBLE_BYTES];
    p[..6].copy_from_slice(PAGE_STREAM_MAGIC);
    p[6..].copy_from_slice(&PAGE_STREAM_VERSION.to_le_bytes());
    p
}

/// Checks a peer's preamble.
pub fn check_preamble(p: &[u8; PAGE_PREAMBLE_BYTES]) -> Result<(), PageStreamError> {
    if &p[..6] != PAGE_STREAM_MAGIC {
        return Err(PageStreamError::BadMagic {
            got: String::from_utf8_lossy(&p[..6]).into_owned(),
        });
    }
    let v = u16::from_le_bytes([p[6], p[7]]);
    if v != PAGE_STREAM_VERSION {
        return Err(PageStreamError::Version { got: v });
    }
    Ok(())
}

fn crc(kind: u8, parts: &[&[u8]]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&[kind]);
    for p in parts {
        h.update(p);
    }
    h.finalize()
}

/// Numbers outgoing records.
#[derive(Debug, Default)]
pub struct RecordEncoder {
    next_seq: u32,
}

impl RecordEncoder {
    /// The header of a record of `kind` whose payload is `parts` joined:
    /// send it, then the parts (pages need not be copied into one buffer).
    ///
    /// # Panics
    /// If the payload is over the kind's limit: this side builds bounded
    /// records, so a larger one is a bug here.
    pub fn header(&mut self, kind: RecordKind, parts: &[&[u8]]) -> [u8; RECORD_HEADER_BYTES] {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        assert!(
            len <= kind.max_payload(),
            "an outgoing {} record of {len} bytes is over its limit",
            kind.name()
        );
        let seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1);
        let mut h = [0u8; RECORD_HEADER_BYTES];
        #[allow(clippy::cast_possible_truncation)] // bounded above
        h[0..4].copy_from_slice(&(len as u32).to_le_bytes());
        h[4..8].copy_from_slice(&seq.to_le_bytes());
        h[8] = kind as u8;
        h[12..16].copy_from_slice(&crc(kind as u8, parts).to_le_bytes());
        h
    }

    /// One whole record (header and payload) appended to `out`.
    pub fn encode(&mut self, r: &Record, out: &mut Vec<u8>) {
        let json;
        let fixed: Vec<u8>;
        let parts: Vec<&[u8]> = match r {
            Record::Hello { ticket, session } => {
                fixed = [ticket.to_le_bytes(), session.to_le_bytes()].concat();
                vec![&fixed]
            }
            Record::Image(img) => {
                // Serializing plain data cannot fail.
                json = serde_json::to_vec(img).unwrap_or_default();
                vec![&json]
            }
            Record::Pages { addr, data } => {
                fixed = addr.to_le_bytes().to_vec();
                vec![&fixed, data]
            }
            Record::Want { addr, pages } => {
                fixed = [&addr.to_le_bytes()[..], &pages.to_le_bytes()[..]].concat();
                vec![&fixed]
            }
            Record::Error(text) => vec![text.as_bytes()],
            Record::End | Record::Restored | Record::Resident => vec![],
        };
        let h = self.header(r.kind(), &parts);
        out.extend_from_slice(&h);
        for p in parts {
            out.extend_from_slice(p);
        }
    }
}

/// A record's header, read before its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    pub len: usize,
    pub seq: u32,
    pub kind: RecordKind,
    pub crc: u32,
}

/// Checks headers and payloads in order (sans-IO): a blocking reader reads
/// a header, asks [`RecordChecker::header`], reads the payload and asks
/// [`RecordChecker::payload`].
#[derive(Debug, Default)]
pub struct RecordChecker {
    next_seq: u32,
}

impl RecordChecker {
    /// Checks a header: its kind, length and sequence number.
    pub fn header(
        &mut self,
        h: &[u8; RECORD_HEADER_BYTES],
    ) -> Result<RecordHeader, PageStreamError> {
        let word = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
        let (len, seq, crc) = (word(0) as usize, word(4), word(12));
        if seq != self.next_seq {
            return Err(PageStreamError::OutOfOrder {
                expected: self.next_seq,
                got: seq,
            });
        }
        let kind =
            RecordKind::from_byte(h[8]).ok_or(PageStreamError::UnknownKind { seq, kind: h[8] })?;
        if len > kind.max_payload() {
            return Err(PageStreamError::TooLarge {
                seq,
                kind: kind.name(),
                len,
                limit: kind.max_payload(),
            });
        }
        self.next_seq = self.next_seq.wrapping_add(1);
        Ok(RecordHeader {
            len,
            seq,
            kind,
            crc,
        })
    }

    /// Checks a payload against its header and decodes it.
    pub fn payload(&self, h: &RecordHeader, payload: Vec<u8>) -> Result<Record, PageStreamError> {
        let computed = crc(h.kind as u8, &[&payload]);
        if computed != h.crc {
            return Err(PageStreamError::Corrupted {
                seq: h.seq,
                kind: h.kind.name(),
                got: h.crc,
                computed,
            });
        }
        let bad = |what: String| PageStreamError::BadPayload {
            seq: h.seq,
            kind: h.kind.name(),
            what,
        };
        let u64_at = |b: &[u8], i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(w)
        };
        Ok(match h.kind {
            RecordKind::Hello if payload.len() == 16 => Record::Hello {
                ticket: u64_at(&payload, 0),
                session: u64_at(&payload, 8),
            },
            RecordKind::Image => {
                let img: MxImage = serde_json::from_slice(&payload)
                    .map_err(|e| bad(format!("malformed image: {e}")))?;
                img.validate().map_err(|e| bad(format!("bad image: {e}")))?;
                Record::Image(Box::new(img))
            }
            RecordKind::Pages => {
                let n = payload.len().saturating_sub(8);
                if payload.len() < 8 || n == 0 || !(n as u64).is_multiple_of(PAGE_BYTES) {
                    return Err(bad(format!(
                        "{n} bytes of pages is not a whole number of pages"
                    )));
                }
                let addr = u64_at(&payload, 0);
                if !addr.is_multiple_of(PAGE_BYTES) || addr.saturating_add(n as u64) > USER_END {
                    return Err(bad(format!("address {addr:#x} is not a user page")));
                }
                let mut data = payload;
                data.drain(..8);
                Record::Pages { addr, data }
            }
            RecordKind::Want if payload.len() == 12 => {
                let addr = u64_at(&payload, 0);
                let pages = u32::from_le_bytes([payload[8], payload[9], payload[10], payload[11]]);
                if !addr.is_multiple_of(PAGE_BYTES) || pages == 0 || pages > MAX_WANT_PAGES {
                    return Err(bad(format!("want of {pages} pages at {addr:#x}")));
                }
                Record::Want { addr, pages }
            }
            RecordKind::Error => Record::Error(String::from_utf8_lossy(&payload).into_owned()),
            RecordKind::End => Record::End,
            RecordKind::Restored => Record::Restored,
            RecordKind::Resident => Record::Resident,
            k => {
                return Err(bad(format!(
                    "{} bytes is the wrong size for {}",
                    payload.len(),
                    k.name()
                )));
            }
        })
    }
}

/// Splits a page stream's bytes into checked records (sans-IO; fed in any
/// chunks). After an error it stays failed.
#[derive(Debug, Default)]
pub struct RecordDecoder {
    buf: Vec<u8>,
    preamble_seen: bool,
    checker: RecordChecker,
    header: Option<RecordHeader>,
    failed: Option<PageStreamError>,
}

impl RecordDecoder {
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends received bytes.
    pub fn feed(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete record, `None` until one is.
    pub fn next_record(&mut self) -> Result<Option<Record>, PageStreamError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let r = self.step();
        if let Err(e) = &r {
            self.failed = Some(e.clone());
        }
        r
    }

    fn step(&mut self) -> Result<Option<Record>, PageStreamError> {
        if !self.preamble_seen {
            if self.buf.len() < PAGE_PREAMBLE_BYTES {
                return Ok(None);
            }
            let mut p = [0u8; PAGE_PREAMBLE_BYTES];
            p.copy_from_slice(&self.buf[..PAGE_PREAMBLE_BYTES]);
            check_preamble(&p)?;
            self.buf.drain(..PAGE_PREAMBLE_BYTES);
            self.preamble_seen = true;
        }
        if self.header.is_none() {
            if self.buf.len() < RECORD_HEADER_BYTES {
                return Ok(None);
            }
            let mut h = [0u8; RECORD_HEADER_BYTES];
            h.copy_from_slice(&self.buf[..RECORD_HEADER_BYTES]);
            self.header = Some(self.checker.header(&h)?);
            self.buf.drain(..RECORD_HEADER_BYTES);
        }
        let Some(h) = self.header else {
            return Ok(None);
        };
        if self.buf.len() < h.len {
            return Ok(None);
        }
        let rest = self.buf.split_off(h.len);
        let payload = std::mem::replace(&mut self.buf, rest);
        self.header = None;
        self.checker.payload(&h, payload).map(Some)
    }

    /// The stream ended: fine between records only.
    pub fn finish(&self) -> Result<(), PageStreamError> {
        let buffered = self.buf.len() + self.header.map_or(0, |_| RECORD_HEADER_BYTES);
        if buffered > 0 {
            return Err(PageStreamError::Truncated { buffered });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn image() -> MxImage {
        MxImage {
            session: 9,
            lazy: false,
            regs: vec![0; REGS_WORDS],
            xstate: vec![1, 2, 3],
            regions: vec![
                MxRegion {
                    start: 0x1000,
                    end: 0x5000,
                    prot: 3,
                    what: MxRegionKind::Anon { stack: false },
                    pages: vec![(0, 2), (3, 1)],
                },
                MxRegion {
                    start: 0x7000,
                    end: 0x9000,
                    prot: 5,
                    what: MxRegionKind::File {
                        path: "/usr/lib/libc.so.6".into(),
                        offset: 0,
                        size: 100,
                        mtime_ns: 1,
                    },
                    pages: vec![],
                },
            ],
            mm: MxMm::default(),
            fds: vec![MxFd {
                fd: 1,
                cloexec: false,
                what: MxFdKind::Stdio { stream: 1 },
            }],
            signals: MxSignals::default(),
            task: MxTask {
                cwd: "/home/u".into(),
                ..MxTask::default()
            },
            stdin_pending: b"abc".to_vec(),
            stdin_eof: true,
        }
    }

    #[test]
    fn images_are_checked_before_use() {
        let i = image();
        i.validate().unwrap();
        assert_eq!(i.held_bytes(), 3 * PAGE_BYTES);
        assert_eq!(i.region_of(0x4fff & !0xfff).map(|r| r.start), Some(0x1000));
        assert!(i.region_of(0x6000).is_none());
        let mut o = image();
        o.regions[1].start = 0x4000;
        assert!(matches!(
            o.validate(),
            Err(ImageError::Region { index: 1, .. })
        ));
        let mut o = image();
        o.regions[0].pages = vec![(3, 2)];
        assert_eq!(
            o.validate().unwrap_err().to_string(),
            "region 0: page run (3, 2) lies outside its 4 pages or out of order"
        );
        let mut o = image();
        o.fds.push(o.fds[0].clone());
        assert_eq!(
            o.validate().unwrap_err().to_string(),
            "descriptor 1: appears twice"
        );
        let mut o = image();
        o.regions[1].what = MxRegionKind::Special {
            name: "[evil]".into(),
        };
        assert!(o.validate().is_err());
        let mut o = image();
        o.regs.pop();
        assert_eq!(o.validate().unwrap_err(), ImageError::Regs(26));
    }

    fn stream(records: &[Record]) -> Vec<u8> {
        let mut out = page_preamble().to_vec();
        let mut e = RecordEncoder::default();
        for r in records {
            e.encode(r, &mut out);
        }
        out
    }

    #[test]
    fn records_round_trip_in_any_chunks() {
        let recs = vec![
            Record::Hello {
                ticket: 5,
                session: 9,
            },
            Record::Image(Box::new(image())),
            Record::Pages {
                addr: 0x1000,
                data: vec![7; 8192],
            },
            Record::End,
            Record::Want {
                addr: 0x3000,
                pages: 1,
            },
            Record::Restored,
            Record::Resident,
            Record::Error("no".into()),
        ];
        let bytes = stream(&recs);
        for chunk in [1, 7, 4096, bytes.len()] {
            let mut d = RecordDecoder::new();
            let mut got = Vec::new();
            for c in bytes.chunks(chunk) {
                d.feed(c);
                while let Some(r) = d.next_record().unwrap() {
                    got.push(r);
                }
            }
            d.finish().unwrap();
            assert_eq!(got, recs);
        }
    }

    #[test]
    fn bad_streams_are_named() {
        let mut d = RecordDecoder::new();
        d.feed(b"SCNODE\x02\x00");
        assert!(
            d.next_record()
                .unwrap_err()
                .to_string()
                .contains("not a Metachory page stream")
        );
        // A corrupted page.
        let mut b = stream(&[Record::Pages {
            addr: 0x1000,
            data: vec![0; 4096],
        }]);
        let n = b.len();
        b[n - 1] ^= 1;
        let mut d = RecordDecoder::new();
        d.feed(&b);
        assert!(
            d.next_record()
                .unwrap_err()
                .to_string()
                .starts_with("record #0 (pages) is corrupted"),
        );
        // Pages that are not whole pages.
        let mut out = page_preamble().to_vec();
        let mut e = RecordEncoder::default();
        let addr = 0x1000u64.to_le_bytes();
        let h = e.header(RecordKind::Pages, &[&addr, &[0; 100]]);
        out.extend_from_slice(&h);
        out.extend_from_slice(&addr);
        out.extend_from_slice(&[0; 100]);
        let mut d = RecordDecoder::new();
        d.feed(&out);
        assert_eq!(
            d.next_record().unwrap_err().to_string(),
            "record #0 (pages): 100 bytes of pages is not a whole number of pages"
        );
        // An image that does not validate.
        let mut img = image();
        img.fds[0].fd = -1;
        let mut d = RecordDecoder::new();
        d.feed(&stream(&[Record::Image(Box::new(img))]));
        assert!(
            d.next_record()
                .unwrap_err()
                .to_string()
                .contains("bad image: descriptor -1: is out of range"),
        );
        // A record cut short.
        let b = stream(&[Record::End, Record::Error("x".into())]);
        let mut d = RecordDecoder::new();
        d.feed(&b[..b.len() - 1]);
        assert_eq!(d.next_record().unwrap(), Some(Record::End));
        assert_eq!(d.next_record().unwrap(), None);
        assert!(matches!(d.finish(), Err(PageStreamError::Truncated { .. })));
        // An unknown kind.
        let mut b = stream(&[Record::End]);
        b[PAGE_PREAMBLE_BYTES + 8] = 99;
        let mut d = RecordDecoder::new();
        d.feed(&b);
        assert_eq!(
            d.next_record().unwrap_err(),
            PageStreamError::UnknownKind { seq: 0, kind: 99 }
        );
    }
}

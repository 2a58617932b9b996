//! The `file` offcode (HYDRA's TiVoPC, Figure 8.2: File Pull Streamer): reads
//! a file in fixed-size chunks straight into the slots of its output ring
//! (zero copy: `pread` writes into the slot the streamer then sends from), as
//! fast as the ring takes them, so the ring's back-pressure — not a timer —
//! sets its pace.
//!
//! Each message is the chunk's offset in the file (u64, little-endian)
//! followed by the chunk's bytes ([`HEADER_BYTES`]). At the end of the file it
//! starts again from the beginning (`loop_file = true`, the default) or
//! finishes.
//!
//! Parameters: `path`, `chunk_bytes` (1..=[`MAX_CHUNK_BYTES`], default 1024),
//! `count` (chunks, 0: until stopped), `loop_file`, `batch` (chunks per turn).
//! Metrics: `chunks`, `bytes`, `rewinds`, `backpressure`.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use serde::Deserialize;
use sidecore_channel::SendOutcome;
use sidecore_offcode::{
    BuildSpec, InitCx, Metric, Offcode, OffcodeError, OutputId, Progress, RunCx, parse_params,
};

use crate::util::bad;

/// Bytes before the chunk in each message: its offset in the file.
pub const HEADER_BYTES: usize = 8;
/// Largest chunk: one UDP datagram in a 1500-byte MTU without fragmenting
/// (1500 − 20 IPv4 − 8 UDP).
pub const MAX_CHUNK_BYTES: usize = 1472;
/// Largest batch per turn.
const MAX_BATCH: usize = 1024;

fn default_chunk() -> usize {
    1024
}
fn default_true() -> bool {
    true
}
fn default_batch() -> usize {
    32
}

/// Checks a chunk size parameter.
pub fn check_chunk(field: &str, n: usize) -> Result<(), OffcodeError> {
    if (1..=MAX_CHUNK_BYTES).contains(&n) {
        Ok(())
    } else {
        Err(bad(
            field,
            format!("{n} is outside 1..={MAX_CHUNK_BYTES} (one UDP datagram in a 1500-byte MTU)"),
        ))
    }
}

/// The file offcode's parameters.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub path: PathBuf,
    #[serde(default = "default_chunk")]
    pub chunk_bytes: usize,
    #[serde(default)]
    pub count: u64,
    #[serde(default = "default_true")]
    pub loop_file: bool,
    #[serde(default = "default_batch")]
    pub batch: usize,
}

impl Params {
    /// Reads and checks the parameters; the file must exist, be readable
    /// and not be empty.
    pub fn parse(t: &toml::Table) -> Result<Params, OffcodeError> {
        let p: Params = parse_params(t)?;
        check_chunk("chunk_bytes", p.chunk_bytes)?;
        if !(1..=MAX_BATCH).contains(&p.batch) {
            return Err(bad(
                "batch",
                format!("{} is outside 1..={MAX_BATCH}", p.batch),
            ));
        }
        let len = open(&p.path)?.1;
        if len == 0 {
            return Err(bad(
                "path",
                format!("{} is empty: nothing to stream", p.path.display()),
            ));
        }
        Ok(p)
    }
}

/// Opens the file, with its length.
fn open(path: &std::path::Path) -> Result<(File, u64), OffcodeError> {
    let f = File::open(path).map_err(|e| bad("path", format!("{}: {e}", path.display())))?;
    let meta = f
        .metadata()
        .map_err(|e| bad("path", format!("{}: {e}", path.display())))?;
    if !meta.is_file() {
        return Err(bad(
            "path",
            format!("{} is not a regular file", path.display()),
        ));
    }
    Ok((f, meta.len()))
}

/// The file offcode.
pub struct FileSource {
    p: Params,
    file: Option<File>,
    len: u64,
    offset: u64,
    sent: u64,
    out: OutputId,
    /// On the host, a full ring blocks it for [`HOST_WAIT`], as a full pipe
    /// blocks an ordinary reader (instead of the executor's spin and yield).
    host: bool,
    m: [Metric; 4],
}

/// How long a host-placed file offcode waits when its ring is full.
const HOST_WAIT: std::time::Duration = std::time::Duration::from_millis(1);

/// Builds a file offcode.
pub fn build(spec: &BuildSpec<'_>) -> Result<Box<dyn Offcode>, OffcodeError> {
    Ok(Box::new(FileSource {
        p: Params::parse(spec.params)?,
        file: None,
        len: 0,
        offset: 0,
        sent: 0,
        out: OutputId(0),
        host: spec.kind == sidecore_types::PeKind::Host,
        m: Default::default(),
    }))
}

impl FileSource {
    /// Reads the next chunk into `slot`; returns the message length, or an
    /// error. At the end of the file, wraps (or returns 0 when not looping).
    fn fill(&mut self, slot: &mut [u8]) -> Result<usize, OffcodeError> {
        let Some(f) = &self.file else { return Ok(0) };
        if self.offset >= self.len {
            if !self.p.loop_file {
                return Ok(0);
            }
            self.offset = 0;
            self.m[2].add(1);
        }
        let want = usize::try_from((self.len - self.offset).min(self.p.chunk_bytes as u64))
            .unwrap_or(self.p.chunk_bytes);
        slot[..HEADER_BYTES].copy_from_slice(&self.offset.to_le_bytes());
        let body = &mut slot[HEADER_BYTES..HEADER_BYTES + want];
        f.read_exact_at(body, self.offset).map_err(|e| {
            OffcodeError::failed(format!(
                "`path`: reading {} bytes of {} at offset {}: {e}",
                want,
                self.p.path.display(),
                self.offset
            ))
        })?;
        self.offset += want as u64;
        Ok(HEADER_BYTES + want)
    }

    fn finished(&self) -> bool {
        (self.p.count > 0 && self.sent >= self.p.count)
            || (!self.p.loop_file && self.offset >= self.len)
    }
}

impl Offcode for FileSource {
    fn initialize(&mut self, cx: &mut InitCx<'_>) -> Result<(), OffcodeError> {
        self.out = cx.output("out")?;
        for (m, n) in self
            .m
            .iter_mut()
            .zip(["chunks", "bytes", "rewinds", "backpressure"])
        {
            *m = cx.metric(n);
        }
        let (f, len) = open(&self.p.path)?;
        self.file = Some(f);
        self.len = len;
        Ok(())
    }

    fn start(&mut self, cx: &mut RunCx<'_>) -> Result<(), OffcodeError> {
        let cap = cx.capacity(self.out)?;
        if cap < HEADER_BYTES + self.p.chunk_bytes {
            return Err(bad(
                "chunk_bytes",
                format!(
                    "{} bytes and the {HEADER_BYTES}-byte offset do not fit the output channel's {cap}-byte slots (raise its slot_size)",
                    self.p.chunk_bytes
                ),
            ));
        }
        Ok(())
    }

    fn poll(&mut self, cx: &mut RunCx<'_>) -> Result<Progress, OffcodeError> {
        let mut n = 0;
        while n < self.p.batch && !self.finished() {
            let mut err = None;
            let mut len = 0;
            let r = cx.send(self.out, |slot| match self.fill(slot) {
                Ok(k) => {
                    len = k;
                    k
                }
                Err(e) => {
                    err = Some(e);
                    0
                }
            });
            if let Some(e) = err {
                return Err(e);
            }
            match r? {
                SendOutcome::Sent | SendOutcome::Dropped if len > 0 => {
                    n += 1;
                    self.sent += 1;
                    self.m[0].add(1);
                    self.m[1].add((len - HEADER_BYTES) as u64);
                }
                SendOutcome::Full => {
                    self.m[3].add(1);
                    if self.host && n == 0 {
                        std::thread::sleep(HOST_WAIT);
                    }
                    break;
                }
                _ => break,
            }
        }
        Ok(if self.finished() {
            Progress::Done
        } else if n > 0 {
            Progress::Busy
        } else {
            Progress::Idle
        })
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
        let e = Params::parse(&t("path = \"/nonexistent/movie.mpg\"")).unwrap_err();
        assert!(
            e.to_string()
                .contains("`path`: /nonexistent/movie.mpg: No such file"),
            "{e}"
        );
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("m.bin");
        std::fs::write(&f, [1u8; 100]).unwrap();
        let e = Params::parse(&t(&format!("path = {f:?}\nchunk_bytes = 0"))).unwrap_err();
        assert!(e.to_string().contains("`chunk_bytes`: 0 is outside"), "{e}");
        let e = Params::parse(&t(&format!("path = {f:?}\nchunk_bytes = 9000"))).unwrap_err();
        assert!(e.to_string().contains("`chunk_bytes`: 9000"), "{e}");
        let e = Params::parse(&t(&format!("path = {:?}", dir.path()))).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        let empty = dir.path().join("empty");
        std::fs::write(&empty, []).unwrap();
        let e = Params::parse(&t(&format!("path = {empty:?}"))).unwrap_err();
        assert!(e.to_string().contains("is empty"), "{e}");
        Params::parse(&t(&format!("path = {f:?}"))).unwrap();
    }

    #[test]
    fn chunks_cover_the_file_and_wrap() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("m.bin");
        let data: Vec<u8> = (0..2500u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&f, &data).unwrap();
        let mut s = FileSource {
            p: Params::parse(&t(&format!("path = {f:?}"))).unwrap(),
            file: None,
            len: 0,
            offset: 0,
            sent: 0,
            out: OutputId(0),
            host: true,
            m: Default::default(),
        };
        let (file, len) = open(&f).unwrap();
        (s.file, s.len) = (Some(file), len);
        let mut slot = vec![0u8; 2048];
        let mut got = Vec::new();
        for _ in 0..3 {
            let n = s.fill(&mut slot).unwrap();
            let off = u64::from_le_bytes(slot[..8].try_into().unwrap());
            assert_eq!(off as usize, got.len());
            got.extend_from_slice(&slot[HEADER_BYTES..n]);
        }
        assert_eq!(got, data, "three chunks (1024, 1024, 452) are the file");
        let n = s.fill(&mut slot).unwrap();
        assert_eq!(n, HEADER_BYTES + 1024);
        assert_eq!(
            u64::from_le_bytes(slot[..8].try_into().unwrap()),
            0,
            "wrapped"
        );
        assert_eq!(s.m[2].get(), 1);
    }
}

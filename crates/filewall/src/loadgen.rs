//! An NFSv3 load generator on FileWall's codec, for the §4.7 measurements:
//! a blocking client ([`NfsClient`]) that times single calls (the seed's raw RPC
//! microbenchmark), a Postmark-like workload ([`postmark`]: a pool of small files,
//! then transactions pairing a CREATE or DELETE with a READ or an append), and an
//! open-loop generator ([`open_loop`]) that offers calls at a fixed rate on
//! several connections, whatever the server's pace, to find where throughput
//! saturates. Every call runs as AUTH_SYS root.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::message::{Call, CallArgs, Procedure, ReplyResults, decode_reply, decode_reply_header};
use crate::mount::{DirPath, MountCall, MountReply, MountRes3};
use crate::nfs3::{
    CreateArgs, CreateHow3, DirOpArgs3, Nfs3Call, Nfs3Reply, NfsFh3, NfsRes, NfsStat3, ReadArgs,
    ReaddirplusArgs, Sattr3, SetTime, StableHow, WriteArgs,
};
use crate::record::{RecordReader, encode_record};
use crate::rpc::{Auth, AuthSys};

/// The largest reply read.
const MAX_REPLY: usize = 4 << 20;

/// A call that failed.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("reply to {what}: {why}")]
    Reply { what: String, why: String },
    #[error("{what}: status {status:?}")]
    Status { what: String, status: NfsStat3 },
}

fn root_cred() -> Auth {
    Auth::Sys(AuthSys {
        stamp: 0,
        machine_name: b"sidecore-load".to_vec(),
        uid: 0,
        gid: 0,
        gids: vec![0],
    })
}

/// Reads one record from a stream.
fn read_record(
    s: &mut TcpStream,
    reader: &mut RecordReader,
    buf: &mut [u8],
) -> Result<Vec<u8>, LoadError> {
    loop {
        if let Some(r) = reader.next_record().map_err(|e| LoadError::Reply {
            what: "a record".into(),
            why: e.to_string(),
        })? {
            return Ok(r);
        }
        let n = s.read(buf)?;
        if n == 0 {
            return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into());
        }
        reader.push(&buf[..n]);
    }
}

/// One connection, one call at a time.
pub struct NfsClient {
    stream: TcpStream,
    reader: RecordReader,
    buf: Vec<u8>,
    xid: u32,
}

impl NfsClient {
    pub fn connect(addr: SocketAddr) -> Result<Self, LoadError> {
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        Ok(Self {
            stream,
            reader: RecordReader::new(MAX_REPLY),
            buf: vec![0; 256 * 1024],
            xid: 1,
        })
    }

    /// One call; its accepted results.
    pub fn call(&mut self, args: CallArgs) -> Result<ReplyResults, LoadError> {
        self.xid = self.xid.wrapping_add(1);
        let procedure = args.procedure();
        let call = Call {
            xid: self.xid,
            cred: root_cred(),
            verf: Auth::None,
            args,
        };
        self.stream
            .write_all(&encode_record(&call.to_bytes(), 1 << 20))?;
        let what = || format!("{procedure:?}");
        let bytes = read_record(&mut self.stream, &mut self.reader, &mut self.buf)?;
        let reply = decode_reply(&bytes, procedure).map_err(|e| LoadError::Reply {
            what: what(),
            why: e.to_string(),
        })?;
        if reply.header.xid != self.xid {
            return Err(LoadError::Reply {
                what: what(),
                why: format!("xid {:#x}, {:#x} expected", reply.header.xid, self.xid),
            });
        }
        reply.results.ok_or_else(|| LoadError::Reply {
            what: what(),
            why: format!("refused: {:?}", reply.header.body),
        })
    }

    /// MNT of `export`: the root handle.
    pub fn mnt(&mut self, export: &str) -> Result<NfsFh3, LoadError> {
        match self.call(CallArgs::Mount3(MountCall::Mnt(DirPath(
            export.as_bytes().to_vec(),
        ))))? {
            ReplyResults::Mount3(MountReply::Mnt(MountRes3::Ok { fhandle, .. })) => Ok(fhandle),
            other => Err(LoadError::Reply {
                what: "MNT".into(),
                why: format!("{other:?}"),
            }),
        }
    }

    /// One NFSv3 call; fails unless its status is OK.
    pub fn nfs(&mut self, args: Nfs3Call) -> Result<Nfs3Reply, LoadError> {
        let what = format!("{:?}", args.procedure());
        match self.call(CallArgs::Nfs3(args))? {
            ReplyResults::Nfs3(r) => {
                let s = r.status();
                if s == NfsStat3::Ok {
                    Ok(r)
                } else {
                    Err(LoadError::Status { what, status: s })
                }
            }
            other => Err(LoadError::Reply {
                what,
                why: format!("{other:?}"),
            }),
        }
    }

    pub fn lookup(&mut self, dir: &NfsFh3, name: &str) -> Result<NfsFh3, LoadError> {
        match self.nfs(Nfs3Call::Lookup(dirop(dir, name)))? {
            Nfs3Reply::Lookup(NfsRes::Ok(ok)) => Ok(ok.object),
            other => Err(LoadError::Reply {
                what: "LOOKUP".into(),
                why: format!("{other:?}"),
            }),
        }
    }

    /// CREATE (UNCHECKED) of `name` in `dir`: its handle.
    pub fn create(&mut self, dir: &NfsFh3, name: &str) -> Result<NfsFh3, LoadError> {
        match self.nfs(create(dir, name))? {
            Nfs3Reply::Create(NfsRes::Ok(ok)) => ok.obj.ok_or_else(|| LoadError::Reply {
                what: "CREATE".into(),
                why: "no handle returned".into(),
            }),
            other => Err(LoadError::Reply {
                what: "CREATE".into(),
                why: format!("{other:?}"),
            }),
        }
    }
}

pub fn dirop(dir: &NfsFh3, name: &str) -> DirOpArgs3 {
    DirOpArgs3 {
        dir: dir.clone(),
        name: name.as_bytes().to_vec(),
    }
}

pub fn create(dir: &NfsFh3, name: &str) -> Nfs3Call {
    Nfs3Call::Create(CreateArgs {
        place: dirop(dir, name),
        how: CreateHow3::Unchecked(Sattr3 {
            mode: Some(0o644),
            uid: None,
            gid: None,
            size: None,
            atime: SetTime::DontChange,
            mtime: SetTime::DontChange,
        }),
    })
}

pub fn write(file: &NfsFh3, offset: u64, data: Vec<u8>, stable: StableHow) -> Nfs3Call {
    Nfs3Call::Write(WriteArgs {
        file: file.clone(),
        offset,
        count: data.len() as u32,
        stable,
        data,
    })
}

pub fn read(file: &NfsFh3, offset: u64, count: u32) -> Nfs3Call {
    Nfs3Call::Read(ReadArgs {
        file: file.clone(),
        offset,
        count,
    })
}

pub fn readdirplus(dir: &NfsFh3) -> Nfs3Call {
    Nfs3Call::Readdirplus(ReaddirplusArgs {
        dir: dir.clone(),
        cookie: 0,
        cookieverf: [0; 8],
        dircount: 8192,
        maxcount: 65_536,
    })
}

/// Latencies of `n` runs of `call` (after `warmup` untimed ones), sorted.
pub fn time_calls(
    c: &mut NfsClient,
    call: &Nfs3Call,
    warmup: usize,
    n: usize,
) -> Result<Vec<Duration>, LoadError> {
    for _ in 0..warmup {
        c.nfs(call.clone())?;
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        c.nfs(call.clone())?;
        out.push(t.elapsed());
    }
    out.sort();
    Ok(out)
}

/// A small deterministic generator (xorshift64*), so runs are repeatable.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }
}

/// Postmark's settings (the seed's: 5,000 files of 1–16 KB, 20,000
/// transactions, 8 KB blocks).
#[derive(Debug, Clone, Copy)]
pub struct Postmark {
    pub files: usize,
    pub transactions: usize,
    pub min_bytes: u64,
    pub max_bytes: u64,
    pub block: u32,
    pub seed: u64,
}

impl Default for Postmark {
    fn default() -> Self {
        Self {
            files: 5_000,
            transactions: 20_000,
            min_bytes: 1024,
            max_bytes: 16 * 1024,
            block: 8192,
            seed: 42,
        }
    }
}

/// What a Postmark run did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PostmarkResult {
    pub transactions: usize,
    /// Seconds for the transactions phase alone.
    pub transactions_secs: f64,
    /// Seconds for the whole run (create pool, transactions, delete all).
    pub total_secs: f64,
    pub calls: u64,
}

impl PostmarkResult {
    pub fn tps(&self) -> f64 {
        self.transactions as f64 / self.transactions_secs.max(1e-9)
    }
}

struct Pm<'a> {
    c: &'a mut NfsClient,
    dir: NfsFh3,
    files: Vec<(String, NfsFh3, u64)>,
    rng: Rng,
    next: usize,
    calls: u64,
    p: Postmark,
}

impl Pm<'_> {
    fn write_file(&mut self, fh: &NfsFh3, from: u64, len: u64) -> Result<(), LoadError> {
        let mut at = from;
        while at < from + len {
            let n = (from + len - at).min(u64::from(self.p.block));
            let data = vec![(at % 251) as u8; n as usize];
            self.c.nfs(write(fh, at, data, StableHow::Unstable))?;
            self.calls += 1;
            at += n;
        }
        Ok(())
    }

    fn create_one(&mut self) -> Result<(), LoadError> {
        let name = format!("pm{}", self.next);
        self.next += 1;
        let fh = self.c.create(&self.dir, &name)?;
        self.calls += 1;
        let size = self.rng.range(self.p.min_bytes, self.p.max_bytes);
        self.write_file(&fh, 0, size)?;
        self.files.push((name, fh, size));
        Ok(())
    }

    fn delete_one(&mut self) -> Result<(), LoadError> {
        if self.files.is_empty() {
            return Ok(());
        }
        let i = (self.rng.next_u64() as usize) % self.files.len();
        let (name, _, _) = self.files.swap_remove(i);
        self.c.nfs(Nfs3Call::Remove(dirop(&self.dir, &name)))?;
        self.calls += 1;
        Ok(())
    }

    fn read_or_append(&mut self) -> Result<(), LoadError> {
        if self.files.is_empty() {
            return Ok(());
        }
        let i = (self.rng.next_u64() as usize) % self.files.len();
        let (_, fh, size) = self.files[i].clone();
        if self.rng.next_u64().is_multiple_of(2) {
            let mut at = 0;
            while at < size {
                self.c.nfs(read(&fh, at, self.p.block))?;
                self.calls += 1;
                at += u64::from(self.p.block);
            }
        } else {
            let extra = self
                .rng
                .range(self.p.min_bytes, self.p.max_bytes)
                .min(u64::from(self.p.block));
            self.write_file(&fh, size, extra)?;
            self.files[i].2 = size + extra;
        }
        Ok(())
    }
}

/// Runs Postmark in a new directory `name` under `root`.
pub fn postmark(
    c: &mut NfsClient,
    root: &NfsFh3,
    name: &str,
    p: Postmark,
) -> Result<PostmarkResult, LoadError> {
    let t0 = Instant::now();
    let dir = match c.nfs(Nfs3Call::Mkdir(crate::nfs3::MkdirArgs {
        place: dirop(root, name),
        attributes: Sattr3 {
            mode: Some(0o755),
            uid: None,
            gid: None,
            size: None,
            atime: SetTime::DontChange,
            mtime: SetTime::DontChange,
        },
    }))? {
        Nfs3Reply::Mkdir(NfsRes::Ok(ok)) => ok.obj.ok_or_else(|| LoadError::Reply {
            what: "MKDIR".into(),
            why: "no handle".into(),
        })?,
        other => {
            return Err(LoadError::Reply {
                what: "MKDIR".into(),
                why: format!("{other:?}"),
            });
        }
    };
    let mut pm = Pm {
        c,
        dir,
        files: Vec::with_capacity(p.files),
        rng: Rng::new(p.seed),
        next: 0,
        calls: 1,
        p,
    };
    for _ in 0..p.files {
        pm.create_one()?;
    }
    let t1 = Instant::now();
    for _ in 0..p.transactions {
        if pm.rng.next_u64().is_multiple_of(2) {
            pm.create_one()?;
        } else {
            pm.delete_one()?;
        }
        pm.read_or_append()?;
    }
    let transactions_secs = t1.elapsed().as_secs_f64();
    while !pm.files.is_empty() {
        pm.delete_one()?;
    }
    pm.c.nfs(Nfs3Call::Rmdir(dirop(root, name)))?;
    pm.calls += 1;
    Ok(PostmarkResult {
        transactions: p.transactions,
        transactions_secs,
        total_secs: t0.elapsed().as_secs_f64(),
        calls: pm.calls,
    })
}

/// What an open-loop run saw.
#[derive(Debug, Clone, PartialEq)]
pub struct OpenLoopResult {
    /// Calls per second offered and completed.
    pub offered: f64,
    pub achieved: f64,
    pub sent: u64,
    pub completed: u64,
    /// Completion latencies: median and 99th percentile.
    pub p50: Duration,
    pub p99: Duration,
}

/// Offers `rate` calls a second for `secs`, spread over `connections` TCP
/// connections to `addr`, cycling through `calls` (their XIDs are set here);
/// waits up to a second for stragglers.
pub fn open_loop(
    addr: SocketAddr,
    calls: &[Nfs3Call],
    rate: f64,
    secs: f64,
    connections: usize,
) -> Result<OpenLoopResult, LoadError> {
    let templates: Vec<(Procedure, Vec<u8>)> = calls
        .iter()
        .map(|c| {
            let call = Call {
                xid: 0,
                cred: root_cred(),
                verf: Auth::None,
                args: CallArgs::Nfs3(c.clone()),
            };
            (
                call.args.procedure(),
                encode_record(&call.to_bytes(), 1 << 20),
            )
        })
        .collect();
    let templates = Arc::new(templates);
    let per_conn = rate / connections.max(1) as f64;
    let mut workers = Vec::new();
    for w in 0..connections.max(1) {
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        let t = Arc::clone(&templates);
        workers.push(thread::spawn(move || {
            one_connection(stream, &t, per_conn, secs, w)
        }));
    }
    let mut sent = 0;
    let mut lat = Vec::new();
    for h in workers {
        let (s, l) = h.join().map_err(|_| LoadError::Reply {
            what: "a load thread".into(),
            why: "panicked".into(),
        })??;
        sent += s;
        lat.extend(l);
    }
    lat.sort();
    let q = |f: f64| {
        lat.get(((lat.len() as f64 * f) as usize).min(lat.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    Ok(OpenLoopResult {
        offered: rate,
        achieved: lat.len() as f64 / secs,
        sent,
        completed: lat.len() as u64,
        p50: q(0.5),
        p99: q(0.99),
    })
}

type Latencies = Vec<Duration>;

fn one_connection(
    stream: TcpStream,
    templates: &[(Procedure, Vec<u8>)],
    rate: f64,
    secs: f64,
    worker: usize,
) -> Result<(u64, Latencies), LoadError> {
    let sent_at: Arc<Mutex<HashMap<u32, Instant>>> = Arc::default();
    let mut reader_stream = stream.try_clone()?;
    reader_stream.set_read_timeout(Some(Duration::from_millis(200)))?;
    let end = Duration::from_secs_f64(secs);
    let t0 = Instant::now();
    let map = Arc::clone(&sent_at);
    let reader = thread::spawn(move || {
        let mut rr = RecordReader::new(MAX_REPLY);
        let mut buf = vec![0u8; 256 * 1024];
        let mut lat = Vec::new();
        let deadline = end + Duration::from_secs(1);
        while t0.elapsed() < deadline {
            match read_record(&mut reader_stream, &mut rr, &mut buf) {
                Ok(r) => {
                    let Ok((h, _)) = decode_reply_header(&r) else {
                        continue;
                    };
                    let at = map
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .remove(&h.xid);
                    if let Some(at) = at
                        && at.duration_since(t0) < end
                    {
                        lat.push(at.elapsed());
                    }
                }
                Err(LoadError::Io(e))
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => break,
            }
        }
        lat
    });
    let mut w = stream;
    let gap = Duration::from_secs_f64(1.0 / rate.max(1e-3));
    let mut sent = 0u64;
    let mut xid = (worker as u32) << 24;
    while t0.elapsed() < end {
        let due = gap.mul_f64(sent as f64);
        // Sleep until the next call is due (no spinning: the generator shares the
        // machine with the server and the proxy); behind schedule, send at once.
        if let Some(wait) = due.checked_sub(t0.elapsed()) {
            thread::sleep(wait);
            continue;
        }
        let (_, bytes) = &templates[sent as usize % templates.len()];
        let mut b = bytes.clone();
        xid = xid.wrapping_add(1);
        b[4..8].copy_from_slice(&xid.to_be_bytes());
        sent_at
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(xid, Instant::now());
        w.write_all(&b)?;
        sent += 1;
    }
    let lat = reader.join().map_err(|_| LoadError::Reply {
        what: "a reader thread".into(),
        why: "panicked".into(),
    })?;
    Ok((sent, lat))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generator_is_repeatable_and_in_range() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        for _ in 0..1000 {
            let x = a.range(1024, 16 * 1024);
            assert_eq!(x, b.range(1024, 16 * 1024));
            assert!((1024..=16 * 1024).contains(&x));
        }
        let p = Postmark::default();
        assert_eq!((p.files, p.transactions, p.block), (5000, 20_000, 8192));
    }
}

//! The projection of the client's directories on the server: a read-only
//! FUSE file system (the guest's container mounts it and lays an overlayfs
//! over it) whose lookups, listings and links are asked of the client, and
//! whose file data comes region by region through DisCo (the client is the
//! manager and owner of every file region; the server holds read copies).
//!
//! The root lists one directory per projected directory, by number (`0`,
//! `1`, …); paths sent to the client are `N/inside/the/dir`.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    FileAttr, FileType, Filesystem, ReplyAttr, ReplyData, ReplyDirectory, ReplyEntry, ReplyOpen,
    Request,
};
use sidecore_disco::ObjectId;
use sidecore_disco::space::REGION_BYTES;
use sidecore_wire::mx_msg::{MxAttr, MxBody};

use super::conn::{Conn, ConnError};

/// How long the kernel may cache attributes and names: the projection is a
/// snapshot of the client's tree for the session (see the README's limits).
const TTL: Duration = Duration::from_secs(3600);
/// The FUSE root's inode.
const ROOT_INO: u64 = 1;

struct Node {
    path: String,
    attr: Option<MxAttr>,
}

/// The FUSE file system of one session.
pub struct Projection {
    conn: Arc<Conn>,
    roots: usize,
    nodes: HashMap<u64, Node>,
    by_path: HashMap<String, u64>,
    next_ino: u64,
}

fn errno(e: &ConnError) -> i32 {
    match e {
        ConnError::Timeout => libc::ETIMEDOUT,
        _ => libc::EIO,
    }
}

fn time(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

fn kind(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        _ => FileType::RegularFile,
    }
}

fn file_attr(ino: u64, a: &MxAttr) -> FileAttr {
    FileAttr {
        ino,
        size: a.size,
        blocks: a.size.div_ceil(512),
        atime: time(a.atime_ns),
        mtime: time(a.mtime_ns),
        ctime: time(a.ctime_ns),
        crtime: time(a.ctime_ns),
        kind: kind(a.mode),
        perm: (a.mode & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev as u32,
        blksize: 4096,
        flags: 0,
    }
}

fn root_attr() -> FileAttr {
    FileAttr {
        ino: ROOT_INO,
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: FileType::Directory,
        perm: 0o555,
        nlink: 2,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

impl Projection {
    /// The file system for `roots` projected directories over `conn`.
    #[must_use]
    pub fn new(conn: Arc<Conn>, roots: usize) -> Self {
        Projection {
            conn,
            roots,
            nodes: HashMap::new(),
            by_path: HashMap::new(),
            next_ino: ROOT_INO + 1,
        }
    }

    fn ino_for(&mut self, path: &str) -> u64 {
        if let Some(i) = self.by_path.get(path) {
            return *i;
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        self.by_path.insert(path.to_string(), ino);
        self.nodes.insert(
            ino,
            Node {
                path: path.to_string(),
                attr: None,
            },
        );
        ino
    }

    fn child_path(&self, parent: u64, name: &OsStr) -> Option<String> {
        let name = name.to_str()?;
        if name.is_empty() || name == "." || name == ".." || name.contains('/') {
            return None;
        }
        if parent == ROOT_INO {
            let i: usize = name.parse().ok()?;
            return (i < self.roots && i.to_string() == name).then(|| name.to_string());
        }
        Some(format!("{}/{name}", self.nodes.get(&parent)?.path))
    }

    fn lookup_path(&mut self, path: &str) -> Result<(u64, MxAttr), i32> {
        let p = path.to_string();
        match self.conn.request(|req| MxBody::Lookup { req, path: p }) {
            Ok(MxBody::Attr { attr: Some(a), .. }) => {
                let ino = self.ino_for(path);
                if let Some(n) = self.nodes.get_mut(&ino) {
                    n.attr = Some(a);
                }
                Ok((ino, a))
            }
            Ok(MxBody::Attr { errno, .. }) if errno > 0 => Err(errno),
            Ok(_) => Err(libc::EIO),
            Err(e) => Err(errno(&e)),
        }
    }

    fn read_range(&self, a: &MxAttr, offset: u64, size: u64) -> Result<Vec<u8>, ConnError> {
        let end = (offset + size).min(a.size);
        let mut out = Vec::with_capacity(end.saturating_sub(offset) as usize);
        let mut at = offset;
        while at < end {
            let idx = at / REGION_BYTES;
            let region = self.conn.region(ObjectId(a.base + idx * REGION_BYTES))?;
            let from = (at - idx * REGION_BYTES) as usize;
            let upto = ((end - idx * REGION_BYTES) as usize).min(region.len());
            if from >= upto {
                break; // the file shrank on the client: a short read
            }
            out.extend_from_slice(&region[from..upto]);
            at = idx * REGION_BYTES + upto as u64;
        }
        Ok(out)
    }
}

impl Filesystem for Projection {
    fn lookup(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        let Some(path) = self.child_path(parent, name) else {
            reply.error(libc::ENOENT);
            return;
        };
        match self.lookup_path(&path) {
            Ok((ino, a)) => reply.entry(&TTL, &file_attr(ino, &a), 0),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&mut self, _req: &Request<'_>, ino: u64, _fh: Option<u64>, reply: ReplyAttr) {
        if ino == ROOT_INO {
            reply.attr(&TTL, &root_attr());
            return;
        }
        match self.nodes.get(&ino).map(|n| (n.path.clone(), n.attr)) {
            Some((_, Some(a))) => reply.attr(&TTL, &file_attr(ino, &a)),
            Some((path, None)) => match self.lookup_path(&path) {
                Ok((ino, a)) => reply.attr(&TTL, &file_attr(ino, &a)),
                Err(e) => reply.error(e),
            },
            None => reply.error(libc::ENOENT),
        }
    }

    fn readlink(&mut self, _req: &Request<'_>, ino: u64, reply: ReplyData) {
        let Some(path) = self.nodes.get(&ino).map(|n| n.path.clone()) else {
            reply.error(libc::ENOENT);
            return;
        };
        match self.conn.request(|req| MxBody::ReadLink { req, path }) {
            Ok(MxBody::Target {
                target, errno: 0, ..
            }) => {
                reply.data(target.as_bytes());
            }
            Ok(MxBody::Target { errno, .. }) => reply.error(errno.max(1)),
            Ok(_) => reply.error(libc::EIO),
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// Nothing to do per open (reads go by inode), so the kernel is told
    /// to stop asking: `ENOSYS` to an open makes it open every later file of
    /// this mount without a message (and without a release), keeping the page
    /// cache as the `FOPEN_KEEP_CACHE` open flag would — one round trip through this
    /// daemon less for every file the guest opens. The mount is read-only,
    /// so the kernel refuses a write open before it gets here.
    fn open(&mut self, _req: &Request<'_>, _ino: u64, flags: i32, reply: ReplyOpen) {
        if flags & libc::O_ACCMODE != libc::O_RDONLY {
            reply.error(libc::EROFS);
            return;
        }
        reply.error(libc::ENOSYS);
    }

    /// As [`Projection::open`], for directories (listings go by inode).
    fn opendir(&mut self, _req: &Request<'_>, _ino: u64, _flags: i32, reply: ReplyOpen) {
        reply.error(libc::ENOSYS);
    }

    fn read(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        size: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyData,
    ) {
        let Some(a) = self.nodes.get(&ino).and_then(|n| n.attr) else {
            reply.error(libc::ENOENT);
            return;
        };
        match self.read_range(&a, offset.max(0) as u64, u64::from(size)) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdir(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        mut reply: ReplyDirectory,
    ) {
        let entries: Vec<(String, FileType)> = if ino == ROOT_INO {
            (0..self.roots)
                .map(|i| (i.to_string(), FileType::Directory))
                .collect()
        } else {
            let Some(path) = self.nodes.get(&ino).map(|n| n.path.clone()) else {
                reply.error(libc::ENOENT);
                return;
            };
            match self.conn.request(|req| MxBody::ReadDir { req, path }) {
                Ok(MxBody::Entries {
                    entries, errno: 0, ..
                }) => entries
                    .into_iter()
                    .map(|e| (e.name, kind(e.kind)))
                    .collect(),
                Ok(MxBody::Entries { errno, .. }) => {
                    reply.error(errno.max(1));
                    return;
                }
                Ok(_) => {
                    reply.error(libc::EIO);
                    return;
                }
                Err(e) => {
                    reply.error(errno(&e));
                    return;
                }
            }
        };
        let base = self.nodes.get(&ino).map(|n| n.path.clone());
        let mut all = vec![
            (ino, FileType::Directory, ".".to_string()),
            (ino, FileType::Directory, "..".to_string()),
        ];
        for (name, k) in entries {
            let p = match &base {
                Some(b) => format!("{b}/{name}"),
                None => name.clone(),
            };
            all.push((self.ino_for(&p), k, name));
        }
        for (i, (e_ino, k, name)) in all.into_iter().enumerate().skip(offset.max(0) as usize) {
            if reply.add(e_ino, (i + 1) as i64, k, name) {
                break;
            }
        }
        reply.ok();
    }
}

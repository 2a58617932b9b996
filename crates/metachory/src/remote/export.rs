//! The client's file server: answers the server's lookups, listings and
//! links for the projected directories, and supplies file regions to DisCo
//! (the client manages and owns them). The server is not trusted: every
//! path it names is resolved beneath its projected directory with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`, so nothing outside the
//! projection is ever read.

use std::collections::{BTreeMap, HashMap};
use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use sidecore_disco::space::{REGION_BYTES, Space};
use sidecore_disco::{Endpoint, ObjectId};
use sidecore_wire::mx_msg::{MxAttr, MxBody, MxDirent};

/// Entries a listing may return (a larger directory is refused with E2BIG).
pub const MAX_DIR_ENTRIES: usize = 100_000;

/// One projected directory.
struct Root {
    fd: OwnedFd,
}

/// The client's side of the projection.
pub struct Export {
    roots: Vec<Root>,
    space: Space,
    /// Region base → (root, path inside it, size, vnode).
    files: BTreeMap<u64, (usize, String, u64)>,
    by_path: HashMap<String, (u64, u64)>,
    next_vnode: u64,
}

fn openat2(dir: &OwnedFd, rel: &str, flags: i32) -> io::Result<OwnedFd> {
    let path = CString::new(if rel.is_empty() { "." } else { rel })
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: open_how is plain data; all-zero is valid.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: valid path, `how` of the size passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            path.as_ptr(),
            &raw const how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor from the kernel.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

fn ns(sec: i64, nsec: i64) -> i64 {
    sec.saturating_mul(1_000_000_000).saturating_add(nsec)
}

fn errno_of(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

impl Export {
    /// Opens each projected directory; `me` is the client's endpoint.
    pub fn new(dirs: &[PathBuf], me: Endpoint) -> io::Result<Self> {
        let mut roots = Vec::new();
        for d in dirs {
            let f = File::open(d)
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", d.display())))?;
            roots.push(Root { fd: f.into() });
        }
        Ok(Export {
            roots,
            space: Space::new(me),
            files: BTreeMap::new(),
            by_path: HashMap::new(),
            next_vnode: 3, // 0–2 are the stdio streams
        })
    }

    /// Splits `N/inside` into the root and a path with only plain parts.
    fn resolve<'a>(&self, path: &'a str) -> Result<(usize, &'a str), i32> {
        let (n, rest) = path.split_once('/').unwrap_or((path, ""));
        let i: usize = n.parse().map_err(|_| libc::ENOENT)?;
        if i >= self.roots.len() || i.to_string() != n {
            return Err(libc::ENOENT);
        }
        if !rest.is_empty()
            && rest
                .split('/')
                .any(|c| c.is_empty() || c == "." || c == "..")
        {
            return Err(libc::EINVAL);
        }
        Ok((i, rest))
    }

    fn lstat(&self, root: usize, rel: &str) -> io::Result<libc::stat> {
        let (parent, name) = rel.rsplit_once('/').unwrap_or(("", rel));
        let dir = openat2(
            &self.roots[root].fd,
            parent,
            libc::O_PATH | libc::O_DIRECTORY,
        )?;
        let name = CString::new(if name.is_empty() { "." } else { name })
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: stat is plain data; all-zero is valid.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a directory descriptor, a NUL-terminated name, a stat buffer.
        let r = unsafe {
            libc::fstatat(
                dir.as_raw_fd(),
                name.as_ptr(),
                &raw mut st,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(st)
    }

    /// Answers a `lookup`.
    pub fn lookup(&mut self, req: u64, path: &str) -> MxBody {
        let fail = |errno| MxBody::Attr {
            req,
            attr: None,
            errno,
        };
        let (root, rel) = match self.resolve(path) {
            Ok(x) => x,
            Err(e) => return fail(e),
        };
        let st = match self.lstat(root, rel) {
            Ok(s) => s,
            Err(e) => return fail(errno_of(&e)),
        };
        let (vnode, base) = if st.st_mode & libc::S_IFMT == libc::S_IFREG {
            match self.vnode_for(root, rel, st.st_size as u64) {
                Ok(x) => x,
                Err(e) => return fail(e),
            }
        } else {
            (0, 0)
        };
        MxBody::Attr {
            req,
            attr: Some(MxAttr {
                mode: st.st_mode,
                nlink: st.st_nlink as u32,
                uid: st.st_uid,
                gid: st.st_gid,
                size: st.st_size as u64,
                atime_ns: ns(st.st_atime, st.st_atime_nsec),
                mtime_ns: ns(st.st_mtime, st.st_mtime_nsec),
                ctime_ns: ns(st.st_ctime, st.st_ctime_nsec),
                rdev: st.st_rdev,
                vnode,
                base,
            }),
            errno: 0,
        }
    }

    /// The vnode of a regular file: its regions are allocated in the
    /// client's chunk of the physical space once per path.
    fn vnode_for(&mut self, root: usize, rel: &str, size: u64) -> Result<(u64, u64), i32> {
        let key = format!("{root}/{rel}");
        if let Some((v, base)) = self.by_path.get(&key)
            && let Some(f) = self.files.get_mut(base)
            && size.div_ceil(REGION_BYTES).max(1) <= f.2.div_ceil(REGION_BYTES).max(1)
        {
            f.2 = size;
            return Ok((*v, *base));
        }
        let (base, _notices) = self
            .space
            .allocate(size.div_ceil(REGION_BYTES).max(1))
            .map_err(|_| libc::ENOSPC)?;
        let v = self.next_vnode;
        self.next_vnode += 1;
        self.files.insert(base.0, (root, rel.to_string(), size));
        self.by_path.insert(key, (v, base.0));
        Ok((v, base.0))
    }

    /// The data of region `obj`, if it belongs to a file this client
    /// looked up (read now from the file).
    pub fn region(&self, obj: ObjectId) -> Option<Vec<u8>> {
        let (base, (root, rel, size)) = self.files.range(..=obj.0).next_back()?;
        let offset = obj.0 - base;
        if !offset.is_multiple_of(REGION_BYTES)
            || offset >= size.div_ceil(REGION_BYTES).max(1) * REGION_BYTES
        {
            return None;
        }
        let fd = openat2(&self.roots[*root].fd, rel, libc::O_RDONLY).ok()?;
        let f = File::from(fd);
        let want = REGION_BYTES.min(size.saturating_sub(offset)) as usize;
        let mut buf = vec![0u8; want];
        let mut got = 0;
        while got < want {
            match f.read_at(&mut buf[got..], offset + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return None,
            }
        }
        buf.truncate(got);
        Some(buf)
    }

    /// Answers a `readdir`, in the directory's own order.
    pub fn readdir(&self, req: u64, path: &str) -> MxBody {
        let fail = |errno| MxBody::Entries {
            req,
            entries: Vec::new(),
            errno,
        };
        let (root, rel) = match self.resolve(path) {
            Ok(x) => x,
            Err(e) => return fail(e),
        };
        let dir = match openat2(
            &self.roots[root].fd,
            rel,
            libc::O_RDONLY | libc::O_DIRECTORY,
        ) {
            Ok(d) => d,
            Err(e) => return fail(errno_of(&e)),
        };
        let listing = match std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd())) {
            Ok(l) => l,
            Err(e) => return fail(errno_of(&e)),
        };
        let mut entries = Vec::new();
        for e in listing {
            let Ok(e) = e else { continue };
            let Ok(name) = e.file_name().into_string() else {
                continue; // names that are not UTF-8 are not projected
            };
            let kind = match e.file_type() {
                Ok(t) if t.is_dir() => libc::S_IFDIR,
                Ok(t) if t.is_symlink() => libc::S_IFLNK,
                Ok(t) if t.is_file() => libc::S_IFREG,
                _ => libc::S_IFREG,
            };
            entries.push(MxDirent { name, kind });
            if entries.len() > MAX_DIR_ENTRIES {
                return fail(libc::E2BIG);
            }
        }
        MxBody::Entries {
            req,
            entries,
            errno: 0,
        }
    }

    /// Answers a `readlink`.
    pub fn readlink(&self, req: u64, path: &str) -> MxBody {
        let fail = |errno| MxBody::Target {
            req,
            target: String::new(),
            errno,
        };
        let (root, rel) = match self.resolve(path) {
            Ok(x) => x,
            Err(e) => return fail(e),
        };
        let (parent, name) = rel.rsplit_once('/').unwrap_or(("", rel));
        let dir = match openat2(
            &self.roots[root].fd,
            parent,
            libc::O_PATH | libc::O_DIRECTORY,
        ) {
            Ok(d) => d,
            Err(e) => return fail(errno_of(&e)),
        };
        let p = PathBuf::from(format!("/proc/self/fd/{}/{name}", dir.as_raw_fd()));
        match std::fs::read_link(&p) {
            Ok(t) => match t.into_os_string().into_string() {
                Ok(target) => MxBody::Target {
                    req,
                    target,
                    errno: 0,
                },
                Err(_) => fail(libc::EILSEQ),
            },
            Err(e) => fail(errno_of(&e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_outside_the_projection_is_served() {
        let d = tempfile::tempdir().unwrap();
        let proj = d.path().join("proj");
        std::fs::create_dir(&proj).unwrap();
        std::fs::write(proj.join("a.txt"), b"hello").unwrap();
        std::fs::write(d.path().join("secret"), b"no").unwrap();
        std::os::unix::fs::symlink("../secret", proj.join("link")).unwrap();
        let mut x = Export::new(&[proj], Endpoint(1)).unwrap();
        let MxBody::Attr { attr: Some(a), .. } = x.lookup(1, "0/a.txt") else {
            panic!()
        };
        assert_eq!(a.size, 5);
        assert_eq!(x.region(ObjectId(a.base)).unwrap(), b"hello");
        assert!(
            x.region(ObjectId(a.base + 1)).is_none(),
            "not a region start"
        );
        for bad in [
            "0/../secret",
            "1/a.txt",
            "0/./a.txt",
            "00/a.txt",
            "0//a.txt",
        ] {
            let MxBody::Attr { attr, errno, .. } = x.lookup(2, bad) else {
                panic!()
            };
            assert!(attr.is_none() && errno != 0, "{bad}");
        }
        // A symlink is reported as one; following it is the guest's kernel's
        // business, inside the guest's own view.
        let MxBody::Attr { attr: Some(l), .. } = x.lookup(3, "0/link") else {
            panic!()
        };
        assert_eq!(l.mode & libc::S_IFMT, libc::S_IFLNK);
        let MxBody::Target { target, .. } = x.readlink(4, "0/link") else {
            panic!()
        };
        assert_eq!(target, "../secret");
        let MxBody::Entries { entries, .. } = x.readdir(5, "0") else {
            panic!()
        };
        let mut names: Vec<_> = entries.iter().map(|e| e.name.as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, ["a.txt", "link"]);
        let MxBody::Entries { errno, .. } = x.readdir(6, "0/link") else {
            panic!()
        };
        assert_eq!(errno, libc::ELOOP, "no listing through a symlink");
    }
}

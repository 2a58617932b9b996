//! The write-back overlay: what the guest wrote stays in the overlayfs
//! upper directories on the server until the guest ends; then the server
//! lists the changes ([`collect`]) and sends them with their contents
//! (`VNODEWRITE`), and the client stages them ([`Staged`]) and applies,
//! shows or discards them as the user decided. Nothing the server names is
//! applied outside the projected directories.

use std::collections::HashMap;
use std::ffi::CString;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sidecore_wire::mx_msg::{MxChange, clean_absolute};

/// Bytes of file contents per `VNODEWRITE`.
pub const WRITE_CHUNK_BYTES: usize = 256 * 1024;
/// Largest total of file contents a client stages in memory.
pub const MAX_STAGED_BYTES: u64 = 4 << 30;

fn opaque(dir: &Path, userxattr: bool) -> bool {
    let name = if userxattr {
        "user.overlay.opaque"
    } else {
        "trusted.overlay.opaque"
    };
    let (Ok(p), Ok(n)) = (CString::new(dir.as_os_str().as_bytes()), CString::new(name)) else {
        return false;
    };
    let mut v = [0u8; 4];
    // SAFETY: NUL-terminated strings and a buffer of the length passed.
    let r = unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), v.as_mut_ptr().cast(), v.len()) };
    r >= 1 && v[0] == b'y'
}

/// The changes in the upper directories: `(upper dir, client dir)` pairs.
/// Returns the changes in applying order and, for each `Write`, the file
/// holding its contents (indexed by the change's `vnode`).
pub fn collect(
    uppers: &[(PathBuf, String)],
    userxattr: bool,
) -> io::Result<(Vec<MxChange>, Vec<PathBuf>)> {
    let mut changes = Vec::new();
    let mut files = Vec::new();
    for (upper, client) in uppers {
        walk(upper, client, userxattr, &mut changes, &mut files)?;
    }
    Ok((changes, files))
}

fn walk(
    dir: &Path,
    client: &str,
    userxattr: bool,
    changes: &mut Vec<MxChange>,
    files: &mut Vec<PathBuf>,
) -> io::Result<()> {
    let mut names: Vec<_> = fs::read_dir(dir)?.filter_map(Result::ok).collect();
    names.sort_by_key(fs::DirEntry::file_name);
    for e in names {
        let Ok(name) = e.file_name().into_string() else {
            continue; // not UTF-8: not projected, so not written back
        };
        let path = format!("{}/{name}", client.trim_end_matches('/'));
        let md = fs::symlink_metadata(e.path())?;
        let t = md.file_type();
        if t.is_char_device() && md.rdev() == 0 {
            changes.push(MxChange::Delete { path });
        } else if t.is_dir() {
            if opaque(&e.path(), userxattr) {
                changes.push(MxChange::Delete { path: path.clone() });
            }
            changes.push(MxChange::Mkdir {
                path: path.clone(),
                mode: md.mode() & 0o7777,
            });
            walk(&e.path(), &path, userxattr, changes, files)?;
        } else if t.is_symlink() {
            let target = fs::read_link(e.path())?.to_string_lossy().into_owned();
            changes.push(MxChange::Symlink { path, target });
        } else if t.is_file() {
            changes.push(MxChange::Write {
                path,
                mode: md.mode() & 0o7777,
                size: md.len(),
                vnode: files.len() as u64,
                mtime_ns: md.mtime() * 1_000_000_000 + md.mtime_nsec(),
            });
            files.push(e.path());
        }
    }
    Ok(())
}

/// Reads a file of the overlay in `VNODEWRITE`-sized chunks.
pub fn chunks(path: &Path, mut each: impl FnMut(u64, Vec<u8>) -> io::Result<()>) -> io::Result<()> {
    let mut f = File::open(path)?;
    let mut offset = 0u64;
    loop {
        let mut buf = vec![0u8; WRITE_CHUNK_BYTES];
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        buf.truncate(n);
        each(offset, buf)?;
        offset += n as u64;
    }
}

/// Why the client refused an overlay.
#[derive(Debug, thiserror::Error)]
pub enum OverlayError {
    #[error("the server named {0:?}, which is outside the projected directories")]
    Outside(String),
    #[error(
        "the server sent contents for vnode {vnode} at offset {offset}, which no change expects there"
    )]
    Unexpected { vnode: u64, offset: u64 },
    #[error("the server sent {got} bytes for {path}, which it announced as {size}")]
    Size { path: String, got: u64, size: u64 },
    #[error("the overlay holds more than {MAX_STAGED_BYTES} bytes")]
    TooLarge,
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: io::Error,
    },
}

/// An overlay received by the client, not yet applied.
#[derive(Debug, Default)]
pub struct Staged {
    pub changes: Vec<MxChange>,
    data: HashMap<u64, Vec<u8>>,
    total: u64,
}

fn within(path: &str, dirs: &[PathBuf]) -> bool {
    clean_absolute(path)
        && dirs.iter().any(|d| {
            let d = d.to_string_lossy();
            path.len() > d.len() && path.starts_with(d.as_ref()) && path.as_bytes()[d.len()] == b'/'
        })
}

impl Staged {
    /// Takes the change list, refusing any path outside `dirs`.
    pub fn new(changes: Vec<MxChange>, dirs: &[PathBuf]) -> Result<Self, OverlayError> {
        for c in &changes {
            let p = match c {
                MxChange::Write { path, .. }
                | MxChange::Mkdir { path, .. }
                | MxChange::Symlink { path, .. }
                | MxChange::Delete { path } => path,
            };
            if !within(p, dirs) {
                return Err(OverlayError::Outside(p.clone()));
            }
        }
        Ok(Staged {
            changes,
            data: HashMap::new(),
            total: 0,
        })
    }

    /// One `VNODEWRITE`: contents of a `Write` change, in order.
    pub fn write(&mut self, vnode: u64, offset: u64, bytes: &[u8]) -> Result<(), OverlayError> {
        let size = self.changes.iter().find_map(|c| match c {
            MxChange::Write { vnode: v, size, .. } if *v == vnode => Some(*size),
            _ => None,
        });
        let buf = self.data.entry(vnode).or_default();
        let Some(size) = size.filter(|_| buf.len() as u64 == offset) else {
            return Err(OverlayError::Unexpected { vnode, offset });
        };
        if offset + bytes.len() as u64 > size {
            return Err(OverlayError::Unexpected { vnode, offset });
        }
        self.total += bytes.len() as u64;
        if self.total > MAX_STAGED_BYTES {
            return Err(OverlayError::TooLarge);
        }
        buf.extend_from_slice(bytes);
        Ok(())
    }

    /// Checks that every file's contents arrived whole.
    pub fn complete(&self) -> Result<(), OverlayError> {
        for c in &self.changes {
            if let MxChange::Write {
                path, size, vnode, ..
            } = c
            {
                let got = self.data.get(vnode).map_or(0, |d| d.len() as u64);
                if got != *size {
                    return Err(OverlayError::Size {
                        path: path.clone(),
                        got,
                        size: *size,
                    });
                }
            }
        }
        Ok(())
    }

    /// A one-line summary per change.
    #[must_use]
    pub fn summary(&self) -> Vec<String> {
        self.changes
            .iter()
            .map(|c| match c {
                MxChange::Write { path, size, .. } if Path::new(path).exists() => {
                    format!("M {path} ({size} bytes)")
                }
                MxChange::Write { path, size, .. } => format!("A {path} ({size} bytes)"),
                MxChange::Mkdir { path, .. } => format!("D {path}/"),
                MxChange::Symlink { path, target } => format!("L {path} -> {target}"),
                MxChange::Delete { path } => format!("R {path}"),
            })
            .filter(|l| !(l.starts_with("D ") && Path::new(&l[2..l.len() - 1]).is_dir()))
            .collect()
    }

    /// `diff -u` of every written file against the client's, into `out`.
    pub fn diff(&self, out: &mut dyn Write) -> io::Result<()> {
        let tmp = tempfile::tempdir()?;
        for c in &self.changes {
            match c {
                MxChange::Write { path, vnode, .. } => {
                    let new = tmp.path().join(vnode.to_string());
                    fs::write(&new, self.data.get(vnode).map_or(&[][..], Vec::as_slice))?;
                    let old = if Path::new(path).is_file() {
                        PathBuf::from(path)
                    } else {
                        PathBuf::from("/dev/null")
                    };
                    let o = std::process::Command::new("diff")
                        .arg("-u")
                        .arg("--label")
                        .arg(format!("a{path}"))
                        .arg("--label")
                        .arg(format!("b{path}"))
                        .arg(&old)
                        .arg(&new)
                        .output()?;
                    out.write_all(&o.stdout)?;
                }
                MxChange::Delete { path } => writeln!(out, "removed {path}")?,
                MxChange::Symlink { path, target } => writeln!(out, "symlink {path} -> {target}")?,
                MxChange::Mkdir { path, .. } if !Path::new(path).is_dir() => {
                    writeln!(out, "new directory {path}")?;
                }
                MxChange::Mkdir { .. } => {}
            }
        }
        Ok(())
    }

    /// Applies every change: files are written beside their target, synced
    /// and renamed over it, so a crash leaves the old file or the new one.
    pub fn apply(&self) -> Result<usize, OverlayError> {
        let io = |path: &str| {
            let path = path.to_string();
            move |source| OverlayError::Io { path, source }
        };
        for c in &self.changes {
            match c {
                MxChange::Mkdir { path, mode } => {
                    if !Path::new(path).is_dir() {
                        fs::create_dir_all(path).map_err(io(path))?;
                        fs::set_permissions(path, fs::Permissions::from_mode(*mode))
                            .map_err(io(path))?;
                    }
                }
                MxChange::Delete { path } => {
                    let r = match fs::symlink_metadata(path) {
                        Ok(m) if m.is_dir() => fs::remove_dir_all(path),
                        Ok(_) => fs::remove_file(path),
                        Err(e) => Err(e),
                    };
                    match r {
                        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(io(path)(e)),
                        _ => {}
                    }
                }
                MxChange::Symlink { path, target } => {
                    let _ = fs::remove_file(path);
                    std::os::unix::fs::symlink(target, path).map_err(io(path))?;
                }
                MxChange::Write {
                    path,
                    mode,
                    vnode,
                    mtime_ns,
                    ..
                } => {
                    let data = self.data.get(vnode).map_or(&[][..], Vec::as_slice);
                    write_atomically(Path::new(path), data, *mode, *mtime_ns).map_err(io(path))?;
                }
            }
        }
        Ok(self.changes.len())
    }
}

fn write_atomically(path: &Path, data: &[u8], mode: u32, mtime_ns: i64) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.sidecore-mx-{}", std::process::id()));
    let mut f = File::create(&tmp)?;
    f.write_all(data)?;
    f.set_permissions(fs::Permissions::from_mode(mode))?;
    let t = libc::timespec {
        tv_sec: mtime_ns.div_euclid(1_000_000_000),
        tv_nsec: mtime_ns.rem_euclid(1_000_000_000),
    };
    let times = [
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        t,
    ];
    // SAFETY: futimens on our open file with two valid timespecs.
    unsafe { libc::futimens(std::os::fd::AsRawFd::as_raw_fd(&f), times.as_ptr()) };
    f.sync_all()?;
    drop(f);
    fs::rename(&tmp, path)?;
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_overlay_is_collected_staged_and_applied() {
        let d = tempfile::tempdir().unwrap();
        let client = d.path().join("client");
        let upper = d.path().join("upper");
        fs::create_dir_all(client.join("sub")).unwrap();
        fs::write(client.join("old.txt"), b"old\n").unwrap();
        fs::write(client.join("gone.txt"), b"x").unwrap();
        fs::create_dir_all(upper.join("sub/new")).unwrap();
        fs::write(upper.join("old.txt"), b"new\n").unwrap();
        fs::write(upper.join("sub/new/f.bin"), vec![7u8; 300_000]).unwrap();
        std::os::unix::fs::symlink("old.txt", upper.join("ln")).unwrap();
        // A whiteout: a 0:0 character device.
        let wo = CString::new(upper.join("gone.txt").as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid path; mknod of a 0:0 char device (root only).
        let r = unsafe { libc::mknod(wo.as_ptr(), libc::S_IFCHR | 0o600, 0) };
        let cdir = client.to_string_lossy().into_owned();
        let (changes, files) = collect(&[(upper.clone(), cdir)], false).unwrap();
        let mut s = Staged::new(changes, std::slice::from_ref(&client)).unwrap();
        for (i, f) in files.iter().enumerate() {
            chunks(f, |off, b| {
                s.write(i as u64, off, &b).map_err(io::Error::other)
            })
            .unwrap();
        }
        s.complete().unwrap();
        let mut diff = Vec::new();
        s.diff(&mut diff).unwrap();
        let diff = String::from_utf8_lossy(&diff);
        assert!(diff.contains("-old\n+new"), "{diff}");
        s.apply().unwrap();
        assert_eq!(fs::read(client.join("old.txt")).unwrap(), b"new\n");
        assert_eq!(
            fs::read(client.join("sub/new/f.bin")).unwrap().len(),
            300_000
        );
        assert_eq!(
            fs::read_link(client.join("ln")).unwrap(),
            Path::new("old.txt")
        );
        if r == 0 {
            assert!(!client.join("gone.txt").exists());
        }
    }

    #[test]
    fn paths_outside_the_projection_and_bad_contents_are_refused() {
        let dirs = [PathBuf::from("/home/u/p")];
        for bad in [
            "/home/u/p",
            "/home/u/pp/x",
            "/home/u/p/../x",
            "/etc/passwd",
            "rel",
        ] {
            let c = vec![MxChange::Delete { path: bad.into() }];
            assert!(
                matches!(Staged::new(c, &dirs), Err(OverlayError::Outside(_))),
                "{bad}"
            );
        }
        let c = vec![MxChange::Write {
            path: "/home/u/p/f".into(),
            mode: 0o644,
            size: 3,
            vnode: 0,
            mtime_ns: 0,
        }];
        let mut s = Staged::new(c, &dirs).unwrap();
        assert!(s.write(1, 0, b"x").is_err(), "unknown vnode");
        assert!(s.write(0, 1, b"x").is_err(), "out of order");
        assert!(s.write(0, 0, b"abcd").is_err(), "longer than announced");
        s.write(0, 0, b"ab").unwrap();
        let e = s.complete().unwrap_err();
        assert!(
            e.to_string()
                .contains("sent 2 bytes for /home/u/p/f, which it announced as 3"),
            "{e}"
        );
    }
}

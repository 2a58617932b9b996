//! The sans-IO decision: what the supervisor does with one trapped open.
//!
//! The caller copies the path out of the guest, makes it absolute (from the
//! guest's cwd or directory descriptor) and passes it here; no file system is
//! touched. A `Project` answer is tentative: the supervisor falls back to
//! `Continue` when the projected root does not hold the file.

use std::path::{Component, Path, PathBuf};

/// What to do with one trapped call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Let the kernel run the call natively (`SECCOMP_USER_NOTIF_FLAG_CONTINUE`).
    Continue,
    /// Fail the call with this errno.
    Deny(i32),
    /// Open `rel` under the projected root on the supervisor's side and inject
    /// the descriptor (`SECCOMP_IOCTL_NOTIF_ADDFD`); `write` says the guest
    /// asked for write access, which the read-only projection refuses.
    Project { rel: PathBuf, write: bool },
}

/// One trapped open, as the supervisor saw it.
#[derive(Debug, Clone)]
pub struct OpenRequest<'a> {
    /// The path as the guest passed it (may be relative).
    pub path: &'a Path,
    /// The directory a relative path is resolved against (the guest's cwd or
    /// `dirfd`), if the supervisor could tell.
    pub base: Option<&'a Path>,
    /// The `open(2)` flags.
    pub flags: i32,
}

/// The per-guest policy: denied paths and the projected root.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    deny: Vec<PathBuf>,
    root: Option<PathBuf>,
}

/// Paths a guest never opens, even when the supervisor could.
pub const DEFAULT_DENY: &[&str] = &["/etc/shadow", "/etc/gshadow", "/etc/sudoers"];

/// Trees that always come from the server's own kernel, never the projection.
const NATIVE_TREES: &[&str] = &["/proc", "/sys", "/dev"];

impl Policy {
    /// A policy with [`DEFAULT_DENY`] and no projected root.
    #[must_use]
    pub fn new() -> Self {
        Self {
            deny: DEFAULT_DENY.iter().map(PathBuf::from).collect(),
            root: None,
        }
    }

    /// Also deny `path` and everything under it (lexically, after `.`/`..`).
    #[must_use]
    pub fn deny(mut self, path: &Path) -> Self {
        self.deny.push(normalise(Path::new("/"), path));
        self
    }

    /// Project the files under `root` over the guest's `/`.
    #[must_use]
    pub fn with_root(mut self, root: PathBuf) -> Self {
        self.root = Some(root);
        self
    }

    /// The projected root, if any.
    #[must_use]
    pub fn root(&self) -> Option<&Path> {
        self.root.as_deref()
    }

    /// Whether `abs` (absolute and normalised) is on the deny list.
    #[must_use]
    pub fn is_denied(&self, abs: &Path) -> bool {
        self.deny.iter().any(|d| abs.starts_with(d))
    }

    /// Decide one open.
    #[must_use]
    pub fn decide(&self, req: &OpenRequest<'_>) -> Decision {
        let abs = if req.path.is_absolute() {
            normalise(Path::new("/"), req.path)
        } else if let Some(base) = req.base.filter(|b| b.is_absolute()) {
            normalise(base, req.path)
        } else {
            // A relative path against something that is not a directory we
            // can name (an anonymous inode, a vanished fd): the kernel fails
            // or resolves it against what the guest already holds.
            return Decision::Continue;
        };
        if self.is_denied(&abs) {
            return Decision::Deny(libc::EACCES);
        }
        if self.root.is_none() || NATIVE_TREES.iter().any(|t| abs.starts_with(t)) {
            return Decision::Continue;
        }
        let rel = abs.strip_prefix("/").unwrap_or(&abs).to_path_buf();
        if rel.as_os_str().is_empty() {
            return Decision::Continue;
        }
        let acc = req.flags & libc::O_ACCMODE;
        let write = acc == libc::O_WRONLY
            || acc == libc::O_RDWR
            || req.flags & (libc::O_CREAT | libc::O_TRUNC | libc::O_APPEND) != 0;
        Decision::Project { rel, write }
    }
}

/// Join `path` onto `base` and resolve `.` and `..` lexically, never above `/`.
#[must_use]
pub fn normalise(base: &Path, path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    let joined = base.join(path);
    for c in joined.components() {
        match c {
            Component::Normal(s) => out.push(s),
            Component::ParentDir => {
                out.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(path: &str, flags: i32) -> OpenRequest<'_> {
        OpenRequest {
            path: Path::new(path),
            base: Some(Path::new("/home/u")),
            flags,
        }
    }

    #[test]
    fn denies_shadow_even_through_dotdot() {
        let p = Policy::new();
        assert_eq!(
            p.decide(&req("/etc/shadow", 0)),
            Decision::Deny(libc::EACCES)
        );
        assert_eq!(
            p.decide(&req("../../etc/./shadow", 0)),
            Decision::Deny(libc::EACCES)
        );
        assert_eq!(p.decide(&req("/etc/passwd", 0)), Decision::Continue);
    }

    #[test]
    fn projects_under_root_but_not_proc() {
        let p = Policy::new().with_root(PathBuf::from("/srv/proj"));
        assert_eq!(
            p.decide(&req("notes.txt", libc::O_RDONLY)),
            Decision::Project {
                rel: PathBuf::from("home/u/notes.txt"),
                write: false
            }
        );
        assert_eq!(p.decide(&req("/proc/self/maps", 0)), Decision::Continue);
        assert_eq!(
            p.decide(&req("/tmp/x", libc::O_WRONLY | libc::O_CREAT)),
            Decision::Project {
                rel: PathBuf::from("tmp/x"),
                write: true
            }
        );
    }

    #[test]
    fn relative_without_base_continues() {
        let p = Policy::new();
        let r = OpenRequest {
            path: Path::new("shadow"),
            base: None,
            flags: 0,
        };
        assert_eq!(p.decide(&r), Decision::Continue);
    }

    #[test]
    fn extra_deny_covers_subtree() {
        let p = Policy::new().deny(Path::new("/secret/"));
        assert_eq!(
            p.decide(&req("/secret/a/b", 0)),
            Decision::Deny(libc::EACCES)
        );
        assert_eq!(p.decide(&req("/secretive", 0)), Decision::Continue);
    }
}

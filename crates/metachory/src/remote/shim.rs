//! The container of a remote guest: `sidecore __mx-init SPEC`, started by
//! the server for each session (a fresh process, single-threaded, so it may
//! unshare a user namespace and fork freely).
//!
//! It unshares mount, network, PID, IPC and UTS namespaces (and, in the
//! unprivileged mode, a user namespace first), builds the guest's root on a
//! tmpfs — the server's system directories bound read-only, a private `/tmp`
//! and `/dev`, the secrets masked — mounts the FUSE projection of the
//! client's directories (the server serves it) and an overlayfs over each
//! (the write-back overlay: writes land in the server's work directory), and
//! forks the guest's init (PID 1 of the new namespace). Init mounts `/proc`,
//! pivots into the new root, forks the guest and passes signals on to it.
//! The guest installs the seccomp filter (or waits to be traced) and execs.
//!
//! Everything reports to the server over the control socket (descriptor 3):
//! `fuse` with the `/dev/fuse` descriptor, `init PID`, `seccomp` with the
//! listener, `ptrace` (with the guest's credentials), `exit CODE SIGNAL`,
//! `error TEXT`; for a migrating guest, the restorer's messages
//! ([`crate::migrate::restorer`]).

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};

use serde::{Deserialize, Serialize};

use crate::fdpass::{send_fd, send_msg};
use crate::filter;

/// The control socket's descriptor number in the shim and its children.
pub const CTL_FD: RawFd = 3;

/// What the server asks the shim to build.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ShimSpec {
    /// The session's work directory on the server (root, lower, upper, work).
    pub work: PathBuf,
    /// Client directories projected at the same paths.
    pub project: Vec<String>,
    pub cwd: String,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Standard input is a terminal (make it the controlling one).
    pub tty: bool,
    /// Unprivileged mode: a user namespace mapping its root to `map_uid`.
    pub userns: bool,
    pub map_uid: u32,
    pub map_gid: u32,
    /// Wait to be traced instead of installing the seccomp filter.
    pub ptrace: bool,
    /// Become a migrating guest instead of starting `argv` (`Some(lazy)`):
    /// the guest's process is a restorer ([`crate::migrate::restorer`]).
    #[serde(default)]
    pub restore: Option<bool>,
}

/// System directories bound read-only into the guest's root (or recreated
/// as the symlinks they are on a merged-/usr system).
const SYSTEM: &[&str] = &[
    "usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "opt",
];
/// Device nodes bound from the host.
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];
/// Files masked with /dev/null in the guest's view.
const MASKED: &[&str] = &["etc/shadow", "etc/gshadow", "etc/sudoers", "etc/ssh"];

fn cstr(p: impl AsRef<OsStr>) -> io::Result<CString> {
    CString::new(p.as_ref().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

fn check(r: libc::c_int, what: &str) -> io::Result<()> {
    if r < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("{what}: {e}")));
    }
    Ok(())
}

fn mount(
    src: &str,
    target: &Path,
    fstype: &str,
    flags: libc::c_ulong,
    data: &str,
) -> io::Result<()> {
    let (s, t, f, d) = (cstr(src)?, cstr(target)?, cstr(fstype)?, cstr(data)?);
    // SAFETY: all pointers are NUL-terminated strings alive for the call.
    let r = unsafe {
        libc::mount(
            s.as_ptr(),
            t.as_ptr(),
            f.as_ptr(),
            flags,
            if data.is_empty() {
                std::ptr::null()
            } else {
                d.as_ptr().cast()
            },
        )
    };
    check(r, &format!("mount {fstype} on {}", target.display()))
}

fn bind_ro(src: &Path, target: &Path) -> io::Result<()> {
    let s = src.to_string_lossy();
    mount(&s, target, "", libc::MS_BIND | libc::MS_REC, "")?;
    mount(
        "",
        target,
        "",
        libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_REC,
        "",
    )
}

fn write_file(path: &str, text: &str) -> io::Result<()> {
    std::fs::write(path, text).map_err(|e| io::Error::new(e.kind(), format!("{path}: {e}")))
}

fn enter_namespaces(spec: &ShimSpec) -> io::Result<()> {
    if spec.userns {
        // Become the unprivileged user first: a process may map only its
        // own user into a namespace it makes.
        // SAFETY: setgroups/setresgid/setresuid with plain integers.
        unsafe {
            check(libc::setgroups(0, std::ptr::null()), "drop groups")?;
            check(
                libc::setresgid(spec.map_gid, spec.map_gid, spec.map_gid),
                "setresgid",
            )?;
            check(
                libc::setresuid(spec.map_uid, spec.map_uid, spec.map_uid),
                "setresuid",
            )?;
            // Changing user made /proc/self root's: make it ours again.
            libc::prctl(libc::PR_SET_DUMPABLE, 1);
        }
        // SAFETY: unshare with flag bits only; this process is single-threaded.
        let r = unsafe { libc::unshare(libc::CLONE_NEWUSER) };
        check(r, "unshare a user namespace")?;
        write_file("/proc/self/setgroups", "deny")?;
        write_file("/proc/self/uid_map", &format!("0 {} 1", spec.map_uid))?;
        write_file("/proc/self/gid_map", &format!("0 {} 1", spec.map_gid))?;
    }
    let flags = libc::CLONE_NEWNS
        | libc::CLONE_NEWNET
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUTS;
    // SAFETY: unshare with flag bits only.
    let r = unsafe { libc::unshare(flags) };
    check(r, "unshare mount, network, PID, IPC and UTS namespaces")?;
    mount("", Path::new("/"), "", libc::MS_REC | libc::MS_PRIVATE, "")?;
    let name = b"metachory";
    // SAFETY: a valid buffer and its length.
    unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) };
    loopback_up();
    Ok(())
}

/// Brings `lo` up in the new network namespace (best effort: a guest
/// without it still runs).
fn loopback_up() {
    // SAFETY: a plain socket for the interface ioctls, closed below.
    let s = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if s < 0 {
        return;
    }
    // SAFETY: ifreq is plain data; all-zero is valid.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, c) in ifr.ifr_name.iter_mut().zip(b"lo\0") {
        *d = *c as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS/SIOCSIFFLAGS on a valid ifreq.
    unsafe {
        if libc::ioctl(s, libc::SIOCGIFFLAGS, &raw mut ifr) == 0 {
            ifr.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            libc::ioctl(s, libc::SIOCSIFFLAGS, &raw mut ifr);
        }
        libc::close(s);
    }
}

/// The guest's root: a tmpfs with the system bound in, devices, `/tmp`.
fn build_root(root: &Path) -> io::Result<()> {
    std::fs::create_dir_all(root)?;
    mount("mx-root", root, "tmpfs", libc::MS_NOSUID, "mode=0755")?;
    for name in SYSTEM {
        let host = Path::new("/").join(name);
        let here = root.join(name);
        match std::fs::symlink_metadata(&host) {
            Ok(m) if m.file_type().is_symlink() => {
                std::os::unix::fs::symlink(std::fs::read_link(&host)?, &here)?;
            }
            Ok(m) if m.is_dir() => {
                std::fs::create_dir(&here)?;
                bind_ro(&host, &here)?;
            }
            _ => {}
        }
    }
    for d in [
        "proc", "tmp", "dev", "root", "home", "run", "var", "var/tmp",
    ] {
        std::fs::create_dir_all(root.join(d))?;
    }
    mount(
        "mx-tmp",
        &root.join("tmp"),
        "tmpfs",
        libc::MS_NOSUID | libc::MS_NODEV,
        "mode=1777",
    )?;
    mount(
        "mx-vartmp",
        &root.join("var/tmp"),
        "tmpfs",
        libc::MS_NOSUID | libc::MS_NODEV,
        "mode=1777",
    )?;
    let dev = root.join("dev");
    mount("mx-dev", &dev, "tmpfs", libc::MS_NOSUID, "mode=0755")?;
    for d in DEVICES {
        let target = dev.join(d);
        std::fs::write(&target, b"")?;
        mount(&format!("/dev/{d}"), &target, "", libc::MS_BIND, "")?;
    }
    for d in ["pts", "shm"] {
        std::fs::create_dir(dev.join(d))?;
    }
    mount(
        "mx-shm",
        &dev.join("shm"),
        "tmpfs",
        libc::MS_NOSUID | libc::MS_NODEV,
        "mode=1777",
    )?;
    // A private devpts instance: the guest's terminal, if any, was opened by
    // the server from the host's; this one serves ptys the guest makes.
    let _ = mount(
        "devpts",
        &dev.join("pts"),
        "devpts",
        libc::MS_NOSUID | libc::MS_NOEXEC,
        "newinstance,ptmxmode=0666,mode=620",
    );
    let _ = std::os::unix::fs::symlink("pts/ptmx", dev.join("ptmx"));
    for (l, t) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        std::os::unix::fs::symlink(t, dev.join(l))?;
    }
    Ok(())
}

/// The FUSE projection: mounted here, served by the server through the
/// descriptor sent over the control socket.
fn open_fuse() -> io::Result<RawFd> {
    let dev = cstr("/dev/fuse")?;
    // SAFETY: a NUL-terminated path.
    let fd = unsafe { libc::open(dev.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    check(fd, "open /dev/fuse")?;
    Ok(fd)
}

fn mount_projection(lower: &Path, fd: RawFd) -> io::Result<()> {
    std::fs::create_dir_all(lower)?;
    let opts =
        format!("fd={fd},rootmode=40000,user_id=0,group_id=0,allow_other,default_permissions");
    mount(
        "sidecore-mx",
        lower,
        "fuse.sidecore-mx",
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_RDONLY,
        &opts,
    )?;
    let r = send_fd(CTL_FD, b"fuse", fd);
    // SAFETY: our copy of the descriptor; the server holds its own now.
    unsafe { libc::close(fd) };
    r
}

/// The write-back overlay over each projected directory.
fn mount_overlays(spec: &ShimSpec, root: &Path) -> io::Result<()> {
    for (i, dir) in spec.project.iter().enumerate() {
        let target = root.join(dir.trim_start_matches('/'));
        std::fs::create_dir_all(&target).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot project {dir}: its place in the guest's root cannot be made: {e}"),
            )
        })?;
        let (lower, upper, work) = (
            spec.work.join("lower").join(i.to_string()),
            spec.work.join("upper").join(i.to_string()),
            spec.work.join("work").join(i.to_string()),
        );
        std::fs::create_dir_all(&upper)?;
        std::fs::create_dir_all(&work)?;
        like_lower(&lower, &upper)?;
        // `volatile`: the overlay never syncs its upper directory (the
        // server's disk). It is read back into the client's memory at the
        // guest's end and thrown away with the session, so nothing is lost;
        // without it every container's unmount waited for the whole disk's
        // writeback (seconds on a busy machine, D state in
        // wb_wait_for_completion).
        let mut data = format!(
            "lowerdir={},upperdir={},workdir={},volatile",
            lower.display(),
            upper.display(),
            work.display()
        );
        if spec.userns {
            data.push_str(",userxattr");
        }
        mount("mx-overlay", &target, "overlay", libc::MS_NOSUID, &data)?;
    }
    Ok(())
}

/// Gives the upper directory the projected directory's owner, mode and
/// times: overlayfs shows a merged directory with its upper's attributes,
/// and a listing of the guest's working directory must equal the client's.
fn like_lower(lower: &Path, upper: &Path) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(lower)?;
    // In the unprivileged mode the client's owner is not mapped: keep ours.
    let _ = std::os::unix::fs::chown(upper, Some(m.uid()), Some(m.gid()));
    std::fs::set_permissions(
        upper,
        std::os::unix::fs::PermissionsExt::from_mode(m.mode() & 0o7777),
    )?;
    let times = [
        libc::timespec {
            tv_sec: m.atime(),
            tv_nsec: m.atime_nsec(),
        },
        libc::timespec {
            tv_sec: m.mtime(),
            tv_nsec: m.mtime_nsec(),
        },
    ];
    let p = cstr(upper)?;
    // SAFETY: a NUL-terminated path and two timespecs.
    check(
        unsafe { libc::utimensat(libc::AT_FDCWD, p.as_ptr(), times.as_ptr(), 0) },
        "set the overlay's times",
    )
}

fn mask_secrets(root: &Path) {
    for m in MASKED {
        let p = root.join(m);
        let _ = if p.is_dir() {
            mount("mx-mask", &p, "tmpfs", libc::MS_RDONLY, "mode=0")
        } else if p.exists() {
            mount("/dev/null", &p, "", libc::MS_BIND, "")
        } else {
            Ok(())
        };
    }
}

/// Entry point of `sidecore __mx-init`: returns the shim's exit code.
#[must_use]
pub fn main(spec_json: &str) -> i32 {
    let spec: ShimSpec = match serde_json::from_str(spec_json) {
        Ok(s) => s,
        Err(e) => {
            let _ = send_msg(CTL_FD, format!("error bad shim spec: {e}").as_bytes());
            return 2;
        }
    };
    match setup_and_run(&spec) {
        Ok(code) => code,
        Err(e) => {
            let _ = send_msg(CTL_FD, format!("error {e}").as_bytes());
            1
        }
    }
}

fn setup_and_run(spec: &ShimSpec) -> io::Result<i32> {
    // The projection is mounted while still privileged, in a mount
    // namespace of its own: FUSE wants the device opened in the user
    // namespace that mounts it, and the device is root's alone here. The
    // unprivileged mode's namespaces then inherit the mount.
    // SAFETY: unshare with a flag.
    let r = unsafe { libc::unshare(libc::CLONE_NEWNS) };
    check(r, "unshare a mount namespace")?;
    mount("", Path::new("/"), "", libc::MS_REC | libc::MS_PRIVATE, "")?;
    mount_projection(&spec.work.join("lower"), open_fuse()?)?;
    enter_namespaces(spec)?;
    let root = spec.work.join("root");
    build_root(&root)?;
    mount_overlays(spec, &root)?;
    mask_secrets(&root);
    // SAFETY: this process is single-threaded: the child may run Rust code.
    let pid = unsafe { libc::fork() };
    check(pid, "fork the guest's init")?;
    if pid == 0 {
        let code = match init(spec, &root) {
            Ok(c) => c,
            Err(e) => {
                let _ = send_msg(CTL_FD, format!("error {e}").as_bytes());
                1
            }
        };
        // SAFETY: leaving the child without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    send_msg(CTL_FD, format!("init {pid}").as_bytes())?;
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &raw mut status, 0) };
    Ok(0)
}

/// The guest's PID: init passes signals on to its process group.
static GUEST: AtomicI32 = AtomicI32::new(0);

extern "C" fn pass_on(sig: libc::c_int) {
    let g = GUEST.load(Ordering::Relaxed);
    if g > 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe { libc::kill(-g, sig) };
    }
}

/// Signals init passes on to the guest.
const PASSED: &[libc::c_int] = &[
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGWINCH,
    libc::SIGCONT,
    libc::SIGTSTP,
];

/// PID 1 of the guest's namespace.
fn init(spec: &ShimSpec, root: &Path) -> io::Result<i32> {
    // SAFETY: prctl with integers: die with the shim.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    mount(
        "proc",
        &root.join("proc"),
        "proc",
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        "",
    )?;
    let old = root.join(".old");
    std::fs::create_dir_all(&old)?;
    let (r, o) = (cstr(root)?, cstr(&old)?);
    // SAFETY: two NUL-terminated paths.
    let pr = unsafe { libc::syscall(libc::SYS_pivot_root, r.as_ptr(), o.as_ptr()) };
    check(pr as i32, "pivot_root")?;
    std::env::set_current_dir("/")?;
    let dot_old = cstr("/.old")?;
    // SAFETY: a NUL-terminated path.
    let u = unsafe { libc::umount2(dot_old.as_ptr(), libc::MNT_DETACH) };
    check(u, "detach the old root")?;
    let _ = std::fs::remove_dir("/.old");
    std::env::set_current_dir(&spec.cwd)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot enter {}: {e}", spec.cwd)))?;
    // SAFETY: this process is single-threaded.
    let pid = unsafe { libc::fork() };
    check(pid, "fork the guest")?;
    if pid == 0 {
        let e = guest(spec);
        eprintln!("sidecore exec: {}: {e}", spec.argv[0]);
        let code = if e.kind() == io::ErrorKind::NotFound {
            127
        } else {
            126
        };
        // SAFETY: leaving the child.
        unsafe { libc::_exit(code) };
    }
    GUEST.store(pid, Ordering::Relaxed);
    for s in PASSED {
        // SAFETY: installing an async-signal-safe handler.
        unsafe { libc::signal(*s, pass_on as *const () as libc::sighandler_t) };
    }
    for fd in 0..=2 {
        // SAFETY: init keeps no standard descriptor: the guest's end of
        // each pipe closes when the guest's last process does.
        unsafe { libc::close(fd) };
    }
    loop {
        let mut status = 0;
        // SAFETY: reaping our children (and orphans reparented to init).
        let w = unsafe { libc::waitpid(-1, &raw mut status, 0) };
        if w < 0 {
            if io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Ok(1);
        }
        if w == pid {
            let (code, sig) = if libc::WIFSIGNALED(status) {
                (128 + libc::WTERMSIG(status), libc::WTERMSIG(status))
            } else {
                (libc::WEXITSTATUS(status), 0)
            };
            send_msg(CTL_FD, format!("exit {code} {sig}").as_bytes())?;
            // Init's exit ends every process left in the namespace.
            return Ok(0);
        }
    }
}

/// The guest: its own session, the supervision, then exec.
fn guest(spec: &ShimSpec) -> io::Error {
    // SAFETY: setsid and TIOCSCTTY with integers; the guest leads its session.
    unsafe {
        libc::setsid();
        if spec.tty {
            libc::ioctl(0, libc::TIOCSCTTY, 0);
        }
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    if let Some(lazy) = spec.restore {
        return crate::migrate::restorer::run(CTL_FD, lazy);
    }
    let r = if spec.ptrace {
        crate::ptrace::await_tracer(CTL_FD)
    } else {
        filter::install_and_send(filter::Profile::Container, CTL_FD)
    };
    if let Err(e) = r {
        return e;
    }
    // SAFETY: the control socket is the server's business, not the guest's.
    unsafe { libc::close(CTL_FD) };
    let argv: Vec<CString> = match spec.argv.iter().map(cstr).collect() {
        Ok(a) => a,
        Err(e) => return e,
    };
    let env: Vec<CString> = spec
        .env
        .iter()
        .filter_map(|(k, v)| CString::new(format!("{k}={v}")).ok())
        .collect();
    for (k, _) in std::env::vars_os() {
        // SAFETY: single-threaded child about to exec.
        unsafe { std::env::remove_var(k) };
    }
    for (k, v) in &spec.env {
        // SAFETY: as above.
        unsafe { std::env::set_var(k, v) };
    }
    let mut ap: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    ap.push(std::ptr::null());
    let mut ep: Vec<*const libc::c_char> = env.iter().map(|a| a.as_ptr()).collect();
    ep.push(std::ptr::null());
    // SAFETY: NULL-terminated arrays of NUL-terminated strings alive here.
    unsafe { libc::execvpe(argv[0].as_ptr(), ap.as_ptr(), ep.as_ptr()) };
    io::Error::last_os_error()
}

//! The restorer: the guest's process on the target before it is the guest.
//! The container's init forks it as it would fork a new guest; instead of
//! exec'ing a program it (lazily: first makes a userfaultfd for its own
//! memory, which the guest's will become, and hands it to the server),
//! installs the seccomp filter as every guest does, receives the migrated
//! descriptor table over the control socket (`SCM_RIGHTS`), puts each
//! descriptor at its number, reports where it keeps the rest, and waits.
//! The server then seizes it with ptrace and replaces its address space,
//! registers and signal state with the image's ([`super::restore`]).
//!
//! Control messages, server → restorer: `fd N stdio S C` (N is the session's
//! stdio stream S), `fd N file C` + descriptor, `map` + descriptor (a file
//! a region maps), `exe` + descriptor, `end` (C: close-on-exec 0/1).
//! Restorer → server: `uffd` + descriptor, `seccomp` + listener,
//! `installed CTL EXE MAP…` (where the control socket, the executable and the
//! mapped files now are; -1: none), `error TEXT`.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use crate::fdpass;

/// `UFFD_API` and the `UFFDIO_API` ioctl.
pub const UFFD_API: u64 = 0xAA;
pub const UFFDIO_API: libc::c_ulong = 0xc018_aa3f;

/// Where each migrated descriptor comes from.
enum Source {
    Stdio(RawFd),
    Passed(OwnedFd),
}

fn check(r: libc::c_int, what: &str) -> io::Result<libc::c_int> {
    if r < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("{what}: {e}")));
    }
    Ok(r)
}

/// A userfaultfd for this process's memory (the guest's after the
/// restore), its API handshake done.
fn userfaultfd() -> io::Result<RawFd> {
    // SAFETY: userfaultfd with flags.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) };
    let fd = check(fd as libc::c_int, "userfaultfd (lazy migration needs root)")?;
    let mut api = [UFFD_API, 0, 0];
    // SAFETY: UFFDIO_API on a new userfaultfd with a uffdio_api struct.
    let r = unsafe { libc::ioctl(fd, UFFDIO_API, api.as_mut_ptr()) };
    check(r, "UFFDIO_API")?;
    Ok(fd)
}

/// Runs the restorer in the freshly forked guest process; returns only on
/// failure (the server takes it over otherwise).
pub fn run(ctl: RawFd, lazy: bool) -> io::Error {
    match setup(ctl, lazy) {
        Ok(()) => loop {
            // SAFETY: waiting to be taken over; the tracer changes everything.
            unsafe { libc::pause() };
        },
        Err(e) => {
            let _ = fdpass::send_msg(ctl, format!("error {e}").as_bytes());
            e
        }
    }
}

fn setup(ctl: RawFd, lazy: bool) -> io::Result<()> {
    if lazy {
        let u = userfaultfd()?;
        fdpass::send_fd(ctl, b"uffd", u)?;
        // SAFETY: our copy; the server holds its own.
        unsafe { libc::close(u) };
    }
    crate::filter::install_and_send(crate::filter::Profile::Container, ctl)?;
    let (table, maps, exe) = receive(ctl)?;
    let (new_ctl, maps, exe) = install(ctl, table, maps, exe)?;
    let mut msg = format!("installed {new_ctl} {}", exe.unwrap_or(-1));
    for m in maps {
        msg.push_str(&format!(" {m}"));
    }
    fdpass::send_msg(new_ctl, msg.as_bytes())
}

type Table = Vec<(RawFd, Source, bool)>;

fn receive(ctl: RawFd) -> io::Result<(Table, Vec<OwnedFd>, Option<OwnedFd>)> {
    let (mut table, mut maps, mut exe) = (Vec::new(), Vec::new(), None);
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
    loop {
        let m = fdpass::recv(ctl)?.ok_or_else(|| bad("the server closed the control socket"))?;
        let text = String::from_utf8_lossy(&m.msg).into_owned();
        let w: Vec<&str> = text.split(' ').collect();
        let num = |i: usize| w.get(i).and_then(|x| x.parse::<i32>().ok());
        match (w.first().copied(), m.fd) {
            (Some("fd"), fd) => {
                let (Some(n), Some(cloexec)) =
                    (num(1), num(if w.get(2) == Some(&"stdio") { 4 } else { 3 }))
                else {
                    return Err(bad(&format!("bad table entry {text:?}")));
                };
                let src = match (w.get(2).copied(), fd, num(3)) {
                    (Some("stdio"), None, Some(s @ 0..=2)) => Source::Stdio(s),
                    (Some("file"), Some(fd), _) => Source::Passed(fd),
                    _ => return Err(bad(&format!("bad table entry {text:?}"))),
                };
                table.push((n, src, cloexec != 0));
            }
            (Some("map"), Some(fd)) => maps.push(fd),
            (Some("exe"), Some(fd)) => exe = Some(fd),
            (Some("end"), None) => return Ok((table, maps, exe)),
            _ => return Err(bad(&format!("unexpected control message {text:?}"))),
        }
    }
}

/// Moves `fd` to the lowest free number at or above `at` (close-on-exec).
fn above(fd: RawFd, at: RawFd) -> io::Result<RawFd> {
    // SAFETY: fcntl(F_DUPFD_CLOEXEC) with integers.
    check(
        unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, at) },
        "move a descriptor",
    )
}

fn install(
    ctl: RawFd,
    table: Table,
    maps: Vec<OwnedFd>,
    exe: Option<OwnedFd>,
) -> io::Result<(RawFd, Vec<RawFd>, Option<RawFd>)> {
    let hi = table
        .iter()
        .map(|(n, _, _)| *n)
        .max()
        .unwrap_or(2)
        .max(CTL_MIN)
        + 1;
    // Everything this process keeps goes above the highest number the
    // guest uses, before any dup2 can overwrite it.
    let stdio = [above(0, hi)?, above(1, hi)?, above(2, hi)?];
    let new_ctl = above(ctl, hi)?;
    let mut keep = vec![new_ctl];
    let mut srcs = Vec::new();
    for (n, src, cloexec) in table {
        let from = match src {
            Source::Stdio(s) => stdio[s as usize],
            Source::Passed(fd) => above(fd.as_raw_fd(), hi)?,
        };
        srcs.push((n, from, cloexec));
    }
    // Each original is closed as soon as it moved: its number may be one
    // the guest's table uses.
    let maps: Vec<RawFd> = maps
        .into_iter()
        .map(|m| above(m.as_raw_fd(), hi))
        .collect::<io::Result<_>>()?;
    let exe = exe.map(|e| above(e.as_raw_fd(), hi)).transpose()?;
    keep.extend(&maps);
    keep.extend(exe);
    for (n, from, cloexec) in &srcs {
        let flags = if *cloexec { libc::O_CLOEXEC } else { 0 };
        // SAFETY: dup3 with integers; `from` is above every target number.
        let r = unsafe { libc::dup3(*from, *n, flags) };
        check(r, "install a descriptor")?;
        keep.push(*n);
    }
    close_all_but(&keep)?;
    Ok((new_ctl, maps, exe))
}

/// The lowest number the control socket moves to (past the standard three).
const CTL_MIN: RawFd = 3;

fn close_all_but(keep: &[RawFd]) -> io::Result<()> {
    let open: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")?
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok()))
        .collect();
    for fd in open {
        if !keep.contains(&fd) {
            // SAFETY: closing a descriptor of this process that the guest
            // does not have (the directory's own one fails harmlessly).
            unsafe { libc::close(fd) };
        }
    }
    Ok(())
}

/// Sends the server's side of the table to the restorer over `ctl`.
pub fn send_table(
    ctl: RawFd,
    fds: &[(i32, Option<u8>, Option<OwnedFd>, bool)],
    maps: &[OwnedFd],
    exe: Option<&OwnedFd>,
) -> io::Result<()> {
    for (n, stdio, fd, cloexec) in fds {
        let c = u8::from(*cloexec);
        match (stdio, fd) {
            (Some(s), _) => fdpass::send_msg(ctl, format!("fd {n} stdio {s} {c}").as_bytes())?,
            (None, Some(fd)) => {
                fdpass::send_fd(ctl, format!("fd {n} file {c}").as_bytes(), fd.as_raw_fd())?;
            }
            (None, None) => {}
        }
    }
    for m in maps {
        fdpass::send_fd(ctl, b"map", m.as_raw_fd())?;
    }
    if let Some(e) = exe {
        fdpass::send_fd(ctl, b"exe", e.as_raw_fd())?;
    }
    fdpass::send_msg(ctl, b"end")
}

/// Parses `installed CTL EXE MAP…`.
#[must_use]
pub fn parse_installed(text: &str) -> Option<(i32, Option<i32>, Vec<i32>)> {
    let mut it = text.strip_prefix("installed ")?.split(' ');
    let ctl = it.next()?.parse().ok()?;
    let exe: i32 = it.next()?.parse().ok()?;
    let maps = it.map(str::parse).collect::<Result<Vec<i32>, _>>().ok()?;
    Some((ctl, (exe >= 0).then_some(exe), maps))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn installed_reports_parse() {
        assert_eq!(parse_installed("installed 9 -1"), Some((9, None, vec![])));
        assert_eq!(
            parse_installed("installed 9 10 11 12"),
            Some((9, Some(10), vec![11, 12]))
        );
        assert_eq!(parse_installed("installed x"), None);
    }
}

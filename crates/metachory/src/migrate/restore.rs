//! The target's half: turn the restorer ([`super::restorer`]) into the
//! guest of an [`MxImage`]. The files the guest had open or mapped are
//! reopened by path inside the guest's root (`openat2` with
//! `RESOLVE_IN_ROOT`, as the supervisor opens them) and handed over; then,
//! with the restorer held under ptrace, injected calls unmap all of its own
//! memory, move the kernel's `[vvar]`/`[vdso]` to where the image had them
//! (`mremap`: the guest's code and libc hold pointers into its vDSO), map
//! every region at its address, fill it, protect it as it was, set the mm
//! fields (`PR_SET_MM_MAP`), signal dispositions, mask and alternate stack,
//! the robust list, rseq, umask, personality, name and working directory,
//! close what the restorer kept, and finally load the registers and FPU
//! state. Nothing of the restorer is left in the guest.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;

use sidecore_wire::mx_image::{MxFdKind, MxImage, MxRegion, MxRegionKind, PAGE_BYTES};

use super::Error;
use super::checkpoint::words_regs;
use super::procfs;
use super::tracee::Tracee;

const PR_SET_MM: u64 = 35;
const PR_SET_MM_MAP: u64 = 14;
/// Bytes of `struct prctl_mm_map`.
const PRCTL_MM_MAP_BYTES: usize = 104;
/// `openat2` accepts only these flags (it refuses unknown bits).
const REOPEN_FLAGS: i32 = libc::O_ACCMODE
    | libc::O_APPEND
    | libc::O_NONBLOCK
    | libc::O_DSYNC
    | libc::O_SYNC
    | libc::O_DIRECT
    | libc::O_LARGEFILE
    | libc::O_DIRECTORY
    | libc::O_NOFOLLOW
    | libc::O_NOATIME
    | libc::O_PATH;

/// The files the guest will hold, opened on the target.
pub struct Files {
    /// (number, stdio stream, descriptor, close-on-exec) per image descriptor.
    pub fds: Vec<(i32, Option<u8>, Option<OwnedFd>, bool)>,
    /// Files regions map, by path (in the order sent to the restorer).
    pub maps: Vec<(String, OwnedFd)>,
    pub exe: Option<OwnedFd>,
}

fn open_in(root: &File, path: &str, flags: i32) -> Result<OwnedFd, Error> {
    let rel = path.trim_start_matches('/');
    let c = std::ffi::CString::new(if rel.is_empty() { "." } else { rel }.as_bytes())
        .map_err(|_| Error::Refused(format!("{path:?} holds a NUL")))?;
    // SAFETY: open_how is plain data; all-zero is valid.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = ((flags & REOPEN_FLAGS) | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: a NUL-terminated path and an open_how of the size passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            root.as_raw_fd(),
            c.as_ptr(),
            &raw const how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(Error::Os {
            what: format!("reopen {path} in the guest's root"),
            source: std::io::Error::last_os_error(),
        });
    }
    // SAFETY: a new descriptor from the kernel.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Opens the image's files in the guest's root on this side; a mapped file
/// whose size or time differs from the source's is refused (its pages
/// would not be the ones the guest saw).
pub fn open_files(root: &File, image: &MxImage) -> Result<Files, Error> {
    use std::os::unix::fs::MetadataExt;
    let mut fds = Vec::new();
    for f in &image.fds {
        match &f.what {
            MxFdKind::Stdio { stream } => fds.push((f.fd, Some(*stream), None, f.cloexec)),
            MxFdKind::File { path, flags, pos } => {
                let fd = open_in(root, path, *flags)?;
                if *pos > 0 {
                    // SAFETY: lseek on our descriptor.
                    unsafe { libc::lseek(fd.as_raw_fd(), *pos as libc::off_t, libc::SEEK_SET) };
                }
                fds.push((f.fd, None, Some(fd), f.cloexec));
            }
        }
    }
    let mut maps: Vec<(String, OwnedFd)> = Vec::new();
    for r in &image.regions {
        let MxRegionKind::File {
            path,
            size,
            mtime_ns,
            ..
        } = &r.what
        else {
            continue;
        };
        if maps.iter().any(|(p, _)| p == path) {
            continue;
        }
        let fd = open_in(root, path, libc::O_RDONLY)?;
        let md = File::from(fd.try_clone().map_err(|source| Error::Os {
            what: format!("dup {path}"),
            source,
        })?)
        .metadata()
        .map_err(|source| Error::Os {
            what: format!("stat {path}"),
            source,
        })?;
        let here = md.mtime() * 1_000_000_000 + md.mtime_nsec();
        if md.size() != *size || here != *mtime_ns {
            return Err(Error::Refused(format!(
                "the target's {path} differs from the source's ({} bytes, mtime {here} ns here; \
                 {size} bytes, {mtime_ns} ns there): the guest maps it",
                md.size()
            )));
        }
        maps.push((path.clone(), fd));
    }
    let exe = if image.task.exe.is_empty() {
        None
    } else {
        open_in(root, &image.task.exe, libc::O_RDONLY).ok()
    };
    Ok(Files { fds, maps, exe })
}

/// Where the restorer keeps what the restore needs (its report).
#[derive(Debug, Clone)]
pub struct Installed {
    pub ctl: i32,
    pub exe: Option<i32>,
    /// (path, descriptor number in the restorer), as [`Files::maps`].
    pub maps: Vec<(String, i32)>,
}

fn is_special(name: &str) -> bool {
    sidecore_wire::mx_image::SPECIAL_REGIONS.contains(&name) || name == "[vsyscall]"
}

/// Unmaps the restorer's memory, moves the kernel's regions and maps the
/// image's (writable, to be filled).
pub fn map_space(t: &mut Tracee, image: &MxImage, inst: &Installed) -> Result<(), Error> {
    let own = procfs::parse_maps(&procfs::read(t.pid, "maps")?).map_err(Error::Refused)?;
    for m in own.iter().filter(|m| !is_special(&m.name)) {
        t.call(
            "munmap (restorer)",
            libc::SYS_munmap,
            [m.start, m.end - m.start, 0, 0, 0, 0],
        )?;
    }
    move_specials(t, &own, image)?;
    for r in &image.regions {
        map_region(t, r, inst)?;
    }
    Ok(())
}

fn map_region(t: &mut Tracee, r: &MxRegion, inst: &Installed) -> Result<(), Error> {
    let rw = (libc::PROT_READ | libc::PROT_WRITE) as u64;
    let fixed = (libc::MAP_PRIVATE | libc::MAP_FIXED) as u64;
    let len = r.end - r.start;
    let args = match &r.what {
        MxRegionKind::Special { .. } => return Ok(()),
        MxRegionKind::Anon { stack } => {
            let grows = if *stack {
                libc::MAP_GROWSDOWN as u64
            } else {
                0
            };
            [
                r.start,
                len,
                rw,
                fixed | libc::MAP_ANONYMOUS as u64 | grows,
                u64::MAX,
                0,
            ]
        }
        MxRegionKind::File { path, offset, .. } => {
            let fd = inst
                .maps
                .iter()
                .find(|(p, _)| p == path)
                .map(|(_, fd)| *fd)
                .ok_or_else(|| Error::Refused(format!("{path} was not handed to the restorer")))?;
            [r.start, len, rw, fixed, fd as u64, *offset]
        }
    };
    let got = t.call("mmap (region)", libc::SYS_mmap, args)?;
    if got != r.start {
        return Err(Error::Refused(format!(
            "mmap of {:#x} landed at {got:#x}",
            r.start
        )));
    }
    Ok(())
}

/// A free stretch of `len` bytes away from the image's regions and `own`.
fn hole(image: &MxImage, own: &[procfs::MapLine], len: u64) -> Option<u64> {
    let busy = |a: u64| {
        image.regions.iter().any(|r| a < r.end && r.start < a + len)
            || own.iter().any(|m| a < m.end && m.start < a + len)
    };
    (1..4096u64)
        .map(|i| 0x1000_0000_0000 + i * 0x10_0000_0000)
        .find(|a| !busy(*a))
}

/// Moves `[vvar]`, `[vvar_vclock]` and `[vdso]` to the image's addresses
/// (through a hole, so that no move lands on another special region).
fn move_specials(t: &mut Tracee, own: &[procfs::MapLine], image: &MxImage) -> Result<(), Error> {
    let mut moves = Vec::new();
    for r in &image.regions {
        let MxRegionKind::Special { name } = &r.what else {
            continue;
        };
        let m = own.iter().find(|m| &m.name == name).ok_or_else(|| {
            Error::Refused(format!("this kernel maps no {name}, the source's did"))
        })?;
        if m.end - m.start != r.end - r.start {
            return Err(Error::Refused(format!(
                "this kernel's {name} has {} bytes, the source's {}: different kernels",
                m.end - m.start,
                r.end - r.start
            )));
        }
        moves.push((name.clone(), m.start, r.start, r.end - r.start));
    }
    if moves.iter().all(|(_, from, to, _)| from == to) {
        return Ok(());
    }
    let span: u64 = moves.iter().map(|m| m.3).sum();
    let tmp =
        hole(image, own, span).ok_or_else(|| Error::Refused("no room to move the vDSO".into()))?;
    let mut at = tmp;
    let mut staged = Vec::new();
    for (name, from, to, len) in &moves {
        remap(t, name, *from, at, *len)?;
        staged.push((name, at, *to, *len));
        at += len;
    }
    for (name, from, to, len) in staged {
        remap(t, name, from, to, len)?;
    }
    Ok(())
}

fn remap(t: &mut Tracee, name: &str, from: u64, to: u64, len: u64) -> Result<(), Error> {
    let flags = (libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED) as u64;
    let got = t.call(
        "mremap (vDSO)",
        libc::SYS_mremap,
        [from, len, len, flags, to, 0],
    )?;
    if got != to {
        return Err(Error::Refused(format!(
            "{name} moved to {got:#x}, not {to:#x}"
        )));
    }
    if name == "[vdso]" {
        t.vdso_moved(from, to);
    }
    Ok(())
}

/// Checks that `len` bytes at `addr` lie in one region the source holds
/// data for, and writes them.
pub fn write_pages(t: &Tracee, image: &MxImage, addr: u64, data: &[u8]) -> Result<(), Error> {
    let end = addr + data.len() as u64;
    let ok = image
        .region_of(addr)
        .is_some_and(|r| end <= r.end && !matches!(r.what, MxRegionKind::Special { .. }));
    if !ok {
        return Err(Error::Refused(format!(
            "pages at {addr:#x}-{end:#x} lie in no region of the image"
        )));
    }
    t.write_mem(addr, data)
}

/// Everything after the memory: protections, mm fields, signals, the rest
/// of the task, closing what the restorer kept, registers.
pub fn finish(t: &mut Tracee, image: &MxImage, inst: &Installed) -> Result<(), Error> {
    for r in &image.regions {
        if !matches!(r.what, MxRegionKind::Special { .. }) {
            t.call(
                "mprotect",
                libc::SYS_mprotect,
                [r.start, r.end - r.start, u64::from(r.prot), 0, 0, 0],
            )?;
        }
    }
    let scratch = t.map_scratch()?;
    set_mm(t, image, inst, scratch)?;
    set_signals(t, image, scratch)?;
    set_task(t, image, scratch)?;
    for fd in std::iter::once(inst.ctl)
        .chain(inst.exe)
        .chain(inst.maps.iter().map(|(_, fd)| *fd))
    {
        t.call("close", libc::SYS_close, [fd as u64, 0, 0, 0, 0, 0])?;
    }
    t.unmap_scratch(scratch)?;
    t.set_regs(&words_regs(&image.regs))?;
    t.set_xstate(&image.xstate)
}

fn set_mm(t: &mut Tracee, image: &MxImage, inst: &Installed, scratch: u64) -> Result<(), Error> {
    let m = &image.mm;
    let auxv_at = scratch + PRCTL_MM_MAP_BYTES as u64;
    let auxv: Vec<u8> = m.auxv.iter().flat_map(|w| w.to_le_bytes()).collect();
    let mut b = Vec::with_capacity(PRCTL_MM_MAP_BYTES);
    for w in [
        m.start_code,
        m.end_code,
        m.start_data,
        m.end_data,
        m.start_brk,
        m.brk,
        m.start_stack,
        m.arg_start,
        m.arg_end,
        m.env_start,
        m.env_end,
        auxv_at,
    ] {
        b.extend_from_slice(&w.to_le_bytes());
    }
    b.extend_from_slice(&u32::try_from(auxv.len()).unwrap_or(0).to_le_bytes());
    let exe_fd = inst.exe.map_or(u32::MAX, |e| e as u32);
    b.extend_from_slice(&exe_fd.to_le_bytes());
    b.extend_from_slice(&auxv);
    t.write_mem(scratch, &b)?;
    let args = [
        PR_SET_MM,
        PR_SET_MM_MAP,
        scratch,
        PRCTL_MM_MAP_BYTES as u64,
        0,
        0,
    ];
    let r = t.syscall(libc::SYS_prctl, args)?;
    if r >= 0 {
        return Ok(());
    }
    if inst.exe.is_none() {
        return Err(Error::Os {
            what: format!("prctl(PR_SET_MM_MAP) in PID {}", t.pid),
            source: std::io::Error::from_raw_os_error(-r as i32),
        });
    }
    // Without the executable: `/proc/self/exe` keeps the restorer's.
    b[100..104].copy_from_slice(&u32::MAX.to_le_bytes());
    t.write_mem(scratch, &b)?;
    t.call("prctl(PR_SET_MM_MAP)", libc::SYS_prctl, args)?;
    Ok(())
}

fn set_signals(t: &mut Tracee, image: &MxImage, scratch: u64) -> Result<(), Error> {
    let s = &image.signals;
    for a in &s.actions {
        let b: Vec<u8> = [a.handler, a.flags, a.restorer, a.mask]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        t.write_mem(scratch, &b)?;
        t.call(
            "rt_sigaction",
            libc::SYS_rt_sigaction,
            [a.sig as u64, scratch, 0, 8, 0, 0],
        )?;
    }
    let (sp, flags, size) = s.altstack;
    let mut b = Vec::new();
    b.extend_from_slice(&sp.to_le_bytes());
    b.extend_from_slice(&(i64::from(flags) as u64).to_le_bytes());
    b.extend_from_slice(&size.to_le_bytes());
    t.write_mem(scratch, &b)?;
    // A disabled stack is set as disabled (the restorer's Rust runtime had one).
    t.call(
        "sigaltstack",
        libc::SYS_sigaltstack,
        [scratch, 0, 0, 0, 0, 0],
    )?;
    t.write_mem(scratch, &s.blocked.to_le_bytes())?;
    t.call(
        "rt_sigprocmask",
        libc::SYS_rt_sigprocmask,
        [libc::SIG_SETMASK as u64, scratch, 0, 8, 0, 0],
    )?;
    Ok(())
}

fn set_task(t: &mut Tracee, image: &MxImage, scratch: u64) -> Result<(), Error> {
    let k = &image.task;
    let (head, len) = k.robust_list;
    if head != 0 {
        t.call(
            "set_robust_list",
            libc::SYS_set_robust_list,
            [head, len, 0, 0, 0, 0],
        )?;
    }
    if let Some(r) = k.rseq {
        t.call(
            "rseq",
            libc::SYS_rseq,
            [r.addr, u64::from(r.len), 0, u64::from(r.sig), 0, 0],
        )?;
    }
    t.call(
        "umask",
        libc::SYS_umask,
        [u64::from(k.umask), 0, 0, 0, 0, 0],
    )?;
    t.call(
        "personality",
        libc::SYS_personality,
        [u64::from(k.personality), 0, 0, 0, 0, 0],
    )?;
    let mut name = k.comm.as_bytes()[..k.comm.len().min(15)].to_vec();
    name.push(0);
    t.write_mem(scratch, &name)?;
    t.call(
        "prctl(PR_SET_NAME)",
        libc::SYS_prctl,
        [libc::PR_SET_NAME as u64, scratch, 0, 0, 0, 0],
    )?;
    if !k.cwd.is_empty() {
        let mut p = std::path::Path::new(&k.cwd).as_os_str().as_bytes().to_vec();
        p.push(0);
        if p.len() <= PAGE_BYTES as usize {
            t.write_mem(scratch, &p)?;
            t.call("chdir", libc::SYS_chdir, [scratch, 0, 0, 0, 0, 0])?;
        }
    }
    Ok(())
}

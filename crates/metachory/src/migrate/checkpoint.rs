//! The source's half: freeze a guest and capture it as an [`MxImage`]
//! (registers, FPU state, memory map with the pages that hold data, the mm
//! fields, descriptors, signal dispositions, mask and alternate stack, the
//! robust-futex list and rseq area), then read its pages for the page
//! stream. The guest stays frozen under ptrace while the image travels;
//! [`Frozen::thaw`] lets it go on where it was if the migration fails.

use sidecore_wire::mx_image::{
    MxFd, MxFdKind, MxImage, MxMm, MxRegion, MxRegionKind, MxRseq, MxSigaction, MxSignals, MxTask,
    PAGE_BYTES, SPECIAL_REGIONS,
};

use super::Error;
use super::procfs::{self, MapLine, PM_FILE, PM_PRESENT, PM_SWAPPED};
use super::tracee::Tracee;

/// Errnos a call interrupted by the freeze may carry in `rax`.
const ERESTARTSYS: i64 = 512;
const ERESTARTNOINTR: i64 = 513;
const ERESTARTNOHAND: i64 = 514;
const ERESTART_RESTARTBLOCK: i64 = 516;
/// `O_CLOEXEC` as fdinfo shows it.
const FD_CLOEXEC_FLAG: i32 = libc::O_CLOEXEC;

/// What the source knows beyond the guest itself.
#[derive(Debug, Clone, Copy)]
pub struct CaptureOptions {
    pub session: u64,
    pub lazy: bool,
    /// Inodes of the session's stdin, stdout and stderr pipes (0: none).
    pub stdio_inodes: [u64; 3],
}

/// A frozen guest and its image.
pub struct Frozen {
    pub image: MxImage,
    tracee: Tracee,
    regs: libc::user_regs_struct,
    xstate: Vec<u8>,
}

/// Rewinds a call the freeze interrupted so that it runs again on the
/// target (as the kernel would have on resuming it): `ERESTARTSYS`,
/// `ERESTARTNOINTR`, `ERESTARTNOHAND`, and — unlike CRIU, which returns
/// EINTR — `ERESTART_RESTARTBLOCK` too, by calling the original call again
/// with its original arguments (a relative sleep then starts over: it may
/// last longer, never shorter). `orig_rax` becomes -1 so that the target's
/// kernel adds no restart of its own.
#[must_use]
pub fn rewind(mut r: libc::user_regs_struct) -> libc::user_regs_struct {
    if (r.orig_rax as i64) >= 0 {
        let rax = r.rax as i64;
        if [
            -ERESTARTSYS,
            -ERESTARTNOINTR,
            -ERESTARTNOHAND,
            -ERESTART_RESTARTBLOCK,
        ]
        .contains(&rax)
        {
            r.rax = r.orig_rax;
            r.rip -= 2;
        }
    }
    r.orig_rax = u64::MAX;
    r
}

/// Checks that the guest is one process with one thread.
pub fn check_migratable(pid: i32) -> Result<(), Error> {
    let threads = procfs::threads(pid)?;
    if threads != 1 {
        return Err(Error::Refused(format!(
            "the guest (PID {pid}) has {threads} threads: only single-threaded guests migrate \
             (CRIU is the tool for threads, and it does not run on this kernel)"
        )));
    }
    let kids = procfs::children(pid)?;
    if !kids.is_empty() {
        return Err(Error::Refused(format!(
            "the guest (PID {pid}) has {} child process(es): only a single process migrates",
            kids.len()
        )));
    }
    Ok(())
}

/// Freezes `pid` and captures it.
pub fn freeze(pid: i32, opts: &CaptureOptions) -> Result<Frozen, Error> {
    check_migratable(pid)?;
    let mut tracee = Tracee::seize(pid)?;
    let regs = tracee.regs()?;
    let xstate = tracee.xstate()?;
    // Reads that need the guest itself; its registers are put back after.
    let injected = inject_reads(&mut tracee);
    tracee.set_regs(&regs)?;
    let (brk, signals) = injected?;
    // Threads may not appear while it is stopped; check again to be sure.
    check_migratable(pid)?;
    let regions = regions(pid)?;
    let image = MxImage {
        session: opts.session,
        lazy: opts.lazy,
        regs: regs_words(&rewind(regs)),
        xstate: xstate.clone(),
        regions,
        mm: mm(pid, brk)?,
        fds: fds(pid, opts.stdio_inodes)?,
        signals,
        task: task(pid, &tracee)?,
        stdin_pending: Vec::new(),
        stdin_eof: false,
    };
    Ok(Frozen {
        image,
        tracee,
        regs,
        xstate,
    })
}

/// `brk`, and the signal state, asked of the guest through injected calls
/// on a scratch page it maps and unmaps.
fn inject_reads(t: &mut Tracee) -> Result<(u64, MxSignals), Error> {
    let page = t.map_scratch()?;
    let r = signal_state(t, page);
    let brk = t.call("brk", libc::SYS_brk, [0; 6]);
    t.unmap_scratch(page)?;
    Ok((brk?, r?))
}

fn signal_state(t: &mut Tracee, page: u64) -> Result<MxSignals, Error> {
    let mut actions = Vec::new();
    for sig in 1..=64i32 {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        t.call(
            "rt_sigaction",
            libc::SYS_rt_sigaction,
            [sig as u64, 0, page, 8, 0, 0],
        )?;
        let mut b = [0u8; 32];
        t.read_mem(page, &mut b)?;
        let w = words(&b);
        actions.push(MxSigaction {
            sig,
            handler: w[0],
            flags: w[1],
            restorer: w[2],
            mask: w[3],
        });
    }
    t.call("sigaltstack", libc::SYS_sigaltstack, [0, page, 0, 0, 0, 0])?;
    let mut b = [0u8; 24];
    t.read_mem(page, &mut b)?;
    let w = words(&b);
    #[allow(clippy::cast_possible_truncation)] // ss_flags is an int
    let altstack = (w[0], w[1] as u32 as i32, w[2]);
    t.call(
        "rt_sigprocmask",
        libc::SYS_rt_sigprocmask,
        [libc::SIG_BLOCK as u64, 0, page, 8, 0, 0],
    )?;
    let mut b = [0u8; 8];
    t.read_mem(page, &mut b)?;
    Ok(MxSignals {
        blocked: u64::from_le_bytes(b),
        actions,
        altstack,
    })
}

fn words(b: &[u8]) -> Vec<u64> {
    b.chunks_exact(8)
        .map(|c| {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            u64::from_le_bytes(w)
        })
        .collect()
}

/// `user_regs_struct` as words, in its field order.
#[must_use]
pub fn regs_words(r: &libc::user_regs_struct) -> Vec<u64> {
    vec![
        r.r15, r.r14, r.r13, r.r12, r.rbp, r.rbx, r.r11, r.r10, r.r9, r.r8, r.rax, r.rcx, r.rdx,
        r.rsi, r.rdi, r.orig_rax, r.rip, r.cs, r.eflags, r.rsp, r.ss, r.fs_base, r.gs_base, r.ds,
        r.es, r.fs, r.gs,
    ]
}

/// The inverse of [`regs_words`] (27 words, checked by the image).
#[must_use]
pub fn words_regs(w: &[u64]) -> libc::user_regs_struct {
    // SAFETY: all-zero is a valid user_regs_struct.
    let mut r: libc::user_regs_struct = unsafe { std::mem::zeroed() };
    let f: [&mut u64; 27] = [
        &mut r.r15,
        &mut r.r14,
        &mut r.r13,
        &mut r.r12,
        &mut r.rbp,
        &mut r.rbx,
        &mut r.r11,
        &mut r.r10,
        &mut r.r9,
        &mut r.r8,
        &mut r.rax,
        &mut r.rcx,
        &mut r.rdx,
        &mut r.rsi,
        &mut r.rdi,
        &mut r.orig_rax,
        &mut r.rip,
        &mut r.cs,
        &mut r.eflags,
        &mut r.rsp,
        &mut r.ss,
        &mut r.fs_base,
        &mut r.gs_base,
        &mut r.ds,
        &mut r.es,
        &mut r.fs,
        &mut r.gs,
    ];
    for (slot, v) in f.into_iter().zip(w) {
        *slot = *v;
    }
    r
}

fn regions(pid: i32) -> Result<Vec<MxRegion>, Error> {
    let maps = procfs::parse_maps(&procfs::read(pid, "maps")?).map_err(Error::Refused)?;
    let mut out = Vec::new();
    for m in &maps {
        if m.name == "[vsyscall]" {
            continue;
        }
        if let Some(r) = region(pid, m)? {
            out.push(r);
        }
    }
    Ok(out)
}

fn region(pid: i32, m: &MapLine) -> Result<Option<MxRegion>, Error> {
    let what = if SPECIAL_REGIONS.contains(&m.name.as_str()) {
        return Ok(Some(MxRegion {
            start: m.start,
            end: m.end,
            prot: m.prot(),
            what: MxRegionKind::Special {
                name: m.name.clone(),
            },
            pages: vec![],
        }));
    } else if m.shared {
        return Err(Error::Refused(format!(
            "the guest shares memory at {:#x}-{:#x} ({}): shared mappings do not migrate",
            m.start,
            m.end,
            if m.name.is_empty() {
                "anonymous"
            } else {
                &m.name
            }
        )));
    } else if m.name.starts_with('/') && m.inode != 0 && !m.name.ends_with(" (deleted)") {
        file_kind(pid, m)?
    } else if m.name.is_empty()
        || m.name == "[heap]"
        || m.name == "[stack]"
        || m.name.starts_with("[anon")
    {
        MxRegionKind::Anon {
            stack: m.name == "[stack]",
        }
    } else if m.name.starts_with('/') {
        // A deleted file (or a memfd): its pages travel whole, as anonymous memory.
        MxRegionKind::Anon { stack: false }
    } else {
        return Err(Error::Refused(format!(
            "the guest maps {} at {:#x}: not a region that migrates",
            m.name, m.start
        )));
    };
    let pages = (m.end - m.start) / PAGE_BYTES;
    let entries = if m.prot() == 0 {
        // A guard region: nothing readable in it.
        vec![0; usize::try_from(pages).unwrap_or(0)]
    } else {
        procfs::pagemap(pid, m.start, pages)?
    };
    let held = match &what {
        MxRegionKind::File { .. } => procfs::runs(&entries, |e| {
            e & (PM_PRESENT | PM_SWAPPED) != 0 && e & PM_FILE == 0
        }),
        _ if m.name.starts_with('/') => vec![(0, pages)],
        _ => procfs::runs(&entries, |e| e & (PM_PRESENT | PM_SWAPPED) != 0),
    };
    Ok(Some(MxRegion {
        start: m.start,
        end: m.end,
        prot: m.prot(),
        what,
        pages: held,
    }))
}

fn file_kind(pid: i32, m: &MapLine) -> Result<MxRegionKind, Error> {
    use std::os::unix::fs::MetadataExt;
    let link = format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end);
    let md = std::fs::metadata(&link).map_err(|source| Error::Os {
        what: format!("{link} ({})", m.name),
        source,
    })?;
    Ok(MxRegionKind::File {
        path: m.name.clone(),
        offset: m.offset,
        size: md.size(),
        mtime_ns: md.mtime() * 1_000_000_000 + md.mtime_nsec(),
    })
}

fn mm(pid: i32, brk: u64) -> Result<MxMm, Error> {
    let s = procfs::parse_stat_mm(&procfs::read(pid, "stat")?).map_err(Error::Refused)?;
    let auxv = words(&procfs::read_bytes(pid, "auxv")?);
    Ok(MxMm {
        start_code: s.start_code,
        end_code: s.end_code,
        start_data: s.start_data,
        end_data: s.end_data,
        start_brk: s.start_brk,
        brk,
        start_stack: s.start_stack,
        arg_start: s.arg_start,
        arg_end: s.arg_end,
        env_start: s.env_start,
        env_end: s.env_end,
        auxv,
    })
}

fn fds(pid: i32, stdio: [u64; 3]) -> Result<Vec<MxFd>, Error> {
    let dir = format!("/proc/{pid}/fd");
    let rd = std::fs::read_dir(&dir).map_err(|source| Error::Os {
        what: dir.clone(),
        source,
    })?;
    let mut out = Vec::new();
    for e in rd.flatten() {
        let Some(fd) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let target = std::fs::read_link(e.path())
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        let (pos, flags) = procfs::parse_fdinfo(&procfs::read(pid, &format!("fdinfo/{fd}"))?)
            .map_err(Error::Refused)?;
        let what = if let Some(ino) = target
            .strip_prefix("pipe:[")
            .and_then(|r| r.strip_suffix(']'))
            .and_then(|n| n.parse::<u64>().ok())
        {
            let stream = stdio.iter().position(|&s| s != 0 && s == ino).ok_or_else(|| {
                Error::Refused(format!(
                    "descriptor {fd} is a pipe the guest made: only the session's stdio pipes migrate"
                ))
            })?;
            MxFdKind::Stdio {
                stream: stream as u8,
            }
        } else if target.starts_with('/') && !target.ends_with(" (deleted)") {
            MxFdKind::File {
                path: target,
                flags: flags & !(libc::O_CREAT | libc::O_TRUNC | libc::O_EXCL | FD_CLOEXEC_FLAG),
                pos,
            }
        } else {
            return Err(Error::Refused(format!(
                "descriptor {fd} is {target}: only files, devices and the session's stdio migrate"
            )));
        };
        out.push(MxFd {
            fd,
            cloexec: flags & FD_CLOEXEC_FLAG != 0,
            what,
        });
    }
    out.sort_by_key(|f| f.fd);
    Ok(out)
}

fn task(pid: i32, t: &Tracee) -> Result<MxTask, Error> {
    let status = procfs::read(pid, "status")?;
    let umask = procfs::status_field(&status, "Umask")
        .and_then(|v| u32::from_str_radix(v, 8).ok())
        .unwrap_or(0o022);
    let personality =
        u32::from_str_radix(procfs::read(pid, "personality")?.trim(), 16).unwrap_or(0);
    let comm = procfs::read(pid, "comm")?.trim_end().to_string();
    let link = |n: &str| {
        std::fs::read_link(format!("/proc/{pid}/{n}"))
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let exe = Some(link("exe")).filter(|p| p.starts_with('/') && !p.ends_with(" (deleted)"));
    let (mut head, mut len) = (0u64, 0usize);
    // SAFETY: get_robust_list writes a pointer and a length into our locals.
    let r = unsafe { libc::syscall(libc::SYS_get_robust_list, pid, &raw mut head, &raw mut len) };
    let robust_list = if r == 0 { (head, len as u64) } else { (0, 0) };
    Ok(MxTask {
        cwd: link("cwd"),
        exe: exe.unwrap_or_default(),
        umask,
        personality,
        comm,
        robust_list,
        rseq: t.rseq().map(|(addr, len, sig)| MxRseq { addr, len, sig }),
    })
}

impl Frozen {
    /// The guest's PID.
    #[must_use]
    pub fn pid(&self) -> i32 {
        self.tracee.pid
    }

    /// Reads `buf.len()` bytes of the frozen guest's memory at `addr`.
    pub fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), Error> {
        self.tracee.read_mem(addr, buf)
    }

    /// The migration failed: the guest goes on where it was.
    pub fn thaw(self) -> Result<(), Error> {
        self.tracee.set_regs(&self.regs)?;
        self.tracee.set_xstate(&self.xstate)?;
        self.tracee.detach()
    }

    /// The guest runs on the target: end it here.
    pub fn kill(self) {
        // SAFETY: kill with a PID and SIGKILL; the tracee dies stopped or not.
        unsafe { libc::kill(self.tracee.pid, libc::SIGKILL) };
        drop(self.tracee);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interrupted_calls_are_rewound() {
        // SAFETY: all-zero is a valid user_regs_struct.
        let mut r: libc::user_regs_struct = unsafe { std::mem::zeroed() };
        r.orig_rax = 35; // nanosleep
        r.rax = (-ERESTART_RESTARTBLOCK) as u64;
        r.rip = 0x1002;
        let w = rewind(r);
        assert_eq!((w.rax, w.rip, w.orig_rax), (35, 0x1000, u64::MAX));
        r.rax = (-libc::EINTR as i64) as u64;
        let w = rewind(r);
        assert_eq!(
            (w.rip, w.orig_rax),
            (0x1002, u64::MAX),
            "EINTR is the call's own result"
        );
        r.orig_rax = u64::MAX;
        r.rax = (-ERESTARTSYS) as u64;
        assert_eq!(rewind(r).rip, 0x1002, "not in a call: nothing to rewind");
        let words = regs_words(&rewind(r));
        assert_eq!(regs_words(&words_regs(&words)), words);
    }
}

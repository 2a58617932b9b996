//! The PTRACE_SYSEMU supervisor: the fallback where seccomp user
//! notification is unavailable (or `--ptrace` forces it).
//!
//! Every system call of every guest task stops at its entry and is *not*
//! executed (SYSEMU). A refused call is answered there (its result written
//! into the registers): one stop. An allowed call is run natively by
//! rewinding the instruction pointer over the `syscall` instruction and
//! resuming with PTRACE_SYSCALL, so the kernel executes it, then resuming
//! with SYSEMU after its exit: three stops, the price of a supervisor that
//! has no way to let the kernel continue a call it stopped (MX's
//! two-stop cycle with its `getpid` nullification, §7.4, costs two).
//!
//! The tracer is one thread; it waits only for its own tracees
//! (`__WNOTHREAD`), never for the daemon's other children. x86-64 only.

use std::collections::HashMap;
use std::io;
use std::os::fd::RawFd;

use crate::fdpass::send_msg;

/// In the guest, before exec: ask the server to trace this process and
/// wait until it has (one byte on the control socket).
pub fn await_tracer(ctl: RawFd) -> io::Result<()> {
    send_msg(ctl, b"ptrace")?;
    let mut b = [0u8; 16];
    // SAFETY: reading into a local buffer.
    let n = unsafe { libc::read(ctl, b.as_mut_ptr().cast(), b.len()) };
    if n <= 0 {
        return Err(io::Error::new(
            io::ErrorKind::BrokenPipe,
            "the server did not start tracing",
        ));
    }
    Ok(())
}

/// Where a traced task stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum St {
    /// Running under SYSEMU: the next stop is an emulated entry.
    Emu,
    /// Rewound: the next stop is the real entry of the re-executed call.
    Entry,
    /// The next syscall stop is the real exit.
    Exit,
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{HashMap, RawFd, St};

    const EVENT_STOP: i32 = 128; // PTRACE_EVENT_STOP

    fn resume(tid: i32, st: St, sig: i32) {
        let req = if st == St::Emu {
            libc::PTRACE_SYSEMU
        } else {
            libc::PTRACE_SYSCALL
        };
        // SAFETY: ptrace on our tracee with a signal number as data.
        unsafe { libc::ptrace(req, tid, 0, sig as libc::c_long) };
    }

    fn regs(tid: i32) -> Option<libc::user_regs_struct> {
        // SAFETY: GETREGS fills a user_regs_struct; all-zero is valid.
        let mut r: libc::user_regs_struct = unsafe { std::mem::zeroed() };
        // SAFETY: a stopped tracee and a buffer of the right type.
        let ok = unsafe { libc::ptrace(libc::PTRACE_GETREGS, tid, 0, &raw mut r) } == 0;
        ok.then_some(r)
    }

    fn set_regs(tid: i32, r: &libc::user_regs_struct) {
        // SAFETY: as above, writing.
        unsafe { libc::ptrace(libc::PTRACE_SETREGS, tid, 0, r as *const _) };
    }

    /// The refusal a call gets, or `None` to run it.
    fn refuse(r: &libc::user_regs_struct) -> Option<(i32, String)> {
        let nr = r.orig_rax as i64;
        let denied = [
            libc::SYS_ptrace,
            libc::SYS_process_vm_readv,
            libc::SYS_process_vm_writev,
            libc::SYS_mount,
            libc::SYS_umount2,
            libc::SYS_pivot_root,
            libc::SYS_chroot,
            libc::SYS_unshare,
            libc::SYS_setns,
            libc::SYS_bpf,
            libc::SYS_init_module,
            libc::SYS_finit_module,
            libc::SYS_kexec_load,
            libc::SYS_reboot,
            libc::SYS_open_by_handle_at,
        ];
        if denied.contains(&nr) {
            return Some((
                libc::EPERM,
                format!("the guest tried system call {nr}: refused"),
            ));
        }
        if nr == libc::SYS_io_uring_setup || nr == libc::SYS_clone3 {
            return Some((libc::ENOSYS, String::new()));
        }
        let (domain, kind) = (r.rdi as i32, r.rsi as i32 & 0xf);
        if nr == libc::SYS_socket && (domain == libc::AF_PACKET || kind == libc::SOCK_RAW) {
            return Some((
                libc::EPERM,
                format!(
                    "the guest tried to open a raw socket (domain {domain}, type {kind}): refused"
                ),
            ));
        }
        None
    }

    /// Counters of one traced guest.
    #[derive(Default)]
    pub struct Tally {
        pub stops: u64,
        pub emulated: u64,
        pub native: u64,
    }

    pub fn seize(pid: i32) -> bool {
        let opts = libc::PTRACE_O_TRACESYSGOOD
            | libc::PTRACE_O_EXITKILL
            | libc::PTRACE_O_TRACECLONE
            | libc::PTRACE_O_TRACEFORK
            | libc::PTRACE_O_TRACEVFORK
            | libc::PTRACE_O_TRACEEXEC;
        // SAFETY: seize and interrupt a process that waits for us.
        unsafe {
            libc::ptrace(libc::PTRACE_SEIZE, pid, 0, opts as libc::c_long) == 0
                && libc::ptrace(libc::PTRACE_INTERRUPT, pid, 0, 0) == 0
        }
    }

    /// One stop of one task.
    fn on_stop(
        tid: i32,
        status: i32,
        tasks: &mut HashMap<i32, St>,
        t: &mut Tally,
        report: &dyn Fn(String),
    ) {
        t.stops += 1;
        let st = *tasks.entry(tid).or_insert(St::Emu);
        let sig = libc::WSTOPSIG(status);
        let event = status >> 16;
        if sig == (libc::SIGTRAP | 0x80) {
            let next = match st {
                St::Emu => {
                    let Some(mut r) = regs(tid) else {
                        return;
                    };
                    if let Some((e, why)) = refuse(&r) {
                        t.emulated += 1;
                        if !why.is_empty() {
                            report(why);
                        }
                        r.rax = (-i64::from(e)) as u64;
                        set_regs(tid, &r);
                        St::Emu
                    } else {
                        t.native += 1;
                        r.rax = r.orig_rax;
                        r.rip -= 2;
                        set_regs(tid, &r);
                        St::Entry
                    }
                }
                St::Entry => St::Exit,
                St::Exit => St::Emu,
            };
            tasks.insert(tid, next);
            resume(tid, next, 0);
        } else if sig == libc::SIGTRAP && event != 0 {
            if event == EVENT_STOP && st == St::Exit {
                // A new task's first stop arrives before its state is set.
            }
            resume(tid, st, 0);
        } else if event == EVENT_STOP {
            resume(tid, st, 0);
        } else {
            resume(tid, st, sig);
        }
    }

    /// Traces `pid` and every task it makes until all are gone.
    pub fn run(pid: i32, ctl: RawFd, report: &dyn Fn(String)) -> Tally {
        let mut t = Tally::default();
        if !seize(pid) {
            report(format!(
                "cannot trace PID {pid}: {}",
                std::io::Error::last_os_error()
            ));
            return t;
        }
        let mut tasks: HashMap<i32, St> = HashMap::new();
        tasks.insert(pid, St::Emu);
        let mut told = false;
        while !tasks.is_empty() {
            let mut status = 0;
            // SAFETY: waiting for our tracees only (__WNOTHREAD).
            let tid =
                unsafe { libc::waitpid(-1, &raw mut status, libc::__WALL | libc::__WNOTHREAD) };
            if tid < 0 {
                if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                break;
            }
            if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
                tasks.remove(&tid);
                continue;
            }
            if !told && tid == pid {
                told = true;
                // Traced: the guest may exec now.
                // SAFETY: one byte to the guest waiting in `await_tracer`.
                unsafe { libc::write(ctl, b"g".as_ptr().cast(), 1) };
            }
            on_stop(tid, status, &mut tasks, &mut t, report);
        }
        t
    }
}

/// Traces the guest `pid` (told to go on `ctl`) until all its tasks are
/// gone; the counters, as `sidecore exec` reports them.
pub fn trace(pid: i32, ctl: RawFd, report: &(dyn Fn(String) + Send + Sync)) -> String {
    #[cfg(target_arch = "x86_64")]
    {
        let _ = HashMap::<i32, St>::new();
        let t = x86::run(pid, ctl, report);
        format!(
            "stops={} emulated={} native={}",
            t.stops, t.emulated, t.native
        )
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (pid, ctl);
        report("PTRACE_SYSEMU supervision is implemented for x86-64 only".into());
        String::new()
    }
}

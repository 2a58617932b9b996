//! A task the migrator holds under ptrace: seized and stopped, its
//! registers and extended FPU state read and written, its memory read and
//! written with `process_vm_readv`/`writev`, and system calls *injected*:
//! the registers are set for the call, the instruction pointer is put on a
//! `syscall` instruction inside the task's own `[vdso]` (every process has
//! one; no code is planted), and one `PTRACE_SINGLESTEP` runs exactly that
//! instruction. `orig_rax` is set to -1 so the kernel never "restarts" an
//! injected call. x86-64 only.

use std::io;

use super::Error;

const PTRACE_EVENT_STOP: i32 = 128;
const NT_X86_XSTATE: usize = 0x202;
/// Largest `NT_X86_XSTATE` this side reads (AMX tiles included).
const XSTATE_BUF_BYTES: usize = 16 * 1024;
/// Bytes per `process_vm_readv`/`writev` call.
pub const VM_CHUNK_BYTES: usize = 1 << 20;
/// `PTRACE_GET_RSEQ_CONFIGURATION`.
const PTRACE_GET_RSEQ_CONFIGURATION: libc::c_uint = 0x420f;

/// A seized, stopped task.
pub struct Tracee {
    pub pid: i32,
    /// Address of a `syscall` instruction in the task's `[vdso]`.
    syscall_at: u64,
    /// Signals that arrived while the task was held, to deliver after.
    pub deferred: Vec<i32>,
    attached: bool,
}

fn os(what: impl Into<String>) -> impl FnOnce(io::Error) -> Error {
    let what = what.into();
    move |source| Error::Os { what, source }
}

fn last(what: String) -> Error {
    Error::Os {
        what,
        source: io::Error::last_os_error(),
    }
}

/// The `[vdso]` of `maps`, if any.
fn vdso(maps: &[super::procfs::MapLine]) -> Option<(u64, u64)> {
    maps.iter()
        .find(|m| m.name == "[vdso]")
        .map(|m| (m.start, m.end))
}

impl Tracee {
    /// Seizes `pid` and stops it (`PTRACE_SEIZE`, `PTRACE_INTERRUPT`).
    pub fn seize(pid: i32) -> Result<Tracee, Error> {
        // SAFETY: ptrace with integer arguments.
        if unsafe { libc::ptrace(libc::PTRACE_SEIZE, pid, 0, 0) } != 0 {
            return Err(last(format!("ptrace(SEIZE) PID {pid}")));
        }
        let mut t = Tracee {
            pid,
            syscall_at: 0,
            deferred: Vec::new(),
            attached: true,
        };
        // SAFETY: as above.
        if unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, pid, 0, 0) } != 0 {
            return Err(last(format!("ptrace(INTERRUPT) PID {pid}")));
        }
        t.wait_event_stop()?;
        t.find_syscall()?;
        Ok(t)
    }

    fn wait(&self) -> Result<i32, Error> {
        let mut status = 0;
        loop {
            // SAFETY: waiting for our tracee.
            let r = unsafe { libc::waitpid(self.pid, &raw mut status, libc::__WALL) };
            if r == self.pid {
                break;
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(os(format!("waitpid PID {}", self.pid))(e));
            }
        }
        if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
            return Err(Error::Refused(format!("PID {} ended while held", self.pid)));
        }
        Ok(status)
    }

    /// Waits for the stop `PTRACE_INTERRUPT` asked for; signals that come
    /// first are kept for later.
    fn wait_event_stop(&mut self) -> Result<(), Error> {
        loop {
            let status = self.wait()?;
            if status >> 16 == PTRACE_EVENT_STOP {
                return Ok(());
            }
            let sig = libc::WSTOPSIG(status);
            self.deferred.push(sig);
            // SAFETY: resuming our tracee, the signal suppressed (kept above).
            unsafe { libc::ptrace(libc::PTRACE_CONT, self.pid, 0, 0) };
        }
    }

    /// Finds a `syscall` instruction (0f 05) in the task's `[vdso]`.
    pub fn find_syscall(&mut self) -> Result<(), Error> {
        let maps = super::procfs::parse_maps(&super::procfs::read(self.pid, "maps")?)
            .map_err(Error::Refused)?;
        let (s, e) =
            vdso(&maps).ok_or_else(|| Error::Refused(format!("PID {} has no [vdso]", self.pid)))?;
        let mut code = vec![0u8; usize::try_from(e - s).unwrap_or(0)];
        self.read_mem(s, &mut code)?;
        let off = code
            .windows(2)
            .position(|w| w == [0x0f, 0x05])
            .ok_or_else(|| Error::Refused("no syscall instruction in the [vdso]".into()))?;
        self.syscall_at = s + off as u64;
        Ok(())
    }

    /// The general registers.
    pub fn regs(&self) -> Result<libc::user_regs_struct, Error> {
        // SAFETY: all-zero is a valid user_regs_struct.
        let mut r: libc::user_regs_struct = unsafe { std::mem::zeroed() };
        // SAFETY: GETREGS on a stopped tracee into a buffer of its type.
        if unsafe { libc::ptrace(libc::PTRACE_GETREGS, self.pid, 0, &raw mut r) } != 0 {
            return Err(last(format!("ptrace(GETREGS) PID {}", self.pid)));
        }
        Ok(r)
    }

    /// Sets the general registers.
    pub fn set_regs(&self, r: &libc::user_regs_struct) -> Result<(), Error> {
        // SAFETY: SETREGS from a buffer of its type.
        if unsafe { libc::ptrace(libc::PTRACE_SETREGS, self.pid, 0, std::ptr::from_ref(r)) } != 0 {
            return Err(last(format!("ptrace(SETREGS) PID {}", self.pid)));
        }
        Ok(())
    }

    /// The extended FPU state (`NT_X86_XSTATE`).
    pub fn xstate(&self) -> Result<Vec<u8>, Error> {
        let mut buf = vec![0u8; XSTATE_BUF_BYTES];
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // SAFETY: GETREGSET fills at most iov_len bytes and shrinks iov_len.
        let r = unsafe {
            libc::ptrace(
                libc::PTRACE_GETREGSET,
                self.pid,
                NT_X86_XSTATE as *mut libc::c_void,
                &raw mut iov,
            )
        };
        if r != 0 {
            return Err(last(format!("ptrace(GETREGSET xstate) PID {}", self.pid)));
        }
        buf.truncate(iov.iov_len);
        Ok(buf)
    }

    /// Sets the extended FPU state.
    pub fn set_xstate(&self, x: &[u8]) -> Result<(), Error> {
        let mut iov = libc::iovec {
            iov_base: x.as_ptr().cast_mut().cast(),
            iov_len: x.len(),
        };
        // SAFETY: SETREGSET reads iov_len bytes from the buffer.
        let r = unsafe {
            libc::ptrace(
                libc::PTRACE_SETREGSET,
                self.pid,
                NT_X86_XSTATE as *mut libc::c_void,
                &raw mut iov,
            )
        };
        if r != 0 {
            return Err(last(format!("ptrace(SETREGSET xstate) PID {}", self.pid)));
        }
        Ok(())
    }

    /// The registered rseq area: (address, length, signature), if any.
    pub fn rseq(&self) -> Option<(u64, u32, u32)> {
        let mut c = [0u64; 3];
        // SAFETY: the kernel writes a ptrace_rseq_configuration (24 bytes).
        let r = unsafe {
            libc::ptrace(
                PTRACE_GET_RSEQ_CONFIGURATION,
                self.pid,
                std::mem::size_of_val(&c),
                c.as_mut_ptr(),
            )
        };
        #[allow(clippy::cast_possible_truncation)] // two u32 halves of one word
        (r > 0 && c[0] != 0).then_some((c[0], c[1] as u32, (c[1] >> 32) as u32))
    }

    /// Injects system call `nr` with `args`; its result (negative: -errno).
    pub fn syscall(&mut self, nr: i64, args: [u64; 6]) -> Result<i64, Error> {
        let mut r = self.regs()?;
        r.rip = self.syscall_at;
        r.rax = nr as u64;
        r.orig_rax = u64::MAX;
        r.rdi = args[0];
        r.rsi = args[1];
        r.rdx = args[2];
        r.r10 = args[3];
        r.r8 = args[4];
        r.r9 = args[5];
        self.set_regs(&r)?;
        loop {
            // SAFETY: stepping our stopped tracee, no signal.
            if unsafe { libc::ptrace(libc::PTRACE_SINGLESTEP, self.pid, 0, 0) } != 0 {
                return Err(last(format!("ptrace(SINGLESTEP) PID {}", self.pid)));
            }
            let status = self.wait()?;
            let sig = libc::WSTOPSIG(status);
            let at = self.regs()?;
            if at.rip != self.syscall_at {
                if sig != libc::SIGTRAP {
                    self.deferred.push(sig);
                }
                return Ok(at.rax as i64);
            }
            // Stopped before the instruction ran (a signal, or the event stop).
            if sig != libc::SIGTRAP && status >> 16 == 0 {
                self.deferred.push(sig);
            }
        }
    }

    /// Like [`Tracee::syscall`], a negative result an error naming the call.
    pub fn call(&mut self, name: &str, nr: i64, args: [u64; 6]) -> Result<u64, Error> {
        let r = self.syscall(nr, args)?;
        if (-4095..0).contains(&r) {
            return Err(Error::Os {
                what: format!("{name} in PID {}", self.pid),
                source: io::Error::from_raw_os_error(-r as i32),
            });
        }
        Ok(r as u64)
    }

    /// Maps a private read-write page in the task for the arguments and
    /// results of injected calls; its address.
    pub fn map_scratch(&mut self) -> Result<u64, Error> {
        self.call(
            "mmap (scratch)",
            libc::SYS_mmap,
            [
                0,
                sidecore_wire::mx_image::PAGE_BYTES,
                (libc::PROT_READ | libc::PROT_WRITE) as u64,
                (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64,
                u64::MAX,
                0,
            ],
        )
    }

    /// Unmaps the page [`Tracee::map_scratch`] mapped at `page`.
    pub fn unmap_scratch(&mut self, page: u64) -> Result<(), Error> {
        self.call(
            "munmap (scratch)",
            libc::SYS_munmap,
            [page, sidecore_wire::mx_image::PAGE_BYTES, 0, 0, 0, 0],
        )
        .map(drop)
    }

    /// The `[vdso]` moved: find its `syscall` again.
    pub fn vdso_moved(&mut self, old_start: u64, new_start: u64) {
        self.syscall_at = self.syscall_at - old_start + new_start;
    }

    /// Reads the task's memory at `addr` into `buf`.
    pub fn read_mem(&self, addr: u64, buf: &mut [u8]) -> Result<(), Error> {
        self.vm(addr, buf.as_mut_ptr(), buf.len(), false)
    }

    /// Writes `buf` into the task's memory at `addr`.
    pub fn write_mem(&self, addr: u64, buf: &[u8]) -> Result<(), Error> {
        self.vm(addr, buf.as_ptr().cast_mut(), buf.len(), true)
    }

    fn vm(&self, addr: u64, ptr: *mut u8, len: usize, write: bool) -> Result<(), Error> {
        let mut done = 0;
        while done < len {
            let n = (len - done).min(VM_CHUNK_BYTES);
            let local = libc::iovec {
                // SAFETY: within the caller's buffer of `len` bytes.
                iov_base: unsafe { ptr.add(done) }.cast(),
                iov_len: n,
            };
            let remote = libc::iovec {
                iov_base: (addr + done as u64) as *mut libc::c_void,
                iov_len: n,
            };
            // SAFETY: one local iovec inside the caller's buffer; the remote
            // one is checked by the kernel against the tracee's map.
            let r = unsafe {
                if write {
                    libc::process_vm_writev(self.pid, &raw const local, 1, &raw const remote, 1, 0)
                } else {
                    libc::process_vm_readv(self.pid, &raw const local, 1, &raw const remote, 1, 0)
                }
            };
            if r <= 0 {
                let verb = if write { "write" } else { "read" };
                return Err(last(format!(
                    "{verb} {n} bytes at {:#x} of PID {}",
                    addr + done as u64,
                    self.pid
                )));
            }
            done += r as usize;
        }
        Ok(())
    }

    /// Lets the task go (its registers as they are now), delivering the
    /// signals that arrived while it was held.
    pub fn detach(mut self) -> Result<(), Error> {
        self.attached = false;
        // SAFETY: detaching our stopped tracee, no signal.
        if unsafe { libc::ptrace(libc::PTRACE_DETACH, self.pid, 0, 0) } != 0 {
            return Err(last(format!("ptrace(DETACH) PID {}", self.pid)));
        }
        for s in std::mem::take(&mut self.deferred) {
            if s != libc::SIGSTOP && s != libc::SIGTRAP {
                // SAFETY: kill with a PID and a signal.
                unsafe { libc::kill(self.pid, s) };
            }
        }
        Ok(())
    }
}

impl Drop for Tracee {
    fn drop(&mut self) {
        if self.attached {
            // SAFETY: best effort: let the task go.
            unsafe { libc::ptrace(libc::PTRACE_DETACH, self.pid, 0, 0) };
        }
    }
}

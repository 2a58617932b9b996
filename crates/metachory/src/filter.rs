//! The seccomp filter: classic BPF that sends the trapped calls to the
//! supervisor (`SECCOMP_RET_USER_NOTIF`) and allows everything else.
//!
//! Hand-written rather than through libseccomp: the program is a dozen
//! instructions (check the architecture, compare the syscall number against a
//! short list) and this keeps the crate free of a C library dependency.

use libc::sock_filter;

const BPF_LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
const BPF_JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
const BPF_JGE_K: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
const BPF_RET_K: u16 = 0x06; // BPF_RET | BPF_K

/// Offsets into `struct seccomp_data`.
const OFF_NR: u32 = 0;
const OFF_ARCH: u32 = 4;

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E; // AUDIT_ARCH_X86_64
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7; // AUDIT_ARCH_AARCH64

/// The calls sent to the supervisor, with the names the counters use.
#[cfg(target_arch = "x86_64")]
pub const TRAPPED: &[(i64, &str)] = &[(libc::SYS_openat, "openat"), (libc::SYS_open, "open")];
#[cfg(target_arch = "aarch64")]
pub const TRAPPED: &[(i64, &str)] = &[(libc::SYS_openat, "openat")];

/// Calls refused with ENOSYS so that callers fall back to a trapped one:
/// `openat2` passes its flags in a struct this slice does not decode yet.
pub const ENOSYS_CALLS: &[i64] = &[libc::SYS_openat2];

/// The name the counters use for syscall number `nr`.
#[must_use]
pub fn name(nr: i64) -> &'static str {
    TRAPPED
        .iter()
        .find(|(n, _)| *n == nr)
        .map_or("other", |(_, s)| s)
}

fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: usize, jf: usize) -> sock_filter {
    // Offsets are below 256: the program is a handful of instructions.
    sock_filter {
        code,
        jt: u8::try_from(jt).unwrap_or(u8::MAX),
        jf: u8::try_from(jf).unwrap_or(u8::MAX),
        k,
    }
}

/// Build the filter program.
#[must_use]
pub fn program() -> Vec<sock_filter> {
    let n_cmp = TRAPPED.len() + ENOSYS_CALLS.len();
    // Layout: [0] ld arch, [1] jeq arch, [2] ld nr, [3] jge x32,
    // [4..4+n_cmp] comparisons, then ALLOW, NOTIF, ENOSYS, KILL.
    let first_cmp = 4;
    let allow = first_cmp + n_cmp;
    let notif = allow + 1;
    let enosys = allow + 2;
    let kill = allow + 3;
    let mut p = vec![
        stmt(BPF_LD_W_ABS, OFF_ARCH),
        jump(BPF_JEQ_K, AUDIT_ARCH, 0, kill - 2),
        stmt(BPF_LD_W_ABS, OFF_NR),
        // x32 syscall numbers on x86_64 (bit 30) would dodge the comparisons.
        jump(BPF_JGE_K, 0x4000_0000, enosys - 4, 0),
    ];
    for (nr, _) in TRAPPED {
        let at = p.len();
        p.push(jump(BPF_JEQ_K, *nr as u32, notif - at - 1, 0));
    }
    for nr in ENOSYS_CALLS {
        let at = p.len();
        p.push(jump(BPF_JEQ_K, *nr as u32, enosys - at - 1, 0));
    }
    p.push(stmt(BPF_RET_K, libc::SECCOMP_RET_ALLOW));
    p.push(stmt(BPF_RET_K, libc::SECCOMP_RET_USER_NOTIF));
    p.push(stmt(
        BPF_RET_K,
        libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
    ));
    p.push(stmt(BPF_RET_K, libc::SECCOMP_RET_KILL_PROCESS));
    p
}

/// Which guest a filter is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// `sidecore exec` without a node: opens trapped, nothing else.
    Local,
    /// A remote guest in its container: opens trapped (and emulated by the
    /// supervisor), ptrace, cross-process memory access and sockets trapped
    /// (raw and packet sockets refused), calls that could leave the
    /// container refused with EPERM, and calls that bypass interposition
    /// (`io_uring`) or pass structs (`clone3`, `openat2`) refused with
    /// ENOSYS so that libc falls back.
    Container,
}

/// What the filter does with one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Notify,
    Errno(i32),
    /// EPERM when `args[0]` has any of these bits (clone's namespace flags).
    ErrnoIfArg0(i32, u32),
}

#[cfg(target_arch = "x86_64")]
const CONTAINER_NOTIFY: &[i64] = &[
    libc::SYS_openat,
    libc::SYS_open,
    libc::SYS_creat,
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_socket,
];
#[cfg(target_arch = "aarch64")]
const CONTAINER_NOTIFY: &[i64] = &[
    libc::SYS_openat,
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_socket,
];

/// Calls a contained guest may not make (EPERM).
const CONTAINER_EPERM: &[i64] = &[
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_reboot,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_userfaultfd,
    libc::SYS_fsopen,
    libc::SYS_fsmount,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
    libc::SYS_pidfd_getfd,
    libc::SYS_kcmp,
];

/// Calls refused with ENOSYS in a container: libc falls back, or the guest
/// does without.
const CONTAINER_ENOSYS: &[i64] = &[
    libc::SYS_openat2,
    libc::SYS_clone3,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
];

/// Namespace flags a contained guest may not pass to `clone`.
const CLONE_NS_FLAGS: u32 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWCGROUP) as u32;

const BPF_JSET_K: u16 = 0x45; // BPF_JMP | BPF_JSET | BPF_K
const OFF_ARG0_LO: u32 = 16;

fn rules(profile: Profile) -> Vec<(i64, Action)> {
    match profile {
        Profile::Local => TRAPPED
            .iter()
            .map(|(n, _)| (*n, Action::Notify))
            .chain(
                ENOSYS_CALLS
                    .iter()
                    .map(|n| (*n, Action::Errno(libc::ENOSYS))),
            )
            .collect(),
        Profile::Container => CONTAINER_NOTIFY
            .iter()
            .map(|n| (*n, Action::Notify))
            .chain(
                CONTAINER_EPERM
                    .iter()
                    .map(|n| (*n, Action::Errno(libc::EPERM))),
            )
            .chain(
                CONTAINER_ENOSYS
                    .iter()
                    .map(|n| (*n, Action::Errno(libc::ENOSYS))),
            )
            .chain(std::iter::once((
                libc::SYS_clone,
                Action::ErrnoIfArg0(libc::EPERM, CLONE_NS_FLAGS),
            )))
            .collect(),
    }
}

/// The filter for `profile`: architecture check, x32 refused, one
/// comparison per rule, then each rule's block.
#[must_use]
pub fn program_for(profile: Profile) -> Vec<sock_filter> {
    let rules = rules(profile);
    let mut p = vec![
        stmt(BPF_LD_W_ABS, OFF_ARCH),
        jump(BPF_JEQ_K, AUDIT_ARCH, 1, 0),
        stmt(BPF_RET_K, libc::SECCOMP_RET_KILL_PROCESS),
        stmt(BPF_LD_W_ABS, OFF_NR),
        // x32 numbers (bit 30) would dodge the comparisons.
        jump(BPF_JGE_K, 0x4000_0000, 0, 1),
        stmt(BPF_RET_K, libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32),
    ];
    let first_cmp = p.len();
    for (nr, _) in &rules {
        p.push(jump(BPF_JEQ_K, *nr as u32, 0, 0));
    }
    p.push(stmt(BPF_RET_K, libc::SECCOMP_RET_ALLOW));
    for (i, (_, action)) in rules.iter().enumerate() {
        let at = p.len();
        let cmp = first_cmp + i;
        let off = at - cmp - 1;
        assert!(
            off <= usize::from(u8::MAX),
            "seccomp filter too long for a jump"
        );
        p[cmp].jt = off as u8;
        match *action {
            Action::Notify => p.push(stmt(BPF_RET_K, libc::SECCOMP_RET_USER_NOTIF)),
            Action::Errno(e) => p.push(stmt(BPF_RET_K, libc::SECCOMP_RET_ERRNO | e as u32)),
            Action::ErrnoIfArg0(e, mask) => {
                p.push(stmt(BPF_LD_W_ABS, OFF_ARG0_LO));
                p.push(jump(BPF_JSET_K, mask, 0, 1));
                p.push(stmt(BPF_RET_K, libc::SECCOMP_RET_ERRNO | e as u32));
                p.push(stmt(BPF_RET_K, libc::SECCOMP_RET_ALLOW));
            }
        }
    }
    p
}

/// In a freshly forked guest (single-threaded: it may allocate): sets
/// no_new_privs, installs the filter for `profile` with a listener and
/// sends the listener over `sock` tagged `seccomp`.
pub fn install_and_send(profile: Profile, sock: std::os::fd::RawFd) -> std::io::Result<()> {
    let prog = program_for(profile);
    let fprog = libc::sock_fprog {
        len: u16::try_from(prog.len()).unwrap_or(u16::MAX),
        filter: prog.as_ptr().cast_mut(),
    };
    install_listener_and_send(&fprog, sock, b"seccomp")
}

/// Sets no_new_privs, installs `fprog` with a listener and sends the
/// listener over `sock` with message `tag`. Allocates nothing and makes only
/// async-signal-safe calls (prctl, seccomp, sendmsg, close), so it may run
/// between fork and exec.
pub fn install_listener_and_send(
    fprog: &libc::sock_fprog,
    sock: std::os::fd::RawFd,
    tag: &[u8],
) -> std::io::Result<()> {
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fprog` and the filter it points at are alive for the call;
    // the kernel copies the program.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            libc::SECCOMP_FILTER_FLAG_NEW_LISTENER,
            std::ptr::from_ref(fprog),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let fd = fd as std::os::fd::RawFd;
    let r = crate::fdpass::send_fd(sock, tag, fd);
    // SAFETY: our copy of the listener; the receiver holds its own.
    unsafe { libc::close(fd) };
    r
}

/// The counters' name for a container's trapped call.
#[must_use]
pub fn container_name(nr: i64) -> &'static str {
    match nr {
        n if n == libc::SYS_openat => "openat",
        #[cfg(target_arch = "x86_64")]
        n if n == libc::SYS_open => "open",
        #[cfg(target_arch = "x86_64")]
        n if n == libc::SYS_creat => "creat",
        n if n == libc::SYS_ptrace => "ptrace",
        n if n == libc::SYS_process_vm_readv => "process_vm_readv",
        n if n == libc::SYS_process_vm_writev => "process_vm_writev",
        n if n == libc::SYS_socket => "socket",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jumps_land_on_the_right_returns() {
        let p = program();
        let ret = |i: usize| p[i].k;
        let taken = |i: usize| ret(i + 1 + p[i].jt as usize);
        // jeq arch: false branch lands on KILL.
        assert_eq!(
            ret(1 + 1 + p[1].jf as usize),
            libc::SECCOMP_RET_KILL_PROCESS
        );
        for i in 4..4 + TRAPPED.len() {
            assert_eq!(taken(i), libc::SECCOMP_RET_USER_NOTIF);
        }
        let i = 4 + TRAPPED.len();
        assert_eq!(
            ret(i + 1 + p[i].jt as usize),
            libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32
        );
        assert_eq!(ret(3 + 1 + p[3].jt as usize), ret(i + 1 + p[i].jt as usize));
    }

    /// Runs a classic-BPF seccomp program on (nr, arg0) as the kernel would.
    fn run(p: &[sock_filter], nr: i64, arg0: u64) -> u32 {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&(nr as u32).to_le_bytes());
        data[4..8].copy_from_slice(&AUDIT_ARCH.to_le_bytes());
        data[16..24].copy_from_slice(&arg0.to_le_bytes());
        let (mut pc, mut a) = (0usize, 0u32);
        loop {
            let i = p[pc];
            match i.code {
                BPF_LD_W_ABS => {
                    let k = i.k as usize;
                    a = u32::from_le_bytes(data[k..k + 4].try_into().unwrap());
                    pc += 1;
                }
                BPF_RET_K => return i.k,
                BPF_JEQ_K | BPF_JGE_K | BPF_JSET_K => {
                    let t = match i.code {
                        BPF_JEQ_K => a == i.k,
                        BPF_JGE_K => a >= i.k,
                        _ => a & i.k != 0,
                    };
                    pc += 1 + usize::from(if t { i.jt } else { i.jf });
                }
                c => panic!("unknown instruction {c:#x}"),
            }
        }
    }

    #[test]
    fn the_container_profile_decides_as_documented() {
        let p = program_for(Profile::Container);
        assert_eq!(run(&p, libc::SYS_openat, 0), libc::SECCOMP_RET_USER_NOTIF);
        assert_eq!(run(&p, libc::SYS_ptrace, 0), libc::SECCOMP_RET_USER_NOTIF);
        assert_eq!(
            run(&p, libc::SYS_mount, 0),
            libc::SECCOMP_RET_ERRNO | libc::EPERM as u32
        );
        assert_eq!(
            run(&p, libc::SYS_io_uring_setup, 0),
            libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32
        );
        assert_eq!(run(&p, libc::SYS_getpid, 0), libc::SECCOMP_RET_ALLOW);
        assert_eq!(
            run(&p, libc::SYS_clone, libc::SIGCHLD as u64),
            libc::SECCOMP_RET_ALLOW
        );
        assert_eq!(
            run(
                &p,
                libc::SYS_clone,
                (libc::CLONE_NEWUSER | libc::SIGCHLD) as u64
            ),
            libc::SECCOMP_RET_ERRNO | libc::EPERM as u32
        );
        assert_eq!(
            run(&p, 0x4000_0000 | libc::SYS_mount, 0),
            libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32
        );
        let l = program_for(Profile::Local);
        assert_eq!(run(&l, libc::SYS_openat, 0), libc::SECCOMP_RET_USER_NOTIF);
        assert_eq!(run(&l, libc::SYS_mount, 0), libc::SECCOMP_RET_ALLOW);
    }
}

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
}

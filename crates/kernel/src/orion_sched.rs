//! Orion's explicit process sensors on the kernel PE: loads
//! `bpf/orion_sched.bpf.c`, attaches its `sched_process_fork`, `_exec` and
//! `_exit` programs (BTF tracepoints, or raw tracepoints where the kernel
//! refuses those; tracefs is never needed) for one watched cgroup v2 subtree,
//! and hands their ring-buffer records to the monitor ([`SchedEvents::drain`]),
//! which keeps its shadow process tree from them.
//!
//! The links belong to this process: dropping the [`SchedEvents`], or the
//! process dying, detaches the programs.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use aya::Ebpf;
use aya::maps::{Array, MapData, PerCpuArray, RingBuf};
use aya::programs::{BtfTracePoint, RawTracePoint};

use crate::error::{KernelError, chain};
use crate::objects;
use crate::sikker_l4::cgroup_id;

/// The object's name in errors.
const OBJECT: &str = "orion_sched";
/// The tracepoints, and the programs for each (BTF, then raw).
const HOOKS: [(&str, &str, &str); 3] = [
    ("sched_process_fork", "orion_fork", "orion_fork_raw"),
    ("sched_process_exec", "orion_exec", "orion_exec_raw"),
    ("sched_process_exit", "orion_exit", "orion_exit_raw"),
];
/// `comm` length (`TASK_COMM_LEN`).
pub const COMM_LEN: usize = 16;
/// Counter slots of `orion_stats`.
const STATS: u32 = 4;

/// `struct orion_cfg`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct RawCfg {
    cgroup_id: u64,
    level: u32,
    pad: u32,
}

// SAFETY: a plain `repr(C)` struct of integers with no implicit padding
// (8 + 4 + 4 bytes), valid for any bit pattern.
unsafe impl aya::Pod for RawCfg {}

/// What happened to a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchedKind {
    /// `pid` was forked by `ppid`.
    Fork,
    /// `pid` exec'd a new program (its `comm` is the new one).
    Exec,
    /// `pid` exited.
    Exit,
}

/// One record of `orion_events`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedEvent {
    /// CLOCK_MONOTONIC, ns.
    pub ts_ns: u64,
    pub kind: SchedKind,
    /// The process (thread group id).
    pub pid: u32,
    /// Fork: the parent process; else 0.
    pub ppid: u32,
    /// The real uid of the task that ran the hook (the parent, for a fork).
    pub uid: u32,
    /// The command name of the task that ran the hook.
    pub comm: String,
}

/// `struct orion_event`'s size.
pub const EVENT_BYTES: usize = 8 + 4 * 4 + COMM_LEN;

impl SchedEvent {
    /// Decodes a ring-buffer record; `None` when it is not one of ours.
    pub fn from_bytes(b: &[u8]) -> Option<SchedEvent> {
        let b = b.get(..EVENT_BYTES)?;
        let u32_at = |o: usize| {
            b.get(o..o + 4)
                .and_then(|s| s.try_into().ok())
                .map(u32::from_ne_bytes)
        };
        let ts_ns = u64::from_ne_bytes(b.get(0..8)?.try_into().ok()?);
        let kind = match u32_at(8)? {
            1 => SchedKind::Fork,
            2 => SchedKind::Exec,
            3 => SchedKind::Exit,
            _ => return None,
        };
        let comm = b.get(24..24 + COMM_LEN)?;
        let end = comm.iter().position(|c| *c == 0).unwrap_or(COMM_LEN);
        Some(SchedEvent {
            ts_ns,
            kind,
            pid: u32_at(12)?,
            ppid: u32_at(16)?,
            uid: u32_at(20)?,
            comm: String::from_utf8_lossy(&comm[..end]).into_owned(),
        })
    }
}

/// The programs' counters, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SchedStats {
    pub forks: u64,
    pub execs: u64,
    pub exits: u64,
    /// Records lost because the ring buffer was full.
    pub dropped: u64,
}

/// How the programs are attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchedAttach {
    /// `tp_btf/`: BTF-enabled tracepoints.
    BtfTracepoint,
    /// `raw_tp/`: raw tracepoints (the kernel refused tp_btf).
    RawTracepoint,
}

/// The fork/exec/exit sensors of one cgroup subtree, attached.
pub struct SchedEvents {
    ebpf: Ebpf,
    events: RingBuf<MapData>,
    cgroup: PathBuf,
    how: SchedAttach,
}

fn map_err(map: &'static str) -> impl Fn(aya::maps::MapError) -> KernelError {
    move |e| KernelError::Map {
        map: map.to_string(),
        detail: chain(&e),
    }
}

fn verify_err(program: &str) -> impl Fn(aya::programs::ProgramError) -> KernelError + '_ {
    move |e| crate::error::refused(program, &e)
}

/// The level of a cgroup v2 directory below the hierarchy's root (the root is 0).
pub fn cgroup_level(dir: &Path) -> Result<u32, KernelError> {
    let not = |detail: String| KernelError::NotCgroup2 {
        path: dir.display().to_string(),
        detail,
    };
    let dir = dir.canonicalize().map_err(|e| not(e.to_string()))?;
    let dev = std::fs::metadata(&dir)
        .map_err(|e| not(e.to_string()))?
        .dev();
    let mut level = 0;
    let mut cur = dir.as_path();
    // The root is the last ancestor on the same file system (cgroup2 mounts have no
    // parent of their own kind).
    while let Some(parent) = cur.parent() {
        match std::fs::metadata(parent) {
            Ok(m) if m.dev() == dev => {
                level += 1;
                cur = parent;
            }
            _ => break,
        }
    }
    Ok(level)
}

impl SchedEvents {
    /// Loads the programs (the verifier runs here), watches `cgroup` (a cgroup v2
    /// directory; its descendants are inside) and attaches them. The error says what
    /// the kernel refused: a kernel without BTF or BPF, or a caller without the
    /// privilege, gets it here and the monitor falls back to /proc scans.
    pub fn attach(cgroup: &Path) -> Result<SchedEvents, KernelError> {
        let id = cgroup_id(cgroup)?;
        let level = cgroup_level(cgroup)?;
        let mut ebpf = Ebpf::load(objects::orion_sched()).map_err(|e| KernelError::Load {
            object: OBJECT.into(),
            detail: chain(&e),
        })?;
        let mut cfg: Array<_, RawCfg> = Array::try_from(
            ebpf.map_mut("orion_cfg")
                .ok_or_else(|| missing("map", "orion_cfg"))?,
        )
        .map_err(map_err("orion_cfg"))?;
        cfg.set(
            0,
            RawCfg {
                cgroup_id: id,
                level,
                pad: 0,
            },
            0,
        )
        .map_err(map_err("orion_cfg"))?;
        let how = match attach_btf(&mut ebpf) {
            Ok(()) => SchedAttach::BtfTracepoint,
            Err(btf_err) => attach_raw(&mut ebpf).map_err(|raw_err| KernelError::Verify {
                program: "orion_sched".into(),
                detail: format!("tp_btf: {btf_err}; raw_tp: {raw_err}"),
            })?,
        };
        let events = RingBuf::try_from(
            ebpf.take_map("orion_events")
                .ok_or_else(|| missing("map", "orion_events"))?,
        )
        .map_err(map_err("orion_events"))?;
        Ok(SchedEvents {
            ebpf,
            events,
            cgroup: cgroup.to_owned(),
            how,
        })
    }

    /// The watched cgroup.
    pub fn cgroup(&self) -> &Path {
        &self.cgroup
    }

    /// How the programs are attached.
    pub fn attached_as(&self) -> SchedAttach {
        self.how
    }

    /// Hands every waiting record to `f`, oldest first; returns how many.
    pub fn drain(&mut self, mut f: impl FnMut(SchedEvent)) -> usize {
        let mut n = 0;
        while let Some(item) = self.events.next() {
            if let Some(e) = SchedEvent::from_bytes(&item) {
                f(e);
                n += 1;
            }
        }
        n
    }

    /// The programs' counters.
    pub fn stats(&self) -> Result<SchedStats, KernelError> {
        let map = self
            .ebpf
            .map("orion_stats")
            .ok_or_else(|| missing("map", "orion_stats"))?;
        let stats: PerCpuArray<_, u64> =
            PerCpuArray::try_from(map).map_err(map_err("orion_stats"))?;
        let mut v = [0u64; STATS as usize];
        for (i, slot) in v.iter_mut().enumerate() {
            let per_cpu = stats.get(&(i as u32), 0).map_err(map_err("orion_stats"))?;
            *slot = per_cpu.iter().sum();
        }
        Ok(SchedStats {
            forks: v[0],
            execs: v[1],
            exits: v[2],
            dropped: v[3],
        })
    }
}

fn missing(what: &'static str, name: &str) -> KernelError {
    KernelError::Missing {
        object: OBJECT.into(),
        what,
        name: name.to_string(),
    }
}

fn attach_btf(ebpf: &mut Ebpf) -> Result<(), KernelError> {
    let btf = aya::Btf::from_sys_fs().map_err(|e| KernelError::Load {
        object: OBJECT.into(),
        detail: format!("no kernel BTF (/sys/kernel/btf/vmlinux): {}", chain(&e)),
    })?;
    for (tp, prog, _) in HOOKS {
        let p: &mut BtfTracePoint = ebpf
            .program_mut(prog)
            .ok_or_else(|| missing("program", prog))?
            .try_into()
            .map_err(verify_err(prog))?;
        p.load(tp, &btf).map_err(verify_err(prog))?;
        p.attach().map_err(|e| KernelError::Attach {
            program: prog.into(),
            iface: format!("tracepoint {tp}"),
            netns: None,
            detail: chain(&e),
        })?;
    }
    Ok(())
}

fn attach_raw(ebpf: &mut Ebpf) -> Result<SchedAttach, KernelError> {
    for (tp, _, prog) in HOOKS {
        let p: &mut RawTracePoint = ebpf
            .program_mut(prog)
            .ok_or_else(|| missing("program", prog))?
            .try_into()
            .map_err(verify_err(prog))?;
        p.load().map_err(verify_err(prog))?;
        p.attach(tp).map_err(|e| KernelError::Attach {
            program: prog.into(),
            iface: format!("raw tracepoint {tp}"),
            netns: None,
            detail: chain(&e),
        })?;
    }
    Ok(SchedAttach::RawTracepoint)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_layout_decodes() {
        let mut b = vec![0u8; EVENT_BYTES];
        b[0..8].copy_from_slice(&7u64.to_ne_bytes());
        b[8..12].copy_from_slice(&1u32.to_ne_bytes());
        b[12..16].copy_from_slice(&42u32.to_ne_bytes());
        b[16..20].copy_from_slice(&41u32.to_ne_bytes());
        b[20..24].copy_from_slice(&1000u32.to_ne_bytes());
        b[24..28].copy_from_slice(b"bash");
        let e = SchedEvent::from_bytes(&b).unwrap();
        assert_eq!(
            (e.ts_ns, e.kind, e.pid, e.ppid, e.uid, e.comm.as_str()),
            (7, SchedKind::Fork, 42, 41, 1000, "bash")
        );
        b[8..12].copy_from_slice(&9u32.to_ne_bytes());
        assert!(SchedEvent::from_bytes(&b).is_none());
        assert!(SchedEvent::from_bytes(&b[..10]).is_none());
        assert_eq!(std::mem::size_of::<RawCfg>(), 16);
    }
}

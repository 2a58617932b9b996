//! Cores: which CPUs exist, which this process may use (its affinity, i.e. its
//! cpuset), which are isolated or tickless, their NUMA node and SMT siblings,
//! and which of them can be dedicated to a run-to-completion loop.

use std::path::Path;

use crate::cpulist;

const SYS_CPU: &str = "/sys/devices/system/cpu";

/// One CPU as discovered.
#[derive(Debug, Clone, PartialEq)]
pub struct CoreInfo {
    pub cpu: u32,
    pub isolated: bool,
    pub nohz_full: bool,
    pub numa: u32,
    pub siblings: Vec<u32>,
    /// `None` when the CPU can be dedicated; otherwise why not.
    pub not_dedicatable: Option<String>,
}

impl CoreInfo {
    /// One line for `sidecore devices`.
    pub fn describe(&self) -> String {
        let mut s = format!("CPU {} (NUMA {}", self.cpu, self.numa);
        if self.siblings.len() > 1 {
            s.push_str(&format!(
                ", SMT siblings {}",
                cpulist::format(&self.siblings)
            ));
        }
        if self.isolated {
            s.push_str(", isolated");
        }
        if self.nohz_full {
            s.push_str(", nohz_full");
        }
        s.push(')');
        s
    }
}

/// All CPUs, plus a summary line.
#[derive(Debug, Clone)]
pub struct Cores {
    pub cores: Vec<CoreInfo>,
    pub allowed_count: usize,
    pub summary: String,
}

fn read(path: impl AsRef<Path>) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// CPUs this process may run on (`sched_getaffinity`), i.e. its cpuset.
pub fn allowed_cpus() -> Vec<u32> {
    // SAFETY: cpu_set_t is plain data; zeroed is a valid empty set, and
    // sched_getaffinity writes at most size_of::<cpu_set_t>() bytes into it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is this thread; the pointer and size describe `set`.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return Vec::new();
    }
    (0..libc::CPU_SETSIZE as u32)
        // SAFETY: i < CPU_SETSIZE, so CPU_ISSET stays inside `set`.
        .filter(|&i| unsafe { libc::CPU_ISSET(i as usize, &set) })
        .collect()
}

/// Refuses `cpu` unless this process may run on it; the error holds the
/// CPUs it may use, for the caller's message.
pub fn usable_cpu(cpu: u32) -> Result<(), Vec<u32>> {
    let usable = allowed_cpus();
    if usable.contains(&cpu) {
        Ok(())
    } else {
        Err(usable)
    }
}

/// Pins the calling thread to one CPU. One system call and no allocation
/// (a CPU number too large is `EINVAL`), so it may also run between `fork`
/// and `exec`.
pub fn pin_current_thread(cpu: u32) -> std::io::Result<()> {
    // SAFETY: zeroed cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    if cpu as usize >= libc::CPU_SETSIZE as usize {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: cpu < CPU_SETSIZE checked above.
    unsafe { libc::CPU_SET(cpu as usize, &mut set) };
    // SAFETY: pid 0 is the calling thread; the pointer and size describe `set`.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// `MemAvailable` from /proc/meminfo, in bytes.
pub fn mem_available() -> u64 {
    read("/proc/meminfo")
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("MemAvailable:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

fn numa_of(cpu: u32) -> u32 {
    std::fs::read_dir(format!("{SYS_CPU}/cpu{cpu}"))
        .ok()
        .and_then(|d| {
            d.filter_map(Result::ok)
                .filter_map(|e| {
                    e.file_name()
                        .to_str()
                        .and_then(|n| n.strip_prefix("node"))
                        .and_then(|n| n.parse().ok())
                })
                .next()
        })
        .unwrap_or(0)
}

/// Probes the CPUs. `housekeeping`: CPUs never to dedicate (`None` = CPU 0
/// when more than two CPUs are allowed).
pub fn probe(housekeeping: Option<&[u32]>) -> Cores {
    let online = read(format!("{SYS_CPU}/online"))
        .and_then(|t| cpulist::parse(&t).ok())
        .unwrap_or_default();
    let isolated = read(format!("{SYS_CPU}/isolated"))
        .and_then(|t| cpulist::parse(&t).ok())
        .unwrap_or_default();
    let nohz = read(format!("{SYS_CPU}/nohz_full"))
        .and_then(|t| cpulist::parse(&t).ok())
        .unwrap_or_default();
    let allowed = allowed_cpus();
    let default_hk = if allowed.len() > 2 {
        vec![allowed[0]]
    } else {
        vec![]
    };
    let hk = housekeeping.map(<[u32]>::to_vec).unwrap_or(default_hk);
    let cores: Vec<CoreInfo> = online
        .iter()
        .map(|&cpu| {
            let siblings = read(format!("{SYS_CPU}/cpu{cpu}/topology/thread_siblings_list"))
                .and_then(|t| cpulist::parse(&t).ok())
                .unwrap_or_else(|| vec![cpu]);
            let not_dedicatable = if !allowed.contains(&cpu) {
                Some("outside this process's cpuset (sched_getaffinity)".to_string())
            } else if hk.contains(&cpu) {
                Some("kept for housekeeping (the host's own threads)".to_string())
            } else {
                None
            };
            CoreInfo {
                cpu,
                isolated: isolated.contains(&cpu),
                nohz_full: nohz.contains(&cpu),
                numa: numa_of(cpu),
                siblings,
                not_dedicatable,
            }
        })
        .collect();
    let dedicatable = cores.iter().filter(|c| c.not_dedicatable.is_none()).count();
    let summary = format!(
        "{} CPUs online ({}), {} allowed ({}), {} dedicatable, isolated: {}",
        online.len(),
        cpulist::format(&online),
        allowed.len(),
        cpulist::format(&allowed),
        dedicatable,
        if isolated.is_empty() {
            "none".to_string()
        } else {
            cpulist::format(&isolated)
        }
    );
    Cores {
        cores,
        allowed_count: allowed.len(),
        summary,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_machine_has_cores_and_an_affinity() {
        let c = probe(None);
        assert!(!c.cores.is_empty(), "sysfs lists online CPUs");
        assert!(c.allowed_count >= 1);
        let allowed = allowed_cpus();
        for core in &c.cores {
            assert_eq!(
                core.not_dedicatable.is_none(),
                allowed.contains(&core.cpu) && (allowed.len() <= 2 || core.cpu != allowed[0])
            );
        }
        assert!(mem_available() > 0);
    }

    #[test]
    fn housekeeping_cpus_are_not_dedicated() {
        let allowed = allowed_cpus();
        let c = probe(Some(&allowed));
        assert!(c.cores.iter().all(|c| c.not_dedicatable.is_some()));
    }

    #[test]
    fn pinning_moves_the_thread() {
        let allowed = allowed_cpus();
        let target = *allowed.last().unwrap();
        std::thread::spawn(move || {
            pin_current_thread(target).unwrap();
            assert_eq!(allowed_cpus(), vec![target]);
            // SAFETY: sched_getcpu has no preconditions.
            let now = unsafe { libc::sched_getcpu() };
            assert_eq!(now as u32, target);
        })
        .join()
        .unwrap();
    }
}

//! Implicit sensors: values the monitor reads at fetch time from what the kernel already
//! keeps, with no help from the target's CPUs — `/proc/stat` (ctxt, intr, processes,
//! procs_running), `/proc/vmstat`, and a cgroup's `cpu.stat` and `pids.current`.
//! The parsers are pure functions over the file text; [`ImplicitSource::read`] does the IO.

use crate::error::OrionError;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// One implicit sensor source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "source", content = "path", rename_all = "snake_case")]
pub enum ImplicitSource {
    /// `/proc/stat`: `ctxt`, `intr` (the total), `processes`, `procs_running`.
    ProcStat,
    /// `/proc/vmstat`: every line, as `vmstat.<key>`.
    VmStat,
    /// A cgroup directory's `cpu.stat` (v2, or v1 cpuacct's `cpuacct.usage` in ns):
    /// `cpu.usage_usec` and the rest.
    CgroupCpu(PathBuf),
    /// A cgroup directory's `pids.current`.
    CgroupPids(PathBuf),
    /// A cgroup v1 memory directory's `memory.usage_in_bytes` (or v2 `memory.current`).
    CgroupMemory(PathBuf),
}

/// `/proc/stat`'s counters of interest.
pub fn parse_proc_stat(text: &str) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut it = line.split_ascii_whitespace();
        let (Some(key), Some(first)) = (it.next(), it.next()) else {
            continue;
        };
        if matches!(
            key,
            "ctxt" | "intr" | "processes" | "procs_running" | "procs_blocked"
        ) && let Ok(v) = first.parse::<u64>()
        {
            out.push((format!("stat.{key}"), v));
        }
    }
    out
}

/// `key value` lines (vmstat, cpu.stat), each as `<prefix>.<key>`; other lines skipped.
pub fn parse_key_values(prefix: &str, text: &str) -> Vec<(String, u64)> {
    text.lines()
        .filter_map(|line| {
            let mut it = line.split_ascii_whitespace();
            let key = it.next()?;
            let v = it.next()?.parse::<u64>().ok()?;
            it.next().is_none().then(|| (format!("{prefix}.{key}"), v))
        })
        .collect()
}

/// A single number (`pids.current`, `memory.usage_in_bytes`); `max` reads as `u64::MAX`.
pub fn parse_single(text: &str) -> Option<u64> {
    let t = text.trim();
    if t == "max" {
        return Some(u64::MAX);
    }
    t.parse().ok()
}

fn read(path: &Path) -> Result<String, OrionError> {
    std::fs::read_to_string(path).map_err(|e| OrionError::file(path, e))
}

impl ImplicitSource {
    /// Reads the source now: `(name, value)` pairs, names prefixed by the source.
    pub fn read(&self) -> Result<Vec<(String, u64)>, OrionError> {
        match self {
            ImplicitSource::ProcStat => Ok(parse_proc_stat(&read(Path::new("/proc/stat"))?)),
            ImplicitSource::VmStat => Ok(parse_key_values(
                "vmstat",
                &read(Path::new("/proc/vmstat"))?,
            )),
            ImplicitSource::CgroupCpu(dir) => {
                let stat = dir.join("cpu.stat");
                if stat.exists() {
                    return Ok(parse_key_values("cpu", &read(&stat)?));
                }
                let usage = dir.join("cpuacct.usage");
                let ns = parse_single(&read(&usage)?)
                    .ok_or_else(|| OrionError::file(&usage, "not a number"))?;
                Ok(vec![("cpu.usage_usec".to_owned(), ns / 1000)])
            }
            ImplicitSource::CgroupPids(dir) => {
                let p = in_hierarchy(dir, "pids", "pids.current")?;
                let v =
                    parse_single(&read(&p)?).ok_or_else(|| OrionError::file(&p, "not a number"))?;
                Ok(vec![("pids.current".to_owned(), v)])
            }
            ImplicitSource::CgroupMemory(dir) => {
                let p = in_hierarchy(dir, "memory", "memory.current")
                    .or_else(|_| in_hierarchy(dir, "memory", "memory.usage_in_bytes"))?;
                let v =
                    parse_single(&read(&p)?).ok_or_else(|| OrionError::file(&p, "not a number"))?;
                Ok(vec![("memory.usage_bytes".to_owned(), v)])
            }
        }
    }
}

/// The cgroup v1 controllers (a v1 mount's options name them among others).
const V1_CONTROLLERS: &[&str] = &[
    "cpu",
    "cpuacct",
    "cpuset",
    "memory",
    "devices",
    "freezer",
    "net_cls",
    "net_prio",
    "blkio",
    "perf_event",
    "hugetlb",
    "pids",
    "rdma",
    "misc",
];

/// Where cgroup hierarchies are mounted, from `/proc/self/mountinfo`'s text:
/// the v2 mount (if any) and each v1 controller's mount.
pub fn parse_cgroup_mounts(mountinfo: &str) -> (Option<PathBuf>, Vec<(String, PathBuf)>) {
    let mut v2 = None;
    let mut v1 = Vec::new();
    for line in mountinfo.lines() {
        let Some((pre, post)) = line.split_once(" - ") else {
            continue;
        };
        let Some(point) = pre.split_whitespace().nth(4) else {
            continue;
        };
        let mut post = post.split_whitespace();
        match (post.next(), post.nth(1)) {
            (Some("cgroup2"), _) => v2 = Some(PathBuf::from(point)),
            (Some("cgroup"), Some(opts)) => {
                for o in opts.split(',').filter(|o| V1_CONTROLLERS.contains(o)) {
                    v1.push((o.to_owned(), PathBuf::from(point)));
                }
            }
            _ => {}
        }
    }
    (v2, v1)
}

/// `file` of cgroup `dir`: in `dir` itself when the controller is there (v2),
/// else in the same group of the controller's v1 hierarchy (machines that
/// keep pids and memory on v1 beside a v2 mount, like this project's CI).
/// The error says which places were looked at.
fn in_hierarchy(dir: &Path, controller: &str, file: &str) -> Result<PathBuf, OrionError> {
    let here = dir.join(file);
    if here.exists() {
        return Ok(here);
    }
    let (v2, v1) =
        parse_cgroup_mounts(&std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default());
    let twin = v2
        .as_ref()
        .and_then(|root| dir.strip_prefix(root).ok())
        .and_then(|rel| {
            v1.iter()
                .find(|(c, _)| c == controller)
                .map(|(_, m)| m.join(rel).join(file))
        });
    match twin {
        Some(t) if t.exists() => Ok(t),
        Some(t) => Err(OrionError::file(
            &here,
            format!(
                "no such file, nor {} in the v1 {controller} hierarchy",
                t.display()
            ),
        )),
        None => Err(OrionError::file(
            &here,
            format!("no such file, and this machine mounts no v1 {controller} hierarchy for it"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_mounts_are_read_from_mountinfo() {
        let m = "30 24 0:26 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw\n\
                 31 24 0:27 / /sys/fs/cgroup/pids rw,nosuid - cgroup cgroup rw,pids\n\
                 32 24 0:28 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n\
                 33 24 0:29 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,xattr,name=systemd\n\
                 34 24 8:1 / / rw - ext4 /dev/vda rw\n";
        let (v2, v1) = parse_cgroup_mounts(m);
        assert_eq!(v2, Some(PathBuf::from("/sys/fs/cgroup/unified")));
        assert_eq!(
            v1,
            vec![
                ("pids".to_owned(), PathBuf::from("/sys/fs/cgroup/pids")),
                (
                    "cpu".to_owned(),
                    PathBuf::from("/sys/fs/cgroup/cpu,cpuacct")
                ),
                (
                    "cpuacct".to_owned(),
                    PathBuf::from("/sys/fs/cgroup/cpu,cpuacct")
                ),
            ]
        );
    }
    use proptest::prelude::*;

    #[test]
    fn proc_stat_counters() {
        let t =
            "cpu  1 2 3\nintr 1234 5 6 7\nctxt 98765\nbtime 1\nprocesses 4321\nprocs_running 3\n";
        assert_eq!(
            parse_proc_stat(t),
            vec![
                ("stat.intr".to_owned(), 1234),
                ("stat.ctxt".to_owned(), 98765),
                ("stat.processes".to_owned(), 4321),
                ("stat.procs_running".to_owned(), 3)
            ]
        );
    }

    #[test]
    fn cpu_stat_and_single_values() {
        let t = "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\nbogus line here\n";
        assert_eq!(
            parse_key_values("cpu", t)[0],
            ("cpu.usage_usec".to_owned(), 1500)
        );
        assert_eq!(parse_key_values("cpu", t).len(), 3);
        assert_eq!(parse_single("17\n"), Some(17));
        assert_eq!(parse_single("max\n"), Some(u64::MAX));
        assert_eq!(parse_single("x"), None);
    }

    #[test]
    fn this_machine_has_the_host_sources() {
        let stat = ImplicitSource::ProcStat.read().unwrap();
        assert!(stat.iter().any(|(k, _)| k == "stat.ctxt"));
        let vm = ImplicitSource::VmStat.read().unwrap();
        assert!(vm.iter().any(|(k, _)| k == "vmstat.pgfault"));
        let e = ImplicitSource::CgroupPids("/nonexistent/cg".into())
            .read()
            .unwrap_err();
        assert!(
            e.to_string().starts_with("/nonexistent/cg/pids.current:"),
            "{e}"
        );
    }

    proptest! {
        #[test]
        fn parsers_never_panic(s in ".{0,200}") {
            let _ = parse_proc_stat(&s);
            let _ = parse_key_values("p", &s);
            let _ = parse_single(&s);
        }
    }
}

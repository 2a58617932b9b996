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
                let p = dir.join("pids.current");
                let v =
                    parse_single(&read(&p)?).ok_or_else(|| OrionError::file(&p, "not a number"))?;
                Ok(vec![("pids.current".to_owned(), v)])
            }
            ImplicitSource::CgroupMemory(dir) => {
                let p = [
                    dir.join("memory.usage_in_bytes"),
                    dir.join("memory.current"),
                ]
                .into_iter()
                .find(|p| p.exists())
                .unwrap_or_else(|| dir.join("memory.current"));
                let v =
                    parse_single(&read(&p)?).ok_or_else(|| OrionError::file(&p, "not a number"))?;
                Ok(vec![("memory.usage_bytes".to_owned(), v)])
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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

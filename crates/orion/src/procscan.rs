//! Reading processes from /proc and cgroup membership from cgroup files: the monitor's
//! remote walk of the process table. `parse_stat` is pure; the rest does the IO.

use crate::error::OrionError;
use crate::tree::ProcInfo;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

const PF_KTHREAD: u64 = 0x0020_0000;

/// Parses `/proc/<pid>/stat` (comm may hold spaces and parentheses). `page_kib` is the
/// page size in KiB; uid is filled in by the caller.
pub fn parse_stat(text: &str, page_kib: u64) -> Option<ProcInfo> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let pid = text[..open].trim().parse().ok()?;
    let comm = text.get(open + 1..close)?.to_owned();
    let f: Vec<&str> = text.get(close + 1..)?.split_ascii_whitespace().collect();
    // f[0] is field 3 (state): field n is f[n - 3].
    let num = |n: usize| f.get(n - 3).and_then(|s| s.parse::<u64>().ok());
    Some(ProcInfo {
        pid,
        ppid: u32::try_from(num(4)?).ok()?,
        pgid: u32::try_from(num(5)?).ok()?,
        uid: 0,
        comm,
        rss_kib: num(24)?.saturating_mul(page_kib),
        kthread: num(9)? & PF_KTHREAD != 0,
    })
}

/// One process now, or None if it is gone or unreadable.
pub fn read_proc(pid: u32) -> Option<ProcInfo> {
    let dir = format!("/proc/{pid}");
    let text = std::fs::read_to_string(format!("{dir}/stat")).ok()?;
    let page_kib = (rustix::param::page_size() / 1024) as u64;
    let mut info = parse_stat(&text, page_kib)?;
    info.uid = std::fs::metadata(&dir).ok()?.uid();
    Some(info)
}

/// Every process in /proc.
pub fn scan_all() -> Result<Vec<ProcInfo>, OrionError> {
    let rd = std::fs::read_dir("/proc").map_err(|e| OrionError::file("/proc", e))?;
    Ok(rd
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(read_proc)
        .collect())
}

/// The processes of a cgroup and its descendants (`cgroup.procs`, recursively).
pub fn cgroup_pids(dir: &Path) -> Result<Vec<u32>, OrionError> {
    let mut out = Vec::new();
    let procs = dir.join("cgroup.procs");
    let text = std::fs::read_to_string(&procs).map_err(|e| OrionError::file(&procs, e))?;
    out.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
    let rd = std::fs::read_dir(dir).map_err(|e| OrionError::file(dir, e))?;
    for e in rd.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            out.extend(cgroup_pids(&e.path())?);
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// The processes of a cgroup, read from /proc (those that exit meanwhile are left out).
pub fn scan_cgroup(dir: &Path) -> Result<Vec<ProcInfo>, OrionError> {
    Ok(cgroup_pids(dir)?
        .into_iter()
        .filter_map(read_proc)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn stat_with_a_nasty_comm() {
        let t = "4242 (a) b (c) S 17 4242 4242 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 100 1000 25 18446744073709551615";
        let p = parse_stat(t, 4).unwrap();
        assert_eq!(
            (p.pid, p.ppid, p.pgid, p.comm.as_str(), p.rss_kib, p.kthread),
            (4242, 17, 4242, "a) b (c", 100, false)
        );
        let k = "2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0 0 0 0 0 20 0 1 0 1 0 0 0";
        assert!(parse_stat(k, 4).unwrap().kthread);
        assert!(parse_stat("garbage", 4).is_none());
    }

    #[test]
    fn this_process_is_found() {
        let me = read_proc(std::process::id()).unwrap();
        assert!(me.rss_kib > 0 && !me.kthread);
        assert!(scan_all().unwrap().iter().any(|p| p.pid == 1));
    }

    proptest! {
        #[test]
        fn parse_stat_never_panics(s in ".{0,120}") {
            let _ = parse_stat(&s, 4);
        }
    }
}

//! What `/proc` says about a guest the migrator freezes: its memory map,
//! the mm fields of `stat`, `status` lines, descriptors' `fdinfo`, and the
//! page flags of `pagemap`. The parsers are plain functions of text (unit
//! tested); the readers beside them do the I/O.

use std::io::{self, Read, Seek, SeekFrom};

use super::Error;

/// One line of `/proc/PID/maps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapLine {
    pub start: u64,
    pub end: u64,
    pub read: bool,
    pub write: bool,
    pub exec: bool,
    pub shared: bool,
    pub offset: u64,
    pub inode: u64,
    /// The path or `[name]` (empty for anonymous memory).
    pub name: String,
}

impl MapLine {
    /// `PROT_*` bits.
    #[must_use]
    pub fn prot(&self) -> u8 {
        u8::from(self.read) | u8::from(self.write) << 1 | u8::from(self.exec) << 2
    }
}

/// Parses `/proc/PID/maps`.
pub fn parse_maps(text: &str) -> Result<Vec<MapLine>, String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let bad = || format!("maps line {}: {line:?}", n + 1);
        let mut it = line.splitn(6, ' ');
        let range = it.next().ok_or_else(bad)?;
        let perms = it.next().ok_or_else(bad)?.as_bytes();
        let offset = it.next().ok_or_else(bad)?;
        let _dev = it.next().ok_or_else(bad)?;
        let inode = it.next().ok_or_else(bad)?;
        let name = it.next().unwrap_or("").trim_start().to_string();
        let (s, e) = range.split_once('-').ok_or_else(bad)?;
        let hex = |x: &str| u64::from_str_radix(x, 16).map_err(|_| bad());
        if perms.len() != 4 {
            return Err(bad());
        }
        out.push(MapLine {
            start: hex(s)?,
            end: hex(e)?,
            read: perms[0] == b'r',
            write: perms[1] == b'w',
            exec: perms[2] == b'x',
            shared: perms[3] == b's',
            offset: hex(offset)?,
            inode: inode.parse().map_err(|_| bad())?,
            name,
        });
    }
    Ok(out)
}

/// The mm fields of `/proc/PID/stat` (fields 26–28 and 45–51).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatMm {
    pub start_code: u64,
    pub end_code: u64,
    pub start_stack: u64,
    pub start_data: u64,
    pub end_data: u64,
    pub start_brk: u64,
    pub arg_start: u64,
    pub arg_end: u64,
    pub env_start: u64,
    pub env_end: u64,
}

/// Parses `/proc/PID/stat` (the name in parentheses may hold spaces).
pub fn parse_stat_mm(text: &str) -> Result<StatMm, String> {
    let after = text
        .rfind(')')
        .map(|i| &text[i + 1..])
        .ok_or("stat has no command name")?;
    // Fields from 3 on; field k is at index k - 3.
    let f: Vec<&str> = after.split_whitespace().collect();
    let get = |k: usize| -> Result<u64, String> {
        f.get(k - 3)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("stat field {k} missing"))
    };
    Ok(StatMm {
        start_code: get(26)?,
        end_code: get(27)?,
        start_stack: get(28)?,
        start_data: get(45)?,
        end_data: get(46)?,
        start_brk: get(47)?,
        arg_start: get(48)?,
        arg_end: get(49)?,
        env_start: get(50)?,
        env_end: get(51)?,
    })
}

/// A `Key:\tvalue` line of `/proc/PID/status`.
#[must_use]
pub fn status_field<'a>(status: &'a str, key: &str) -> Option<&'a str> {
    status.lines().find_map(|l| {
        l.strip_prefix(key)
            .and_then(|r| r.strip_prefix(':'))
            .map(str::trim)
    })
}

/// `pos` and `flags` of `/proc/PID/fdinfo/FD`.
pub fn parse_fdinfo(text: &str) -> Result<(u64, i32), String> {
    let pos = status_field(text, "pos")
        .and_then(|v| v.parse().ok())
        .ok_or("fdinfo has no pos")?;
    let flags = status_field(text, "flags")
        .and_then(|v| i32::from_str_radix(v, 8).ok())
        .ok_or("fdinfo has no flags")?;
    Ok((pos, flags))
}

/// `pagemap` bits.
pub const PM_PRESENT: u64 = 1 << 63;
pub const PM_SWAPPED: u64 = 1 << 62;
pub const PM_FILE: u64 = 1 << 61;

/// Runs (first page, count) of pages whose entries satisfy `keep`.
#[must_use]
pub fn runs(entries: &[u64], keep: impl Fn(u64) -> bool) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (i, &e) in entries.iter().enumerate() {
        if !keep(e) {
            continue;
        }
        let i = i as u64;
        match out.last_mut() {
            Some((first, n)) if *first + *n == i => *n += 1,
            _ => out.push((i, 1)),
        }
    }
    out
}

fn os(what: String) -> impl FnOnce(io::Error) -> Error {
    move |source| Error::Os { what, source }
}

/// Reads `/proc/PID/<name>` as text.
pub fn read(pid: i32, name: &str) -> Result<String, Error> {
    let p = format!("/proc/{pid}/{name}");
    std::fs::read_to_string(&p).map_err(os(p))
}

/// Reads `/proc/PID/<name>` as bytes.
pub fn read_bytes(pid: i32, name: &str) -> Result<Vec<u8>, Error> {
    let p = format!("/proc/{pid}/{name}");
    std::fs::read(&p).map_err(os(p))
}

/// The `pagemap` entries of `pages` pages from `start`.
pub fn pagemap(pid: i32, start: u64, pages: u64) -> Result<Vec<u64>, Error> {
    let p = format!("/proc/{pid}/pagemap");
    let mut f = std::fs::File::open(&p).map_err(os(p.clone()))?;
    f.seek(SeekFrom::Start(start / 4096 * 8))
        .map_err(os(p.clone()))?;
    let mut raw = vec![0u8; usize::try_from(pages * 8).unwrap_or(0)];
    f.read_exact(&mut raw).map_err(os(p))?;
    Ok(raw
        .chunks_exact(8)
        .map(|c| {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            u64::from_le_bytes(w)
        })
        .collect())
}

/// The guest's threads, from `status`.
pub fn threads(pid: i32) -> Result<u32, Error> {
    let s = read(pid, "status")?;
    status_field(&s, "Threads")
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| Error::Refused(format!("PID {pid}: status has no thread count")))
}

/// The guest's children (all its tasks' `children` lists).
pub fn children(pid: i32) -> Result<Vec<i32>, Error> {
    let dir = format!("/proc/{pid}/task");
    let mut out = Vec::new();
    for t in std::fs::read_dir(&dir).map_err(os(dir.clone()))?.flatten() {
        let p = t.path().join("children");
        if let Ok(s) = std::fs::read_to_string(&p) {
            out.extend(s.split_whitespace().filter_map(|x| x.parse::<i32>().ok()));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines_parse() {
        let m = parse_maps(
            "55d0-55e0 r-xp 00001000 fe:00 325 /usr/bin/cat\n\
             7fff-8000 rw-p 00000000 00:00 0                          [stack]\n\
             9000-a000 rw-s 00000000 00:01 7 /dev/zero (deleted)\n\
             b000-c000 ---p 00000000 00:00 0 \n",
        )
        .unwrap();
        assert_eq!(m.len(), 4);
        assert_eq!(m[0].start, 0x55d0);
        assert_eq!(m[0].offset, 0x1000);
        assert_eq!(m[0].prot(), 5);
        assert_eq!(m[0].name, "/usr/bin/cat");
        assert_eq!(m[1].name, "[stack]");
        assert!(m[2].shared);
        assert_eq!(m[2].name, "/dev/zero (deleted)");
        assert_eq!(m[3].name, "");
        assert_eq!(m[3].prot(), 0);
        assert!(parse_maps("zz-1 r-xp 0 0 0 x").is_err());
    }

    #[test]
    fn stat_status_fdinfo_parse() {
        let mut fields: Vec<String> = (3..=52).map(|k| k.to_string()).collect();
        fields[0] = "S".into();
        let stat = format!("12 (a b) c) {}", fields.join(" "));
        let m = parse_stat_mm(&stat).unwrap();
        assert_eq!(m.start_code, 26);
        assert_eq!(m.start_stack, 28);
        assert_eq!(m.env_end, 51);
        assert_eq!(
            status_field("Name:\tx\nThreads:\t3\n", "Threads"),
            Some("3")
        );
        assert_eq!(
            parse_fdinfo("pos:\t12\nflags:\t02100002\nmnt_id:\t9\n").unwrap(),
            (12, 0o2100002)
        );
        assert!(parse_fdinfo("flags:\t0\n").is_err());
    }

    #[test]
    fn runs_group_neighbours() {
        let e = [
            PM_PRESENT,
            PM_PRESENT,
            0,
            PM_SWAPPED,
            PM_PRESENT | PM_FILE,
            0,
        ];
        assert_eq!(
            runs(&e, |x| x & (PM_PRESENT | PM_SWAPPED) != 0),
            vec![(0, 2), (3, 2)]
        );
        assert_eq!(
            runs(&e, |x| x & (PM_PRESENT | PM_SWAPPED) != 0
                && x & PM_FILE == 0),
            vec![(0, 2), (3, 1)]
        );
    }
}

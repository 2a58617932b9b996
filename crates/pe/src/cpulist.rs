//! Parsing of the kernel's CPU list format (`0-3,8,10-11`), as found in
//! `/sys/devices/system/cpu/online`, `isolated`, `nohz_full` and cpuset files.

/// Most CPUs one range of a list may span.
pub const MAX_RANGE_CPUS: u32 = 65_536;

/// A CPU list that cannot be read, with the part that is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CpuListError {
    #[error("bad CPU number in `{0}`")]
    Number(String),
    #[error("bad CPU range `{0}` (descending, or wider than {MAX_RANGE_CPUS} CPUs)")]
    Range(String),
}

/// Parses a CPU list; the error names the offending part.
pub fn parse(text: &str) -> Result<Vec<u32>, CpuListError> {
    let mut out = Vec::new();
    for part in text
        .trim()
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
    {
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (a, b),
            None => (part, part),
        };
        let lo: u32 = lo
            .trim()
            .parse()
            .map_err(|_| CpuListError::Number(part.to_string()))?;
        let hi: u32 = hi
            .trim()
            .parse()
            .map_err(|_| CpuListError::Number(part.to_string()))?;
        if hi < lo || hi - lo > MAX_RANGE_CPUS {
            return Err(CpuListError::Range(part.to_string()));
        }
        out.extend(lo..=hi);
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// Formats CPUs back into the compact list format.
pub fn format(cpus: &[u32]) -> String {
    let mut v = cpus.to_vec();
    v.sort_unstable();
    v.dedup();
    let mut parts = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let start = v[i];
        let mut end = start;
        while i + 1 < v.len() && v[i + 1] == end + 1 {
            i += 1;
            end = v[i];
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_formats() {
        assert_eq!(parse("0-3,8,10-11\n").unwrap(), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(parse("").unwrap(), Vec::<u32>::new());
        assert_eq!(format(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert!(parse("3-1").unwrap_err().to_string().contains("3-1"));
        assert!(parse("x").unwrap_err().to_string().contains("`x`"));
    }
}

//! Small helpers the packet offcodes share: parsing addresses and MACs from
//! parameters, the calling thread's CPU time, and wall-clock nanoseconds.

use std::net::Ipv4Addr;

use sidecore_offcode::OffcodeError;

/// A parameter error naming the field.
pub fn bad(field: &str, why: impl std::fmt::Display) -> OffcodeError {
    OffcodeError::Params(format!("`{field}`: {why}"))
}

/// An IPv4 address parameter.
pub fn ipv4(field: &str, s: &str) -> Result<u32, OffcodeError> {
    s.parse::<Ipv4Addr>()
        .map(u32::from)
        .map_err(|_| bad(field, format!("`{s}` is not an IPv4 address")))
}

/// A MAC address parameter (`aa:bb:cc:dd:ee:ff`).
pub fn mac(field: &str, s: &str) -> Result<[u8; 6], OffcodeError> {
    let parts: Vec<&str> = s.split(':').collect();
    let mut m = [0u8; 6];
    if parts.len() != 6 {
        return Err(bad(field, format!("`{s}` is not a MAC address")));
    }
    for (d, p) in m.iter_mut().zip(parts) {
        *d = u8::from_str_radix(p, 16)
            .map_err(|_| bad(field, format!("`{s}` is not a MAC address")))?;
    }
    Ok(m)
}

/// CPU time the calling thread has used, in ns.
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into `ts`, which lives for the call.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

/// Wall-clock time in ns since the epoch (what kernel packet stamps use).
pub fn realtime_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// The MAC of the neighbour that routes to `dst` from namespace `netns`:
/// `ip route get`, then the neighbour table.
pub fn next_hop_mac(netns: Option<&str>, dst: u32) -> Result<([u8; 6], String), OffcodeError> {
    let dst = Ipv4Addr::from(dst).to_string();
    let mut args: Vec<&str> = Vec::new();
    if let Some(ns) = netns {
        args.extend(["-n", ns]);
    }
    let route =
        sidecore_testbed::topology::ip(&[args.as_slice(), &["route", "get", &dst]].concat())
            .map_err(|e| bad("dst", e))?;
    let word_after = |w: &str| {
        let v: Vec<&str> = route.split_whitespace().collect();
        v.iter()
            .position(|x| *x == w)
            .and_then(|i| v.get(i + 1))
            .map(|s| (*s).to_string())
    };
    let dev = word_after("dev").ok_or_else(|| bad("dst", format!("no route to {dst}: {route}")))?;
    let hop = word_after("via").unwrap_or(dst.clone());
    let neigh = sidecore_testbed::topology::ip(
        &[args.as_slice(), &["neigh", "show", &hop, "dev", &dev]].concat(),
    )
    .map_err(|e| bad("dst", e))?;
    let lladdr = neigh
        .split_whitespace()
        .skip_while(|w| *w != "lladdr")
        .nth(1)
        .ok_or_else(|| {
            bad(
                "dst",
                format!("no neighbour entry for {hop} on {dev} (give `dst_mac`)"),
            )
        })?;
    Ok((mac("dst_mac", lladdr)?, dev))
}

//! The BPF objects this build carries: compiled from `crates/kernel/bpf` by
//! `build.rs` and embedded, 8-byte aligned as ELF parsing wants.

/// SCIRON's XDP classifier (`bpf/firewall.bpf.c`).
pub fn firewall() -> &'static [u8] {
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/firewall.bpf.o"))
}

/// Sikker's L4 mode: cgroup connect and egress programs (`bpf/sikker_l4.bpf.c`).
pub fn sikker_l4() -> &'static [u8] {
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/sikker_l4.bpf.o"))
}

/// Orion's fork/exec/exit sensors: scheduler tracepoints into a ring buffer
/// (`bpf/orion_sched.bpf.c`).
pub fn orion_sched() -> &'static [u8] {
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/orion_sched.bpf.o"))
}

/// AF_XDP receive: IPv4 frames redirected into sockets by queue
/// (`bpf/xsk_redirect.bpf.c`).
pub fn xsk_redirect() -> &'static [u8] {
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/xsk_redirect.bpf.o"))
}

/// Every embedded object, by name (for `sidecore devices` and errors).
pub fn all() -> [(&'static str, &'static [u8]); 4] {
    [
        ("firewall", firewall()),
        ("sikker_l4", sikker_l4()),
        ("orion_sched", orion_sched()),
        ("xsk_redirect", xsk_redirect()),
    ]
}

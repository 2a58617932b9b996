//! The BPF objects this build carries: compiled from `crates/kernel/bpf` by
//! `build.rs` and embedded, 8-byte aligned as ELF parsing wants.

/// SCIRON's XDP classifier (`bpf/firewall.bpf.c`).
pub fn firewall() -> &'static [u8] {
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/firewall.bpf.o"))
}

/// Every embedded object, by name (for `sidecore devices` and errors).
pub fn all() -> [(&'static str, &'static [u8]); 1] {
    [("firewall", firewall())]
}

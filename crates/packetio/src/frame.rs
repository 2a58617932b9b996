//! Building and parsing frames: Ethernet II, IPv4 (no options), and UDP, TCP
//! (a bare SYN) or ICMP (an echo request). Builders write into the caller's
//! buffer and compute every checksum; the payload of UDP frames starts with
//! a sequence number and a send time, so an analyser can count gaps and
//! delays.

use sidecore_firewall::Packet;
use sidecore_firewall::rule::{PROTO_ICMP, PROTO_TCP, PROTO_UDP};

/// Ethernet header bytes.
pub const ETH_BYTES: usize = 14;
/// IPv4 header bytes (no options).
pub const IPV4_BYTES: usize = 20;
/// Smallest Ethernet frame without its FCS.
pub const MIN_FRAME_BYTES: usize = 60;
/// Largest frame without its FCS at a 1500-byte MTU.
pub const MAX_FRAME_BYTES: usize = 1514;
/// Bytes of the sequence number and send time at the start of a UDP payload.
pub const STAMP_BYTES: usize = 16;

/// What to put in a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameSpec {
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
    /// The 5-tuple (host byte order); ports are ignored for ICMP.
    pub packet: Packet,
    /// The whole frame's length (without FCS), at least the headers.
    pub frame_bytes: usize,
}

/// The Internet checksum (RFC 1071) of `data`, folded.
pub fn checksum(data: &[u8], initial: u32) -> u16 {
    let mut sum = initial;
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [b] = chunks.remainder() {
        sum += u32::from(*b) << 8;
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    #[allow(clippy::cast_possible_truncation)] // folded to 16 bits above
    let folded = sum as u16;
    !folded
}

/// The headers' bytes for a protocol.
fn l4_header_bytes(proto: u8) -> usize {
    match proto {
        PROTO_TCP => 20,
        PROTO_UDP | PROTO_ICMP => 8,
        _ => 0,
    }
}

/// Shortest frame for a protocol (headers, and for UDP the stamp).
pub fn min_bytes(proto: u8) -> usize {
    let stamp = if proto == PROTO_UDP { STAMP_BYTES } else { 0 };
    (ETH_BYTES + IPV4_BYTES + l4_header_bytes(proto) + stamp).max(MIN_FRAME_BYTES)
}

/// Writes the frame of `spec` into `buf` (at least `spec.frame_bytes`
/// long), with sequence number `seq` and send time `t_ns` in a UDP payload.
/// Returns the frame's length.
///
/// # Panics
/// If the buffer or the frame size cannot hold the headers: callers size both
/// from [`min_bytes`].
pub fn build(spec: &FrameSpec, seq: u64, t_ns: u64, buf: &mut [u8]) -> usize {
    let p = &spec.packet;
    let len = spec.frame_bytes.max(min_bytes(p.proto));
    assert!(
        buf.len() >= len,
        "a {}-byte buffer for a {len}-byte frame",
        buf.len()
    );
    let frame = &mut buf[..len];
    frame[0..6].copy_from_slice(&spec.dst_mac);
    frame[6..12].copy_from_slice(&spec.src_mac);
    frame[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    let ip_len = len - ETH_BYTES;
    let ip = &mut frame[ETH_BYTES..];
    ip[0] = 0x45;
    ip[1] = 0;
    ip[2..4].copy_from_slice(&u16::try_from(ip_len).unwrap_or(u16::MAX).to_be_bytes());
    #[allow(clippy::cast_possible_truncation)] // the low 16 bits as the IP id
    ip[4..6].copy_from_slice(&(seq as u16).to_be_bytes());
    ip[6..8].copy_from_slice(&0x4000u16.to_be_bytes()); // don't fragment
    ip[8] = 64;
    ip[9] = p.proto;
    ip[10..12].fill(0);
    ip[12..16].copy_from_slice(&p.src.to_be_bytes());
    ip[16..20].copy_from_slice(&p.dst.to_be_bytes());
    let c = checksum(&ip[..IPV4_BYTES], 0);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    let l4_len = ip_len - IPV4_BYTES;
    let pseudo = pseudo_sum(p, l4_len);
    let l4 = &mut ip[IPV4_BYTES..ip_len];
    match p.proto {
        PROTO_UDP => udp(l4, p, seq, t_ns, pseudo),
        PROTO_TCP => tcp(l4, p, seq, pseudo),
        PROTO_ICMP => icmp(l4, seq),
        _ => l4.fill(0),
    }
    len
}

/// The pseudo-header's contribution to a TCP or UDP checksum.
fn pseudo_sum(p: &Packet, l4_len: usize) -> u32 {
    let words = [
        p.src >> 16,
        p.src & 0xffff,
        p.dst >> 16,
        p.dst & 0xffff,
        u32::from(p.proto),
        u32::try_from(l4_len).unwrap_or(0),
    ];
    words.iter().sum()
}

fn udp(l4: &mut [u8], p: &Packet, seq: u64, t_ns: u64, pseudo: u32) {
    let len = u16::try_from(l4.len()).unwrap_or(u16::MAX);
    l4[0..2].copy_from_slice(&p.sport.to_be_bytes());
    l4[2..4].copy_from_slice(&p.dport.to_be_bytes());
    l4[4..6].copy_from_slice(&len.to_be_bytes());
    l4[6..8].fill(0);
    l4[8..16].copy_from_slice(&seq.to_be_bytes());
    l4[16..24].copy_from_slice(&t_ns.to_be_bytes());
    l4[24..].fill(0);
    let c = match checksum(l4, pseudo) {
        0 => 0xffff, // 0 means "no checksum" in UDP
        c => c,
    };
    l4[6..8].copy_from_slice(&c.to_be_bytes());
}

fn tcp(l4: &mut [u8], p: &Packet, seq: u64, pseudo: u32) {
    l4[0..2].copy_from_slice(&p.sport.to_be_bytes());
    l4[2..4].copy_from_slice(&p.dport.to_be_bytes());
    #[allow(clippy::cast_possible_truncation)] // the low 32 bits as the TCP sequence
    l4[4..8].copy_from_slice(&(seq as u32).to_be_bytes());
    l4[8..12].fill(0);
    l4[12] = 5 << 4; // data offset: 20 bytes
    l4[13] = 0x02; // SYN
    l4[14..16].copy_from_slice(&64_240u16.to_be_bytes());
    l4[16..].fill(0);
    let c = checksum(l4, pseudo);
    l4[16..18].copy_from_slice(&c.to_be_bytes());
}

fn icmp(l4: &mut [u8], seq: u64) {
    l4[0] = 8; // echo request
    l4[1] = 0;
    l4[2..4].fill(0);
    l4[4..6].copy_from_slice(&0x5343u16.to_be_bytes()); // "SC"
    #[allow(clippy::cast_possible_truncation)] // the low 16 bits as the echo sequence
    l4[6..8].copy_from_slice(&(seq as u16).to_be_bytes());
    l4[8..].fill(0);
    let c = checksum(l4, 0);
    l4[2..4].copy_from_slice(&c.to_be_bytes());
}

/// What a received frame carries: its 5-tuple, and for UDP frames built by
/// [`build`] the sequence number and send time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parsed {
    pub packet: Packet,
    pub stamp: Option<(u64, u64)>,
}

/// Reads an Ethernet/IPv4 frame; `None` for anything else or a truncated one.
pub fn parse(frame: &[u8]) -> Option<Parsed> {
    if frame.len() < ETH_BYTES + IPV4_BYTES || frame[12..14] != [0x08, 0x00] {
        return None;
    }
    let ip = &frame[ETH_BYTES..];
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    if ip[0] >> 4 != 4 || ihl < IPV4_BYTES || ip.len() < ihl {
        return None;
    }
    let word = |b: &[u8], i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    let mut packet = Packet {
        proto: ip[9],
        src: word(ip, 12),
        dst: word(ip, 16),
        sport: 0,
        dport: 0,
    };
    let first_fragment = u16::from_be_bytes([ip[6], ip[7]]) & 0x1fff == 0;
    let l4 = &ip[ihl..];
    let mut stamp = None;
    if first_fragment && (packet.proto == PROTO_TCP || packet.proto == PROTO_UDP) {
        if l4.len() < 4 {
            return None;
        }
        packet.sport = u16::from_be_bytes([l4[0], l4[1]]);
        packet.dport = u16::from_be_bytes([l4[2], l4[3]]);
        if packet.proto == PROTO_UDP && l4.len() >= 8 + STAMP_BYTES {
            let q = |i: usize| u64::from_be_bytes(l4[i..i + 8].try_into().unwrap_or([0; 8]));
            stamp = Some((q(8), q(16)));
        }
    }
    Some(Parsed { packet, stamp })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(proto: u8, bytes: usize) -> FrameSpec {
        FrameSpec {
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [2, 0, 0, 0, 0, 2],
            packet: Packet {
                proto,
                src: 0x0ac9_0001,
                sport: 4000,
                dst: 0x0ac9_0102,
                dport: 5000,
            },
            frame_bytes: bytes,
        }
    }

    #[test]
    fn frames_round_trip_with_valid_checksums() {
        let mut buf = [0u8; MAX_FRAME_BYTES];
        for proto in [PROTO_UDP, PROTO_TCP, PROTO_ICMP, 47] {
            for bytes in [0, 64, 512, MAX_FRAME_BYTES] {
                let n = build(&spec(proto, bytes), 77, 123_456, &mut buf);
                assert!(n >= MIN_FRAME_BYTES && n >= bytes.min(MAX_FRAME_BYTES));
                let f = &buf[..n];
                // The IPv4 header sums to zero with its checksum.
                assert_eq!(checksum(&f[ETH_BYTES..ETH_BYTES + IPV4_BYTES], 0), 0);
                let p = parse(f).unwrap();
                assert_eq!(p.packet.proto, proto);
                assert_eq!(p.packet.src, 0x0ac9_0001);
                if proto == PROTO_UDP || proto == PROTO_TCP {
                    assert_eq!((p.packet.sport, p.packet.dport), (4000, 5000));
                    let l4 = &f[ETH_BYTES + IPV4_BYTES..];
                    let pseudo = pseudo_sum(&p.packet, l4.len());
                    assert_eq!(checksum(l4, pseudo), 0, "L4 checksum of proto {proto}");
                } else {
                    assert_eq!((p.packet.sport, p.packet.dport), (0, 0));
                }
                if proto == PROTO_UDP {
                    assert_eq!(p.stamp, Some((77, 123_456)));
                }
            }
        }
        // The RFC 1071 example.
        assert_eq!(
            !checksum(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7], 0),
            0xddf2
        );
        assert_eq!(parse(&buf[..20]), None);
    }
}

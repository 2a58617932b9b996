//! The rule model: an ordered list of 5-tuple rules over IPv4, each field a
//! range (an address prefix, a port range, a protocol or any), an action, and
//! whether matches are logged. A packet is the 5-tuple it carries. First match
//! wins; a packet no rule matches is denied.

use std::fmt;
use std::net::Ipv4Addr;

use serde::Serialize;

/// What a rule does with a packet it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    Accept,
    Deny,
}

impl Action {
    /// The verb as a rule does it: "accepts", "denies".
    pub fn third_person(self) -> &'static str {
        match self {
            Action::Accept => "accepts",
            Action::Deny => "denies",
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Action::Accept => "accept",
            Action::Deny => "deny",
        })
    }
}

/// IP protocol numbers the rules name by keyword.
pub const PROTO_ICMP: u8 = 1;
pub const PROTO_TCP: u8 = 6;
pub const PROTO_UDP: u8 = 17;

/// A rule's protocol field: any protocol, or one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Proto {
    Any,
    Is(u8),
}

impl Proto {
    /// Whether protocol number `p` is in it.
    pub fn contains(self, p: u8) -> bool {
        match self {
            Proto::Any => true,
            Proto::Is(q) => p == q,
        }
    }

    /// The field as an inclusive range of protocol numbers.
    pub fn range(self) -> (u32, u32) {
        match self {
            Proto::Any => (0, 255),
            Proto::Is(p) => (u32::from(p), u32::from(p)),
        }
    }
}

impl fmt::Display for Proto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Proto::Any => f.write_str("any"),
            Proto::Is(PROTO_TCP) => f.write_str("tcp"),
            Proto::Is(PROTO_UDP) => f.write_str("udp"),
            Proto::Is(PROTO_ICMP) => f.write_str("icmp"),
            Proto::Is(p) => write!(f, "{p}"),
        }
    }
}

/// An IPv4 prefix: the addresses whose first `len` bits equal `addr`'s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Prefix {
    /// The network address (host bits zero).
    pub addr: u32,
    /// Prefix length, 0..=32.
    pub len: u8,
}

impl Prefix {
    /// Every address.
    pub const ANY: Prefix = Prefix { addr: 0, len: 0 };

    /// The prefix of `addr` of `len` bits (host bits cleared).
    ///
    /// # Panics
    /// If `len` is over 32: prefixes come from the parser, which refuses them.
    pub fn new(addr: u32, len: u8) -> Prefix {
        assert!(len <= 32, "an IPv4 prefix of {len} bits");
        Prefix {
            addr: addr & mask32(len),
            len,
        }
    }

    /// The netmask of this prefix.
    pub fn mask(self) -> u32 {
        mask32(self.len)
    }

    pub fn contains(self, ip: u32) -> bool {
        ip & self.mask() == self.addr
    }

    /// The prefix as an inclusive range of addresses.
    pub fn range(self) -> (u32, u32) {
        (self.addr, self.addr | !self.mask())
    }
}

/// The netmask of a `len`-bit prefix.
pub fn mask32(len: u8) -> u32 {
    if len == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(len.min(32)))
    }
}

impl fmt::Display for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.len == 0 {
            f.write_str("any")
        } else if self.len == 32 {
            write!(f, "{}", Ipv4Addr::from(self.addr))
        } else {
            write!(f, "{}/{}", Ipv4Addr::from(self.addr), self.len)
        }
    }
}

/// An inclusive range of ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Ports {
    pub lo: u16,
    pub hi: u16,
}

impl Ports {
    /// Every port.
    pub const ANY: Ports = Ports {
        lo: 0,
        hi: u16::MAX,
    };

    pub fn contains(self, p: u16) -> bool {
        self.lo <= p && p <= self.hi
    }

    pub fn range(self) -> (u32, u32) {
        (u32::from(self.lo), u32::from(self.hi))
    }
}

impl fmt::Display for Ports {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == Ports::ANY {
            f.write_str("any")
        } else if self.lo == self.hi {
            write!(f, "{}", self.lo)
        } else {
            write!(f, "{}-{}", self.lo, self.hi)
        }
    }
}

/// One rule of an ordered rule set.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Rule {
    /// Where it was declared (1-based line of its file), for messages.
    pub line: usize,
    pub proto: Proto,
    pub src: Prefix,
    pub sport: Ports,
    pub dst: Prefix,
    pub dport: Ports,
    pub action: Action,
    /// Matches are reported on the log channel.
    pub log: bool,
}

impl Rule {
    /// A rule that matches everything and takes `action`.
    pub fn any(action: Action) -> Rule {
        Rule {
            line: 0,
            proto: Proto::Any,
            src: Prefix::ANY,
            sport: Ports::ANY,
            dst: Prefix::ANY,
            dport: Ports::ANY,
            action,
            log: false,
        }
    }

    /// Whether the rule matches a packet.
    pub fn matches(&self, p: &Packet) -> bool {
        self.proto.contains(p.proto)
            && self.src.contains(p.src)
            && self.dst.contains(p.dst)
            && self.sport.contains(p.sport)
            && self.dport.contains(p.dport)
    }

    /// The rule's five fields as inclusive ranges, in a fixed order (for the
    /// set relations of the analysis).
    pub fn ranges(&self) -> [(u32, u32); 5] {
        [
            self.proto.range(),
            self.src.range(),
            self.sport.range(),
            self.dst.range(),
            self.dport.range(),
        ]
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} {} {} {} {}{}",
            self.proto,
            self.src,
            self.sport,
            self.dst,
            self.dport,
            self.action,
            if self.log { " log" } else { "" }
        )
    }
}

/// What a packet carries that the rules look at. Protocols without ports
/// (ICMP, non-first fragments) carry ports 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Packet {
    pub proto: u8,
    pub src: u32,
    pub sport: u16,
    pub dst: u32,
    pub dport: u16,
}

/// An ordered rule set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RuleSet {
    /// Where it came from, for messages.
    pub source: String,
    pub rules: Vec<Rule>,
}

/// What the rule set decides for a packet: the index of the rule that
/// matched first, or none (denied by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Verdict {
    pub rule: Option<usize>,
    pub action: Action,
    pub log: bool,
}

impl Verdict {
    /// No rule matched.
    pub const DEFAULT_DENY: Verdict = Verdict {
        rule: None,
        action: Action::Deny,
        log: false,
    };
}

impl RuleSet {
    /// First match wins; nothing matches → deny. The reference semantics every
    /// other classifier is checked against (a linear scan).
    pub fn decide(&self, p: &Packet) -> Verdict {
        self.rules
            .iter()
            .position(|r| r.matches(p))
            .map_or(Verdict::DEFAULT_DENY, |i| Verdict {
                rule: Some(i),
                action: self.rules[i].action,
                log: self.rules[i].log,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> u32 {
        u32::from(s.parse::<Ipv4Addr>().unwrap())
    }

    #[test]
    fn prefixes_ports_and_first_match() {
        let p = Prefix::new(ip("10.1.2.3"), 16);
        assert_eq!(p.addr, ip("10.1.0.0"));
        assert!(p.contains(ip("10.1.255.1")) && !p.contains(ip("10.2.0.0")));
        assert_eq!(p.to_string(), "10.1.0.0/16");
        assert_eq!(Prefix::ANY.range(), (0, u32::MAX));
        assert_eq!(mask32(0), 0);
        assert_eq!(mask32(32), u32::MAX);
        assert!(Ports { lo: 10, hi: 20 }.contains(20));

        let mut deny_web = Rule::any(Action::Deny);
        deny_web.proto = Proto::Is(PROTO_TCP);
        deny_web.dport = Ports { lo: 80, hi: 80 };
        let rs = RuleSet {
            source: "t".into(),
            rules: vec![deny_web, {
                let mut r = Rule::any(Action::Accept);
                r.proto = Proto::Is(PROTO_TCP);
                r
            }],
        };
        let pkt = |proto, dport| Packet {
            proto,
            src: ip("1.1.1.1"),
            sport: 1234,
            dst: ip("2.2.2.2"),
            dport,
        };
        assert_eq!(rs.decide(&pkt(PROTO_TCP, 80)).rule, Some(0));
        assert_eq!(rs.decide(&pkt(PROTO_TCP, 80)).action, Action::Deny);
        assert_eq!(rs.decide(&pkt(PROTO_TCP, 81)).action, Action::Accept);
        // Nothing matches UDP: default deny.
        assert_eq!(rs.decide(&pkt(PROTO_UDP, 53)), Verdict::DEFAULT_DENY);
    }
}

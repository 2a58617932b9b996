//! The shared vocabulary of sidecore (see `PRODUCT.md`): the kinds of processing
//! element, offload priorities, layout constraint kinds, channel properties, the
//! bandwidth unit, the status of running apps ([`status`]) and what the
//! supervisor does when an offcode fails ([`restart`]).
//!
//! Every other crate speaks these types, so they live in one small crate with no
//! I/O and no heavy dependencies.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

pub mod calls;
pub mod status;
pub use status::{AppId, AppState, AppStatus, ChannelStatus, OffcodeState, OffcodeStatus};

/// A 128-bit globally unique identifier for offcodes and interfaces (HYDRA §4.1).
pub type Guid = uuid::Uuid;

pub mod keyword;
pub use keyword::UnknownKeyword;

macro_rules! keyword_enum {
    ($(#[$m:meta])* $name:ident, $what:literal, { $($(#[$vm:meta])* $variant:ident = $kw:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(rename_all = "kebab-case")]
        pub enum $name { $($(#[$vm])* #[serde(rename = $kw)] $variant),+ }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];
            /// The manifest keyword for this variant.
            pub fn keyword(self) -> &'static str {
                match self { $($name::$variant => $kw),+ }
            }
            /// The keywords accepted, for error messages.
            pub const EXPECTED: &'static str = concat!($("`", $kw, "` "),+);
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result { f.write_str(self.keyword()) }
        }

        impl FromStr for $name {
            type Err = UnknownKeyword;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($kw => Ok($name::$variant),)+
                    _ => Err(UnknownKeyword { what: $what, got: s.to_string(), expected: $name::EXPECTED }),
                }
            }
        }
    };
}

// After the macro, which it uses.
pub mod restart;
pub use restart::{RestartMode, RestartPolicy};

keyword_enum!(
    /// A kind of processing element: somewhere an offcode can run.
    PeKind, "PE kind", {
        /// A dedicated, pinned CPU core running a run-to-completion loop.
        Core = "core",
        /// The kernel's eBPF engine (XDP, tc, maps, ring buffers).
        Kernel = "kernel",
        /// A WebAssembly sandbox on a core, for untrusted code.
        Wasm = "wasm",
        /// A peer sidecore daemon on another machine.
        Node = "node",
        /// A GPU, when present.
        Gpu = "gpu",
        /// An ordinary thread: the fallback that always exists.
        Host = "host",
    }
);

keyword_enum!(
    /// Offload priority (HYDRA's `OFFLOAD_PRIORITY`): deployment goes in this order,
    /// highest first.
    Priority, "priority", {
        Low = "low",
        Normal = "normal",
        High = "high",
    }
);

keyword_enum!(
    /// How a dedicated core shares its time among the offcodes placed on it
    /// (HYDRA §6.2.5–6.3): at each yield the dispatcher asks the policy which
    /// offcode's turn comes next.
    SchedPolicy, "scheduler", {
        /// Every offcode in turn, each turn (the loop before schedulers).
        RoundRobin = "round-robin",
        /// Non-preemptive EDF over periodic offcodes; others fill time whose
        /// static bound fits before the next release.
        Edf = "edf",
        /// <EDF>++ (Fig. 6.3): EDF, and non-periodic offcodes whose ticket
        /// (next turn's WCET) fits the slack run between periodic slots.
        EdfPlusPlus = "edf++",
        /// A cyclic executive: a fixed frame table over the periods.
        Cyclic = "cyclic",
    }
);

// As for `Priority`: `keyword_enum!` shares one derive list.
#[allow(clippy::derivable_impls)]
impl Default for SchedPolicy {
    fn default() -> Self {
        SchedPolicy::EdfPlusPlus
    }
}

impl Priority {
    /// The weight of this priority in the layout's offload objective.
    pub fn weight(self) -> u32 {
        match self {
            Priority::Low => 1,
            Priority::Normal => 2,
            Priority::High => 4,
        }
    }
}

// `keyword_enum!` shares one derive list among all its enums, so the default
// is written out here.
#[allow(clippy::derivable_impls)]
impl Default for Priority {
    fn default() -> Self {
        Priority::Normal
    }
}

keyword_enum!(
    /// A placement constraint between two offcodes (HYDRA Figure 4.7).
    ConstraintKind, "constraint", {
        /// No placement constraint; records that one needs the other.
        Link = "link",
        /// Both go to the same PE.
        Pull = "pull",
        /// If one is offloaded, so is the other (possibly onto a different PE).
        Gang = "gang",
        /// Offloading the importer implies offloading the imported, not the reverse.
        AsymGang = "asym-gang",
    }
);

keyword_enum!(
    /// Unicast joins exactly two offcodes; multicast delivers each message to N.
    Cast, "cast", {
        Unicast = "unicast",
        Multicast = "multicast",
    }
);

keyword_enum!(
    /// Sequential channels allow one invocation at a time, in order; parallel ones
    /// may be served by several workers at once (HYDRA §4.2.2).
    Order, "order", {
        Sequential = "sequential",
        Parallel = "parallel",
    }
);

keyword_enum!(
    /// Reliable channels apply back-pressure and never drop; unreliable ones drop
    /// when full and count the drops.
    Delivery, "delivery", {
        Reliable = "reliable",
        Unreliable = "unreliable",
    }
);

/// The properties of a channel (HYDRA §4.2.2), as a manifest declares them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChannelProps {
    pub cast: Cast,
    pub order: Order,
    pub delivery: Delivery,
    /// Required: the sender writes into the slot the receiver reads, so the
    /// channel must be shared memory; a deployment that would carry it over a
    /// copying transport (a TCP stream to a peer node) is refused. Local
    /// channels are shared-memory rings either way.
    pub zero_copy: bool,
    /// Number of slots in the ring (a power of two).
    pub slots: u32,
    /// Bytes per slot, including the slot header.
    pub slot_size: u32,
}

impl Default for ChannelProps {
    fn default() -> Self {
        ChannelProps {
            cast: Cast::Unicast,
            order: Order::Sequential,
            delivery: Delivery::Reliable,
            zero_copy: false,
            slots: 1024,
            slot_size: 128,
        }
    }
}

/// A data rate: **bits per second**, the one bandwidth unit of sidecore. Manifests
/// (`bandwidth = "10 Gbit/s"`), the layout's flows and link caps, and `devices`
/// all speak it. Parsed from an integer (bit/s) or a number with a unit:
/// `bit/s`, `kbit/s`, `Mbit/s`, `Gbit/s`, `Tbit/s` (also `bps`, `kbps`, `Mbps`,
/// `Gbps`, `Tbps`); decimal prefixes, as network rates are quoted.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Bandwidth {
    bps: u64,
}

/// The error returned for a bandwidth that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{got}` is not a bandwidth; write a number with a unit such as `500 Mbit/s` or `10 Gbit/s` (units: bit/s kbit/s Mbit/s Gbit/s Tbit/s)"
)]
pub struct BadBandwidth {
    pub got: String,
}

impl Bandwidth {
    /// No traffic.
    pub const ZERO: Bandwidth = Bandwidth { bps: 0 };

    /// `bps` bits per second.
    pub const fn from_bps(bps: u64) -> Self {
        Bandwidth { bps }
    }

    /// `mbps` megabits (10^6 bits) per second.
    pub const fn from_mbps(mbps: u64) -> Self {
        Bandwidth {
            bps: mbps.saturating_mul(1_000_000),
        }
    }

    /// `gbps` gigabits (10^9 bits) per second.
    pub const fn from_gbps(gbps: u64) -> Self {
        Bandwidth {
            bps: gbps.saturating_mul(1_000_000_000),
        }
    }

    /// Bits per second.
    pub const fn bps(self) -> u64 {
        self.bps
    }

    /// Bits per second as a float, for solvers and ratios.
    #[allow(clippy::cast_precision_loss)] // rates far below 2^53 bit/s are exact
    pub fn bps_f64(self) -> f64 {
        self.bps as f64
    }
}

impl fmt::Display for Bandwidth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // (scale, digits of the scale, unit): exact decimals, so it parses back.
        const UNITS: [(u64, usize, &str); 4] = [
            (1_000_000_000_000, 12, "Tbit/s"),
            (1_000_000_000, 9, "Gbit/s"),
            (1_000_000, 6, "Mbit/s"),
            (1_000, 3, "kbit/s"),
        ];
        for (scale, digits, unit) in UNITS {
            if self.bps >= scale {
                let (int, frac) = (self.bps / scale, self.bps % scale);
                if frac == 0 {
                    return write!(f, "{int} {unit}");
                }
                let frac = format!("{frac:0digits$}");
                return write!(f, "{int}.{} {unit}", frac.trim_end_matches('0'));
            }
        }
        write!(f, "{} bit/s", self.bps)
    }
}

impl FromStr for Bandwidth {
    type Err = BadBandwidth;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || BadBandwidth { got: s.to_string() };
        let t = s.trim();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
            .unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let num: f64 = num.replace('_', "").parse().map_err(|_| bad())?;
        let scale: f64 = match unit.trim() {
            "" | "bit/s" | "bps" | "b/s" => 1.0,
            "kbit/s" | "kbps" | "Kbit/s" | "Kbps" => 1e3,
            "Mbit/s" | "Mbps" => 1e6,
            "Gbit/s" | "Gbps" => 1e9,
            "Tbit/s" | "Tbps" => 1e12,
            _ => return Err(bad()),
        };
        let bps = num * scale;
        // u64::MAX as f64 rounds up to 2^64, so `<` keeps the cast in range.
        #[allow(clippy::cast_precision_loss)]
        let max = u64::MAX as f64;
        if !bps.is_finite() || bps < 0.0 || bps >= max {
            return Err(bad());
        }
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // checked above
        Ok(Bandwidth::from_bps(bps.round() as u64))
    }
}

/// A property of a PE, or a requirement on one (`require = { isolated = true }`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PropValue {
    Bool(bool),
    Int(i64),
    Str(String),
}

impl fmt::Display for PropValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PropValue::Bool(b) => write!(f, "{b}"),
            PropValue::Int(i) => write!(f, "{i}"),
            PropValue::Str(s) => write!(f, "{s:?}"),
        }
    }
}

keyword_enum!(
    /// Types a method may take and return (HYDRA's PARAM_* codes, plus bytes).
    ValueType, "type", {
        Bool = "bool",
        U8 = "u8",
        U16 = "u16",
        U32 = "u32",
        U64 = "u64",
        I8 = "i8",
        I16 = "i16",
        I32 = "i32",
        I64 = "i64",
        F32 = "f32",
        F64 = "f64",
        String = "string",
        Bytes = "bytes",
    }
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keywords_round_trip() {
        for k in PeKind::ALL {
            assert_eq!(k.keyword().parse::<PeKind>().unwrap(), *k);
        }
        for k in ConstraintKind::ALL {
            assert_eq!(k.to_string().parse::<ConstraintKind>().unwrap(), *k);
        }
    }

    #[test]
    fn unknown_keyword_lists_the_expected_ones() {
        let e = "fpga".parse::<PeKind>().unwrap_err();
        assert_eq!(e.got, "fpga");
        let msg = e.to_string();
        assert!(msg.contains("unknown PE kind `fpga`"), "{msg}");
        assert!(msg.contains("`core`") && msg.contains("`host`"), "{msg}");
    }

    #[test]
    fn priority_orders_low_to_high() {
        assert!(Priority::Low < Priority::Normal && Priority::Normal < Priority::High);
        assert!(Priority::High.weight() > Priority::Low.weight());
    }

    #[test]
    fn bandwidth_reads_units_and_prints_them_back() {
        assert_eq!(
            "10 Gbit/s".parse::<Bandwidth>().unwrap().bps(),
            10_000_000_000
        );
        assert_eq!(
            "500Mbps".parse::<Bandwidth>().unwrap(),
            Bandwidth::from_mbps(500)
        );
        assert_eq!(
            "1.5 Gbit/s".parse::<Bandwidth>().unwrap().bps(),
            1_500_000_000
        );
        assert_eq!("64000".parse::<Bandwidth>().unwrap().bps(), 64_000);
        assert_eq!(Bandwidth::from_gbps(10).to_string(), "10 Gbit/s");
        assert_eq!(Bandwidth::from_bps(1_500_000).to_string(), "1.5 Mbit/s");
        assert_eq!(Bandwidth::from_bps(12).to_string(), "12 bit/s");
        for bad in [
            "",
            "fast",
            "10 GB/s",
            "-1 Mbit/s",
            "1e400 bit/s",
            "10 Gbit/s/s",
        ] {
            let e = bad.parse::<Bandwidth>().unwrap_err();
            assert!(e.to_string().contains("is not a bandwidth"), "{bad}: {e}");
        }
        for b in [
            Bandwidth::ZERO,
            Bandwidth::from_mbps(1),
            Bandwidth::from_bps(123_456_789),
        ] {
            assert_eq!(b.to_string().parse::<Bandwidth>().unwrap(), b);
        }
    }
}

//! SCIRON, HYDRA's firewall (§8.4), sans-IO: the rules and what they decide,
//! with no sockets or kernel in sight.
//!
//! * [`rule`] — the model: ordered 5-tuple rules, first match wins, default deny.
//! * [`parse`] — rule files in TOML or the Al-Shaer & Hamed table layout, with
//!   every problem located.
//! * [`analyze`] — the policy advisor: shadowing, redundancy, generalization
//!   and correlation, each naming the pair of rules and their lines.
//! * [`classify`] — a tuple-space classifier whose lookup cost follows the
//!   number of rule shapes, not rules; the kernel and dedicated-core PEs run it.
//! * [`nft`] — the same rules as an nftables ruleset (the host baseline).

pub mod analyze;
pub mod classify;
pub mod nft;
pub mod parse;
pub mod rule;

pub use analyze::{Anomaly, Finding, analyze};
pub use classify::{Classifier, CompileError};
pub use parse::{RulesError, load};
pub use rule::{Action, Packet, Ports, Prefix, Proto, Rule, RuleSet, Verdict};

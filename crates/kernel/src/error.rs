//! How an XDP program is attached, and why the kernel PE could not do what was
//! asked: the refusal with the kernel's own words and a hint.

use std::fmt::Write as _;

/// How an XDP program is attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum XdpMode {
    /// Native mode where the driver has it, else generic.
    #[default]
    Auto,
    /// Generic (SKB) mode: every driver, after the socket buffer is built.
    Generic,
    /// Native (driver) mode: before the socket buffer exists.
    Native,
}

impl XdpMode {
    pub(crate) fn aya(self) -> aya::programs::XdpMode {
        match self {
            XdpMode::Auto => aya::programs::XdpMode::Default,
            XdpMode::Generic => aya::programs::XdpMode::Skb,
            XdpMode::Native => aya::programs::XdpMode::Driver,
        }
    }
}

/// A text that names no XDP mode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not an XDP mode (auto, generic or native)")]
pub struct BadXdpMode(pub String);

impl std::str::FromStr for XdpMode {
    type Err = BadXdpMode;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(XdpMode::Auto),
            "generic" | "skb" => Ok(XdpMode::Generic),
            "native" | "driver" => Ok(XdpMode::Native),
            _ => Err(BadXdpMode(s.to_string())),
        }
    }
}

/// Why the kernel PE could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("the kernel refused BPF object `{object}`: {detail}{}", hint(.detail))]
    Load { object: String, detail: String },
    #[error("BPF object `{object}` has no {what} `{name}`")]
    Missing {
        object: String,
        what: &'static str,
        name: String,
    },
    #[error("BPF object `{object}` has no {what} `{name}` (it has: {have})")]
    Absent {
        object: String,
        what: &'static str,
        name: String,
        have: String,
    },
    #[error("the kernel refused program `{program}`: {detail}{}", hint(.detail))]
    Verify { program: String, detail: String },
    #[error("cannot attach `{program}` at XDP on {iface}{}: {detail}{}", .netns.as_deref().map(|n| format!(" in namespace `{n}`")).unwrap_or_default(), hint(.detail))]
    Attach {
        program: String,
        iface: String,
        netns: Option<String>,
        detail: String,
    },
    #[error("{path} is not a cgroup v2 directory: {detail}")]
    NotCgroup2 { path: String, detail: String },
    #[error("cannot attach `{program}` to cgroup {cgroup}: {detail}{}", hint(.detail))]
    CgroupAttach {
        program: String,
        cgroup: String,
        detail: String,
    },
    #[error("Sikker L4 tables: {0}")]
    L4Tables(String),
    #[error("BPF map `{map}`: {detail}")]
    Map { map: String, detail: String },
    #[error(transparent)]
    Netns(#[from] sidecore_testbed::NetnsError),
    #[error(transparent)]
    Rules(#[from] sidecore_firewall::CompileError),
    #[error(
        "the rule set has {shapes} tuple shapes; the XDP classifier probes at most {max} (use fewer distinct prefix lengths or port ranges)"
    )]
    TooManyShapes { shapes: usize, max: usize },
}

/// Where the kernel exposes its own BTF.
const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// What to do about a refusal, from the error text.
fn hint(detail: &str) -> String {
    hint_for(detail, std::path::Path::new(VMLINUX_BTF).exists())
}

/// [`hint`] on a kernel that does (`btf`) or does not expose its BTF.
fn hint_for(detail: &str, btf: bool) -> String {
    let mut h = String::new();
    if detail.contains("Operation not permitted") || detail.contains("EPERM") {
        h.push_str(
            " (needs root, or CAP_BPF with CAP_NET_ADMIN; check kernel.unprivileged_bpf_disabled)",
        );
    }
    if detail.contains("BTF") && !btf {
        h.push_str(" (this kernel exposes no BTF at ");
        h.push_str(VMLINUX_BTF);
        h.push(')');
    }
    h
}

/// An error with its chain of sources, on one line (aya's errors nest).
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let _ = write!(s, ": {c}");
        cur = c.source();
    }
    s
}

/// Verifier log lines kept in an error.
pub(crate) const VERIFIER_LINES: usize = 12;

/// A program the kernel refused to load, with the tail of the verifier's log
/// when there is one.
pub(crate) fn refused(program: &str, e: &aya::programs::ProgramError) -> KernelError {
    KernelError::Verify {
        program: program.to_string(),
        detail: match e {
            aya::programs::ProgramError::LoadError {
                io_error,
                verifier_log,
            } => format!(
                "{io_error}; the verifier said:\n{}",
                tail(&verifier_log.to_string(), VERIFIER_LINES)
            ),
            other => chain(other),
        },
    }
}

/// The last lines of a verifier log: where it stopped, and why.
pub(crate) fn tail(log: &str, lines: usize) -> String {
    let v: Vec<&str> = log.lines().collect();
    v[v.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_say_what_to_do() {
        let eperm = KernelError::Load {
            object: "firewall.bpf.o".into(),
            detail: "map `rules`: Operation not permitted (os error 1)".into(),
        }
        .to_string();
        assert!(
            eperm.contains("firewall.bpf.o") && eperm.contains("needs root, or CAP_BPF"),
            "{eperm}"
        );
        let btf = "program `orion_fork`: BTF is required for tp_btf";
        assert!(hint_for(btf, false).contains("exposes no BTF at /sys/kernel/btf/vmlinux"));
        assert_eq!(
            hint_for(btf, true),
            "",
            "a kernel with BTF gets no BTF hint"
        );
        assert_eq!(hint_for("Invalid argument (os error 22)", false), "");
    }
}

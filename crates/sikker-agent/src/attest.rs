//! Identity, derived and never claimed (Sikker S.2/N.2 on Linux, digest §7.1):
//! a connecting process's pid and uid come from the kernel (`SO_PEERCRED`),
//! its cgroup from `/proc/PID/cgroup` (the v2 line) and its executable from
//! `/proc/PID/exe`. The policy maps those facts to one (service, process):
//! the process definition whose `cgroup` matches, and whose `program` and
//! `uid`, when given, match too. Reading the facts is I/O; matching them is
//! not, so tests drive [`attest`] with any facts they like.

use std::path::{Path, PathBuf};

use sidecore_sikker_nmu::{ProcessId, ServiceId};
use sidecore_sikker_policy::Policy;

/// What the kernel says about a process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessFacts {
    pub pid: i32,
    pub uid: u32,
    /// Its cgroup v2 path (`/sikker/bill/101`), or `None` when it has no v2
    /// membership line.
    pub cgroup: Option<String>,
    /// The executable it runs.
    pub exe: PathBuf,
}

/// Why a process cannot be given an identity.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AttestError {
    #[error("cannot read what the kernel says about pid {pid}: {why}")]
    Facts { pid: i32, why: String },
    #[error(
        "pid {pid} (uid {uid}, {exe}) is in no cgroup v2; the policy attests processes by cgroup"
    )]
    NoCgroup { pid: i32, uid: u32, exe: String },
    #[error("pid {pid} (uid {uid}, {exe}, cgroup {cgroup}) matches no process of the policy{near}")]
    NoMatch {
        pid: i32,
        uid: u32,
        exe: String,
        cgroup: String,
        /// What a definition with the same cgroup wanted instead, if any.
        near: String,
    },
    #[error(
        "pid {pid} in cgroup {cgroup} matches several processes ({which}); a cgroup must name one"
    )]
    Ambiguous {
        pid: i32,
        cgroup: String,
        which: String,
    },
}

/// Reads the facts of `pid` from `/proc` (root `proc`, normally `/proc`).
pub fn read_facts(proc: &Path, pid: i32, uid: u32) -> Result<ProcessFacts, AttestError> {
    let fail = |why: String| AttestError::Facts { pid, why };
    let dir = proc.join(pid.to_string());
    let cg = std::fs::read_to_string(dir.join("cgroup")).map_err(|e| fail(e.to_string()))?;
    let exe = std::fs::read_link(dir.join("exe")).map_err(|e| fail(e.to_string()))?;
    Ok(ProcessFacts {
        pid,
        uid,
        cgroup: cgroup_v2(&cg),
        exe,
    })
}

/// The facts of the process `f` describes, read again from `/proc` (root
/// `proc`): its cgroup and program, and its effective user from
/// `status` (the user the socket's credentials gave at attach otherwise).
/// `None` when the process cannot be read (it has gone).
pub fn reread_facts(proc: &Path, f: &ProcessFacts) -> Option<ProcessFacts> {
    let status = std::fs::read_to_string(proc.join(f.pid.to_string()).join("status")).ok()?;
    let euid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().nth(1))
        .and_then(|u| u.parse().ok())
        .unwrap_or(f.uid);
    read_facts(proc, f.pid, euid).ok()
}

/// The v2 path in the text of `/proc/PID/cgroup` (the `0::` line).
pub fn cgroup_v2(text: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| p.trim().to_string())
}

/// The one process of `policy` whose definition the facts satisfy.
pub fn attest(policy: &Policy, f: &ProcessFacts) -> Result<(ServiceId, ProcessId), AttestError> {
    let exe = f.exe.display().to_string();
    let Some(cgroup) = &f.cgroup else {
        return Err(AttestError::NoCgroup {
            pid: f.pid,
            uid: f.uid,
            exe,
        });
    };
    let mut found = Vec::new();
    let mut near = Vec::new();
    for s in policy.services.values() {
        for (&p, def) in &s.processes {
            if def.cgroup.as_deref() != Some(cgroup.as_str()) {
                continue;
            }
            let program_ok = def
                .program
                .as_deref()
                .is_none_or(|want| Path::new(want) == f.exe);
            let uid_ok = def.uid.is_none_or(|u| u == f.uid);
            if program_ok && uid_ok {
                found.push((s.id, p, format!("{}:{p}", s.name)));
            } else {
                near.push(format!(
                    "{}:{p} wants{}{}",
                    s.name,
                    def.program
                        .as_deref()
                        .filter(|_| !program_ok)
                        .map(|w| format!(" program {w}"))
                        .unwrap_or_default(),
                    def.uid
                        .filter(|_| !uid_ok)
                        .map(|u| format!(" uid {u}"))
                        .unwrap_or_default()
                ));
            }
        }
    }
    match found.as_slice() {
        [(s, p, _)] => Ok((*s, *p)),
        [] => Err(AttestError::NoMatch {
            pid: f.pid,
            uid: f.uid,
            exe,
            cgroup: cgroup.clone(),
            near: if near.is_empty() {
                String::new()
            } else {
                format!(" (in that cgroup, {})", near.join("; "))
            },
        }),
        many => Err(AttestError::Ambiguous {
            pid: f.pid,
            cgroup: cgroup.clone(),
            which: many
                .iter()
                .map(|(_, _, n)| n.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sidecore_sikker_policy::parse_policy;

    fn policy() -> Policy {
        parse_policy(
            "p.toml",
            r#"
[[service]]
name = "bill"
domains = ["Reply"]
[[service.process]]
id = 101
program = "/usr/bin/bill"
cgroup = "/sikker/bill/101"
uid = 1000

[[service]]
name = "kvs"
domains = ["Get"]
[[service.process]]
id = 3
cgroup = "/sikker/kvs/3"
[[service.process]]
id = 4
cgroup = "/sikker/shared"
[[service.process]]
id = 5
cgroup = "/sikker/shared"
"#,
        )
        .unwrap()
    }

    fn facts(cgroup: Option<&str>, exe: &str, uid: u32) -> ProcessFacts {
        ProcessFacts {
            pid: 42,
            uid,
            cgroup: cgroup.map(str::to_string),
            exe: exe.into(),
        }
    }

    #[test]
    fn the_cgroup_program_and_uid_together_name_one_process() {
        let p = policy();
        let bill = attest(&p, &facts(Some("/sikker/bill/101"), "/usr/bin/bill", 1000)).unwrap();
        assert_eq!(bill.1, 101);
        let kvs = attest(&p, &facts(Some("/sikker/kvs/3"), "/anything", 0)).unwrap();
        assert_eq!(kvs.1, 3);
    }

    #[test]
    fn every_mismatch_is_refused_and_says_why() {
        let p = policy();
        let e = attest(&p, &facts(Some("/sikker/bill/101"), "/usr/bin/other", 1000)).unwrap_err();
        assert!(
            e.to_string()
                .contains("bill:101 wants program /usr/bin/bill"),
            "{e}"
        );
        let e = attest(&p, &facts(Some("/sikker/bill/101"), "/usr/bin/bill", 0)).unwrap_err();
        assert!(e.to_string().contains("wants uid 1000"), "{e}");
        let e = attest(&p, &facts(Some("/elsewhere"), "/usr/bin/bill", 1000)).unwrap_err();
        assert!(
            e.to_string().contains("matches no process of the policy"),
            "{e}"
        );
        let e = attest(&p, &facts(None, "/usr/bin/bill", 1000)).unwrap_err();
        assert!(e.to_string().contains("in no cgroup v2"), "{e}");
        let e = attest(&p, &facts(Some("/sikker/shared"), "/x", 0)).unwrap_err();
        assert!(e.to_string().contains("kvs:4, kvs:5"), "{e}");
    }

    #[test]
    fn the_v2_line_is_found_among_v1_lines() {
        let text = "12:pids:/user.slice\n3:memory:/\n0::/sikker/kvs/3\n";
        assert_eq!(cgroup_v2(text).as_deref(), Some("/sikker/kvs/3"));
        assert_eq!(cgroup_v2("4:cpu:/\n"), None);
    }
}

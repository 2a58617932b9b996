//! The temporal access control template (§4.4) as a chain policy: rules that deny
//! NFSv3 procedures (or the classes "read", "write", "all") inside or outside a
//! daily time window, optionally only on some weekdays and only for some AUTH_SYS
//! UIDs. A denied call is answered NFS3ERR_ACCES by the policy itself and never
//! reaches the server. Sans-IO: [`TemporalRules::decide`] takes the time; the
//! policy reads it from a clock that tests can set ([`TemporalPolicy::with_clock`]).
//! The TOML schema is read in `policy`.

use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::chain::{Action, Policy};
use crate::flowstats::{PolicyCounters, lock_counters};
use crate::handles::{accepted, nfs_failure};
use crate::message::{Call, CallArgs, Msg, ReplyResults};
use crate::nfs3::{Nfs3Proc, NfsStat3};
use crate::rpc::Auth;

/// Procedures that change the file system (the "write" class).
pub const WRITE_CLASS: &[Nfs3Proc] = &[
    Nfs3Proc::Setattr,
    Nfs3Proc::Write,
    Nfs3Proc::Create,
    Nfs3Proc::Mkdir,
    Nfs3Proc::Symlink,
    Nfs3Proc::Mknod,
    Nfs3Proc::Remove,
    Nfs3Proc::Rmdir,
    Nfs3Proc::Rename,
    Nfs3Proc::Link,
    Nfs3Proc::Commit,
];

/// Procedures that only read (the "read" class).
pub const READ_CLASS: &[Nfs3Proc] = &[
    Nfs3Proc::Getattr,
    Nfs3Proc::Lookup,
    Nfs3Proc::Access,
    Nfs3Proc::Readlink,
    Nfs3Proc::Read,
    Nfs3Proc::Readdir,
    Nfs3Proc::Readdirplus,
    Nfs3Proc::Fsstat,
    Nfs3Proc::Fsinfo,
    Nfs3Proc::Pathconf,
];

/// A set of NFSv3 procedures (bit = procedure number).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcSet(u32);

impl ProcSet {
    pub fn insert(&mut self, p: Nfs3Proc) {
        self.0 |= 1 << p.to_u32();
    }
    pub fn contains(self, p: Nfs3Proc) -> bool {
        self.0 & (1 << p.to_u32()) != 0
    }

    /// Adds a class ("read", "write", "all") or a procedure name ("WRITE",
    /// case-insensitive). NULL cannot be denied: its reply has no status.
    pub fn add_name(&mut self, name: &str) -> Result<(), BadOp> {
        let lower = name.to_ascii_lowercase();
        match lower.as_str() {
            "read" => READ_CLASS.iter().for_each(|&p| self.insert(p)),
            "write" => WRITE_CLASS.iter().for_each(|&p| self.insert(p)),
            "all" => READ_CLASS
                .iter()
                .chain(WRITE_CLASS)
                .for_each(|&p| self.insert(p)),
            "null" => return Err(BadOp::Null),
            _ => {
                let Some(&p) = Nfs3Proc::ALL
                    .iter()
                    .find(|p| format!("{p:?}").eq_ignore_ascii_case(name))
                else {
                    return Err(BadOp::Unknown(name.to_string()));
                };
                self.insert(p);
            }
        }
        Ok(())
    }
}

/// A daily window `[start, end)` in minutes after midnight; `end < start` wraps
/// past midnight ("22:00-06:00").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub start: u32,
    pub end: u32,
}

/// Why an operation name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadOp {
    #[error("NULL cannot be denied (its reply carries no status)")]
    Null,
    #[error(
        "unknown operation {0:?} (a class: read, write, all; or an NFSv3 procedure such as \
         WRITE, REMOVE, READDIRPLUS)"
    )]
    Unknown(String),
}

/// Why a time, window or UTC offset was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadTime {
    #[error("{0:?} is not a time HH:MM (00:00 to 23:59, or 24:00 as an end)")]
    Time(String),
    #[error("{0:?} is not a window \"HH:MM-HH:MM\"")]
    NoDash(String),
    #[error("window {window:?}: {time}")]
    InWindow { window: String, time: Box<BadTime> },
    #[error("window {0:?} is empty")]
    Empty(String),
    #[error("{0:?} is not a UTC offset (\"+01:00\", \"-05:30\" or \"Z\")")]
    Offset(String),
}

fn parse_hhmm(s: &str, end: bool) -> Result<u32, BadTime> {
    let bad = || BadTime::Time(s.to_string());
    let (h, m) = s.split_once(':').ok_or_else(bad)?;
    if h.len() != 2 || m.len() != 2 {
        return Err(bad());
    }
    let h: u32 = h.parse().map_err(|_| bad())?;
    let m: u32 = m.parse().map_err(|_| bad())?;
    if m > 59 || h > 24 || (h == 24 && (m != 0 || !end)) {
        return Err(bad());
    }
    Ok(h * 60 + m)
}

impl Window {
    /// Parses "HH:MM-HH:MM".
    pub fn parse(s: &str) -> Result<Self, BadTime> {
        let (a, b) = s
            .split_once('-')
            .ok_or_else(|| BadTime::NoDash(s.to_string()))?;
        let in_window = |e: BadTime| BadTime::InWindow {
            window: s.to_string(),
            time: Box::new(e),
        };
        let w = Window {
            start: parse_hhmm(a.trim(), false).map_err(in_window)?,
            end: parse_hhmm(b.trim(), true).map_err(in_window)?,
        };
        if w.start == w.end {
            return Err(BadTime::Empty(s.to_string()));
        }
        Ok(w)
    }

    pub fn contains(self, minute: u32) -> bool {
        if self.start < self.end {
            (self.start..self.end).contains(&minute)
        } else {
            minute >= self.start || minute < self.end
        }
    }
}

/// Weekday names, index 0 = Monday.
pub const DAYS: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];

/// Parses a UTC offset "+HH:MM" / "-HH:MM" / "Z" into minutes.
pub fn parse_offset(s: &str) -> Result<i32, BadTime> {
    if s == "Z" || s == "UTC" {
        return Ok(0);
    }
    let bad = || BadTime::Offset(s.to_string());
    let (sign, rest) = match s.as_bytes().first() {
        Some(b'+') => (1, &s[1..]),
        Some(b'-') => (-1, &s[1..]),
        _ => return Err(bad()),
    };
    let m = parse_hhmm(rest, false).map_err(|_| bad())?;
    if m > 14 * 60 {
        return Err(bad());
    }
    Ok(sign * m as i32)
}

/// When a rule's window applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// Deny while the clock is inside the window.
    During(Window),
    /// Deny while the clock is outside the window.
    Outside(Window),
}

/// One rule: deny `ops` for `uids` (all callers if `None`) when `when` holds on
/// `days` (bit 0 = Monday; all days if 0x7f).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemporalRule {
    pub ops: ProcSet,
    pub when: When,
    pub days: u8,
    pub uids: Option<Vec<u32>>,
    /// The rule's line in the policy file (for the operator; 0 if built in code).
    pub line: usize,
}

/// The rules of one temporal policy and the zone their clock times are in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TemporalRules {
    /// Minutes east of UTC.
    pub utc_offset_min: i32,
    pub rules: Vec<TemporalRule>,
}

/// Local (weekday 0 = Monday, minute of the day) of `now`.
pub fn local_time(now: SystemTime, utc_offset_min: i32) -> (u32, u32) {
    let secs = match now.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => -(e.duration().as_secs() as i64),
    };
    let minutes = secs.div_euclid(60) + i64::from(utc_offset_min);
    let day = minutes.div_euclid(1440);
    let minute = minutes.rem_euclid(1440) as u32;
    // 1970-01-01 was a Thursday (index 3).
    let weekday = (day + 3).rem_euclid(7) as u32;
    (weekday, minute)
}

impl TemporalRules {
    /// The index of the first rule that denies `call` at `now`, if any.
    pub fn decide(&self, call: &Call, now: SystemTime) -> Option<usize> {
        let CallArgs::Nfs3(args) = &call.args else {
            return None;
        };
        let proc_ = args.procedure();
        let uid = match &call.cred {
            Auth::Sys(s) => Some(s.uid),
            _ => None,
        };
        let (weekday, minute) = local_time(now, self.utc_offset_min);
        self.rules.iter().position(|r| {
            r.ops.contains(proc_)
                && r.days & (1 << weekday) != 0
                && r.uids
                    .as_ref()
                    .is_none_or(|u| uid.is_some_and(|uid| u.contains(&uid)))
                && match r.when {
                    When::During(w) => w.contains(minute),
                    When::Outside(w) => !w.contains(minute),
                }
        })
    }
}

/// The clock a temporal policy reads.
pub type Clock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

/// The temporal policy.
pub struct TemporalPolicy {
    rules: TemporalRules,
    counters: Arc<Mutex<PolicyCounters>>,
    clock: Clock,
}

impl TemporalPolicy {
    /// A policy on the system clock.
    pub fn new(rules: TemporalRules, counters: Arc<Mutex<PolicyCounters>>) -> Self {
        Self::with_clock(rules, counters, Arc::new(SystemTime::now))
    }

    pub fn with_clock(
        rules: TemporalRules,
        counters: Arc<Mutex<PolicyCounters>>,
        clock: Clock,
    ) -> Self {
        Self {
            rules,
            counters,
            clock,
        }
    }
}

impl Policy<Msg> for TemporalPolicy {
    fn name(&self) -> &str {
        "temporal"
    }

    fn on_request(&mut self, _xid: u32, request: Msg, out: &mut Vec<Action<Msg>>) {
        if let Msg::Call { call, .. } = &request
            && let CallArgs::Nfs3(args) = &call.args
            && self.rules.decide(call, (self.clock)()).is_some()
        {
            lock_counters(&self.counters).temporal_denied += 1;
            let fail = nfs_failure(args.procedure(), NfsStat3::Acces);
            out.push(Action::Respond(Msg::Reply(accepted(ReplyResults::Nfs3(
                fail,
            )))));
            return;
        }
        out.push(Action::Forward(request));
    }

    fn on_response(
        &mut self,
        _xid: u32,
        _request: &Msg,
        response: Msg,
        out: &mut Vec<Action<Msg>>,
    ) {
        out.push(Action::Forward(response));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nfs3::{Nfs3Call, NfsFh3, WriteArgs};
    use crate::rpc::AuthSys;
    use std::time::Duration;

    /// 2026-11-23 (a Monday) 00:00 UTC plus `h` hours and `m` minutes.
    fn at(h: u64, m: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_795_392_000 + h * 3600 + m * 60)
    }

    fn call(args: Nfs3Call, uid: Option<u32>) -> Call {
        Call {
            xid: 7,
            cred: uid.map_or(Auth::None, |uid| {
                Auth::Sys(AuthSys {
                    stamp: 0,
                    machine_name: b"c".to_vec(),
                    uid,
                    gid: uid,
                    gids: vec![],
                })
            }),
            verf: Auth::None,
            args: CallArgs::Nfs3(args),
        }
    }

    fn getattr() -> Nfs3Call {
        Nfs3Call::Getattr(NfsFh3(vec![1; 8]))
    }

    fn rule(ops: &[&str], when: When, uids: Option<Vec<u32>>) -> TemporalRule {
        let mut set = ProcSet::default();
        for o in ops {
            set.add_name(o).unwrap();
        }
        TemporalRule {
            ops: set,
            when,
            days: 0x7f,
            uids,
            line: 0,
        }
    }

    #[test]
    fn clock_arithmetic() {
        assert_eq!(local_time(at(0, 0), 0), (0, 0));
        assert_eq!(local_time(at(13, 5), 0), (0, 13 * 60 + 5));
        // An hour west of UTC, Monday 00:30 is Sunday 23:30.
        assert_eq!(local_time(at(0, 30), -60), (6, 23 * 60 + 30));
        assert_eq!(local_time(UNIX_EPOCH, 0), (3, 0));
        assert_eq!(
            local_time(UNIX_EPOCH - Duration::from_secs(60), 0),
            (2, 1439)
        );
    }

    #[test]
    fn windows_parse_and_wrap() {
        let w = Window::parse("09:00-17:00").unwrap();
        assert_eq!((w.start, w.end), (540, 1020));
        assert!(w.contains(540) && w.contains(1019) && !w.contains(1020) && !w.contains(0));
        let night = Window::parse("22:00-06:00").unwrap();
        assert!(night.contains(23 * 60) && night.contains(0) && !night.contains(6 * 60));
        assert!(Window::parse("00:00-24:00").unwrap().contains(1439));
        for bad in [
            "9-17",
            "09:00",
            "25:00-26:00",
            "09:60-10:00",
            "24:00-01:00",
            "10:00-10:00",
        ] {
            assert!(Window::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_offset("+01:30"), Ok(90));
        assert_eq!(parse_offset("-05:00"), Ok(-300));
        assert_eq!(parse_offset("Z"), Ok(0));
        assert!(parse_offset("01:00").is_err() && parse_offset("+15:00").is_err());
    }

    #[test]
    fn names_and_classes() {
        let mut s = ProcSet::default();
        s.add_name("write").unwrap();
        assert!(s.contains(Nfs3Proc::Remove) && !s.contains(Nfs3Proc::Read));
        s.add_name("readdirPLUS").unwrap();
        assert!(s.contains(Nfs3Proc::Readdirplus));
        assert!(s.add_name("NULL").is_err());
        assert!(
            s.add_name("frobnicate")
                .unwrap_err()
                .to_string()
                .contains("unknown operation")
        );
        let mut all = ProcSet::default();
        all.add_name("all").unwrap();
        assert!(
            Nfs3Proc::ALL
                .iter()
                .all(|&p| all.contains(p) == (p != Nfs3Proc::Null))
        );
    }

    #[test]
    fn decide_by_window_uid_and_day() {
        let w = Window::parse("09:00-17:00").unwrap();
        let rules = TemporalRules {
            utc_offset_min: 0,
            rules: vec![
                rule(&["write"], When::Outside(w), None),
                rule(&["read"], When::During(w), Some(vec![1001])),
            ],
        };
        let write = call(
            Nfs3Call::Write(WriteArgs {
                file: NfsFh3(vec![1; 8]),
                offset: 0,
                count: 1,
                stable: crate::nfs3::StableHow::FileSync,
                data: vec![0],
            }),
            Some(1000),
        );
        assert_eq!(rules.decide(&write, at(8, 59)), Some(0));
        assert_eq!(rules.decide(&write, at(9, 0)), None);
        assert_eq!(rules.decide(&write, at(16, 59)), None);
        assert_eq!(rules.decide(&write, at(17, 0)), Some(0));
        // Reads: only UID 1001, only during the window; AUTH_NONE never matches a UID list.
        assert_eq!(
            rules.decide(&call(getattr(), Some(1001)), at(10, 0)),
            Some(1)
        );
        assert_eq!(rules.decide(&call(getattr(), Some(1000)), at(10, 0)), None);
        assert_eq!(rules.decide(&call(getattr(), None), at(10, 0)), None);
        assert_eq!(rules.decide(&call(getattr(), Some(1001)), at(18, 0)), None);
        // Weekends only: Monday passes, Saturday (5 days later) is denied.
        let mut weekend = rule(&["all"], When::Outside(w), None);
        weekend.days = 0b110_0000;
        let rules = TemporalRules {
            utc_offset_min: 0,
            rules: vec![weekend],
        };
        let sat = at(5 * 24 + 20, 0);
        assert_eq!(rules.decide(&call(getattr(), None), at(20, 0)), None);
        assert_eq!(rules.decide(&call(getattr(), None), sat), Some(0));
        // The zone moves the window: 08:30 UTC is 09:30 at +01:00.
        let rules = TemporalRules {
            utc_offset_min: 60,
            rules: vec![rule(&["write"], When::Outside(w), None)],
        };
        assert_eq!(rules.decide(&write, at(8, 30)), None);
        assert_eq!(rules.decide(&write, at(16, 30)), Some(0));
    }

    #[test]
    fn policy_answers_acces_and_follows_the_clock() {
        let w = Window::parse("09:00-17:00").unwrap();
        let rules = TemporalRules {
            utc_offset_min: 0,
            rules: vec![rule(&["getattr"], When::Outside(w), None)],
        };
        let now = Arc::new(Mutex::new(at(3, 0)));
        let clock_now = now.clone();
        let counters = Arc::<Mutex<PolicyCounters>>::default();
        let mut p = TemporalPolicy::with_clock(
            rules,
            counters.clone(),
            Arc::new(move || *clock_now.lock().unwrap()),
        );
        let msg = Msg::Call {
            flow: 1,
            peer: std::net::Ipv4Addr::LOCALHOST.into(),
            call: call(getattr(), Some(1000)),
        };
        let mut out = Vec::new();
        p.on_request(1, msg.clone(), &mut out);
        let expected = Msg::Reply(accepted(ReplyResults::Nfs3(nfs_failure(
            Nfs3Proc::Getattr,
            NfsStat3::Acces,
        ))));
        assert_eq!(out, vec![Action::Respond(expected)]);
        assert_eq!(counters.lock().unwrap().temporal_denied, 1);
        *now.lock().unwrap() = at(12, 0);
        out.clear();
        p.on_request(2, msg.clone(), &mut out);
        assert_eq!(out, vec![Action::Forward(msg)]);
        assert_eq!(counters.lock().unwrap().temporal_denied, 1);
    }
}

//! `fault-injector`: forwards every record from `in` to `out` unchanged and,
//! for restart policies to be tried on, fails on purpose. After `fail_after`
//! records in one life it fails at the end of that turn: with an error
//! (`fail = "error"`), or by stalling the turn for `stall_ms` so its watchdog
//! expires (`fail = "stall"`). Only the first `failing_lives` lives fail
//! (0: every life); a restarted instance counts its life from the offcode's
//! `lives` counter, which outlives instances. Records are counted across
//! lives (`records`), so a test sees what went through in all.
//!
//! It fails at a turn's end, after the burst it took was forwarded, so a
//! restart loses no record; an offcode that fails halfway through a burst
//! would lose the rest of that burst.

use std::time::Duration;

use serde::Deserialize;
use sidecore_offcode::{
    InitCx, InputId, Metric, Offcode, OffcodeError, OutputId, Progress, RunCx, parse_params,
};

/// Longest stall a `fail = "stall"` life may ask for.
const MAX_STALL_MS: u64 = 60_000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Params {
    /// Records one life forwards before it fails.
    fail_after: u64,
    /// `error` or `stall`.
    #[serde(default = "default_fail")]
    fail: String,
    /// How long a failing turn stalls (with `fail = "stall"`), ms.
    #[serde(default = "default_stall_ms")]
    stall_ms: u64,
    /// Lives that fail; later ones run clean. 0: all of them.
    #[serde(default)]
    failing_lives: u64,
}

fn default_fail() -> String {
    "error".into()
}

fn default_stall_ms() -> u64 {
    200
}

/// How a life ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fail {
    Error,
    Stall(Duration),
}

/// The fault injector.
pub struct FaultInjector {
    fail_after: u64,
    fail: Fail,
    failing_lives: u64,
    /// This instance's life, from 1.
    life: u64,
    /// Records forwarded in this life.
    n: u64,
    input: InputId,
    out: Option<OutputId>,
    records: Metric,
    lives: Metric,
}

impl FaultInjector {
    pub fn new(params: &toml::Table) -> Result<Self, OffcodeError> {
        let p: Params = parse_params(params)?;
        if p.fail_after == 0 {
            return Err(OffcodeError::Params(
                "`fail_after` must be at least 1".into(),
            ));
        }
        let fail = match p.fail.as_str() {
            "error" => Fail::Error,
            "stall" if p.stall_ms <= MAX_STALL_MS => Fail::Stall(Duration::from_millis(p.stall_ms)),
            "stall" => {
                return Err(OffcodeError::Params(format!(
                    "`stall_ms` must be at most {MAX_STALL_MS}, got {}",
                    p.stall_ms
                )));
            }
            other => {
                return Err(OffcodeError::Params(format!(
                    "`fail` must be `error` or `stall`, got `{other}`"
                )));
            }
        };
        Ok(FaultInjector {
            fail_after: p.fail_after,
            fail,
            failing_lives: p.failing_lives,
            life: 0,
            n: 0,
            input: InputId(0),
            out: None,
            records: Metric::default(),
            lives: Metric::default(),
        })
    }

    fn fails(&self) -> bool {
        self.failing_lives == 0 || self.life <= self.failing_lives
    }
}

impl Offcode for FaultInjector {
    fn initialize(&mut self, cx: &mut InitCx<'_>) -> Result<(), OffcodeError> {
        self.input = cx.input("in")?;
        self.out = cx.output("out").ok();
        self.records = cx.metric("records");
        self.lives = cx.metric("lives");
        self.lives.add(1);
        self.life = self.lives.get();
        Ok(())
    }

    fn handle(
        &mut self,
        cx: &mut RunCx<'_>,
        input: InputId,
        msg: &[u8],
    ) -> Result<(), OffcodeError> {
        debug_assert_eq!(input, self.input);
        if let Some(out) = self.out {
            cx.send(out, |slot| {
                let n = msg.len().min(slot.len());
                slot[..n].copy_from_slice(&msg[..n]);
                n
            })?;
        }
        self.n += 1;
        self.records.add(1);
        Ok(())
    }

    fn poll(&mut self, _cx: &mut RunCx<'_>) -> Result<Progress, OffcodeError> {
        if self.n < self.fail_after || !self.fails() {
            return Ok(Progress::Idle);
        }
        match self.fail {
            Fail::Error => Err(OffcodeError::failed(format!(
                "injected fault after {} records (life {})",
                self.n, self.life
            ))),
            Fail::Stall(d) => {
                // The watchdog stops it when this turn returns; without one
                // it stalls again after the next `fail_after` records.
                self.n = 0;
                std::thread::sleep(d);
                Ok(Progress::Idle)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(t: &str) -> toml::Table {
        toml::from_str(t).unwrap_or_default()
    }

    #[test]
    fn bad_parameters_are_named() {
        let e = |t: &str| FaultInjector::new(&params(t)).err().map(|e| e.to_string());
        assert!(e("").unwrap_or_default().contains("fail_after"));
        assert!(
            e("fail_after = 0")
                .unwrap_or_default()
                .contains("at least 1")
        );
        assert!(
            e("fail_after = 1\nfail = \"boom\"")
                .unwrap_or_default()
                .contains("`error` or `stall`")
        );
        assert!(
            e("fail_after = 1\nfail = \"stall\"\nstall_ms = 999999")
                .unwrap_or_default()
                .contains("at most 60000")
        );
        assert!(e("fail_after = 3\nfail = \"stall\"").is_none());
    }
}

//! When to grow or shrink ActivePPE (§2.5.1's reconfiguration, driven by
//! load), sans-IO: fed one [`Sample`] per interval — each active PPE's busy
//! fraction over it — it answers [`Decision::Add`], [`Decision::Remove`] or
//! [`Decision::Hold`]. The caller (the `tcps-autoscale` offcode) measures and
//! acts; nothing here touches a server.
//!
//! Hysteresis three ways, so ActivePPE does not flap:
//! * grow only after `up_after` samples in a row with the mean load at or
//!   above `high`; shrink only after `down_after` samples in a row where the
//!   total load would fit on one PPE fewer at or below `low` (< `high`), so a
//!   shrink never lands the remaining PPEs above `high`;
//! * no change within `cooldown` samples of the last one (the new PPE's
//!   share of connections takes a moment to arrive, and its first samples
//!   are partial);
//! * one PPE at a time.
//!
//! A PPE is added on the lowest CPU of AllowedPPE not yet active; the one
//! removed is the active helper with the fewest connections (the master is
//! never removed: it owns the listening socket).

use crate::shared::CoreSet;

/// Thresholds and dwell times.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Policy {
    /// Mean busy fraction of the active PPEs at or above which they are saturated.
    pub high: f64,
    /// Busy fraction one PPE fewer would have, at or below which one can go.
    pub low: f64,
    /// Saturated samples in a row before a PPE is added.
    pub up_after: u32,
    /// Idle samples in a row before a PPE is removed.
    pub down_after: u32,
    /// Samples after a change before the next one.
    pub cooldown: u32,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            high: 0.75,
            low: 0.3,
            up_after: 3,
            down_after: 20,
            cooldown: 10,
        }
    }
}

/// What is wrong with a policy.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PolicyError {
    #[error("`high` = {high} must be above 0 and at most 1")]
    High { high: f64 },
    #[error("`low` = {low} must be at least 0 and below `high` = {high} (hysteresis)")]
    Low { low: f64, high: f64 },
    #[error("`up_after` and `down_after` must be at least 1 sample")]
    Dwell,
}

impl Policy {
    /// Checks the thresholds.
    pub fn validate(&self) -> Result<(), PolicyError> {
        if !(self.high > 0.0 && self.high <= 1.0) {
            return Err(PolicyError::High { high: self.high });
        }
        if !(self.low >= 0.0 && self.low < self.high) {
            return Err(PolicyError::Low {
                low: self.low,
                high: self.high,
            });
        }
        if self.up_after == 0 || self.down_after == 0 {
            return Err(PolicyError::Dwell);
        }
        Ok(())
    }
}

/// One interval's view of a server.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub allowed: CoreSet,
    pub active: CoreSet,
    pub master: usize,
    /// (CPU, busy fraction over the interval, connections) of each active PPE.
    pub ppes: Vec<(usize, f64, u64)>,
}

impl Sample {
    /// Mean busy fraction of the active PPEs (0 with none).
    pub fn mean_load(&self) -> f64 {
        if self.ppes.is_empty() {
            return 0.0;
        }
        self.total_load() / self.ppes.len() as f64
    }

    /// Sum of the active PPEs' busy fractions.
    pub fn total_load(&self) -> f64 {
        self.ppes.iter().map(|p| p.1.clamp(0.0, 1.0)).sum()
    }
}

/// What to do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Hold,
    /// Make this CPU an active PPE.
    Add(usize),
    /// Take this CPU out of ActivePPE.
    Remove(usize),
}

/// The controller's memory between samples.
#[derive(Debug, Clone)]
pub struct Autoscaler {
    policy: Policy,
    hot: u32,
    cold: u32,
    since_change: u32,
}

impl Autoscaler {
    /// A controller; `policy` should have passed [`Policy::validate`].
    pub fn new(policy: Policy) -> Autoscaler {
        Autoscaler {
            policy,
            hot: 0,
            cold: 0,
            // The first change may come as soon as the dwell allows.
            since_change: policy.cooldown,
        }
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Takes one sample and says what to do. After `Add`/`Remove` the caller
    /// acts; if that fails, [`Autoscaler::failed`] lets the next sample try
    /// again instead of waiting out the cooldown.
    pub fn observe(&mut self, s: &Sample) -> Decision {
        self.since_change = self.since_change.saturating_add(1);
        let n = s.ppes.len();
        let mean = s.mean_load();
        if mean >= self.policy.high {
            self.hot += 1;
        } else {
            self.hot = 0;
        }
        let fits_fewer = n > 1 && s.total_load() / (n - 1) as f64 <= self.policy.low;
        if fits_fewer {
            self.cold += 1;
        } else {
            self.cold = 0;
        }
        if self.since_change < self.policy.cooldown {
            return Decision::Hold;
        }
        if self.hot >= self.policy.up_after
            && let Some(cpu) = s
                .allowed
                .cpus()
                .into_iter()
                .find(|c| !s.active.contains(*c))
        {
            self.changed();
            return Decision::Add(cpu);
        }
        if self.cold >= self.policy.down_after
            && let Some(cpu) = s
                .ppes
                .iter()
                .filter(|p| p.0 != s.master)
                .min_by_key(|p| (p.2, std::cmp::Reverse(p.0)))
                .map(|p| p.0)
        {
            self.changed();
            return Decision::Remove(cpu);
        }
        Decision::Hold
    }

    /// The change it asked for could not be made.
    pub fn failed(&mut self) {
        self.since_change = self.policy.cooldown;
    }

    fn changed(&mut self) {
        self.hot = 0;
        self.cold = 0;
        self.since_change = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(allowed: &[usize], ppes: &[(usize, f64, u64)]) -> Sample {
        Sample {
            allowed: CoreSet::of(allowed).unwrap_or_default(),
            active: CoreSet::of(&ppes.iter().map(|p| p.0).collect::<Vec<_>>()).unwrap_or_default(),
            master: 1,
            ppes: ppes.to_vec(),
        }
    }

    fn quick() -> Policy {
        Policy {
            high: 0.8,
            low: 0.3,
            up_after: 3,
            down_after: 4,
            cooldown: 2,
        }
    }

    #[test]
    fn grows_after_the_dwell_on_the_lowest_free_cpu() {
        let mut a = Autoscaler::new(quick());
        let hot = sample(&[0, 1, 2], &[(1, 0.95, 100)]);
        assert_eq!(a.observe(&hot), Decision::Hold);
        assert_eq!(a.observe(&hot), Decision::Hold);
        assert_eq!(a.observe(&hot), Decision::Add(0));
    }

    #[test]
    fn one_cool_sample_resets_the_dwell() {
        let mut a = Autoscaler::new(quick());
        let hot = sample(&[0, 1], &[(1, 0.95, 100)]);
        let cool = sample(&[0, 1], &[(1, 0.5, 100)]);
        for _ in 0..2 {
            assert_eq!(a.observe(&hot), Decision::Hold);
        }
        assert_eq!(a.observe(&cool), Decision::Hold);
        for _ in 0..2 {
            assert_eq!(a.observe(&hot), Decision::Hold);
        }
        assert_eq!(a.observe(&hot), Decision::Add(0));
    }

    #[test]
    fn never_grows_beyond_allowed_nor_removes_the_master() {
        let mut a = Autoscaler::new(quick());
        let all = sample(&[0, 1], &[(0, 1.0, 5), (1, 1.0, 5)]);
        for _ in 0..20 {
            assert_eq!(a.observe(&all), Decision::Hold);
        }
        let alone = sample(&[0, 1], &[(1, 0.0, 0)]);
        for _ in 0..20 {
            assert_eq!(a.observe(&alone), Decision::Hold);
        }
    }

    #[test]
    fn shrinks_the_emptiest_helper_only_when_one_fewer_stays_low() {
        let mut a = Autoscaler::new(quick());
        // 0.2 + 0.2 on one PPE would be 0.4 > low: both stay.
        let two = sample(&[0, 1, 2], &[(0, 0.2, 3), (1, 0.2, 9)]);
        for _ in 0..10 {
            assert_eq!(a.observe(&two), Decision::Hold);
        }
        let idle = sample(&[0, 1, 2], &[(0, 0.05, 3), (1, 0.1, 9), (2, 0.05, 1)]);
        for _ in 0..3 {
            assert_eq!(a.observe(&idle), Decision::Hold);
        }
        assert_eq!(a.observe(&idle), Decision::Remove(2));
        // Cooldown, then the dwell again.
        let idle2 = sample(&[0, 1, 2], &[(0, 0.05, 3), (1, 0.1, 9)]);
        for _ in 0..3 {
            assert_eq!(a.observe(&idle2), Decision::Hold);
        }
        assert_eq!(a.observe(&idle2), Decision::Remove(0));
    }

    #[test]
    fn a_shrink_never_lands_above_high_and_so_never_flaps() {
        let p = quick();
        let mut a = Autoscaler::new(p);
        // Two PPEs at `low / 2` each: the total fits one PPE at `low`.
        let s = sample(&[0, 1], &[(0, p.low / 2.0, 1), (1, p.low / 2.0, 1)]);
        let mut d = Decision::Hold;
        for _ in 0..p.down_after {
            d = a.observe(&s);
        }
        assert_eq!(d, Decision::Remove(0));
        // The same total on one PPE is `low`, below `high`: no grow follows.
        let after = sample(&[0, 1], &[(1, p.low, 2)]);
        for _ in 0..50 {
            assert_eq!(a.observe(&after), Decision::Hold);
        }
    }

    #[test]
    fn cooldown_holds_after_a_change_and_failure_lifts_it() {
        let mut a = Autoscaler::new(quick());
        let hot = sample(&[0, 1, 2], &[(1, 0.95, 100)]);
        for _ in 0..2 {
            a.observe(&hot);
        }
        assert_eq!(a.observe(&hot), Decision::Add(0));
        a.failed();
        for _ in 0..2 {
            assert_eq!(a.observe(&hot), Decision::Hold);
        }
        assert_eq!(a.observe(&hot), Decision::Add(0));
        // Succeeded this time: the cooldown holds even a hot server.
        let hot2 = sample(&[0, 1, 2], &[(0, 0.95, 50), (1, 0.95, 50)]);
        assert_eq!(a.observe(&hot2), Decision::Hold);
    }

    #[test]
    fn policy_errors_name_the_field() {
        let bad = Policy {
            low: 0.9,
            ..quick()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("`low` = 0.9")
        );
        let bad = Policy {
            high: 1.5,
            ..quick()
        };
        assert!(bad.validate().unwrap_err().to_string().contains("`high`"));
        let bad = Policy {
            up_after: 0,
            ..quick()
        };
        assert_eq!(bad.validate(), Err(PolicyError::Dwell));
        assert_eq!(quick().validate(), Ok(()));
    }

    proptest::proptest! {
        /// Whatever the loads: adds stay within AllowedPPE and off the active
        /// set, removes never take the master nor leave one PPE fewer above
        /// `low`, and two changes are at least `cooldown` samples apart.
        #[test]
        fn decisions_respect_the_sets_and_the_cooldown(
            loads in proptest::collection::vec(proptest::collection::vec(0.0f64..1.0, 3), 1..200),
            active_mask in 1u64..8,
        ) {
            let p = quick();
            let mut a = Autoscaler::new(p);
            let mut last_change: Option<usize> = None;
            let mut active = CoreSet(active_mask | 0b10);
            for (t, l) in loads.iter().enumerate() {
                let ppes: Vec<(usize, f64, u64)> =
                    active.cpus().into_iter().map(|c| (c, l[c], c as u64)).collect();
                let s = Sample { allowed: CoreSet(0b111), active, master: 1, ppes: ppes.clone() };
                match a.observe(&s) {
                    Decision::Hold => {}
                    Decision::Add(c) => {
                        proptest::prop_assert!(c < 3 && !active.contains(c));
                        proptest::prop_assert!(s.mean_load() >= p.high);
                        if let Some(t0) = last_change { proptest::prop_assert!(t - t0 >= p.cooldown as usize); }
                        last_change = Some(t);
                        active.0 |= 1 << c;
                    }
                    Decision::Remove(c) => {
                        proptest::prop_assert!(c != 1 && active.contains(c));
                        proptest::prop_assert!(s.total_load() / (ppes.len() - 1) as f64 <= p.low);
                        if let Some(t0) = last_change { proptest::prop_assert!(t - t0 >= p.cooldown as usize); }
                        last_change = Some(t);
                        active.0 &= !(1 << c);
                    }
                }
            }
        }
    }
}

//! An offcode's timing for the schedulers of a shared core (HYDRA §6.3):
//! `period_ms` makes it periodic (a job every period, due by the next), and
//! `wcet_us` is the worst-case time of one turn between two yields — the
//! ticket of §6.3.2. A periodic offcode's CPU share (Eq. 7.6's `u = e/p`) is
//! its default `cpu`. Ground floor: it knows the diagnostics only.

use std::time::Duration;

use crate::diag::{FileId, Report};
use crate::raw::S;

/// When an offcode runs and for how long at most.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Timing {
    /// Release period: set for a periodic offcode.
    pub period: Option<Duration>,
    /// Worst-case time of one turn (its WCET between two yields).
    pub wcet: Option<Duration>,
}

impl Timing {
    /// `e/p` for a periodic offcode with both declared.
    pub fn utilisation(&self) -> Option<f64> {
        match (self.period, self.wcet) {
            (Some(p), Some(e)) => Some(e.as_secs_f64() / p.as_secs_f64()),
            _ => None,
        }
    }
}

/// Reads `period_ms` and `wcet_us`; `None` once a problem is reported.
pub(crate) fn timing(
    r: &mut Report,
    file: FileId,
    period_ms: Option<&S<f64>>,
    wcet_us: Option<&S<f64>>,
) -> Option<Timing> {
    let positive = |r: &mut Report, v: &S<f64>, field: &str, unit: f64| {
        let x = *v.get_ref();
        if x.is_finite() && x > 0.0 && x * unit < 1e12 {
            Some(Duration::from_secs_f64(x * unit / 1e9))
        } else {
            r.error(
                file,
                v.span(),
                format!("`{field}` must be a positive time below 1000 s, got {x}"),
                "bad time",
            );
            None
        }
    };
    let period = period_ms.map(|v| positive(r, v, "period_ms", 1e6));
    let wcet = wcet_us.map(|v| positive(r, v, "wcet_us", 1e3));
    let (period, wcet) = match (period, wcet) {
        (Some(None), _) | (_, Some(None)) => return None,
        (p, w) => (p.flatten(), w.flatten()),
    };
    if let (Some(p), None, Some(v)) = (period, wcet, period_ms) {
        r.error(
            file,
            v.span(),
            format!(
                "a periodic offcode (every {} ms) needs `wcet_us`, the worst-case time of one turn",
                p.as_secs_f64() * 1e3
            ),
            "no wcet_us",
        );
        return None;
    }
    if let (Some(p), Some(e), Some(v)) = (period, wcet, wcet_us)
        && e > p
    {
        r.error(
            file,
            v.span(),
            format!(
                "`wcet_us` ({} µs) exceeds the period ({} µs): the offcode can never finish a job in time",
                e.as_secs_f64() * 1e6,
                p.as_secs_f64() * 1e6
            ),
            "longer than the period",
        );
        return None;
    }
    Some(Timing { period, wcet })
}

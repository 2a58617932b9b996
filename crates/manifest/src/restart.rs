//! An offcode's restart policy (`restart = "on-failure"`, `restart_limit`,
//! `restart_window_ms`, `restart_backoff_ms`, `restart_backoff_max_ms`): read
//! and checked here, each fault located at the key that holds it. Ground
//! floor: it knows the diagnostics and the raw offcode only.

use sidecore_types::restart::{MAX_RESTART_LIMIT, MAX_RESTART_TIME_MS};
use sidecore_types::{RestartMode, RestartPolicy};

use crate::diag::{FileId, Report};
use crate::raw::{RawOffcode, S};

/// Reads the policy; `None` once a problem is reported.
pub(crate) fn restart(r: &mut Report, file: FileId, raw: &RawOffcode) -> Option<RestartPolicy> {
    let mode = mode(r, file, raw.restart.as_ref())?;
    if mode == RestartMode::Never {
        return never(r, file, raw);
    }
    let d = RestartPolicy::ON_FAILURE;
    let (ms, max_ms) = (" ms", MAX_RESTART_TIME_MS);
    let max_limit = u64::from(MAX_RESTART_LIMIT);
    let limit = bounded(
        r,
        file,
        raw.restart_limit.as_ref(),
        "restart_limit",
        (1, max_limit),
        "",
    );
    let window = bounded(
        r,
        file,
        raw.restart_window_ms.as_ref(),
        "restart_window_ms",
        (1, max_ms),
        ms,
    );
    let backoff = bounded(
        r,
        file,
        raw.restart_backoff_ms.as_ref(),
        "restart_backoff_ms",
        (0, max_ms),
        ms,
    );
    let cap = bounded(
        r,
        file,
        raw.restart_backoff_max_ms.as_ref(),
        "restart_backoff_max_ms",
        (1, max_ms),
        ms,
    );
    let (Some(limit), Some(window), Some(backoff), Some(cap)) = (limit, window, backoff, cap)
    else {
        return None;
    };
    let p = RestartPolicy {
        mode,
        limit: limit.map_or(d.limit, |v| u32::try_from(v).unwrap_or(MAX_RESTART_LIMIT)),
        window_ms: window.unwrap_or(d.window_ms),
        backoff_ms: backoff.unwrap_or(d.backoff_ms),
        // A first delay beyond the default cap raises the cap with it.
        backoff_max_ms: cap.unwrap_or(d.backoff_max_ms.max(backoff.unwrap_or(0))),
    };
    if p.backoff_ms > p.backoff_max_ms {
        let at = raw
            .restart_backoff_max_ms
            .as_ref()
            .or(raw.restart_backoff_ms.as_ref())
            .map(S::span)
            .unwrap_or_default();
        r.error(
            file,
            at,
            format!(
                "`restart_backoff_ms` ({} ms) exceeds `restart_backoff_max_ms` ({} ms)",
                p.backoff_ms, p.backoff_max_ms
            ),
            "the first delay is longer than the longest",
        );
        return None;
    }
    Some(p)
}

/// `restart` itself: `never` when absent.
fn mode(r: &mut Report, file: FileId, v: Option<&S<String>>) -> Option<RestartMode> {
    let Some(v) = v else {
        return Some(RestartMode::Never);
    };
    match v.get_ref().parse::<RestartMode>() {
        Ok(m) => Some(m),
        Err(e) => {
            r.error(
                file,
                v.span(),
                format!("`restart`: {e}"),
                "not a restart policy",
            );
            None
        }
    }
}

/// `never`: the other keys would be ignored, so each one written is an error.
fn never(r: &mut Report, file: FileId, raw: &RawOffcode) -> Option<RestartPolicy> {
    let keys = [
        ("restart_limit", &raw.restart_limit),
        ("restart_window_ms", &raw.restart_window_ms),
        ("restart_backoff_ms", &raw.restart_backoff_ms),
        ("restart_backoff_max_ms", &raw.restart_backoff_max_ms),
    ];
    let mut ok = true;
    for (key, v) in keys {
        if let Some(v) = v {
            r.error(
                file,
                v.span(),
                format!("`{key}` has no effect without `restart = \"on-failure\"`"),
                "the offcode is never restarted",
            );
            ok = false;
        }
    }
    ok.then_some(RestartPolicy::NEVER)
}

/// A key's value if it is within `lo..=hi`: `Some(None)` when absent, `None`
/// once a problem is reported.
fn bounded(
    r: &mut Report,
    file: FileId,
    v: Option<&S<i64>>,
    key: &str,
    (lo, hi): (u64, u64),
    unit: &str,
) -> Option<Option<u64>> {
    let Some(v) = v else { return Some(None) };
    match u64::try_from(*v.get_ref()) {
        Ok(x) if (lo..=hi).contains(&x) => Some(Some(x)),
        _ => {
            r.error(
                file,
                v.span(),
                format!(
                    "`{key}` must be from {lo}{unit} to {hi}{unit}, got {}",
                    v.get_ref()
                ),
                "out of range",
            );
            None
        }
    }
}

//! Checks of the ring size and traffic estimate that both a `[[channel]]` and
//! an offcode's `[[offcode.uses]]` (the channels of a call binding) carry. A
//! ground-floor module: it knows the diagnostics and nothing else of loading.

use sidecore_types::{Bandwidth, ChannelProps};

use crate::diag::{FileId, Report};
use crate::raw::S;

/// Largest number of slots a channel may declare.
pub const MAX_SLOTS: i64 = 1 << 20;
/// Largest slot size a channel may declare.
pub const MAX_SLOT_SIZE: i64 = 1 << 20;

/// `slots` and `slot_size`, checked and set in `props`; false when either is
/// out of range (reported at its span).
pub(crate) fn ring_size(
    r: &mut Report,
    file: FileId,
    slots: Option<&S<i64>>,
    slot_size: Option<&S<i64>>,
    props: &mut ChannelProps,
) -> bool {
    let mut ok = true;
    if let Some(s) = slots {
        let v = *s.get_ref();
        match u32::try_from(v) {
            Ok(n) if (2..=MAX_SLOTS).contains(&v) && n.is_power_of_two() => props.slots = n,
            _ => {
                r.error(
                    file,
                    s.span(),
                    format!("`slots` must be a power of two between 2 and {MAX_SLOTS}, got {v}"),
                    "bad slot count",
                );
                ok = false;
            }
        }
    }
    if let Some(s) = slot_size {
        let v = *s.get_ref();
        match u32::try_from(v) {
            Ok(n) if (32..=MAX_SLOT_SIZE).contains(&v) && v % 16 == 0 => props.slot_size = n,
            _ => {
                r.error(
                    file,
                    s.span(),
                    format!(
                        "`slot_size` must be a multiple of 16 between 32 and {MAX_SLOT_SIZE} bytes, got {v}"
                    ),
                    "bad slot size",
                );
                ok = false;
            }
        }
    }
    ok
}

/// A traffic estimate (`bandwidth`, with its unit); the old `bandwidth_mbps`
/// key is refused with what replaced it. Returns the value (0 when absent or
/// bad) and whether it was valid.
pub(crate) fn bandwidth(
    r: &mut Report,
    file: FileId,
    value: Option<&S<String>>,
    old_key: Option<&S<toml::Value>>,
) -> (Bandwidth, bool) {
    let mut ok = true;
    if let Some(old) = old_key {
        r.error(
            file,
            old.span(),
            "`bandwidth_mbps` was replaced by `bandwidth`, which carries its unit: \
             write `bandwidth = \"100 Mbit/s\"`"
                .to_string(),
            "old key",
        );
        ok = false;
    }
    let bandwidth = match value {
        Some(b) => match b.get_ref().parse::<Bandwidth>() {
            Ok(v) => v,
            Err(e) => {
                r.error(file, b.span(), format!("`bandwidth`: {e}"), "bad bandwidth");
                ok = false;
                Bandwidth::default()
            }
        },
        None => Bandwidth::default(),
    };
    (bandwidth, ok)
}

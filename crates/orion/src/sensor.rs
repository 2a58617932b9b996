//! Sensors as the seed defines them, ⟨ID, T, V⟩: kinds, values, names and the checks a
//! registration must pass before it reaches shared memory (sans-IO).

use crate::error::OrionError;
use serde::Serialize;

/// Longest sensor name, in bytes (it lives in a fixed 32-byte field of the box).
pub const SENSOR_NAME_MAX: usize = 31;
/// Longest box name, in bytes (a fixed 64-byte field of the box header).
pub const BOX_NAME_MAX: usize = 63;

/// What a sensor's value means, which decides how updates are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SensorKind {
    /// A monotone scalar (progress sensors: ticks, context switches, requests served).
    /// Only its latest value is kept; an update that goes backwards is refused.
    Counter,
    /// A scalar that goes up and down (queue depth, memory in use); latest value kept.
    Gauge,
    /// A two-word record appended to the box's event log on every update, such as
    /// FORK_REC = (parent, child). The latest value is kept as well.
    Event,
}

impl SensorKind {
    /// The code stored in shared memory.
    pub fn code(self) -> u32 {
        match self {
            SensorKind::Counter => 1,
            SensorKind::Gauge => 2,
            SensorKind::Event => 3,
        }
    }

    /// The kind a stored code names, if any.
    pub fn from_code(code: u32) -> Option<SensorKind> {
        match code {
            1 => Some(SensorKind::Counter),
            2 => Some(SensorKind::Gauge),
            3 => Some(SensorKind::Event),
            _ => None,
        }
    }

    /// Its name, for messages.
    pub fn name(self) -> &'static str {
        match self {
            SensorKind::Counter => "counter",
            SensorKind::Gauge => "gauge",
            SensorKind::Event => "event",
        }
    }
}

/// A sensor value: one word for counters and gauges, two for event records.
pub type SensorValue = [u64; 2];

/// A checked registration: a name unique in its box and a kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SensorSpec {
    /// The name, 1 to [`SENSOR_NAME_MAX`] bytes of `[A-Za-z0-9_.:-]`.
    pub name: String,
    /// The kind.
    pub kind: SensorKind,
}

impl SensorSpec {
    /// A registration from raw parts, as a client in another process sends them:
    /// `name` bytes and a kind code. Refused with [`OrionError::BadSensor`] when the
    /// name is empty, too long, not ASCII of the allowed set, or the kind is unknown.
    pub fn parse(sb: &str, name: &[u8], kind_code: u32) -> Result<SensorSpec, OrionError> {
        let shown = String::from_utf8_lossy(name).into_owned();
        let bad = |why: String| OrionError::BadSensor {
            sb: sb.to_owned(),
            name: shown.clone(),
            why,
        };
        check_name(name, SENSOR_NAME_MAX).map_err(|e| bad(e.to_string()))?;
        let kind = SensorKind::from_code(kind_code).ok_or_else(|| OrionError::BadSensor {
            sb: sb.to_owned(),
            name: shown.clone(),
            why: format!(
                "unknown kind code {kind_code}; expected 1 (counter), 2 (gauge) or 3 (event)"
            ),
        })?;
        Ok(SensorSpec {
            name: shown.clone(),
            kind,
        })
    }

    /// A registration from a name and kind (checked like [`SensorSpec::parse`]).
    pub fn new(sb: &str, name: &str, kind: SensorKind) -> Result<SensorSpec, OrionError> {
        SensorSpec::parse(sb, name.as_bytes(), kind.code())
    }
}

/// Why a sensor or box name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadName {
    #[error("the name is empty")]
    Empty,
    #[error("the name is {len} bytes long; at most {max} are allowed")]
    TooLong { len: usize, max: usize },
    #[error("byte {pos} ({byte:#04x}) is not allowed; names use A-Z a-z 0-9 _ . : -")]
    Byte { pos: usize, byte: u8 },
}

/// Checks a sensor or box name: non-empty, at most `max` bytes, `[A-Za-z0-9_.:-]` only.
pub fn check_name(name: &[u8], max: usize) -> Result<(), BadName> {
    if name.is_empty() {
        return Err(BadName::Empty);
    }
    if name.len() > max {
        return Err(BadName::TooLong {
            len: name.len(),
            max,
        });
    }
    if let Some(pos) = name
        .iter()
        .position(|b| !(b.is_ascii_alphanumeric() || b"_.:-".contains(b)))
    {
        return Err(BadName::Byte {
            pos,
            byte: name[pos],
        });
    }
    Ok(())
}

/// Packs a name into `N` little-endian words (zero padded).
pub fn pack_name<const N: usize>(name: &str) -> [u64; N] {
    let mut words = [0u64; N];
    for (i, b) in name.bytes().take(N * 8 - 1).enumerate() {
        words[i / 8] |= u64::from(b) << ((i % 8) * 8);
    }
    words
}

/// Unpacks a name packed by [`pack_name`] (stops at the first zero byte).
pub fn unpack_name(words: &[u64]) -> String {
    let bytes: Vec<u8> = words
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .take_while(|b| *b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn malformed_registrations_are_refused_by_name() {
        let e = SensorSpec::parse("box", b"", 1).unwrap_err().to_string();
        assert!(e.contains("sensor box `box`") && e.contains("empty"), "{e}");
        let e = SensorSpec::parse("box", &[b'a'; 40], 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("40 bytes") && e.contains("at most 31"), "{e}");
        let e = SensorSpec::parse("box", b"ti ck", 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("byte 2 (0x20)"), "{e}");
        let e = SensorSpec::parse("box", b"tick", 9)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown kind code 9"), "{e}");
        assert!(SensorSpec::parse("box", b"TIMER_INTR", 1).is_ok());
    }

    proptest! {
        #[test]
        fn names_round_trip_through_packing(name in "[A-Za-z0-9_.:-]{1,31}") {
            let words: [u64; 4] = pack_name(&name);
            prop_assert_eq!(unpack_name(&words), name);
        }

        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64), code in any::<u32>()) {
            let _ = SensorSpec::parse("b", &bytes, code);
        }
    }
}

//! The manifest as written: serde structures mirroring the TOML, with byte spans
//! kept on every value that a later check may need to point at.

use serde::Deserialize;
use toml::Spanned;

pub type S<T> = Spanned<T>;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawFile {
    pub app: Option<S<RawApp>>,
    #[serde(default)]
    pub offcode: Vec<S<RawOffcode>>,
    #[serde(default)]
    pub channel: Vec<S<RawChannel>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawApp {
    pub name: S<String>,
    pub description: Option<String>,
    #[serde(default)]
    pub library: Vec<S<String>>,
    /// How dedicated cores share their time among this app's offcodes.
    pub scheduler: Option<S<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawOffcode {
    pub name: S<String>,
    pub id: S<String>,
    #[serde(rename = "impl")]
    pub implementation: Option<S<String>>,
    pub description: Option<String>,
    pub priority: Option<S<String>>,
    pub watchdog_ms: Option<S<i64>>,
    pub obsolete_ms: Option<S<i64>>,
    /// `never` (the default) or `on-failure`, with the keys below.
    pub restart: Option<S<String>>,
    /// Restarts allowed within `restart_window_ms`.
    pub restart_limit: Option<S<i64>>,
    pub restart_window_ms: Option<S<i64>>,
    /// Delay before the first restart in the window, doubled per restart.
    pub restart_backoff_ms: Option<S<i64>>,
    pub restart_backoff_max_ms: Option<S<i64>>,
    /// Release period of a periodic offcode, ms.
    pub period_ms: Option<S<f64>>,
    /// Worst-case time of one turn, µs.
    pub wcet_us: Option<S<f64>>,
    pub cpu: Option<S<f64>>,
    pub memory: Option<S<toml::Value>>,
    #[serde(default)]
    pub inputs: Vec<S<String>>,
    #[serde(default)]
    pub outputs: Vec<S<String>>,
    pub params: Option<S<toml::Table>>,
    #[serde(default)]
    pub interface: Vec<S<RawInterface>>,
    #[serde(default)]
    pub import: Vec<S<RawImport>>,
    #[serde(default)]
    pub target: Vec<S<RawTarget>>,
    /// Interfaces of other offcodes this one calls.
    #[serde(default)]
    pub uses: Vec<S<RawUse>>,
}

/// `[[offcode.uses]]`: a call binding to an interface another offcode provides.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUse {
    /// The providing offcode.
    pub offcode: S<String>,
    /// One of the interfaces it declares.
    pub interface: S<String>,
    /// The methods this offcode calls (every method of the interface if absent).
    pub methods: Option<Vec<S<String>>>,
    pub slots: Option<S<i64>>,
    pub slot_size: Option<S<i64>>,
    /// Estimated traffic of the requests, with its unit.
    pub bandwidth: Option<S<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawInterface {
    pub name: S<String>,
    pub id: S<String>,
    #[serde(default)]
    pub methods: Vec<S<RawMethod>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMethod {
    pub name: S<String>,
    pub id: Option<S<i64>>,
    #[serde(default)]
    pub params: Vec<S<String>>,
    pub returns: Option<S<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawImport {
    pub offcode: S<String>,
    pub file: Option<S<String>>,
    pub constraint: Option<S<String>>,
    pub id: Option<S<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTarget {
    pub kind: S<String>,
    pub require: Option<S<toml::Table>>,
    pub cpu: Option<S<f64>>,
    pub memory: Option<S<toml::Value>>,
    pub module: Option<S<String>>,
}

/// `to = "b.in"` or `to = ["b.in", "c.in"]`. A hand-written visitor because
/// serde's untagged enums buffer their input and so lose the TOML spans.
#[derive(Debug)]
pub enum OneOrMany {
    One(String),
    Many(Vec<S<String>>),
}

impl<'de> Deserialize<'de> for OneOrMany {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = OneOrMany;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an endpoint `offcode.port` or a list of them")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<OneOrMany, E> {
                Ok(OneOrMany::One(v.to_string()))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<OneOrMany, A::Error> {
                let mut out = Vec::new();
                while let Some(e) = seq.next_element::<S<String>>()? {
                    out.push(e);
                }
                Ok(OneOrMany::Many(out))
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawChannel {
    pub name: S<String>,
    pub from: S<String>,
    pub to: S<OneOrMany>,
    pub cast: Option<S<String>>,
    pub order: Option<S<String>>,
    pub delivery: Option<S<String>>,
    pub zero_copy: Option<bool>,
    pub slots: Option<S<i64>>,
    pub slot_size: Option<S<i64>>,
    /// Estimated traffic with its unit (`"10 Gbit/s"`).
    pub bandwidth: Option<S<String>>,
    /// The old unitless key, kept only to say what replaced it.
    pub bandwidth_mbps: Option<S<toml::Value>>,
}

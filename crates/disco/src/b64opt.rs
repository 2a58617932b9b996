//! An optional byte payload as a base64 string or null.

use serde::{Deserialize, Deserializer, Serializer};

pub fn serialize<S: Serializer>(v: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(b) => crate::b64::serialize(b, s),
        None => s.serialize_none(),
    }
}

pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
    #[derive(Deserialize)]
    struct W(#[serde(with = "crate::b64")] Vec<u8>);
    Ok(Option::<W>::deserialize(d)?.map(|w| w.0))
}

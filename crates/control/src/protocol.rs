//! The control protocol: one JSON object per line each way on the Unix socket.

use serde::{Deserialize, Serialize};
use sidecore_runtime::AppStatus;

/// A request to the daemon.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Request {
    /// Is anyone there?
    Ping,
    /// Deploy the manifest at this (absolute) path.
    Up { manifest: String },
    /// List apps and offcodes.
    Ps,
    /// Stop one app (by name or id), or all when `app` is absent.
    Down { app: Option<String> },
    /// Stop everything and exit the daemon.
    Shutdown,
    /// The event log (optionally of one app); with `json`, one JSON object
    /// per line instead of text.
    Events {
        app: Option<String>,
        #[serde(default)]
        json: bool,
    },
    /// A control message to one offcode of an app, answered by the offcode.
    Control {
        app: String,
        offcode: String,
        body: serde_json::Value,
    },
}

/// The daemon's answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "kebab-case")]
pub enum Response {
    Ok {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        apps: Vec<AppStatus>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        lines: Vec<String>,
    },
    Error {
        error: String,
    },
}

impl Response {
    pub fn ok(message: impl Into<String>) -> Self {
        Response::Ok {
            message: Some(message.into()),
            apps: Vec::new(),
            lines: Vec::new(),
        }
    }
    pub fn error(e: impl Into<String>) -> Self {
        Response::Error { error: e.into() }
    }
}

/// A control request that cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("bad control request: {0}")]
pub struct BadRequest(#[from] serde_json::Error);

/// Parses one request line; the error says what is wrong with it.
pub fn parse_request(line: &str) -> Result<Request, BadRequest> {
    Ok(serde_json::from_str(line.trim())?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_and_bad_ones_explain() {
        let r = Request::Down {
            app: Some("x".into()),
        };
        let s = serde_json::to_string(&r).unwrap();
        assert_eq!(s, r#"{"op":"down","app":"x"}"#);
        assert_eq!(parse_request(&s).unwrap(), r);
        assert!(
            parse_request(r#"{"op":"explode"}"#)
                .unwrap_err()
                .to_string()
                .contains("unknown variant `explode`")
        );
        assert!(
            parse_request("not json")
                .unwrap_err()
                .to_string()
                .starts_with("bad control request")
        );
    }
}

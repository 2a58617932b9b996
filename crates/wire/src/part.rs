//! The deploy request: the part of an origin's app that the layout put on one
//! peer node (HYDRA's remote PEs), and the checks a peer runs on it before
//! building anything. It arrives from the network, so every index and name is
//! checked and each error says which field of which item is wrong.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};
use sidecore_types::calls::CallPortSpec;
use sidecore_types::{ChannelProps, Priority, RestartPolicy};

/// Most offcodes, and most channels, one part may carry.
pub const MAX_PART_ITEMS: usize = 1024;
/// Longest name (app, origin, offcode, port, channel) a part may carry.
pub const MAX_NAME_BYTES: usize = 128;

/// One offcode of a part, as the peer builds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteOffcode {
    pub name: String,
    pub implementation: String,
    pub priority: Priority,
    pub watchdog_ms: Option<u64>,
    pub obsolete_ms: Option<u64>,
    pub params: toml::Table,
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    /// Its call bindings (`[[offcode.uses]]`, either side), by port index.
    #[serde(default)]
    pub calls: Vec<CallPortSpec>,
    /// Its restart policy, which the peer's supervisor carries out; absent
    /// for `never` (so a peer from before restarts still takes the part).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart: Option<RestartPolicy>,
}

/// An end of a channel in the part: (offcode index in the part, port index).
pub type PartEnd = (usize, usize);

/// One channel with at least one end in the part.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteChannel {
    pub name: String,
    pub props: ChannelProps,
    /// The sending end, if it is in the part (otherwise it is at the origin,
    /// and the peer listens for it).
    pub from: Option<PartEnd>,
    /// The receiving ends in the part.
    pub to: Vec<PartEnd>,
    /// Where the receiver at the origin listens, if the receiver is there.
    pub connect: Option<String>,
}

/// The part of a plan placed on one peer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemotePart {
    /// The app's name at the origin.
    pub app: String,
    /// Who asked (host name and process), for names and messages.
    pub origin: String,
    pub offcodes: Vec<RemoteOffcode>,
    pub channels: Vec<RemoteChannel>,
}

/// What is wrong with a deploy request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PartError {
    #[error("invalid app name {0:?}")]
    AppName(String),
    #[error("invalid origin name {0:?}")]
    OriginName(String),
    #[error("the part has no offcodes")]
    NoOffcodes,
    #[error(
        "the part has {offcodes} offcodes and {channels} channels (at most {MAX_PART_ITEMS} each)"
    )]
    TooMany { offcodes: usize, channels: usize },
    #[error("offcodes[{index}].name: invalid name {name:?}")]
    OffcodeName { index: usize, name: String },
    #[error("offcodes[{index}].name: `{name}` appears twice")]
    DuplicateOffcode { index: usize, name: String },
    #[error("offcode `{offcode}`: invalid port name {port:?}")]
    PortName { offcode: String, port: String },
    #[error("offcodes[{index}].restart: {problem}")]
    Restart { index: usize, problem: String },
    #[error("channels[{index}].name: invalid name {name:?}")]
    ChannelName { index: usize, name: String },
    #[error("channels[{index}].name: `{name}` appears twice")]
    DuplicateChannel { index: usize, name: String },
    #[error("channel `{channel}`: {end} names offcode #{offcode}, but the part has {have}")]
    EndOffcode {
        channel: String,
        end: &'static str,
        offcode: usize,
        have: usize,
    },
    #[error(
        "channel `{channel}`: {end} names port #{port} of `{offcode}`, which has {have} {direction} ports"
    )]
    EndPort {
        channel: String,
        end: &'static str,
        port: usize,
        offcode: String,
        have: usize,
        direction: &'static str,
    },
    #[error(
        "channel `{0}`: needs one sender and its receivers in the part, or exactly one end here and the other at the origin"
    )]
    Ends(String),
    #[error("offcode `{offcode}`: calls[{index}]: {problem}")]
    Call {
        offcode: String,
        index: usize,
        problem: String,
    },
    #[error("channel `{channel}`: `connect` is not an ip:port address: {addr:?}")]
    Connect { channel: String, addr: String },
}

/// A name a part may carry: plain ASCII, bounded.
pub fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME_BYTES
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@' | ':'))
}

impl RemotePart {
    /// Checks the request: every index points into the part, every channel has
    /// exactly one sender and a receiver, names are plain.
    pub fn validate(&self) -> Result<(), PartError> {
        if !valid_name(&self.app) {
            return Err(PartError::AppName(self.app.clone()));
        }
        if !valid_name(&self.origin) {
            return Err(PartError::OriginName(self.origin.clone()));
        }
        if self.offcodes.is_empty() {
            return Err(PartError::NoOffcodes);
        }
        if self.offcodes.len() > MAX_PART_ITEMS || self.channels.len() > MAX_PART_ITEMS {
            return Err(PartError::TooMany {
                offcodes: self.offcodes.len(),
                channels: self.channels.len(),
            });
        }
        self.validate_offcodes()?;
        for (i, c) in self.channels.iter().enumerate() {
            self.validate_channel(i, c)?;
        }
        Ok(())
    }

    fn validate_offcodes(&self) -> Result<(), PartError> {
        for (index, o) in self.offcodes.iter().enumerate() {
            if !valid_name(&o.name) {
                return Err(PartError::OffcodeName {
                    index,
                    name: o.name.clone(),
                });
            }
            if self.offcodes[..index].iter().any(|p| p.name == o.name) {
                return Err(PartError::DuplicateOffcode {
                    index,
                    name: o.name.clone(),
                });
            }
            if let Some(p) = o.inputs.iter().chain(&o.outputs).find(|p| !valid_name(p)) {
                return Err(PartError::PortName {
                    offcode: o.name.clone(),
                    port: p.clone(),
                });
            }
            for (b, c) in o.calls.iter().enumerate() {
                validate_call(o, b, c)?;
            }
            if let Some(problem) = o.restart.as_ref().and_then(RestartPolicy::problem) {
                return Err(PartError::Restart { index, problem });
            }
        }
        Ok(())
    }

    fn validate_channel(&self, index: usize, c: &RemoteChannel) -> Result<(), PartError> {
        if !valid_name(&c.name) {
            return Err(PartError::ChannelName {
                index,
                name: c.name.clone(),
            });
        }
        if self.channels[..index].iter().any(|d| d.name == c.name) {
            return Err(PartError::DuplicateChannel {
                index,
                name: c.name.clone(),
            });
        }
        if let Some(f) = c.from {
            self.check_end(c, "from", f, true)?;
        }
        for &t in &c.to {
            self.check_end(c, "to", t, false)?;
        }
        match (c.from.is_some(), c.to.len(), c.connect.is_some()) {
            (true, n, false) if n > 0 => {}
            (true, 0, true) | (false, 1, false) => {}
            _ => return Err(PartError::Ends(c.name.clone())),
        }
        if let Some(addr) = &c.connect
            && addr.parse::<SocketAddr>().is_err()
        {
            return Err(PartError::Connect {
                channel: c.name.clone(),
                addr: addr.clone(),
            });
        }
        Ok(())
    }

    fn check_end(
        &self,
        c: &RemoteChannel,
        end: &'static str,
        (offcode, port): PartEnd,
        output: bool,
    ) -> Result<(), PartError> {
        let Some(oc) = self.offcodes.get(offcode) else {
            return Err(PartError::EndOffcode {
                channel: c.name.clone(),
                end,
                offcode,
                have: self.offcodes.len(),
            });
        };
        let ports = if output { &oc.outputs } else { &oc.inputs };
        if port >= ports.len() {
            return Err(PartError::EndPort {
                channel: c.name.clone(),
                end,
                port,
                offcode: oc.name.clone(),
                have: ports.len(),
                direction: if output { "output" } else { "input" },
            });
        }
        Ok(())
    }
}

/// A call binding of `o`: plain names, a bounded method list, and port
/// indices inside its port lists.
fn validate_call(o: &RemoteOffcode, index: usize, c: &CallPortSpec) -> Result<(), PartError> {
    let fail = |problem: String| PartError::Call {
        offcode: o.name.clone(),
        index,
        problem,
    };
    if !valid_name(&c.interface) || !valid_name(&c.peer) {
        return Err(fail(format!(
            "invalid interface or peer name {:?} / {:?}",
            c.interface, c.peer
        )));
    }
    if c.methods.len() > MAX_PART_ITEMS {
        return Err(fail(format!(
            "{} methods (at most {MAX_PART_ITEMS})",
            c.methods.len()
        )));
    }
    if let Some(m) = c.methods.iter().find(|m| !valid_name(&m.name)) {
        return Err(fail(format!("invalid method name {:?}", m.name)));
    }
    if c.input >= o.inputs.len() || c.output >= o.outputs.len() {
        return Err(fail(format!(
            "ports #{} / #{} outside its {} inputs and {} outputs",
            c.input,
            c.output,
            o.inputs.len(),
            o.outputs.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn part() -> RemotePart {
        RemotePart {
            app: "demo".into(),
            origin: "vm.1".into(),
            offcodes: vec![RemoteOffcode {
                name: "checksum".into(),
                implementation: "inet-checksum".into(),
                priority: Priority::Normal,
                watchdog_ms: Some(1000),
                obsolete_ms: None,
                params: toml::Table::new(),
                inputs: vec!["in".into()],
                outputs: vec![],
                calls: vec![],
                restart: None,
            }],
            channels: vec![RemoteChannel {
                name: "records".into(),
                props: ChannelProps::default(),
                from: None,
                to: vec![(0, 0)],
                connect: None,
            }],
        }
    }

    fn err(p: &RemotePart) -> String {
        p.validate().unwrap_err().to_string()
    }

    #[test]
    fn a_good_part_passes() {
        part().validate().unwrap();
    }

    #[test]
    fn a_restart_policy_travels_and_a_bad_one_is_named() {
        let mut p = part();
        let json = serde_json::to_string(&p).unwrap();
        assert!(!json.contains("restart"), "`never` is not written: {json}");
        p.offcodes[0].restart = Some(RestartPolicy::ON_FAILURE);
        let back: RemotePart = serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
        assert_eq!(back, p);
        back.validate().unwrap();
        p.offcodes[0].restart = Some(RestartPolicy {
            limit: 0,
            ..RestartPolicy::ON_FAILURE
        });
        assert!(
            err(&p).contains("offcodes[0].restart: limit 0"),
            "{}",
            err(&p)
        );
    }

    fn with_call(edit: impl FnOnce(&mut CallPortSpec)) -> RemotePart {
        let mut p = part();
        let mut c = CallPortSpec {
            role: sidecore_types::calls::CallRole::Provider,
            interface: "IKeyValue".into(),
            peer: "client".into(),
            methods: vec![sidecore_types::calls::MethodSpec {
                id: 1,
                name: "get".into(),
                params: vec![sidecore_types::ValueType::String],
                returns: Some(sidecore_types::ValueType::String),
            }],
            input: 0,
            output: 0,
        };
        p.offcodes[0].outputs.push("reply:IKeyValue@client".into());
        edit(&mut c);
        p.offcodes[0].calls.push(c);
        p
    }

    #[test]
    fn call_bindings_in_a_part_are_checked() {
        with_call(|_| {}).validate().unwrap();
        let e = err(&with_call(|c| c.input = 3));
        assert!(
            e.contains(
                "offcode `checksum`: calls[0]: ports #3 / #0 outside its 1 inputs and 1 outputs"
            ),
            "{e}"
        );
        let e = err(&with_call(|c| c.peer = "a b".into()));
        assert!(
            e.contains("calls[0]: invalid interface or peer name"),
            "{e}"
        );
        let e = err(&with_call(|c| c.methods[0].name = String::new()));
        assert!(e.contains("calls[0]: invalid method name"), "{e}");
        // A request from an older origin without `calls` still parses.
        let mut v = serde_json::to_value(part()).unwrap();
        v["offcodes"][0].as_object_mut().unwrap().remove("calls");
        let back: RemotePart = serde_json::from_value(v).unwrap();
        assert!(back.offcodes[0].calls.is_empty());
    }

    #[test]
    fn bad_deploy_requests_say_what_is_wrong() {
        let mut p = part();
        p.app = "../etc".into();
        assert!(err(&p).contains("invalid app name"));

        let mut p = part();
        p.origin = String::new();
        assert!(err(&p).contains("invalid origin name"));

        let mut p = part();
        p.offcodes.clear();
        assert!(err(&p).contains("no offcodes"));

        let mut p = part();
        p.offcodes.push(p.offcodes[0].clone());
        assert!(err(&p).contains("offcodes[1].name: `checksum` appears twice"));

        let mut p = part();
        p.offcodes[0].inputs[0] = "in put".into();
        assert!(err(&p).contains("offcode `checksum`: invalid port name"));

        let mut p = part();
        p.channels[0].to = vec![(5, 0)];
        let e = err(&p);
        assert!(
            e.contains("channel `records`: to names offcode #5, but the part has 1"),
            "{e}"
        );

        let mut p = part();
        p.channels[0].to = vec![(0, 3)];
        let e = err(&p);
        assert!(
            e.contains("port #3 of `checksum`, which has 1 input ports"),
            "{e}"
        );

        // An input used as a sender.
        let mut p = part();
        p.channels[0].from = Some((0, 0));
        p.channels[0].to = vec![];
        p.channels[0].connect = Some("127.0.0.1:9".into());
        let e = err(&p);
        assert!(e.contains("which has 0 output ports"), "{e}");

        // Neither end here.
        let mut p = part();
        p.channels[0].to = vec![];
        assert!(err(&p).contains("needs one sender"));

        let mut p = part();
        p.offcodes[0].outputs = vec!["out".into()];
        p.channels[0].from = Some((0, 0));
        p.channels[0].to = vec![];
        p.channels[0].connect = Some("somewhere".into());
        assert!(err(&p).contains("`connect` is not an ip:port address"));

        let mut p = part();
        p.channels.push(p.channels[0].clone());
        assert!(err(&p).contains("channels[1].name: `records` appears twice"));
    }
}

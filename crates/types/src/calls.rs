//! Call bindings as the runtime hands them to an offcode (HYDRA §4.1.5, §5.5):
//! which interface, which offcode is at the other end, the methods by id with
//! their types, and the two ports the binding uses. The same description goes
//! to a peer node in a deploy request, so it is plain serde data.

use serde::{Deserialize, Serialize};

use crate::ValueType;

/// Which side of a call binding an offcode is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CallRole {
    /// It invokes methods: requests go out on `output`, replies come in on `input`.
    Caller,
    /// It serves them: requests come in on `input`, replies go out on `output`.
    Provider,
}

/// One method of a bound interface.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MethodSpec {
    /// The id carried in call headers.
    pub id: u16,
    pub name: String,
    pub params: Vec<ValueType>,
    pub returns: Option<ValueType>,
}

/// A call binding as one of its two offcodes sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallPortSpec {
    pub role: CallRole,
    /// The interface's name (as the provider declares it).
    pub interface: String,
    /// The offcode at the other end.
    pub peer: String,
    /// The methods the caller may invoke.
    pub methods: Vec<MethodSpec>,
    /// Index of the input port: the caller's return port, the provider's serve port.
    pub input: usize,
    /// Index of the output port: the caller's request port, the provider's reply port.
    pub output: usize,
}

impl CallPortSpec {
    /// The method named `name`.
    pub fn method(&self, name: &str) -> Option<&MethodSpec> {
        self.methods.iter().find(|m| m.name == name)
    }

    /// The method with header id `id`.
    pub fn method_by_id(&self, id: u16) -> Option<&MethodSpec> {
        self.methods.iter().find(|m| m.id == id)
    }
}

/// The names of the four ports and two channels a binding adds, built from
/// characters a manifest's own port names cannot contain (`:` and `@`), so
/// they never collide with declared ones.
pub mod port_names {
    /// The caller's request output.
    pub fn request(interface: &str, provider: &str) -> String {
        format!("call:{interface}@{provider}")
    }
    /// The caller's return input.
    pub fn ret(interface: &str, provider: &str) -> String {
        format!("return:{interface}@{provider}")
    }
    /// The provider's serve input.
    pub fn serve(interface: &str, caller: &str) -> String {
        format!("serve:{interface}@{caller}")
    }
    /// The provider's reply output.
    pub fn reply(interface: &str, caller: &str) -> String {
        format!("reply:{interface}@{caller}")
    }
    /// The request channel's name.
    pub fn request_channel(caller: &str, interface: &str, provider: &str) -> String {
        format!("call:{caller}@{provider}.{interface}")
    }
    /// The reply channel's name.
    pub fn reply_channel(caller: &str, interface: &str, provider: &str) -> String {
        format!("reply:{provider}@{caller}.{interface}")
    }
}

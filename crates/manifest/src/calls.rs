//! Call bindings: each `[[offcode.uses]]` entry names an interface that another
//! offcode declares and, optionally, the methods it calls. Binding checks the
//! names (every problem located at its file, line and column), then adds the
//! binding's four ports and its two channels (requests and replies), so that
//! everything downstream — the layout's flows, the transports, parts sent to
//! peer nodes — carries calls like any other traffic.

use std::ops::Range;

use sidecore_types::calls::port_names;
use sidecore_types::{Bandwidth, ChannelProps, Delivery};

use crate::diag::{FileId, Report, Sources, also, note};
use crate::model::{CallBinding, Channel, Endpoint, Offcode};
use crate::props;
use crate::raw::{RawUse, S};

/// Slots of a call channel unless its `uses` entry says otherwise.
pub const CALL_SLOTS: u32 = 64;
/// Slot size of a call channel unless its `uses` entry says otherwise: room
/// for the 16-byte call header and small arguments or results.
pub const CALL_SLOT_SIZE: u32 = 256;

/// The `uses` entries of one offcode, still as written.
pub(crate) struct UsesOf {
    pub offcode: usize,
    pub file: FileId,
    pub uses: Vec<S<RawUse>>,
}

/// Checks every `uses` entry and binds the good ones: ports are appended to
/// the two offcodes, channels to `channels`. Problems go to `report`.
pub(crate) fn bind(
    report: &mut Report,
    sources: &Sources,
    offcodes: &mut [Offcode],
    name_spans: &[(FileId, Range<usize>)],
    all_uses: Vec<UsesOf>,
    channels: &mut Vec<Channel>,
) -> Vec<CallBinding> {
    let mut out: Vec<CallBinding> = Vec::new();
    for u in all_uses {
        for raw in &u.uses {
            let cx = Cx {
                report: &mut *report,
                offcodes,
                name_spans,
                file: u.file,
                caller: u.offcode,
            };
            let Some(checked) = cx.check(raw.get_ref()) else {
                continue;
            };
            if let Some(prev) = out.iter().find(|b| {
                b.caller == u.offcode
                    && b.provider == checked.provider
                    && b.interface == checked.interface
            }) {
                report.error(
                    u.file,
                    raw.span(),
                    format!(
                        "`{}` already uses interface `{}` of `{}` (at {})",
                        offcodes[u.offcode].name,
                        raw.get_ref().interface.get_ref(),
                        offcodes[checked.provider].name,
                        prev.origin
                    ),
                    "second binding",
                );
                continue;
            }
            let origin = sources.origin(u.file, &raw.span());
            out.push(add_binding(offcodes, channels, u.offcode, checked, origin));
        }
    }
    out
}

/// A `uses` entry whose names all resolved.
struct Checked {
    provider: usize,
    interface: usize,
    methods: Vec<u16>,
    props: ChannelProps,
    bandwidth: Bandwidth,
}

/// What checking one entry needs.
struct Cx<'a> {
    report: &'a mut Report,
    offcodes: &'a [Offcode],
    name_spans: &'a [(FileId, Range<usize>)],
    file: FileId,
    caller: usize,
}

impl Cx<'_> {
    /// Resolves the provider, the interface and the methods, and checks the
    /// channel sizes; `None` once a problem is reported.
    fn check(mut self, raw: &RawUse) -> Option<Checked> {
        let provider = self.provider(raw)?;
        let interface = self.interface(raw, provider)?;
        let methods = self.methods(raw, provider, interface);
        let (file, r) = (self.file, &mut *self.report);
        let mut props = ChannelProps {
            slots: CALL_SLOTS,
            slot_size: CALL_SLOT_SIZE,
            delivery: Delivery::Reliable,
            ..ChannelProps::default()
        };
        let size_ok = props::ring_size(
            r,
            file,
            raw.slots.as_ref(),
            raw.slot_size.as_ref(),
            &mut props,
        );
        let (bandwidth, bw_ok) = props::bandwidth(r, file, raw.bandwidth.as_ref(), None);
        let methods = methods?;
        (size_ok && bw_ok).then_some(Checked {
            provider,
            interface,
            methods,
            props,
            bandwidth,
        })
    }

    /// The providing offcode: named, and not the caller itself.
    fn provider(&mut self, raw: &RawUse) -> Option<usize> {
        let target = raw.offcode.get_ref();
        let Some(provider) = self.offcodes.iter().position(|o| o.name == *target) else {
            let known: Vec<_> = self
                .offcodes
                .iter()
                .map(|o| format!("`{}`", o.name))
                .collect();
            let d = self.report.error(
                self.file,
                raw.offcode.span(),
                format!("`uses` names unknown offcode `{target}`"),
                "no offcode has this name",
            );
            note(
                d,
                format!("offcodes in this application: {}", known.join(", ")),
            );
            return None;
        };
        if provider == self.caller {
            self.report.error(
                self.file,
                raw.offcode.span(),
                format!("offcode `{target}` uses an interface of its own"),
                "calls itself",
            );
            return None;
        }
        Some(provider)
    }

    /// The interface, among those the provider declares.
    fn interface(&mut self, raw: &RawUse, provider: usize) -> Option<usize> {
        let offcodes = self.offcodes;
        let p = &offcodes[provider];
        let (target, want) = (&p.name, raw.interface.get_ref());
        if let Some(i) = p.interfaces.iter().position(|i| i.name == *want) {
            return Some(i);
        }
        let have: Vec<_> = p
            .interfaces
            .iter()
            .map(|i| format!("`{}`", i.name))
            .collect();
        let d = self.report.error(
            self.file,
            raw.interface.span(),
            format!("offcode `{target}` declares no interface `{want}`"),
            "unknown interface",
        );
        let (pf, ps) = self.name_spans[provider].clone();
        also(d, pf, ps, "the provider is declared here");
        note(
            d,
            if have.is_empty() {
                format!(
                    "`{target}` declares no interfaces: add an [[offcode.interface]] table to it"
                )
            } else {
                format!("`{target}` declares: {}", have.join(", "))
            },
        );
        None
    }

    /// The ids of the methods listed (all of the interface's if none are),
    /// each declared and listed once.
    fn methods(&mut self, raw: &RawUse, provider: usize, interface: usize) -> Option<Vec<u16>> {
        let offcodes = self.offcodes;
        let p = &offcodes[provider];
        let itf = &p.interfaces[interface];
        let Some(list) = &raw.methods else {
            return Some(itf.methods.iter().map(|m| m.id).collect());
        };
        let mut methods = Vec::new();
        let mut ok = true;
        for (i, m) in list.iter().enumerate() {
            let Some(found) = itf.methods.iter().find(|x| x.name == *m.get_ref()) else {
                let have: Vec<_> = itf.methods.iter().map(|x| x.name.as_str()).collect();
                let d = self.report.error(
                    self.file,
                    m.span(),
                    format!(
                        "interface `{}` of `{}` has no method `{}`",
                        itf.name,
                        p.name,
                        m.get_ref()
                    ),
                    "unknown method",
                );
                let have = if have.is_empty() {
                    "no methods".to_string()
                } else {
                    have.join(", ")
                };
                note(d, format!("`{}` has: {have}", itf.name));
                ok = false;
                continue;
            };
            if list[..i].iter().any(|o| o.get_ref() == m.get_ref()) {
                self.report.error(
                    self.file,
                    m.span(),
                    format!("method `{}` is listed twice", m.get_ref()),
                    "duplicate",
                );
                ok = false;
                continue;
            }
            methods.push(found.id);
        }
        ok.then_some(methods)
    }
}

/// Adds the binding's ports to both offcodes and its two channels.
fn add_binding(
    offcodes: &mut [Offcode],
    channels: &mut Vec<Channel>,
    caller: usize,
    c: Checked,
    origin: crate::diag::Origin,
) -> CallBinding {
    let itf = offcodes[c.provider].interfaces[c.interface].name.clone();
    let (caller_name, provider_name) = (
        offcodes[caller].name.clone(),
        offcodes[c.provider].name.clone(),
    );
    let request_port = port_names::request(&itf, &provider_name);
    let return_port = port_names::ret(&itf, &provider_name);
    let serve_port = port_names::serve(&itf, &caller_name);
    let reply_port = port_names::reply(&itf, &caller_name);
    offcodes[caller].outputs.push(request_port.clone());
    offcodes[caller].inputs.push(return_port.clone());
    offcodes[c.provider].inputs.push(serve_port.clone());
    offcodes[c.provider].outputs.push(reply_port.clone());
    let channel = |name: String, from: Endpoint, to: Endpoint| Channel {
        name,
        from,
        to: vec![to],
        props: c.props,
        bandwidth: c.bandwidth,
        origin: origin.clone(),
    };
    let request = channels.len();
    channels.push(channel(
        port_names::request_channel(&caller_name, &itf, &provider_name),
        Endpoint {
            offcode: caller,
            port: request_port,
        },
        Endpoint {
            offcode: c.provider,
            port: serve_port,
        },
    ));
    channels.push(channel(
        port_names::reply_channel(&caller_name, &itf, &provider_name),
        Endpoint {
            offcode: c.provider,
            port: reply_port,
        },
        Endpoint {
            offcode: caller,
            port: return_port,
        },
    ));
    CallBinding {
        caller,
        provider: c.provider,
        interface: c.interface,
        methods: c.methods,
        request,
        reply: request + 1,
        origin,
    }
}

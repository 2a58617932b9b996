//! Call bindings (`[[offcode.uses]]`): a good binding adds its ports and two
//! channels; every kind of bad binding is refused with its file:line:column.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed run

use sidecore_manifest::parse_str;
use sidecore_types::ValueType;
use sidecore_types::calls::CallRole;

const ITF: &str = r#"
  [[offcode.interface]]
  name = "IKeyValue"
  id = "8c2f4a10-5d6e-4b7a-9c1d-2e3f4a5b6c10"
  methods = [
    { name = "put", params = ["string", "string"] },
    { name = "get", params = ["string"], returns = "string" },
    { name = "len", returns = "u64" },
  ]
"#;

/// A store declaring `IKeyValue` and a client with the given `uses` entries.
fn manifest(uses: &str) -> String {
    format!(
        "[[offcode]]\nname = \"store\"\nid = \"8c2f4a10-5d6e-4b7a-9c1d-2e3f4a5b6c01\"\n{ITF}\n  [[offcode.target]]\n  kind = \"host\"\n\n\
         [[offcode]]\nname = \"client\"\nid = \"8c2f4a10-5d6e-4b7a-9c1d-2e3f4a5b6c02\"\ninputs = [\"in\"]\n{uses}\n  [[offcode.target]]\n  kind = \"host\"\n"
    )
}

fn err(uses: &str) -> String {
    match parse_str("m.toml", &manifest(uses)) {
        Ok(_) => panic!("should be refused:\n{uses}"),
        Err(e) => e.render(false),
    }
}

#[track_caller]
fn expect(e: &str, what: &str, at: &str) {
    assert!(e.contains(what), "expected `{what}` in:\n{e}");
    assert!(e.contains(at), "expected location `{at}` in:\n{e}");
}

#[test]
fn a_binding_adds_its_ports_and_two_channels() {
    let m = parse_str(
        "m.toml",
        &manifest(
            "  [[offcode.uses]]\n  offcode = \"store\"\n  interface = \"IKeyValue\"\n  methods = [\"get\", \"len\"]\n  slot_size = 512\n  bandwidth = \"5 Mbit/s\"\n",
        ),
    )
    .unwrap_or_else(|e| panic!("{}", e.render(false)));
    assert_eq!(m.calls.len(), 1);
    let b = &m.calls[0];
    assert_eq!((b.caller, b.provider), (1, 0));
    assert_eq!(b.methods, vec![2, 3], "only the methods listed, by id");
    assert_eq!(m.channels.len(), 2);
    let (req, rep) = (&m.channels[b.request], &m.channels[b.reply]);
    assert_eq!((req.from.offcode, req.to[0].offcode), (1, 0));
    assert_eq!((rep.from.offcode, rep.to[0].offcode), (0, 1));
    assert_eq!(req.props.slot_size, 512);
    assert_eq!(req.bandwidth.bps(), 5_000_000);
    // The client keeps its own input first; the binding's ports come after.
    assert_eq!(m.offcodes[1].inputs[0], "in");
    let client = m.call_ports(1);
    assert_eq!(client.len(), 1);
    assert_eq!(client[0].role, CallRole::Caller);
    assert_eq!(client[0].peer, "store");
    assert_eq!(m.offcodes[1].inputs[client[0].input], rep.to[0].port);
    assert_eq!(m.offcodes[1].outputs[client[0].output], req.from.port);
    let names: Vec<_> = client[0].methods.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["get", "len"]);
    assert_eq!(client[0].methods[0].params, vec![ValueType::String]);
    let store = m.call_ports(0);
    assert_eq!(store[0].role, CallRole::Provider);
    assert_eq!(store[0].peer, "client");
    assert_eq!(m.offcodes[0].inputs[store[0].input], req.to[0].port);
    assert!(b.origin.to_string().starts_with("m.toml:"));
}

#[test]
fn all_methods_are_bound_when_none_are_listed() {
    let m = parse_str(
        "m.toml",
        &manifest("  [[offcode.uses]]\n  offcode = \"store\"\n  interface = \"IKeyValue\"\n"),
    )
    .unwrap();
    assert_eq!(m.calls[0].methods, vec![1, 2, 3]);
}

#[test]
fn unknown_provider_is_located() {
    let e = err("  [[offcode.uses]]\n  offcode = \"stor\"\n  interface = \"IKeyValue\"\n");
    expect(&e, "`uses` names unknown offcode `stor`", "m.toml:");
    expect(&e, "offcodes in this application: `store`, `client`", "");
}

#[test]
fn unknown_interface_names_what_the_provider_declares() {
    let e = err("  [[offcode.uses]]\n  offcode = \"store\"\n  interface = \"IKV\"\n");
    expect(&e, "offcode `store` declares no interface `IKV`", "m.toml:");
    expect(&e, "`store` declares: `IKeyValue`", "");
}

#[test]
fn a_wrong_method_name_is_an_error_at_its_line() {
    let text = "  [[offcode.uses]]\n  offcode = \"store\"\n  interface = \"IKeyValue\"\n  methods = [\"get\", \"gett\"]\n";
    let e = err(text);
    expect(
        &e,
        "interface `IKeyValue` of `store` has no method `gett`",
        "",
    );
    expect(&e, "`IKeyValue` has: put, get, len", "");
    // The line of `methods = [...]` in the whole manifest.
    let line = manifest(text)
        .lines()
        .position(|l| l.contains("gett"))
        .unwrap()
        + 1;
    expect(&e, "unknown method", &format!("m.toml:{line}:"));
}

#[test]
fn self_use_duplicate_binding_and_listed_twice_are_refused() {
    let e = parse_str(
        "m.toml",
        &format!(
            "[[offcode]]\nname = \"store\"\nid = \"8c2f4a10-5d6e-4b7a-9c1d-2e3f4a5b6c01\"\n{ITF}\n  [[offcode.uses]]\n  offcode = \"store\"\n  interface = \"IKeyValue\"\n"
        ),
    )
    .err()
    .unwrap()
    .render(false);
    expect(
        &e,
        "offcode `store` uses an interface of its own",
        "m.toml:",
    );
    let e = err(
        "  [[offcode.uses]]\n  offcode = \"store\"\n  interface = \"IKeyValue\"\n  [[offcode.uses]]\n  offcode = \"store\"\n  interface = \"IKeyValue\"\n",
    );
    expect(
        &e,
        "`client` already uses interface `IKeyValue` of `store`",
        "",
    );
    let e = err(
        "  [[offcode.uses]]\n  offcode = \"store\"\n  interface = \"IKeyValue\"\n  methods = [\"get\", \"get\"]\n",
    );
    expect(&e, "method `get` is listed twice", "");
}

#[test]
fn bad_sizes_and_bandwidth_of_a_binding_are_refused() {
    let e = err(
        "  [[offcode.uses]]\n  offcode = \"store\"\n  interface = \"IKeyValue\"\n  slots = 3\n  slot_size = 8\n  bandwidth = \"fast\"\n",
    );
    expect(&e, "`slots` must be a power of two", "");
    expect(&e, "`slot_size` must be a multiple of 16", "");
    expect(&e, "`bandwidth`:", "");
    let e = err(
        "  [[offcode.uses]]\n  offcode = \"store\"\n  interface = \"IKeyValue\"\n  method = [\"get\"]\n",
    );
    expect(&e, "unknown field `method`", "m.toml:");
}

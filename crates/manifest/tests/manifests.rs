//! Every kind of bad manifest, each with an assertion on its message and on the
//! file:line:column it points at; plus the good cases (the built-in example,
//! multi-file imports, diamonds).
#![allow(clippy::unwrap_used, clippy::too_many_lines)] // test and benchmark code: a failed unwrap is a failed run; long scenarios read top to bottom

use std::path::PathBuf;

use sidecore_manifest::{Manifest, load, parse_str};
use sidecore_types::{Cast, ConstraintKind, Delivery, Order, PeKind, Priority};

const A: &str = "5b0c1e7a-2d43-4f4e-9b0a-6c1f0e6f2a01";
const B: &str = "6060843a-9c1e-4b8e-a3c7-2f5d8e1b4c02";
const C: &str = "7070714a-9c1e-4b8e-a3c7-2f5d8e1b4c03";

/// Writes `files` into a fresh directory and loads the first one.
fn load_files(files: &[(&str, &str)]) -> (tempfile::TempDir, Result<Manifest, String>) {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in files {
        let p = dir.path().join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    let r = load(&dir.path().join(files[0].0)).map_err(|e| e.render(false));
    (dir, r)
}

fn err(text: &str) -> String {
    match load_files(&[("main.toml", text)]).1 {
        Ok(_) => panic!("manifest should have been rejected:\n{text}"),
        Err(e) => e,
    }
}

fn errs(files: &[(&str, &str)]) -> String {
    match load_files(files).1 {
        Ok(_) => panic!("manifest should have been rejected"),
        Err(e) => e,
    }
}

#[track_caller]
fn expect(e: &str, what: &str, at: &str) {
    assert!(e.contains(what), "expected message `{what}` in:\n{e}");
    assert!(e.contains(at), "expected location `{at}` in:\n{e}");
}

fn offcode(name: &str, id: &str, extra: &str) -> String {
    format!(
        "[[offcode]]\nname = \"{name}\"\nid = \"{id}\"\n{extra}\n[[offcode.target]]\nkind = \"host\"\n"
    )
}

#[test]
fn the_built_in_example_loads() {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("run by cargo"))
        .join("../../examples/checksum.toml");
    let m = load(&root).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(m.app, "checksum-demo");
    assert_eq!(m.offcodes.len(), 2);
    let src = &m.offcodes[0];
    assert_eq!(
        (src.name.as_str(), src.implementation.as_str()),
        ("source", "record-source")
    );
    assert_eq!(src.priority, Priority::High);
    assert_eq!(src.watchdog, Some(std::time::Duration::from_millis(1000)));
    assert_eq!(
        src.targets.iter().map(|t| t.kind).collect::<Vec<_>>(),
        vec![PeKind::Core, PeKind::Host]
    );
    assert_eq!(src.interfaces[0].methods[1].id, 2);
    assert_eq!(m.constraints.len(), 1);
    assert_eq!(m.constraints[0].kind, ConstraintKind::Gang);
    let ch = &m.channels[0];
    assert_eq!((ch.from.offcode, ch.to[0].offcode), (0, 1));
    assert_eq!(
        (ch.props.cast, ch.props.order, ch.props.delivery),
        (Cast::Unicast, Order::Sequential, Delivery::Reliable)
    );
    assert_eq!((ch.props.slots, ch.props.slot_size), (4096, 128));
    assert!(
        m.constraints[0]
            .origin
            .to_string()
            .contains("checksum.toml:")
    );
}

#[test]
fn syntax_error_points_at_the_spot() {
    let e = err("[[offcode]]\nname = \"a\nid = 3\n");
    expect(&e, "invalid manifest", "main.toml:2:");
}

#[test]
fn unknown_field_is_named() {
    let e = err(&offcode("a", A, "watchdog = 5"));
    expect(&e, "unknown field `watchdog`", "main.toml:4:1");
}

#[test]
fn missing_field_is_named() {
    let e = err("[[offcode]]\nname = \"a\"\n[[offcode.target]]\nkind = \"host\"\n");
    expect(&e, "missing field `id`", "main.toml:1:");
}

#[test]
fn wrong_type_is_named() {
    let e = err(&offcode("a", A, "cpu = \"lots\""));
    expect(&e, "invalid type", "main.toml:4:7");
}

#[test]
fn empty_manifest_is_refused() {
    let e = err("[app]\nname = \"x\"\n");
    expect(&e, "declares no offcodes", "main.toml:1:1");
}

#[test]
fn bad_names_are_refused() {
    expect(
        &err(&offcode("9lives", A, "")),
        "not a valid binding name",
        "main.toml:2:8",
    );
    expect(
        &err(&offcode("a", A, "inputs = [\"in.x\"]")),
        "not a valid port name",
        "main.toml:4:",
    );
    expect(
        &err(&format!(
            "[app]\nname = \"has space\"\n{}",
            offcode("a", A, "")
        )),
        "app name",
        "main.toml:2:8",
    );
}

#[test]
fn duplicate_offcode_names_point_at_both() {
    let e = err(&format!("{}{}", offcode("a", A, ""), offcode("a", B, "")));
    expect(&e, "offcode `a` is declared twice", "main.toml:8:8");
    assert!(e.contains("first declared here"), "{e}");
}

#[test]
fn bad_and_duplicate_guids() {
    expect(
        &err(&offcode("a", "7070714", "")),
        "must be a 128-bit GUID, got `7070714`",
        "main.toml:3:6",
    );
    let e = err(&format!("{}{}", offcode("a", A, ""), offcode("b", A, "")));
    expect(
        &e,
        "offcode `b` reuses the id of offcode `a`",
        "main.toml:9:6",
    );
}

#[test]
fn bad_attributes() {
    expect(
        &err(&offcode("a", A, "priority = \"urgent\"")),
        "unknown priority `urgent`",
        "main.toml:4:12",
    );
    expect(
        &err(&offcode("a", A, "watchdog_ms = 0")),
        "positive number of milliseconds",
        "main.toml:4:15",
    );
    expect(
        &err(&offcode("a", A, "obsolete_ms = -5")),
        "`obsolete_ms` must be a positive",
        "main.toml:4:15",
    );
    expect(
        &err(&offcode("a", A, "cpu = 1.5")),
        "must be in (0, 1], got 1.5",
        "main.toml:4:7",
    );
    expect(
        &err(&offcode("a", A, "memory = \"16XB\"")),
        "`memory` must be a positive size",
        "main.toml:4:10",
    );
    expect(
        &err(&offcode("a", A, "memory = 0")),
        "`memory` must be a positive size",
        "main.toml:4:10",
    );
}

#[test]
fn targets_are_checked() {
    let e = err(&format!("[[offcode]]\nname = \"a\"\nid = \"{A}\"\n"));
    expect(&e, "offcode `a` declares no target", "main.toml:1:");
    let e = err(&format!(
        "[[offcode]]\nname = \"a\"\nid = \"{A}\"\n[[offcode.target]]\nkind = \"fpga\"\n"
    ));
    expect(&e, "unknown PE kind `fpga`", "main.toml:5:8");
    assert!(e.contains("`core`"), "lists the kinds: {e}");
    let e = err(&offcode("a", A, "[[offcode.target]]\nkind = \"host\""));
    expect(&e, "lists target kind `host` twice", "main.toml:");
    let e = err(&format!(
        "[[offcode]]\nname = \"a\"\nid = \"{A}\"\n[[offcode.target]]\nkind = \"core\"\nrequire = {{ colour = \"red\" }}\n"
    ));
    expect(
        &e,
        "target kind `core` has no property `colour`; it understands: `isolated`, `cpu`, `numa`",
        "main.toml:6:11",
    );
    let e = err(&format!(
        "[[offcode]]\nname = \"a\"\nid = \"{A}\"\n[[offcode.target]]\nkind = \"core\"\nrequire = {{ isolated = 3 }}\n"
    ));
    expect(
        &e,
        "property `isolated` of target `core` must be a bool",
        "main.toml:6:",
    );
    let e = err(&format!(
        "[[offcode]]\nname = \"a\"\nid = \"{A}\"\n[[offcode.target]]\nkind = \"wasm\"\n"
    ));
    expect(&e, "a `wasm` target needs a `module`", "main.toml:5:8");
    let e = err(&format!(
        "[[offcode]]\nname = \"a\"\nid = \"{A}\"\n[[offcode.target]]\nkind = \"wasm\"\nmodule = \"nope.wasm\"\n"
    ));
    expect(&e, "module `nope.wasm` does not exist", "main.toml:6:10");
}

#[test]
fn imports_are_checked() {
    let e = err(&offcode("a", A, "[[offcode.import]]\noffcode = \"ghost\""));
    expect(&e, "import of unknown offcode `ghost`", "main.toml:5:11");
    let e = err(&format!(
        "{}{}",
        offcode(
            "a",
            A,
            "[[offcode.import]]\noffcode = \"b\"\nconstraint = \"glue\""
        ),
        offcode("b", B, "")
    ));
    expect(&e, "unknown constraint `glue`", "main.toml:6:14");
    assert!(e.contains("`asym-gang`"), "{e}");
    let e = err(&offcode("a", A, "[[offcode.import]]\noffcode = \"a\""));
    expect(&e, "offcode `a` imports itself", "main.toml:5:11");
    let e = err(&format!(
        "{}{}",
        offcode(
            "a",
            A,
            &format!("[[offcode.import]]\noffcode = \"b\"\nid = \"{C}\"")
        ),
        offcode("b", B, "")
    ));
    expect(
        &e,
        &format!("import of `b` expects id {C}, but `b` has id {B}"),
        "main.toml:6:6",
    );
}

#[test]
fn file_imports_missing_cyclic_and_wrong() {
    let e = errs(&[(
        "main.toml",
        &offcode(
            "a",
            A,
            "[[offcode.import]]\noffcode = \"b\"\nfile = \"lib/b.toml\"",
        ),
    )]);
    expect(&e, "cannot read imported manifest `", "main.toml:6:8");

    let a = offcode(
        "a",
        A,
        "[[offcode.import]]\noffcode = \"b\"\nfile = \"b.toml\"",
    );
    let b = offcode(
        "b",
        B,
        "[[offcode.import]]\noffcode = \"a\"\nfile = \"main.toml\"",
    );
    let e = errs(&[("main.toml", &a), ("b.toml", &b)]);
    assert!(
        e.contains("import cycle: main.toml → b.toml → main.toml") || e.contains("import cycle:"),
        "{e}"
    );
    expect(&e, "import cycle", "b.toml:6:8");
    assert!(
        e.contains("main.toml") && e.contains("→"),
        "names the chain: {e}"
    );

    let a = offcode(
        "a",
        A,
        "[[offcode.import]]\noffcode = \"c\"\nfile = \"b.toml\"",
    );
    let e = errs(&[
        ("main.toml", &format!("{a}{}", offcode("c", C, ""))),
        ("b.toml", &offcode("b", B, "")),
    ]);
    expect(
        &e,
        "`b.toml` does not declare offcode `c`",
        "main.toml:5:11",
    );
}

#[test]
fn diamond_imports_load_each_file_once() {
    let main = format!(
        "{}{}",
        offcode(
            "a",
            A,
            "[[offcode.import]]\noffcode = \"b\"\nfile = \"b.toml\"\nconstraint = \"pull\""
        ),
        offcode(
            "x",
            "11111111-1111-4111-8111-111111111111",
            "[[offcode.import]]\noffcode = \"c\"\nfile = \"c.toml\""
        )
    );
    let b = offcode(
        "b",
        B,
        "[[offcode.import]]\noffcode = \"d\"\nfile = \"d.toml\"\nconstraint = \"asym-gang\"",
    );
    let c = offcode(
        "c",
        C,
        "[[offcode.import]]\noffcode = \"d\"\nfile = \"d.toml\"\nconstraint = \"gang\"",
    );
    let d = offcode("d", "22222222-2222-4222-8222-222222222222", "");
    let (_dir, m) = load_files(&[
        ("main.toml", &main),
        ("b.toml", &b),
        ("c.toml", &c),
        ("d.toml", &d),
    ]);
    let m = m.unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<_> = m.offcodes.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(names.len(), 5, "{names:?}");
    let kinds: Vec<_> = m.constraints.iter().map(|c| c.kind).collect();
    assert!(kinds.contains(&ConstraintKind::Pull) && kinds.contains(&ConstraintKind::AsymGang));
    let d_idx = m.offcode_index("d").unwrap();
    assert!(m.offcodes[d_idx].file.ends_with("d.toml"));
}

fn two(extra_a: &str, extra_b: &str, channel: &str) -> String {
    format!(
        "{}{}{}",
        offcode("a", A, extra_a),
        offcode("b", B, extra_b),
        channel
    )
}

#[test]
fn channels_are_checked() {
    let ports = |ch: &str| {
        two(
            "outputs = [\"out\"]\ninputs = [\"cmd\"]",
            "inputs = [\"in\"]",
            ch,
        )
    };
    let e = err(&ports(
        "[[channel]]\nname = \"c\"\nfrom = \"a\"\nto = \"b.in\"\n",
    ));
    expect(
        &e,
        "channel endpoint `a` must be written `offcode.port`",
        "main.toml:16:8",
    );
    let e = err(&ports(
        "[[channel]]\nname = \"c\"\nfrom = \"z.out\"\nto = \"b.in\"\n",
    ));
    expect(
        &e,
        "channel endpoint names unknown offcode `z`",
        "main.toml:16:8",
    );
    let e = err(&ports(
        "[[channel]]\nname = \"c\"\nfrom = \"a.out\"\nto = \"b.inn\"\n",
    ));
    expect(&e, "offcode `b` has no input port `inn`", "main.toml:17:6");
    assert!(e.contains("`b` declares input ports: in"), "{e}");
    let e = err(&ports(
        "[[channel]]\nname = \"c\"\nfrom = \"a.cmd\"\nto = \"b.in\"\n",
    ));
    expect(&e, "offcode `a` has no output port `cmd`", "main.toml:16:8");
    assert!(e.contains("declared, but as an input"), "{e}");
    let e = err(&ports(
        "[[channel]]\nname = \"c\"\nfrom = \"a.out\"\nto = [\"b.in\", \"a.cmd\"]\ncast = \"unicast\"\n",
    ));
    expect(&e, "unicast channel `c` has 2 receivers", "main.toml:17:6");
    assert!(e.contains("order = \"parallel\""), "{e}");
    let e = err(&ports(
        "[[channel]]\nname = \"c\"\nfrom = \"a.out\"\nto = \"b.in\"\ncast = \"multicast\"\n",
    ));
    expect(
        &e,
        "multicast channel `c` needs at least two receivers",
        "main.toml:17:6",
    );
    let e = err(&ports(
        "[[channel]]\nname = \"c\"\nfrom = \"a.out\"\nto = \"b.in\"\nslots = 1000\n",
    ));
    expect(&e, "`slots` must be a power of two", "main.toml:18:9");
    let e = err(&ports(
        "[[channel]]\nname = \"c\"\nfrom = \"a.out\"\nto = \"b.in\"\nslot_size = 100\n",
    ));
    expect(
        &e,
        "`slot_size` must be a multiple of 16",
        "main.toml:18:13",
    );
    let e = err(&ports(
        "[[channel]]\nname = \"c\"\nfrom = \"a.out\"\nto = \"b.in\"\nbandwidth_mbps = 100\n",
    ));
    expect(
        &e,
        "`bandwidth_mbps` was replaced by `bandwidth`, which carries its unit: write `bandwidth = \"100 Mbit/s\"`",
        "main.toml:18:18",
    );
    let e = err(&ports(
        "[[channel]]\nname = \"c\"\nfrom = \"a.out\"\nto = \"b.in\"\nbandwidth = \"fast\"\n",
    ));
    expect(
        &e,
        "`bandwidth`: `fast` is not a bandwidth",
        "main.toml:18:13",
    );
    let text = ports(
        "[[channel]]\nname = \"c\"\nfrom = \"a.out\"\nto = \"b.in\"\nbandwidth = \"2.5 Gbit/s\"\n",
    );
    let m = load_files(&[("main.toml", &text)]).1.unwrap();
    assert_eq!(m.channels[0].bandwidth.bps(), 2_500_000_000);
    let e = err(&ports(
        "[[channel]]\nname = \"c\"\nfrom = \"a.out\"\nto = \"b.in\"\ndelivery = \"maybe\"\n",
    ));
    expect(&e, "unknown delivery `maybe`", "main.toml:18:12");
    let e = err(&ports(
        "[[channel]]\nname = \"c\"\nfrom = \"a.out\"\nto = [\"b.in\", \"a.cmd\"]\ncast = \"multicast\"\norder = \"parallel\"\n",
    ));
    expect(
        &e,
        "cannot be both multicast and parallel",
        "main.toml:19:9",
    );
}

#[test]
fn channel_fan_in_fan_out_and_duplicates() {
    let base = two(
        "outputs = [\"out\"]\ninputs = [\"cmd\"]",
        "inputs = [\"in\"]\noutputs = [\"o2\"]",
        "",
    );
    let e = err(&format!(
        "{base}[[channel]]\nname = \"c\"\nfrom = \"a.out\"\nto = \"b.in\"\n[[channel]]\nname = \"c\"\nfrom = \"b.o2\"\nto = \"a.cmd\"\n"
    ));
    expect(&e, "channel `c` is declared twice", "main.toml:20:8");
    let e = err(&format!(
        "{base}[[channel]]\nname = \"c1\"\nfrom = \"a.out\"\nto = \"b.in\"\n[[channel]]\nname = \"c2\"\nfrom = \"a.out\"\nto = \"a.cmd\"\n"
    ));
    expect(
        &e,
        "output `a.out` already feeds another channel",
        "main.toml:21:8",
    );
    let e = err(&format!(
        "{base}[[channel]]\nname = \"c1\"\nfrom = \"a.out\"\nto = \"b.in\"\n[[channel]]\nname = \"c2\"\nfrom = \"b.o2\"\nto = \"b.in\"\n"
    ));
    expect(
        &e,
        "input `b.in` is already fed by another channel",
        "main.toml:22:6",
    );
}

#[test]
fn interfaces_are_checked() {
    let itf = |methods: &str| {
        offcode(
            "a",
            A,
            &format!("[[offcode.interface]]\nname = \"I\"\nid = \"{C}\"\nmethods = [{methods}]"),
        )
    };
    let e = err(&itf("{ name = \"m\", params = [\"u128\"] }"));
    expect(&e, "unknown type `u128`", "main.toml:7:");
    let e = err(&itf("{ name = \"m\", id = 3 }, { name = \"n\", id = 3 }"));
    expect(&e, "methods `m` and `n` share method id 3", "main.toml:7:");
    let e = err(&itf("{ name = \"m\" }, { name = \"m\" }"));
    expect(&e, "method `m` is declared twice", "main.toml:7:");
    let e = err(&itf("{ name = \"m\", id = 70000 }"));
    expect(&e, "method id must be in 1..=65535", "main.toml:7:");
}

#[test]
fn every_problem_is_reported_not_just_the_first() {
    let e = err(&format!(
        "{}{}",
        offcode("a", A, "priority = \"urgent\"\ncpu = 7.0"),
        offcode("b", "bad", "")
    ));
    assert!(
        e.contains("unknown priority")
            && e.contains("must be in (0, 1]")
            && e.contains("128-bit GUID"),
        "{e}"
    );
    // An offcode with a bad field still exists for references: no cascade.
    assert!(!e.contains("unknown offcode"), "{e}");
}

#[test]
fn missing_root_file_is_named() {
    let e = load(&PathBuf::from("/nonexistent/dir/app.toml"))
        .unwrap_err()
        .render(false);
    assert!(
        e.contains("cannot read manifest `/nonexistent/dir/app.toml`"),
        "{e}"
    );
}

#[test]
fn text_manifests_refuse_file_imports() {
    let e = parse_str(
        "inline.toml",
        &offcode(
            "a",
            A,
            "[[offcode.import]]\noffcode = \"b\"\nfile = \"b.toml\"",
        ),
    )
    .unwrap_err()
    .render(false);
    expect(
        &e,
        "file imports need a manifest on disk",
        "inline.toml:6:8",
    );
}

//! One test per kind of bad input, asserting on the message and its location.

use super::*;

const KVS: &str = r#"
[[service]]
name = "kvs"
id = 7
domains = ["MammalsGet", "MammalsSet", "CompaniesGet", "LocationsDelete"]
process_count = 10

[[service.portal]]
name = "AccessForBill"
processes = [3, 6, 9]
domains = ["CompaniesGet", "LocationsDelete"]
# sha256("test")
password_sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"

[[service]]
name = "bill"
[[service.process]]
id = 101
program = "/usr/bin/bill"

[[service]]
name = "john"
self_access = false
domains = ["Inbox"]
[[service.process]]
id = 72

[[grant]]
from = "bill"
to = "kvs"
portal = "AccessForBill"
password = "test"

[[grant]]
from = "john"
to = "kvs"
processes = [1, 2]
domains = ["MammalsGet"]

[[rate_limit]]
from = "bill"
to = "kvs"
gbps = 100.0
"#;

fn one_err(src: &str) -> Diagnostic {
    let e = parse_policy("p.toml", src).unwrap_err();
    assert_eq!(e.0.len(), 1, "{e}");
    e.0[0].clone()
}

fn with(extra: &str) -> String {
    format!("{KVS}\n{extra}")
}

fn line_of(src: &str, needle: &str) -> usize {
    src.lines()
        .position(|l| l.contains(needle))
        .expect("needle")
        + 1
}

#[test]
fn the_kvs_example_compiles_to_the_expected_sacl() {
    let p = parse_policy("p.toml", KVS).unwrap();
    let kvs = p.service_by_name("kvs").unwrap();
    assert_eq!(kvs.id, 7);
    let bill = p.service_by_name("bill").unwrap().id;
    let john = p.service_by_name("john").unwrap().id;
    assert_ne!(bill, 7);
    let sacl = p.sacl();
    let e = &sacl[&(bill, 7)];
    assert_eq!(e.processes, BTreeSet::from([3, 6, 9]));
    assert_eq!(e.domains, BTreeSet::from([2, 3]));
    assert_eq!(e.rate_slot, Some(0));
    assert!(e.allows(6, 3) && !e.allows(6, 0) && !e.allows(4, 2));
    assert_eq!(sacl[&(john, 7)].domains, BTreeSet::from([0]));
    assert_eq!(sacl[&(7, 7)].processes.len(), 10, "self access by default");
    assert!(
        !sacl.contains_key(&(bill, bill)),
        "bill has no domains: nothing to allow"
    );
    assert!(!sacl.contains_key(&(john, john)), "self_access = false");
    assert_eq!(
        p.rate_limits[0].algorithm,
        sidecore_sikker_rate::Algorithm::SeTre
    );
}

#[test]
fn syntax_error_is_located() {
    let d = one_err("[[service]]\nname = \"a\"\nid = = 3\n");
    assert_eq!((d.file.as_str(), d.line), ("p.toml", 3));
    assert!(d.to_string().starts_with("p.toml:3:"), "{d}");
    assert!(d.rendered.contains("id = = 3"));
}

#[test]
fn unknown_field_is_refused() {
    let d = one_err("[[service]]\nname = \"a\"\nprocesses = 3\n");
    assert!(d.message.contains("unknown field"), "{d}");
    assert_eq!(d.line, 3);
}

#[test]
fn unknown_service_in_grant() {
    let src = with(
        "[[grant]]\nfrom = \"bill\"\nto = \"nosuch\"\nall_processes = true\nall_domains = true\n",
    );
    let d = one_err(&src);
    assert_eq!(d.message, "grant `to`: unknown service `nosuch`");
    assert_eq!(d.line, line_of(&src, "\"nosuch\""));
    assert_eq!(d.col, 6);
}

#[test]
fn domain_not_defined_by_its_service() {
    let src = with(
        "[[grant]]\nfrom = \"bill\"\nto = \"kvs\"\nprocesses = [1]\ndomains = [\"SportsRead\"]\n",
    );
    let d = one_err(&src);
    assert_eq!(
        d.message,
        "grant bill → kvs: domain `SportsRead` is not defined by service `kvs`"
    );
    assert_eq!(d.line, line_of(&src, "SportsRead"));
}

#[test]
fn unknown_process_in_portal() {
    let src = KVS.replace("processes = [3, 6, 9]", "processes = [3, 60, 9]");
    let d = one_err(&src);
    assert_eq!(
        d.message,
        "portal `AccessForBill`: service `kvs` has no process 60"
    );
    assert_eq!(d.line, line_of(&src, "[3, 60, 9]"));
    assert_eq!(d.col, 17);
}

#[test]
fn rate_of_zero() {
    let src = KVS.replace("gbps = 100.0", "gbps = 0.0");
    let d = one_err(&src);
    assert_eq!(
        d.message,
        "rate_limit gbps must be a positive number, got 0"
    );
    assert_eq!(d.line, line_of(&src, "gbps = 0.0"));
}

#[test]
fn wrong_and_missing_password() {
    let d = one_err(&KVS.replace("password = \"test\"", "password = \"guess\""));
    assert_eq!(d.message, "wrong password for portal `AccessForBill`");
    let d = one_err(&KVS.replace("password = \"test\"\n", ""));
    assert!(d.message.contains("is password-protected"), "{d}");
}

#[test]
fn unknown_portal() {
    let d = one_err(&KVS.replace("portal = \"AccessForBill\"", "portal = \"AccessForJohn\""));
    assert_eq!(d.message, "service `kvs` has no portal `AccessForJohn`");
}

#[test]
fn duplicates_and_reserved_ids() {
    let d = one_err(&with("[[service]]\nname = \"kvs\"\n"));
    assert_eq!(d.message, "service `kvs` is defined twice");
    let d = one_err(&with("[[service]]\nname = \"other\"\nid = 7\n"));
    assert_eq!(d.message, "service id 7 is used twice");
    let d = one_err(
        "[[service]]\nname = \"nos\"\nid = 4294967294\n[[service]]\nname = \"x\"\nid = 4294967295\n",
    );
    assert!(d.message.contains("out of range"), "{d}");
    let d = one_err("[[service]]\nname = \"a\"\ndomains = [\"D\", \"D\"]\n");
    assert_eq!(d.message, "service `a` defines domain `D` twice");
    let d = one_err(
        "[[service]]\nname = \"a\"\n[[service.process]]\nid = 1\n[[service.process]]\nid = 1\n",
    );
    assert_eq!(d.message, "service `a` defines process 1 twice");
    let d = one_err(&with(
        "[[rate_limit]]\nfrom = \"bill\"\nto = \"kvs\"\ngbps = 5.0\n",
    ));
    assert!(d.message.contains("already defined"), "{d}");
}

#[test]
fn both_list_and_all_or_neither() {
    let d = one_err(&with(
        "[[grant]]\nfrom = \"john\"\nto = \"kvs\"\nprocesses = [1]\nall_processes = true\nall_domains = true\n",
    ));
    assert!(d.message.contains("not both"), "{d}");
    let d = one_err(&with(
        "[[grant]]\nfrom = \"john\"\nto = \"kvs\"\nall_domains = true\n",
    ));
    assert!(d.message.contains("no processes"), "{d}");
}

#[test]
fn bad_algorithm_and_hash_and_nmu_limits() {
    let d = one_err(&KVS.replace("gbps = 100.0", "gbps = 1.0\nalgorithm = \"fast\""));
    assert!(
        d.message.contains("unknown rate-control algorithm `fast`"),
        "{d}"
    );
    let d = one_err(&KVS.replace(
        "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
        "abc",
    ));
    assert!(d.message.contains("64 hexadecimal digits"), "{d}");
    let d = one_err(&with("[nmu]\notp_cap = 0\n"));
    assert_eq!(d.message, "otp_cap must be positive");
}

#[test]
fn several_errors_are_all_reported() {
    let src =
        with("[[grant]]\nfrom = \"x\"\nto = \"y\"\nall_processes = true\nall_domains = true\n");
    let e = parse_policy("p.toml", &src).unwrap_err();
    assert_eq!(e.0.len(), 2);
    assert!(
        e.to_string().contains("unknown service `x`")
            && e.to_string().contains("unknown service `y`")
    );
}

#[test]
fn placement_errors() {
    let p = parse_policy("p.toml", KVS).unwrap();
    let ok = parse_placement(
        "h.toml",
        "[[host]]\nname = \"h1\"\nprocesses = [\"kvs:3\", \"bill:101\"]\n",
        &p,
    )
    .unwrap();
    assert_eq!(ok.hosts[0].1.len(), 2);
    let cases = [
        (
            "[[host]]\nname = \"h1\"\nprocesses = [\"kvs3\"]\n",
            "`kvs3` is not `service:process`",
        ),
        (
            "[[host]]\nname = \"h1\"\nprocesses = [\"kv:3\"]\n",
            "unknown service `kv`",
        ),
        (
            "[[host]]\nname = \"h1\"\nprocesses = [\"kvs:30\"]\n",
            "service `kvs` has no process 30",
        ),
        (
            "[[host]]\nname = \"h1\"\nprocesses = [\"kvs:x\"]\n",
            "`x` is not a process id",
        ),
        (
            "[[host]]\nname = \"h1\"\nprocesses = [\"kvs:3\"]\n[[host]]\nname = \"h2\"\nprocesses = [\"kvs:3\"]\n",
            "process kvs:3 is already placed on host `h1`",
        ),
        (
            "[[host]]\nname = \"h1\"\n[[host]]\nname = \"h1\"\n",
            "host `h1` is defined twice",
        ),
    ];
    for (src, want) in cases {
        let e = parse_placement("h.toml", src, &p).unwrap_err();
        assert_eq!(e.0[0].message, want);
        assert!(e.0[0].to_string().starts_with("h.toml:"));
    }
}

/// Each `(line, message)`: the placement `head` followed by `line` is
/// refused with exactly that one message, located on line 4 at `at`.
fn refused_on_line_4(p: &Policy, head: &str, cases: &[(&str, &str)], at: &str) {
    for (line, want) in cases {
        let src = format!("{head}{line}\n");
        let e = parse_placement("h.toml", &src, p).unwrap_err();
        assert_eq!(e.0.len(), 1, "{e}");
        assert_eq!(e.0[0].message, *want);
        assert_eq!(e.0[0].line, 4, "{e}");
        assert!(e.0[0].to_string().starts_with(at), "{e}");
    }
}

#[test]
fn l4_addresses_are_parsed_and_bad_ones_located() {
    let p = parse_policy("p.toml", KVS).unwrap();
    let ok = parse_placement(
        "h.toml",
        r#"[[host]]
name = "h1"
processes = ["kvs:3", "bill:101"]
l4 = { "kvs:3" = ["10.9.0.2:8080", "[fd00::2]:8080"], "bill:101" = "[::ffff:10.9.0.3]:80" }
"#,
        &p,
    )
    .unwrap();
    assert_eq!(
        ok.l4[&(7, 3)],
        vec![
            "10.9.0.2:8080".parse().unwrap(),
            "[fd00::2]:8080".parse().unwrap()
        ]
    );
    // An IPv4-mapped address is kept as the IPv4 one.
    assert_eq!(ok.l4[&(1, 101)], vec!["10.9.0.3:80".parse().unwrap()]);
    let head = "[[host]]\nname = \"h1\"\nprocesses = [\"kvs:3\"]\n";
    let cases = [
        (
            "l4 = { \"kvs:3\" = \"10.9.0.300:8080\" }",
            "l4 address of kvs:3: `10.9.0.300:8080` is not IP:PORT (for IPv6, `[fd00::2]:8080`)",
        ),
        (
            "l4 = { \"kvs:3\" = \"10.9.0.2\" }",
            "l4 address of kvs:3: `10.9.0.2` is not IP:PORT (for IPv6, `[fd00::2]:8080`)",
        ),
        (
            "l4 = { \"kvs:3\" = \"0.0.0.0:80\" }",
            "l4 address of kvs:3: `0.0.0.0:80` has no specific address; give the one clients connect to",
        ),
        (
            "l4 = { \"kvs:3\" = \"10.0.0.1:0\" }",
            "l4 address of kvs:3: `10.0.0.1:0` has port 0",
        ),
        (
            "l4 = { \"kvs:4\" = \"10.0.0.1:80\" }",
            "l4: process kvs:4 is not placed on host `h1`",
        ),
        (
            "l4 = { \"nope:1\" = \"10.0.0.1:80\" }",
            "l4: `nope:1` is not a `service:process` of the policy",
        ),
        ("l4 = { \"kvs:3\" = [] }", "l4: kvs:3 has no address"),
    ];
    refused_on_line_4(&p, head, &cases, "h.toml:4:");
}

#[test]
fn one_l4_address_for_two_processes_is_refused() {
    let p = parse_policy("p.toml", KVS).unwrap();
    // One address, two processes (on two hosts).
    let src = r#"[[host]]
name = "h1"
processes = ["kvs:3"]
l4 = { "kvs:3" = "10.0.0.1:80" }
[[host]]
name = "h2"
processes = ["kvs:4"]
l4 = { "kvs:4" = "10.0.0.1:80" }
"#;
    let e = parse_placement("h.toml", src, &p).unwrap_err();
    assert_eq!(
        e.0[0].message,
        "l4: 10.0.0.1:80 is already the address of kvs:3"
    );
    assert_eq!(e.0[0].line, 8);
}

#[test]
fn agent_addresses_are_parsed_and_bad_ones_located() {
    let p = parse_policy("p.toml", KVS).unwrap();
    let ok = parse_placement(
        "h.toml",
        "[[host]]\nname = \"h1\"\nprocesses = [\"kvs:3\"]\nagent = \"10.9.0.1:7411\"\n\
         [[host]]\nname = \"h2\"\nagent = \"[fd00::2]:7411\"\n[[host]]\nname = \"h3\"\n",
        &p,
    )
    .unwrap();
    assert_eq!(ok.agents.len(), 2, "h3 gives none");
    assert_eq!(ok.agents["h1"], "10.9.0.1:7411".parse().unwrap());
    assert_eq!(ok.agents["h2"], "[fd00::2]:7411".parse().unwrap());
    let head = "[[host]]\nname = \"h1\"\nprocesses = [\"kvs:3\"]\n";
    let cases = [
        (
            "agent = \"10.9.0.300:7411\"",
            "agent address of host `h1`: `10.9.0.300:7411` is not IP:PORT (for IPv6, `[fd00::2]:8080`)",
        ),
        (
            "agent = \"agent-h1\"",
            "agent address of host `h1`: `agent-h1` is not IP:PORT (for IPv6, `[fd00::2]:8080`)",
        ),
        (
            "agent = \"0.0.0.0:7411\"",
            "agent address of host `h1`: `0.0.0.0:7411` has no specific address; give the one clients connect to",
        ),
        (
            "agent = \"10.0.0.1:0\"",
            "agent address of host `h1`: `10.0.0.1:0` has port 0",
        ),
    ];
    refused_on_line_4(&p, head, &cases, "h.toml:4:9:");
    // Not a string, and one address for two hosts (an IPv4-mapped one is the IPv4 one).
    let e = parse_placement("h.toml", &format!("{head}agent = 7411\n"), &p).unwrap_err();
    assert_eq!(e.0[0].line, 4, "{e}");
    let src = "[[host]]\nname = \"h1\"\nagent = \"10.0.0.1:7411\"\n\
               [[host]]\nname = \"h2\"\nagent = \"[::ffff:10.0.0.1]:7411\"\n";
    let e = parse_placement("h.toml", src, &p).unwrap_err();
    assert_eq!(
        e.0[0].message,
        "agent address 10.0.0.1:7411 is already host `h1`'s"
    );
    assert_eq!(e.0[0].line, 6);
}

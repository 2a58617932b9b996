//! A user's own BPF object on the real kernel, in a real testbed (as root):
//! the example `examples/kernel/udp_count.bpf.c`, compiled here with clang,
//! is loaded; its XDP program counts and filters UDP at the middlebox, its
//! tc egress program counts what leaves, its ring buffer carries a record
//! per datagram, and its config map changes what it drops. Detached and
//! dropped, it leaves nothing. Bad objects and names are refused with the
//! file and what is wrong, and a program the verifier refuses carries the
//! tail of the verifier's log.
#![allow(clippy::unwrap_used, clippy::too_many_lines)] // test code

use std::path::{Path, PathBuf};
use std::process::Command;

use sidecore_kernel::user_object::loaded_programs_named;
use sidecore_kernel::{Hook, UserObject, XdpMode};
use sidecore_testbed::testing::root;
use sidecore_testbed::{Testbed, Topology};

/// Removes the testbed even if the test fails.
struct Bed(Testbed);
impl Drop for Bed {
    fn drop(&mut self) {
        let _ = self.0.down();
    }
}

fn repo(p: &str) -> PathBuf {
    PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap())
        .join("../..")
        .join(p)
}

/// Compiles C to a BPF object with clang, as a user would.
fn clang(src: &Path, out: &Path) {
    let triple = Command::new("gcc")
        .arg("-print-multiarch")
        .output()
        .unwrap();
    let triple = String::from_utf8(triple.stdout).unwrap();
    let st = Command::new("clang")
        .args(["-O2", "-g", "-Wall", "-target", "bpf", "-c"])
        .arg(src)
        .arg("-o")
        .arg(out)
        .arg(format!("-I/usr/include/{}", triple.trim()))
        .status()
        .expect("clang (scripts/setup.sh installs it)");
    assert!(st.success(), "clang failed on {}", src.display());
}

/// The ports of `ports` whose datagram from the client reached the server.
fn probe(tb: &Testbed, ports: &[u16]) -> Vec<u16> {
    let server = tb.iface("server", "middlebox").unwrap().addr;
    let client = tb.iface("client", "middlebox").unwrap().addr;
    sidecore_testbed::testing::udp_reaches(&tb.prefix, client, server, ports)
}

/// The (dport, dropped) of every waiting ring buffer record.
fn records(ring: &mut sidecore_kernel::RingReader) -> Vec<(u16, u32)> {
    let mut v = Vec::new();
    ring.drain(1000, |r| {
        assert_eq!(r.len(), 16, "struct event is 16 bytes");
        let dport = u16::from_ne_bytes([r[10], r[11]]);
        let dropped = u32::from_ne_bytes([r[12], r[13], r[14], r[15]]);
        v.push((dport, dropped));
    });
    v
}

fn xdp_on(ns: &str, dev: &str) -> bool {
    sidecore_testbed::topology::ip(&["-n", ns, "link", "show", "dev", dev])
        .unwrap()
        .contains("xdp")
}

#[test]
fn a_users_object_counts_filters_reports_and_leaves_nothing() {
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let obj_path = dir.path().join("udp_count.bpf.o");
    clang(&repo("examples/kernel/udp_count.bpf.c"), &obj_path);
    let bed =
        Bed(Testbed::up(&Topology::default(), &format!("scu{}", std::process::id())).unwrap());
    let tb = &bed.0;
    let mb = format!("{}-middlebox", tb.prefix);

    let mut obj = UserObject::load(&obj_path).unwrap();
    let mut progs = obj.programs();
    progs.sort();
    assert_eq!(progs, ["egress_count", "udp_count"]);
    // A ring buffer takes no configuration.
    let e = obj.set("events", &[0; 4], &[0; 4]).unwrap_err().to_string();
    assert!(e.contains("a RingBuf map takes no configuration"), "{e}");
    let mut ring = obj.take_ring("events").unwrap();
    // Block 5001: a u32 key and a u32 value.
    obj.set("config", &0u32.to_ne_bytes(), &5001u32.to_ne_bytes())
        .unwrap();
    let xdp = Hook::Xdp {
        iface: "to-client".into(),
        mode: XdpMode::Generic,
    };
    let tc = Hook::Tc {
        iface: "to-server".into(),
        egress: true,
    };
    obj.attach("udp_count", Some(&mb), &xdp).unwrap();
    obj.attach("egress_count", Some(&mb), &tc).unwrap();
    assert_eq!(obj.attached(), 2);
    assert!(xdp_on(&mb, "to-client"));

    assert_eq!(probe(tb, &[5000, 5001]), vec![5000]);
    let c = obj.counters("counts").unwrap();
    assert_eq!((c[0], c[1]), (1, 1), "one passed, one dropped: {c:?}");
    assert!(
        c[2] >= 1,
        "the forwarded datagram left through tc egress: {c:?}"
    );
    assert_eq!(records(&mut ring), vec![(5000, 0), (5001, 1)]);

    // New configuration, same programs: now 5000 is the one dropped.
    obj.set("config", &0u32.to_ne_bytes(), &5000u32.to_ne_bytes())
        .unwrap();
    assert_eq!(probe(tb, &[5000, 5001]), vec![5001]);
    assert_eq!(records(&mut ring), vec![(5000, 1), (5001, 0)]);

    // Wrong sizes, wrong kinds of map and missing names are refused by name.
    let e = obj.set("config", &0u64.to_ne_bytes(), &1u32.to_ne_bytes());
    let e = e.unwrap_err().to_string();
    assert!(
        e.contains("udp_count.bpf.o")
            && e.contains("a 8-byte key and a 4-byte value given; the map takes 4 and 4"),
        "{e}"
    );
    let e = obj.counters("nope").unwrap_err().to_string();
    assert!(
        e.contains("udp_count.bpf.o") && e.contains("has no map `nope` (it has: config, counts"),
        "{e}"
    );
    let e = obj.attach("nope", Some(&mb), &xdp).unwrap_err().to_string();
    assert!(
        e.contains("has no program `nope` (it has: egress_count, udp_count)"),
        "{e}"
    );
    let e = obj
        .attach("udp_count", Some(&mb), &tc)
        .unwrap_err()
        .to_string();
    assert!(e.contains("cannot attach there"), "{e}");

    // Detached: traffic flows unfiltered and unseen.
    obj.detach_all();
    obj.detach_all();
    assert!(!xdp_on(&mb, "to-client"));
    let before = obj.counters("counts").unwrap();
    assert_eq!(probe(tb, &[5000, 5001]), vec![5000, 5001]);
    assert_eq!(
        obj.counters("counts").unwrap(),
        before,
        "nothing counts any more"
    );
    drop(ring);
    drop(obj);
    assert_eq!(
        loaded_programs_named(&["udp_count", "egress_count"]),
        Vec::<String>::new(),
        "programs still loaded"
    );
}

#[test]
fn bad_objects_are_refused_with_the_file_and_the_verifiers_words() {
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Not ELF at all.
    let text = dir.path().join("rules.bpf.o");
    std::fs::write(&text, "1 udp any any any 53 accept\n").unwrap();
    let e = UserObject::load(&text).err().unwrap().to_string();
    assert!(
        e.starts_with(&format!("{}: ", text.display())) && e.contains("not an ELF object"),
        "{e}"
    );
    // ELF, but not BPF: this test binary's own code is no BPF object.
    let own = std::env::current_exe().unwrap();
    let e = UserObject::load(&own).err().unwrap().to_string();
    assert!(
        e.contains("the kernel refused BPF object") || e.contains("error parsing"),
        "{e}"
    );
    // A program the verifier refuses: it reads the packet without a bounds check.
    let src = dir.path().join("bad.bpf.c");
    std::fs::write(
        &src,
        "#include <linux/bpf.h>\n#include <bpf/bpf_helpers.h>\n\
         SEC(\"xdp\") int unchecked(struct xdp_md *ctx) {\n\
           unsigned char *p = (void *)(long)ctx->data;\n\
           return p[40] == 17 ? XDP_DROP : XDP_PASS;\n}\n\
         char LICENSE[] SEC(\"license\") = \"GPL\";\n",
    )
    .unwrap();
    let obj = dir.path().join("bad.bpf.o");
    clang(&src, &obj);
    let mut o = UserObject::load(&obj).unwrap();
    let e = o
        .attach(
            "unchecked",
            None,
            &Hook::Xdp {
                iface: "lo".into(),
                mode: XdpMode::Generic,
            },
        )
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("bad.bpf.o")
            && e.contains("the kernel refused program `unchecked`")
            && e.contains("the verifier said:")
            && e.contains("invalid access to packet"),
        "{e}"
    );
    assert_eq!(o.attached(), 0);
}

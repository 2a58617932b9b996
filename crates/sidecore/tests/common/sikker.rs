//! A cluster of three Sikker agents for end-to-end tests and benchmarks: a
//! triangle testbed of network namespaces `h0`, `h1`, `h2`, cgroups for three
//! senders `s0..s2` and a receiver `sink`, a policy limiting `src → dst`, a
//! placement (`src:i` on `hi`, `dst:9` on `h0`) and the cluster's
//! certificates; agents, loads and meters started as real processes.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

use sidecore_testbed::Testbed;
use sidecore_testbed::topology::{HostSpec, LinkSpec, Topology};

use super::cgroups::{Groups, cgroup2_root, spawn_in};
use super::run;

/// Where the agents listen, in each namespace.
pub const PORT: u16 = 7411;

/// `src:i` on host `hi`, `dst:9` on `h0`.
pub const PLACEMENT: &str = "[[host]]\nname = \"h0\"\nprocesses = [\"src:0\", \"dst:9\"]\n[[host]]\nname = \"h1\"\nprocesses = [\"src:1\"]\n[[host]]\nname = \"h2\"\nprocesses = [\"src:2\"]\n";

/// The policy: `src` (processes 0–2) may reach `dst:9` in domain `In` (not
/// `Admin`), limited to `gbps` with a bucket of `bucket` bytes; `cg` gives
/// each process's cgroup (`s0`, `s1`, `s2`, `sink`).
pub fn policy_text(cg: impl Fn(&str) -> String, gbps: f64, bucket: u64) -> String {
    format!(
        "[[service]]\nname = \"src\"\n[[service.process]]\nid = 0\ncgroup = \"{}\"\n[[service.process]]\nid = 1\ncgroup = \"{}\"\n[[service.process]]\nid = 2\ncgroup = \"{}\"\n\
         [[service]]\nname = \"dst\"\ndomains = [\"In\", \"Admin\"]\n[[service.process]]\nid = 9\ncgroup = \"{}\"\n\
         [[grant]]\nfrom = \"src\"\nto = \"dst\"\nprocesses = [9]\ndomains = [\"In\"]\n\
         [[rate_limit]]\nfrom = \"src\"\nto = \"dst\"\ngbps = {gbps}\nbucket_bytes = {bucket}\n",
        cg("s0"),
        cg("s1"),
        cg("s2"),
        cg("sink")
    )
}

/// Kills the process on drop.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Bed(Testbed);

impl Drop for Bed {
    fn drop(&mut self) {
        let _ = self.0.down();
    }
}

/// The texts a `sikker recv` child printed (JSON lines), once it has exited
/// (within `secs`).
pub fn received_texts(child: &mut Child, secs: u64) -> Vec<String> {
    assert!(
        super::wait_exit(child, secs).is_some(),
        "the receiver did not finish"
    );
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut out).unwrap();
    out.lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["text"].as_str().unwrap().to_string()
        })
        .collect()
}

/// Stops a `sikker agent` child with SIGTERM; the counters it printed.
pub fn counters_at_sigterm(agent: &mut Child) -> serde_json::Value {
    let pid = agent.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    assert!(
        super::wait_exit(agent, 10).is_some(),
        "the agent did not stop"
    );
    let mut out = String::new();
    std::io::Read::read_to_string(&mut agent.stdout.take().unwrap(), &mut out).unwrap();
    serde_json::from_str(out.trim()).unwrap()
}

/// Milliseconds since the Unix epoch (the meter's window clock).
pub fn unix_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// The testbed, cgroups and files of a three-agent cluster.
pub struct Cluster {
    // Dropped in this order: the groups (killing their processes), then the
    // namespaces, then the files.
    pub groups: Groups,
    bed: Bed,
    pub dir: tempfile::TempDir,
    pub policy: PathBuf,
    pub placement: PathBuf,
    /// The cluster's certificates (`sidecore sikker certs`).
    pub tls: PathBuf,
}

impl Cluster {
    /// Makes it all; `tag` names the cgroups, `subnet` and `prefix` the testbed.
    pub fn up(tag: &str, subnet: &str, prefix: &str, gbps: f64, bucket: u64) -> Cluster {
        let cg = cgroup2_root().expect("no cgroup v2 mount on this machine");
        let groups = Groups::new(&cg, tag, &["s0", "s1", "s2", "sink"]);
        let host = |n: &str| HostSpec { name: n.into() };
        let link = |a: &str, b: &str| LinkSpec {
            hosts: [a.into(), b.into()],
        };
        let topo = Topology {
            subnet: subnet.into(),
            hosts: vec![host("h0"), host("h1"), host("h2")],
            links: vec![link("h0", "h1"), link("h1", "h2"), link("h0", "h2")],
        };
        let prefix = format!("{prefix}{}", std::process::id() % 100_000);
        let bed = Bed(Testbed::up(&topo, &prefix).expect("the testbed comes up"));
        let dir = tempfile::tempdir().expect("a temporary directory");
        let policy = dir.path().join("policy.toml");
        std::fs::write(&policy, policy_text(|s| groups.path(s), gbps, bucket)).unwrap();
        let placement = dir.path().join("placement.toml");
        std::fs::write(&placement, PLACEMENT).unwrap();
        let tls = dir.path().join("tls");
        let o = run(&[
            "sikker",
            "certs",
            "--out",
            tls.to_str().unwrap(),
            "h0",
            "h1",
            "h2",
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        Cluster {
            groups,
            bed,
            dir,
            policy,
            placement,
            tls,
        }
    }

    /// Host `h`'s network namespace.
    pub fn ns(&self, h: &str) -> String {
        format!("{}-{h}", self.bed.0.prefix)
    }

    /// Where host `to`'s agent is reached from host `from`.
    pub fn addr(&self, from: &str, to: &str) -> String {
        format!("{}:{PORT}", self.bed.0.iface(to, from).unwrap().addr)
    }

    /// Host `h`'s agent socket.
    pub fn sock(&self, h: &str) -> PathBuf {
        self.dir.path().join(format!("{h}.sock"))
    }

    /// The stderr of agent `h` started with `tag`.
    pub fn log(&self, h: &str, tag: &str) -> PathBuf {
        self.dir.path().join(format!("{h}-{tag}.err"))
    }

    pub fn log_has(&self, h: &str, tag: &str, what: &str) -> bool {
        std::fs::read_to_string(self.log(h, tag)).is_ok_and(|s| s.contains(what))
    }

    /// An agent for `host` in its namespace, with the certificates in `tls`
    /// (under the file names of `host`), its stderr in [`Cluster::log`].
    pub fn agent(&self, host: &str, tls: &Path, tag: &str) -> Proc {
        let mut args: Vec<String> = vec![
            "netns".into(),
            "exec".into(),
            self.ns(host),
            env!("CARGO_BIN_EXE_sidecore").into(),
            "sikker".into(),
            "agent".into(),
            "--policy".into(),
            self.policy.display().to_string(),
            "--placement".into(),
            self.placement.display().to_string(),
            "--host".into(),
            host.into(),
            "--socket".into(),
            self.sock(host).display().to_string(),
            "--listen".into(),
            format!("0.0.0.0:{PORT}"),
            "--tls".into(),
            tls.display().to_string(),
        ];
        for p in ["h0", "h1", "h2"].into_iter().filter(|p| *p != host) {
            args.push("--peer".into());
            args.push(format!("{p}={}", self.addr(host, p)));
        }
        let err = std::fs::File::create(self.log(host, tag)).unwrap();
        Proc(
            Command::new("ip")
                .args(&args)
                .stdout(Stdio::null())
                .stderr(err)
                .spawn()
                .unwrap(),
        )
    }

    /// Sender `s{i}` sending `size`-byte messages to `dst:9:In` through host
    /// `h{i}`'s agent for `ms`.
    pub fn load(&self, i: usize, size: usize, ms: u64) -> Proc {
        Proc(spawn_in(
            &self.groups.procs(&format!("s{i}")),
            &[
                "sikker",
                "load",
                "--socket",
                self.sock(&format!("h{i}")).to_str().unwrap(),
                "--to",
                "dst:9:In",
                "--size",
                &size.to_string(),
                "--duration-ms",
                &ms.to_string(),
            ],
        ))
    }

    /// The receiver, counting bytes per `window_ms` for `ms`.
    pub fn meter(&self, window_ms: u128, ms: u64) -> Child {
        spawn_in(
            &self.groups.procs("sink"),
            &[
                "sikker",
                "meter",
                "--socket",
                self.sock("h0").to_str().unwrap(),
                "--window-ms",
                &window_ms.to_string(),
                "--duration-ms",
                &ms.to_string(),
            ],
        )
    }
}

/// The windows a meter printed: (start ms, bytes, bytes per sender).
pub fn windows(out: &str) -> Vec<(u128, u64, serde_json::Value)> {
    out.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|v| {
            (
                u128::from(v["t_ms"].as_u64().unwrap_or(0)),
                v["bytes"].as_u64().unwrap_or(0),
                v["from"].clone(),
            )
        })
        .collect()
}

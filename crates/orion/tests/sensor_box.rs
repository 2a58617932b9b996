//! The ten calls end to end: a target creates and exports a box, a publisher attaches
//! through the export directory, a monitor discovers, associates, fetches and flushes;
//! a malformed registration and a full box get clear errors while the target goes on.

use sidecore_orion::client::Publisher;
use sidecore_orion::implicit::ImplicitSource;
use sidecore_orion::monitor::{MonitorBox, Update};
use sidecore_orion::sbox::{ExportRecord, SensorBox};
use sidecore_orion::sensor::{SensorKind, SensorSpec};
use sidecore_orion::shm::SbParams;
use std::sync::{Arc, Mutex};

#[test]
fn ten_calls_through_the_export_directory() {
    let dir = std::env::temp_dir().join(format!("orion-sb-{}", std::process::id()));
    // sbcreate + sbexport
    let mut sb = SensorBox::create(
        "target",
        SbParams {
            sensors: 4,
            log_records: 2,
            period_us: 10_000,
        },
    )
    .unwrap();
    let rec = sb.export(&dir).unwrap();
    assert_eq!(ExportRecord::list(&dir).unwrap().0, vec![rec]);
    // addsensor + updatesensor at the target
    let fork = sb
        .add_sensor(&SensorSpec::new("target", "FORK_REC", SensorKind::Event).unwrap())
        .unwrap();
    // the client library, from "another process" (through /proc/<pid>/fd/<fd>)
    let p = Publisher::attach(&dir, "target").unwrap();
    let served = p.counter("requests").unwrap();
    served.add(3).unwrap();
    // sbdiscover + sbassociate
    let mut mon = MonitorBox::discover(&dir, "target").unwrap();
    mon.add_implicit(ImplicitSource::ProcStat);
    mon.add_implicit(ImplicitSource::CgroupPids("/nonexistent".into()));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    mon.associate(move |u| {
        let line = match u {
            Update::Sensor(s) => format!("{}={}", s.name, s.value[0]),
            Update::Event(e) => format!("event {}->{}", e.value[0], e.value[1]),
        };
        s2.lock().unwrap().push(line);
    });
    sb.update(fork, [5120, 5124]).unwrap();
    sb.update(fork, [5120, 5125]).unwrap();
    // A full box: the third event is refused with a clear error; the target goes on.
    let e = sb.update(fork, [5120, 5126]).unwrap_err().to_string();
    assert!(e.contains("sensor box `target` is full"), "{e}");
    served.add(1).unwrap();
    // sbfetch
    let v = mon.fetch();
    assert_eq!(v.value("requests"), Some(4));
    assert!(v.value("stat.ctxt").is_some_and(|c| c > 0));
    assert_eq!(v.events.len(), 2);
    assert_eq!(v.info.dropped, 1);
    assert!(
        v.errors[0].contains("/nonexistent/pids.current"),
        "{:?}",
        v.errors
    );
    let got = seen.lock().unwrap().clone();
    assert!(
        got.contains(&"requests=4".to_owned()) && got.contains(&"event 5120->5125".to_owned()),
        "{got:?}"
    );
    // sbflush frees the log.
    mon.flush(&v);
    sb.update(fork, [5120, 5127]).unwrap();
    let v2 = mon.fetch();
    assert_eq!(v2.events.len(), 1);
    // A malformed registration from the client: refused by name, the box goes on.
    let e = p.counter("bad name!").err().unwrap().to_string();
    assert!(
        e.contains("malformed sensor registration `bad name!`"),
        "{e}"
    );
    // rmsensor (the counter is dropped), then sbdestroy removes the export.
    drop(served);
    assert_eq!(mon.fetch().value("requests"), None);
    sb.destroy();
    assert!(ExportRecord::list(&dir).unwrap().0.is_empty());
    let e = MonitorBox::discover(&dir, "target")
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("no sensor box `target` exported"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

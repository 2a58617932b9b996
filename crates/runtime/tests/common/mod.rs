//! What the runtime's integration tests share: one deployment at a time,
//! this machine's inventory without the kernel and Wasm probes, the event
//! kinds one offcode logged, an offcode's status, and waiting for a condition.
#![allow(dead_code)] // each test binary uses its own share of these

use std::sync::{Mutex, MutexGuard};

use sidecore_pe::{DiscoverOptions, Inventory};
use std::time::{Duration, Instant};

use sidecore_runtime::{EventKind, OffcodeStatus, Runtime};

/// Serialises the tests: they pin threads to the machine's few cores.
static SERIAL: Mutex<()> = Mutex::new(());

pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// This machine's cores and host, no kernel or Wasm PE, no housekeeping core.
pub fn inventory() -> Inventory {
    sidecore_pe::discover(&DiscoverOptions {
        probe_kernel: false,
        probe_wasm: false,
        housekeeping: Some(vec![]),
        ..Default::default()
    })
}

/// The kinds of the events `offcode` of `app` logged, in order.
pub fn kinds(rt: &Runtime, app: &str, offcode: &str) -> Vec<EventKind> {
    rt.events()
        .of_app(app)
        .into_iter()
        .filter(|e| e.offcode == offcode)
        .map(|e| e.kind)
        .collect()
}

/// Offcode `name` of the runtime's first app, as `ps` shows it now.
///
/// # Panics
/// If there is no app or no such offcode.
pub fn offcode(rt: &Runtime, name: &str) -> OffcodeStatus {
    rt.status()[0]
        .offcodes
        .iter()
        .find(|o| o.name == name)
        .cloned()
        .unwrap_or_else(|| panic!("no offcode `{name}`: {:?}", rt.status()))
}

/// Polls `f` every 5 ms for up to `secs` seconds; whether it came true.
pub fn wait(mut f: impl FnMut() -> bool, secs: u64) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(secs) {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    f()
}

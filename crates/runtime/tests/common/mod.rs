//! What the runtime's integration tests share: one deployment at a time,
//! this machine's inventory without the kernel and Wasm probes, and the
//! event kinds one offcode logged.
#![allow(dead_code)] // each test binary uses its own share of these

use std::sync::{Mutex, MutexGuard};

use sidecore_pe::{DiscoverOptions, Inventory};
use sidecore_runtime::{EventKind, Runtime};

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

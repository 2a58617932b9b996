//! The client library for applications: attach to an exported Sensor Box and publish
//! counters and gauges into it (`addsensor` + `updatesensor` from another process).
//!
//! ```no_run
//! # fn main() -> Result<(), sidecore_orion::error::OrionError> {
//! let p = sidecore_orion::client::Publisher::attach("/run/sidecore/orion".as_ref(), "web")?;
//! let served = p.counter("requests")?;
//! served.add(1)?;
//! # Ok(()) }
//! ```

use crate::error::OrionError;
use crate::monitor::open_exported;
use crate::sensor::{SensorKind, SensorSpec};
use crate::shm::{SensorHandle, SharedBox};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A process's connection to one exported box.
#[derive(Clone)]
pub struct Publisher {
    sb: Arc<SharedBox>,
}

impl Publisher {
    /// Attaches to box `name` exported in `dir`.
    pub fn attach(dir: &Path, name: &str) -> Result<Publisher, OrionError> {
        Ok(Publisher {
            sb: Arc::new(open_exported(dir, name)?),
        })
    }

    /// Wraps an already mapped box (the target publishing into its own box).
    pub fn from_shared(sb: Arc<SharedBox>) -> Publisher {
        Publisher { sb }
    }

    /// Registers a counter (monotone) named `name`.
    pub fn counter(&self, name: &str) -> Result<Counter, OrionError> {
        let h = self.register(name, SensorKind::Counter)?;
        Ok(Counter {
            sb: self.sb.clone(),
            handle: h,
            value: AtomicU64::new(0),
        })
    }

    /// Registers a gauge named `name`.
    pub fn gauge(&self, name: &str) -> Result<Gauge, OrionError> {
        let h = self.register(name, SensorKind::Gauge)?;
        Ok(Gauge {
            sb: self.sb.clone(),
            handle: h,
        })
    }

    fn register(&self, name: &str, kind: SensorKind) -> Result<SensorHandle, OrionError> {
        self.sb
            .add_sensor(&SensorSpec::new(self.sb.name(), name, kind)?)
    }
}

/// A published counter; removed from the box when dropped.
pub struct Counter {
    sb: Arc<SharedBox>,
    handle: SensorHandle,
    value: AtomicU64,
}

impl Counter {
    /// Adds `n` and publishes the new total.
    pub fn add(&self, n: u64) -> Result<u64, OrionError> {
        let v = self.value.fetch_add(n, Ordering::Relaxed).saturating_add(n);
        // Two threads adding at once may publish out of order; the box refuses the
        // smaller total, which is harmless: the larger one is already there.
        match self.sb.update(self.handle, [v, 0]) {
            Ok(()) | Err(OrionError::WrongValue { .. }) => Ok(v),
            Err(e) => Err(e),
        }
    }

    /// Its sensor handle.
    pub fn handle(&self) -> SensorHandle {
        self.handle
    }
}

impl Drop for Counter {
    fn drop(&mut self) {
        let _ = self.sb.remove_sensor(self.handle);
    }
}

/// A published gauge; removed from the box when dropped.
pub struct Gauge {
    sb: Arc<SharedBox>,
    handle: SensorHandle,
}

impl Gauge {
    /// Publishes `v`.
    pub fn set(&self, v: u64) -> Result<(), OrionError> {
        self.sb.update(self.handle, [v, 0])
    }
}

impl Drop for Gauge {
    fn drop(&mut self) {
        let _ = self.sb.remove_sensor(self.handle);
    }
}

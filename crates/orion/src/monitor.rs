//! The monitor's side of a Sensor Box: `sbdiscover`, `sbassociate`, `sbfetch` and
//! `sbflush`, plus the implicit sensors read at fetch time. A fetch copies the box into
//! a [`View`] stamped with the monitor's own clock; handlers associated with the box are
//! called for every sensor updated and every event record since the previous fetch.

use crate::error::OrionError;
use crate::implicit::ImplicitSource;
use crate::sbox::ExportRecord;
use crate::shm::{BoxInfo, EventRecord, SensorHandle, SensorReading, SharedBox, now_ns};
use serde::Serialize;
use std::collections::HashMap;
use std::path::Path;

/// Opens box `name` exported in `dir`: reads its record and maps
/// `/proc/<pid>/fd/<fd>`, checking that the memory is a box of that name.
pub fn open_exported(dir: &Path, name: &str) -> Result<SharedBox, OrionError> {
    let path = ExportRecord::path(dir, name);
    let not = |why: String| OrionError::NotExported {
        name: name.to_owned(),
        dir: dir.to_owned(),
        why,
    };
    let text =
        std::fs::read_to_string(&path).map_err(|e| not(format!(" ({}: {e})", path.display())))?;
    let rec: ExportRecord = serde_json::from_str(&text).map_err(|e| OrionError::file(&path, e))?;
    let fd_path = format!("/proc/{}/fd/{}", rec.pid, rec.fd);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&fd_path)
        .map_err(|e| {
            not(format!(
                " (its owner, process {}, is gone or refuses: {fd_path}: {e})",
                rec.pid
            ))
        })?;
    let sb = SharedBox::attach(file.into(), &fd_path)?;
    if sb.name() != name {
        return Err(not(format!(" ({fd_path} now holds box `{}`)", sb.name())));
    }
    Ok(sb)
}

/// One fetch of a box.
#[derive(Debug, Clone, Serialize)]
pub struct View {
    /// The monitor's clock at the fetch (CLOCK_MONOTONIC, ns).
    pub at_ns: u64,
    /// The box's parameters and counters.
    pub info: BoxInfo,
    /// Every live explicit sensor.
    pub sensors: Vec<SensorReading>,
    /// Event records not yet flushed.
    pub events: Vec<EventRecord>,
    /// Implicit sensors, read now.
    pub implicit: Vec<(String, u64)>,
    /// Implicit sources that could not be read (the fetch goes on without them).
    pub errors: Vec<String>,
}

impl View {
    /// A sensor's first word by name: explicit sensors first, then implicit ones.
    pub fn value(&self, name: &str) -> Option<u64> {
        self.sensors
            .iter()
            .find(|s| s.name == name)
            .map(|s| s.value[0])
            .or_else(|| {
                self.implicit
                    .iter()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| *v)
            })
    }
}

/// What a handler is told about.
#[derive(Debug, Clone, Copy)]
pub enum Update<'a> {
    /// A sensor whose update count changed since the previous fetch.
    Sensor(&'a SensorReading),
    /// A new event record.
    Event(&'a EventRecord),
}

type Handler = Box<dyn FnMut(&Update<'_>) + Send>;

/// A monitor's handle on one box.
pub struct MonitorBox {
    sb: SharedBox,
    implicit: Vec<ImplicitSource>,
    handlers: Vec<Handler>,
    seen: HashMap<SensorHandle, u64>,
    next_event: u64,
}

impl MonitorBox {
    /// `sbdiscover(name)`: finds the box among those exported in `dir`.
    pub fn discover(dir: &Path, name: &str) -> Result<MonitorBox, OrionError> {
        Ok(MonitorBox::from_shared(open_exported(dir, name)?))
    }

    /// Monitors an already mapped box.
    pub fn from_shared(sb: SharedBox) -> MonitorBox {
        MonitorBox {
            sb,
            implicit: Vec::new(),
            handlers: Vec::new(),
            seen: HashMap::new(),
            next_event: 0,
        }
    }

    /// A monitor with implicit sensors only (no target box): a box of its own, never
    /// exported, so views have the same shape.
    pub fn implicit_only(name: &str) -> Result<MonitorBox, OrionError> {
        let params = crate::shm::SbParams {
            sensors: 1,
            log_records: 1,
            period_us: 25_000,
        };
        Ok(MonitorBox::from_shared(SharedBox::create(name, params)?))
    }

    /// Adds an implicit sensor source, read at each fetch.
    pub fn add_implicit(&mut self, src: ImplicitSource) {
        self.implicit.push(src);
    }

    /// `sbassociate`: a handler called (during `fetch`) for each update seen.
    pub fn associate(&mut self, handler: impl FnMut(&Update<'_>) + Send + 'static) {
        self.handlers.push(Box::new(handler));
    }

    /// The box's parameters and counters.
    pub fn info(&self) -> BoxInfo {
        self.sb.info()
    }

    /// `sbfetch`: copies the box and reads the implicit sensors into a view.
    pub fn fetch(&mut self) -> View {
        let at_ns = now_ns();
        let sensors = self.sb.read_sensors();
        let events = self.sb.read_log();
        let mut implicit = Vec::new();
        let mut errors = Vec::new();
        for src in &self.implicit {
            match src.read() {
                Ok(v) => implicit.extend(v),
                Err(e) => errors.push(e.to_string()),
            }
        }
        for s in &sensors {
            let before = self.seen.insert(s.handle, s.updates);
            if before != Some(s.updates) {
                for h in &mut self.handlers {
                    h(&Update::Sensor(s));
                }
            }
        }
        for e in events.iter().filter(|e| e.pos >= self.next_event) {
            for h in &mut self.handlers {
                h(&Update::Event(e));
            }
        }
        if let Some(last) = events.last() {
            self.next_event = last.pos + 1;
        }
        View {
            at_ns,
            info: self.sb.info(),
            sensors,
            events,
            implicit,
            errors,
        }
    }

    /// `sbflush`: frees the log records the view holds.
    pub fn flush(&mut self, view: &View) {
        if let Some(last) = view.events.last() {
            self.sb.flush(last.pos + 1);
        }
    }
}

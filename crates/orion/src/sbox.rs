//! The target's side of a Sensor Box: `sbcreate`, `sbdestroy`, `sbexport`, and
//! `addsensor`/`rmsensor`/`updatesensor` on a box it owns; plus the export directory
//! through which a monitor in another process discovers it.
//!
//! The memory descriptor of `sbexport` is the memfd. Exporting writes
//! `<dir>/<name>.json` naming the owning process and the descriptor number, and a monitor
//! opens `/proc/<pid>/fd/<fd>` (the same memfd, no copy, no help from the target).

use crate::error::OrionError;
use crate::sensor::{SensorSpec, SensorValue};
use crate::shm::{SbParams, SensorHandle, SharedBox};
use rustix::fd::AsRawFd;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// What `sbexport` writes in the export directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportRecord {
    /// The box name.
    pub name: String,
    /// The process holding the memfd.
    pub pid: u32,
    /// Its descriptor number in that process.
    pub fd: i32,
    /// The update period of the slowest sensor, µs (the monitor's refresh period).
    pub period_us: u64,
}

impl ExportRecord {
    /// The export file of box `name` in `dir`.
    pub fn path(dir: &Path, name: &str) -> PathBuf {
        dir.join(format!("{name}.json"))
    }

    /// Reads every export record in `dir` (unreadable or malformed files are skipped
    /// and reported in the second list).
    pub fn list(dir: &Path) -> Result<(Vec<ExportRecord>, Vec<String>), OrionError> {
        let mut out = Vec::new();
        let mut bad = Vec::new();
        let rd = std::fs::read_dir(dir).map_err(|e| OrionError::file(dir, e))?;
        for entry in rd.flatten() {
            let p = entry.path();
            if p.extension().is_none_or(|e| e != "json") {
                continue;
            }
            match std::fs::read_to_string(&p)
                .map_err(|e| e.to_string())
                .and_then(|s| serde_json::from_str::<ExportRecord>(&s).map_err(|e| e.to_string()))
            {
                Ok(r) => out.push(r),
                Err(e) => bad.push(format!("{}: {e}", p.display())),
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok((out, bad))
    }
}

/// A Sensor Box owned by this process.
pub struct SensorBox {
    shared: SharedBox,
    exported: Option<PathBuf>,
}

impl SensorBox {
    /// `sbcreate(name, params)`.
    pub fn create(name: &str, params: SbParams) -> Result<SensorBox, OrionError> {
        Ok(SensorBox {
            shared: SharedBox::create(name, params)?,
            exported: None,
        })
    }

    /// `sbexport`: registers the box's name and descriptor in `dir` (created if needed)
    /// and returns the record a monitor will find. Exporting again moves the record.
    pub fn export(&mut self, dir: &Path) -> Result<ExportRecord, OrionError> {
        std::fs::create_dir_all(dir).map_err(|e| OrionError::file(dir, e))?;
        let info = self.shared.info();
        let rec = ExportRecord {
            name: info.name.clone(),
            pid: std::process::id(),
            fd: self.shared.fd().as_raw_fd(),
            period_us: info.params.period_us,
        };
        let path = ExportRecord::path(dir, &rec.name);
        let tmp = path.with_extension("json.tmp");
        let text = serde_json::to_string(&rec).map_err(|e| OrionError::file(&path, e))?;
        std::fs::write(&tmp, text).map_err(|e| OrionError::file(&tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| OrionError::file(&path, e))?;
        if let Some(old) = self.exported.replace(path.clone())
            && old != path
        {
            let _ = std::fs::remove_file(old);
        }
        Ok(rec)
    }

    /// `addsensor`.
    pub fn add_sensor(&self, spec: &SensorSpec) -> Result<SensorHandle, OrionError> {
        self.shared.add_sensor(spec)
    }

    /// `rmsensor`.
    pub fn remove_sensor(&self, h: SensorHandle) -> Result<(), OrionError> {
        self.shared.remove_sensor(h)
    }

    /// `updatesensor`.
    pub fn update(&self, h: SensorHandle, value: SensorValue) -> Result<(), OrionError> {
        self.shared.update(h, value)
    }

    /// The shared mapping (to read it back, or duplicate the descriptor).
    pub fn shared(&self) -> &SharedBox {
        &self.shared
    }

    /// `sbdestroy`: removes the export record and unmaps; monitors that hold the memfd
    /// keep their mapping until they drop it, and see the sensors stop.
    pub fn destroy(self) {
        drop(self);
    }
}

impl Drop for SensorBox {
    fn drop(&mut self) {
        if let Some(p) = self.exported.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

//! The remote OS lock on Linux: `cgroup.freeze` on the suspect's cgroup v2 subtree,
//! held until `cgroup.events` reports `frozen 1` (every task stopped: the analogue of
//! the seed's drain of threads in the kernel), with a timeout, and released by a thaw —
//! on a false positive, after a repair, or when the guard is dropped.

use crate::error::OrionError;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn write(path: &Path, v: &str) -> Result<(), OrionError> {
    std::fs::write(path, v).map_err(|e| OrionError::file(path, e))
}

/// Whether `dir` is a cgroup v2 directory that can be frozen; the error says why not.
pub fn probe(dir: &Path) -> Result<(), OrionError> {
    for f in ["cgroup.freeze", "cgroup.events", "cgroup.procs"] {
        let p = dir.join(f);
        if !p.exists() {
            return Err(OrionError::file(
                p,
                "missing: not a cgroup v2 directory with the freezer (Linux 5.2+)",
            ));
        }
    }
    Ok(())
}

/// Whether `cgroup.events` says the cgroup is frozen.
pub fn is_frozen(dir: &Path) -> Result<bool, OrionError> {
    let p = dir.join("cgroup.events");
    let t = std::fs::read_to_string(&p).map_err(|e| OrionError::file(&p, e))?;
    Ok(t.lines().any(|l| l.trim() == "frozen 1"))
}

/// A held lock; thawed when dropped.
#[derive(Debug)]
pub struct Frozen {
    dir: PathBuf,
    took: Duration,
    held: bool,
}

impl Frozen {
    /// Freezes `dir` and waits up to `timeout` for every task to stop; on timeout it
    /// thaws again and says so.
    pub fn take(dir: &Path, timeout: Duration) -> Result<Frozen, OrionError> {
        probe(dir)?;
        let start = Instant::now();
        write(&dir.join("cgroup.freeze"), "1")?;
        let mut guard = Frozen {
            dir: dir.to_owned(),
            took: Duration::ZERO,
            held: true,
        };
        loop {
            if is_frozen(dir)? {
                guard.took = start.elapsed();
                return Ok(guard);
            }
            if start.elapsed() >= timeout {
                guard.release()?;
                return Err(OrionError::FreezeTimeout {
                    cgroup: dir.to_owned(),
                    timeout_ms: timeout.as_millis() as u64,
                });
            }
            std::thread::sleep(Duration::from_micros(500));
        }
    }

    /// How long the freeze took to settle.
    pub fn took(&self) -> Duration {
        self.took
    }

    /// The frozen cgroup.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Thaws (a false positive, or the repair is done).
    pub fn release(&mut self) -> Result<(), OrionError> {
        if self.held {
            self.held = false;
            write(&self.dir.join("cgroup.freeze"), "0")?;
        }
        Ok(())
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = self.release();
    }
}

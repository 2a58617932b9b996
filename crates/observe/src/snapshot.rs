//! One picture of the daemon for observers: every app with its offcodes and
//! channels, the PE table with what apps hold and how busy each core was, and
//! the event counts. The hub takes one a second and hands the same picture to
//! the metrics endpoint and to every dashboard, so the cost of looking does
//! not grow with the number of lookers.

use std::collections::BTreeMap;

use serde::Serialize;
use sidecore_control::Daemon;
use sidecore_types::AppStatus;

/// One PE as the dashboard's table and the metrics show it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PeRow {
    pub id: String,
    pub kind: String,
    /// Its CPU capacity (cores' worth).
    pub cpu: f64,
    /// The CPU share running apps hold on it (0..=cpu).
    pub allocated: f64,
    /// Busy share of the last sampling interval, for PEs that are one CPU
    /// (`core:N`), from /proc/stat.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub busy: Option<f64>,
    pub detail: String,
}

/// Events seen since the daemon started, by kind and by (app, offcode).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct EventCounts {
    /// Kind (`started`, `watchdog-expired`, ...) → count.
    pub by_kind: BTreeMap<String, u64>,
    /// (app, offcode) → watchdog expiries.
    pub overruns: BTreeMap<(String, String), u64>,
    /// Wasm offcodes that were initialized (admitted by the verifier).
    pub wasm_admitted: u64,
    /// Wasm offcodes stopped by a failure (a violation unloads the module).
    pub wasm_unloaded: u64,
    /// (app, offcode) placed on the Wasm PE.
    #[serde(skip)]
    pub wasm_offcodes: std::collections::BTreeSet<(String, String)>,
}

/// The picture.
#[derive(Debug, Clone, Serialize)]
pub struct Snapshot {
    /// Milliseconds since the hub started.
    pub at_ms: u64,
    pub apps: Vec<AppStatus>,
    pub pes: Vec<PeRow>,
    /// The services scraped beside the daemon.
    pub services: Vec<crate::services::ServiceView>,
    #[serde(skip)]
    pub events: EventCounts,
}

/// Per-CPU (busy, total) jiffies from /proc/stat, for the busy share between
/// two samples.
#[derive(Debug, Clone, Default)]
pub struct CpuSampler {
    last: BTreeMap<u32, (u64, u64)>,
    busy: BTreeMap<u32, f64>,
}

impl CpuSampler {
    /// Reads /proc/stat and updates each CPU's busy share since the last call.
    /// A machine without /proc/stat keeps no shares (the column stays empty).
    pub fn sample(&mut self) {
        let Ok(text) = std::fs::read_to_string("/proc/stat") else {
            return;
        };
        for (cpu, busy, total) in parse_proc_stat(&text) {
            if let Some((b0, t0)) = self.last.insert(cpu, (busy, total)) {
                let dt = total.saturating_sub(t0);
                if dt > 0 {
                    let share = busy.saturating_sub(b0) as f64 / dt as f64;
                    self.busy.insert(cpu, share.clamp(0.0, 1.0));
                }
            }
        }
    }

    /// The busy share of CPU `cpu` over the last interval.
    pub fn busy(&self, cpu: u32) -> Option<f64> {
        self.busy.get(&cpu).copied()
    }
}

/// (cpu, busy jiffies, total jiffies) for each `cpuN` line; idle and iowait
/// are the idle part, the rest busy.
pub fn parse_proc_stat(text: &str) -> Vec<(u32, u64, u64)> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let cpu: u32 = f.next()?.strip_prefix("cpu")?.parse().ok()?;
            let v: Vec<u64> = f.take(8).filter_map(|x| x.parse().ok()).collect();
            if v.len() < 5 {
                return None;
            }
            let total: u64 = v.iter().sum();
            let idle = v[3] + v[4];
            Some((cpu, total - idle, total))
        })
        .collect()
}

/// Takes the picture from a daemon.
pub fn take(d: &Daemon, cpus: &CpuSampler, events: EventCounts, at_ms: u64) -> Snapshot {
    let held = d.held_cpu();
    let pes = d
        .inventory()
        .pes
        .into_iter()
        .map(|p| {
            let busy =
                p.id.strip_prefix("core:")
                    .and_then(|n| n.parse().ok())
                    .and_then(|n| cpus.busy(n));
            PeRow {
                allocated: held.get(&p.id).copied().unwrap_or(0.0).min(p.capacity.cpu),
                id: p.id,
                kind: p.kind.keyword().to_string(),
                cpu: p.capacity.cpu,
                busy,
                detail: p.detail,
            }
        })
        .collect();
    Snapshot {
        at_ms,
        apps: d.ps(),
        pes,
        services: Vec::new(),
        events,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_lines_give_busy_and_total() {
        let text = "cpu  10 0 10 70 10 0 0 0 0 0\n\
                    cpu0 5 0 5 30 10 0 0 0 0 0\n\
                    cpu1 5 0 5 40 0 0 0 0\n\
                    intr 1 2 3\n\
                    cpuX 1 2 3 4 5\n";
        assert_eq!(parse_proc_stat(text), vec![(0, 10, 50), (1, 10, 50)]);
    }

    #[test]
    fn sampler_reports_share_between_samples_only() {
        let mut s = CpuSampler::default();
        assert_eq!(s.busy(0), None);
        s.sample();
        s.sample();
        // Two reads of the real file: every CPU present has a share in [0, 1]
        // or no share yet if no jiffy passed between the reads.
        for (cpu, _, _) in parse_proc_stat(&std::fs::read_to_string("/proc/stat").unwrap()) {
            if let Some(b) = s.busy(cpu) {
                assert!((0.0..=1.0).contains(&b));
            }
        }
    }
}

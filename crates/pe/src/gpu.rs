//! GPUs, when present: DRM cards in sysfs (vendor and device IDs) and the
//! NVIDIA driver's proc entries. sidecore does not run offcodes on GPUs yet; it
//! reports them so layouts can name them.

use std::path::Path;

/// A GPU found on this machine.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuInfo {
    pub index: u32,
    pub vendor: String,
    pub device: String,
    pub memory_bytes: Option<u64>,
}

impl GpuInfo {
    pub fn describe(&self) -> String {
        format!("{} GPU (device {})", self.vendor, self.device)
    }
}

fn vendor_name(id: &str) -> String {
    match id.trim() {
        "0x10de" => "nvidia".into(),
        "0x1002" => "amd".into(),
        "0x8086" => "intel".into(),
        other => other.to_string(),
    }
}

/// Lists GPUs.
pub fn probe() -> Vec<GpuInfo> {
    probe_in(Path::new("/sys/class/drm"))
}

/// Lists GPUs under a sysfs DRM directory (a parameter for tests).
pub fn probe_in(drm: &Path) -> Vec<GpuInfo> {
    let Ok(entries) = std::fs::read_dir(drm) else {
        return Vec::new();
    };
    let mut cards: Vec<(u32, std::path::PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let idx = name.strip_prefix("card")?.parse::<u32>().ok()?;
            Some((idx, e.path()))
        })
        .collect();
    cards.sort();
    cards
        .into_iter()
        .filter_map(|(index, path)| {
            let vendor = std::fs::read_to_string(path.join("device/vendor")).ok()?;
            let device = std::fs::read_to_string(path.join("device/device")).unwrap_or_default();
            let memory = std::fs::read_to_string(path.join("device/mem_info_vram_total"))
                .ok()
                .and_then(|s| s.trim().parse().ok());
            Some(GpuInfo {
                index,
                vendor: vendor_name(&vendor),
                device: device.trim().to_string(),
                memory_bytes: memory,
            })
        })
        .collect()
}

/// Why no GPU was found.
pub fn absent_reason() -> String {
    let drm = Path::new("/sys/class/drm").exists();
    let nv = Path::new("/proc/driver/nvidia/gpus").exists();
    match (drm, nv) {
        (false, false) => {
            "no GPU: no DRM devices in /sys/class/drm and no NVIDIA driver loaded".into()
        }
        (true, false) => "no GPU: /sys/class/drm lists no cards with a PCI vendor".into(),
        _ => "no GPU usable: the NVIDIA driver is loaded but no card was found in /sys/class/drm"
            .into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_cards_from_a_sysfs_tree() {
        let d = tempfile::tempdir().unwrap();
        let c = d.path().join("card1/device");
        std::fs::create_dir_all(&c).unwrap();
        std::fs::write(c.join("vendor"), "0x10de\n").unwrap();
        std::fs::write(c.join("device"), "0x2204\n").unwrap();
        std::fs::create_dir_all(d.path().join("card1-HDMI-A-1")).unwrap();
        let g = probe_in(d.path());
        assert_eq!(g.len(), 1);
        assert_eq!(
            (g[0].index, g[0].vendor.as_str(), g[0].device.as_str()),
            (1, "nvidia", "0x2204")
        );
    }

    #[test]
    fn absence_has_a_reason() {
        if probe().is_empty() {
            assert!(absent_reason().starts_with("no GPU"));
        }
    }
}

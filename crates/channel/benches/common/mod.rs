//! Helpers shared by the channel benchmarks: pinning a thread to a CPU and
//! reading a numeric setting from the environment. Each benchmark uses what it
//! needs of them.
#![allow(dead_code)]

/// The CPUs this process may use, read once before any thread is pinned
/// (a pinned thread's affinity would hide the others from its children).
pub static CPUS: std::sync::OnceLock<Vec<core_affinity::CoreId>> = std::sync::OnceLock::new();

/// Pins the calling thread to the `core`-th allowed CPU.
pub fn pin(core: usize) {
    let ids = CPUS.get_or_init(|| core_affinity::get_core_ids().unwrap_or_default());
    if let Some(id) = ids.get(core % ids.len().max(1)) {
        core_affinity::set_for_current(*id);
    }
}

/// `name` from the environment as a number, else `default`.
pub fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

//! Orion (Bohra 2008, chapter 3) on Linux: monitoring and repair that do not depend on
//! the sick host's own CPUs.
//!
//! - **Sensor Box** ([`shm`], [`sbox`], [`client`], [`monitor`]): the seed's ten calls.
//!   At the target, `sbcreate`/`sbdestroy`/`sbexport` ([`sbox::SensorBox`]) and
//!   `addsensor`/`rmsensor`/`updatesensor` (also through [`client::Publisher`] from other
//!   processes); at the monitor, `sbdiscover`/`sbassociate`/`sbfetch`/`sbflush`
//!   ([`monitor::MonitorBox`]). The box is a sealed memfd: a header, sensor slots behind
//!   seqlocks, and an append-only event log. The memory descriptor is the memfd itself,
//!   found through an export directory ([`sbox::ExportRecord`]).
//! - **Implicit sensors** ([`implicit`]), read at fetch time without the target's help:
//!   `/proc/stat` (ctxt, intr, processes), `/proc/vmstat`, a cgroup's `cpu.stat` and
//!   `pids.current`.
//! - **Summaries** ([`aggregate`]): rates, means and a Count-Min sketch.
//! - **Failure detection** ([`detect`], sans-IO): counter-slope liveness with a refresh
//!   period and k-refresh hysteresis, and a monitoring ring where each node watches its
//!   k+1 successors.
//! - **Across nodes** ([`node_sensors`], [`ring`], [`health`], [`offcode`]): a node's
//!   daemon serves views of its heartbeat and host counters over the node protocol;
//!   the `orion-monitor` offcode (on a dedicated core, or any PE) watches its `k + 1`
//!   ring successors through them and posts what it declares on the process's health
//!   board, where the daemon hears it and has its runtime re-place the dead node's
//!   offcodes.
//! - **Dedicated cores** ([`core_sensors`], [`core_watch`], [`core_monitor`]): each
//!   executor pinned to a core ticks an explicit sensor and marks when it is inside an
//!   offcode; a monitor thread judges every core by those ticks and the threads'
//!   `schedstat` (counter-slope, k refreshes), tells a starved or offline core from an
//!   offcode stuck in one long turn (the watchdog's case), and declares `core:N` dead
//!   or recovered on the health board, like a dead node.
//! - **Remote OS lock** ([`lock`]): `cgroup.freeze` on the suspect subtree, with a
//!   timeout, released on false positives.
//! - **Repair** ([`tree`], [`procscan`], [`policy`], [`repair`], [`actions`]): the shadow
//!   process tree, fork-bomb thresholds (count, depth, per-level breadth, creation rate),
//!   memory-hog ranking by RSS minus a whitelist with the victim scope a setting (E10),
//!   and the freeze → walk → kill → thaw executor that logs every action with its
//!   evidence.

pub mod actions;
pub mod aggregate;
pub mod client;
pub mod core_monitor;
pub mod core_sensors;
pub mod core_watch;
pub mod detect;
pub mod error;
pub mod health;
pub mod implicit;
pub mod lock;
pub mod monitor;
pub mod node_sensors;
pub mod offcode;
pub mod policy;
pub mod procscan;
pub mod repair;
pub mod ring;
pub mod sbox;
pub mod sensor;
pub mod shm;
pub mod tree;

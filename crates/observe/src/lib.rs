//! What operators look at, served by the daemon over HTTP (loopback only
//! unless told otherwise):
//!
//! * [`metrics`] — `/metrics` in the Prometheus text format, built with the
//!   `prometheus-client` crate from one [`snapshot::Snapshot`] of the daemon;
//! * [`http`] — the server: the metrics, the dashboard (TypeScript, bundled by
//!   esbuild into the binary, [`dashboard`]) and its JSON and live event
//!   stream;
//! * [`hub`] — the one picture a second and the event stream every
//!   observer shares, so the data path pays the same however many look;
//! * [`exporters`] — `/metrics` for the services that run as their own
//!   commands (FileWall, TCPServers, Sikker's agent, Orion's watch);
//! * [`services`] — the daemon's scrapes of those services, and
//!   [`capability`] — the dashboard's panel for each, and the families the
//!   daemon relays.

pub mod capability;
pub mod dashboard;
pub mod exporters;
pub mod http;
pub mod hub;
pub mod metrics;
pub mod services;
pub mod snapshot;

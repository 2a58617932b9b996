//! FileWall as a native offcode (`impl = "filewall"`): the manifest's `params` are
//! a [`Settings`]; `initialize` binds the listeners (inside `netns` if given) and
//! builds the chain, and every `poll` turns the event loop once without waiting,
//! so FileWall runs to completion on whatever PE the layout chose — a dedicated
//! core, the host, or a peer node's core (Fig. 4.10's placements: the client's
//! machine, the server's, or a node of its own; which one is where `sidecore up`
//! or the peer daemon runs, and `netns` for namespaces on one machine). Metrics:
//! `records` (replies sent), `calls`, `refused`, `denied` (by policies),
//! `server_errors`, `timeouts`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sidecore_offcode::{
    Implementation, InitCx, Interfaces, Metric, Offcode, OffcodeError, Progress, Registry, RunCx,
    parse_params,
};
use sidecore_types::PeKind;

use crate::control_socket::ControlServer;
use crate::engine::Engine;
use crate::settings::Settings;

/// How often the offcode copies the proxy's counters into its metrics.
const METRICS_EVERY: Duration = Duration::from_millis(100);
const NAMES: [&str; 6] = [
    "records",
    "calls",
    "refused",
    "denied",
    "server_errors",
    "timeouts",
];

/// The `filewall` offcode.
pub struct FilewallOffcode {
    settings: Settings,
    engine: Option<Engine>,
    control: Option<ControlServer>,
    metrics: Vec<Metric>,
    updated: Option<Instant>,
}

impl FilewallOffcode {
    /// Checks the parameters and the files they name (chain, key).
    pub fn new(params: &toml::Table) -> Result<Self, OffcodeError> {
        let settings: Settings = parse_params(params)?;
        settings
            .config()
            .map_err(|e| OffcodeError::Params(e.to_string()))?;
        Ok(Self {
            settings,
            engine: None,
            control: None,
            metrics: Vec::new(),
            updated: None,
        })
    }

    fn update_metrics(&mut self) {
        let Some(e) = &self.engine else { return };
        let s = e.stats_handle().stats();
        let p = &s.policies;
        let denied = p.bad_handles + p.temporal_denied + p.rbac.denied;
        let values = [
            s.ops.values().map(|o| o.replies).sum(),
            s.ops.values().map(|o| o.calls).sum(),
            s.refused_calls,
            denied,
            s.server_errors,
            s.timeouts,
        ];
        for (m, v) in self.metrics.iter().zip(values) {
            m.set(v);
        }
    }
}

impl Offcode for FilewallOffcode {
    fn initialize(&mut self, cx: &mut InitCx<'_>) -> Result<(), OffcodeError> {
        self.metrics = NAMES.iter().map(|n| cx.metric(n)).collect();
        let config = self
            .settings
            .config()
            .map_err(|e| OffcodeError::Params(e.to_string()))?;
        let engine =
            sidecore_testbed::within(self.settings.netns.as_deref(), || Engine::new(config))
                .map_err(|e| OffcodeError::failed(format!("entering the namespace: {e}")))?
                .map_err(|e| OffcodeError::failed(format!("starting FileWall: {e}")))?;
        if let Some(path) = &self.settings.control {
            let c = ControlServer::start(path, vec![("filewall".into(), engine.stats_handle())])
                .map_err(|e| OffcodeError::failed(e.to_string()))?;
            self.control = Some(c);
        }
        self.engine = Some(engine);
        Ok(())
    }

    fn poll(&mut self, _cx: &mut RunCx<'_>) -> Result<Progress, OffcodeError> {
        let Some(e) = &mut self.engine else {
            return Ok(Progress::Idle);
        };
        let busy = e
            .turn(Duration::ZERO)
            .map_err(|e| OffcodeError::failed(format!("FileWall's event loop: {e}")))?;
        if self.updated.is_none_or(|t| t.elapsed() >= METRICS_EVERY) {
            self.updated = Some(Instant::now());
            self.update_metrics();
        }
        Ok(if busy { Progress::Busy } else { Progress::Idle })
    }

    fn stop(&mut self, _cx: &mut RunCx<'_>) -> Result<(), OffcodeError> {
        self.update_metrics();
        self.control = None;
        self.engine = None;
        Ok(())
    }
}

/// Adds `filewall` to the offcode library.
pub fn register(reg: &mut Registry) {
    reg.register(Implementation {
        name: "filewall".into(),
        description: "FileWall: the NFS policy middlebox (a policy chain over NFSv3, MOUNT and the portmapper, TCP and UDP) run to completion on a dedicated core".into(),
        kinds: vec![PeKind::Core, PeKind::Host],
        inputs: Some(vec![]),
        outputs: Some(vec![]),
        factory: Arc::new(|s| Ok(Box::new(FilewallOffcode::new(s.params)?))),
        validate: Some(Arc::new(|p| FilewallOffcode::new(p).map(drop))),
        interfaces: Interfaces::default(),
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_checked_before_deploying() {
        let ok: toml::Table = toml::from_str(
            "nfs_listen = \"127.0.0.1:0\"\nmount_listen = \"127.0.0.1:0\"\nservers = [\"127.0.0.1:2049\"]\n",
        )
        .unwrap();
        assert!(FilewallOffcode::new(&ok).is_ok());
        let mut reg = Registry::new();
        register(&mut reg);
        let imp = reg.lookup("filewall", PeKind::Core).unwrap();
        assert!(imp.runs_on(PeKind::Node), "a peer runs it on its cores");
        let bad: toml::Table =
            toml::from_str("nfs_listen = \"127.0.0.1:0\"\nmount_listen = \"x\"\nservers = []\n")
                .unwrap();
        let e = (imp.validate.as_ref().unwrap())(&bad)
            .unwrap_err()
            .to_string();
        assert!(e.contains("mount_listen") || e.contains("invalid"), "{e}");
        let unknown: toml::Table = toml::from_str(
            "nfs_listen = \"127.0.0.1:0\"\nmount_listen = \"127.0.0.1:0\"\nservers = [\"127.0.0.1:1\"]\ncolour = 1\n",
        )
        .unwrap();
        assert!(
            FilewallOffcode::new(&unknown)
                .err()
                .unwrap()
                .to_string()
                .contains("colour")
        );
    }
}

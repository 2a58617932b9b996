//! Live placement updates (issue 15): a new placement — which processes run
//! on which host, and where each host's agent listens — replaces the running
//! one while the agent serves. The new placement is compiled with the policy
//! in force into a scratch Network OS first, so a refused one (this host left
//! out, a process the policy does not define) changes nothing and the last
//! good placement stays in force. Attached connections whose identity is no
//! longer placed here end; messages route to each process's new host from
//! then on; the I/O layer learns that the peers changed
//! ([`AgentCore::take_peers_changed`]) and dials the new addresses.
//!
//! The tables are compiled whole: one-time permissions outstanding when the
//! placement changes are dropped (their holders are told the key is unknown).
//! A new policy may come with the placement, installed in the same step
//! ([`AgentCore::update_policy_and_placement`]) when neither can be applied
//! alone against the other one in force.

use std::net::SocketAddr;

use sidecore_sikker_policy::Placement;

use super::*;

impl AgentCore {
    /// Where the other hosts' agents listen, as the placement says.
    pub fn agents(&self) -> &BTreeMap<String, SocketAddr> {
        &self.agents
    }

    /// Sets where the hosts' agents listen (the placement the agent started with).
    pub fn set_agents(&mut self, agents: BTreeMap<String, SocketAddr>) {
        self.agents = agents;
    }

    /// Whether the hosts of the placement or their agents' addresses changed
    /// since this was last asked (the links then follow [`AgentCore::peer_hosts`]
    /// and [`AgentCore::agents`]).
    pub fn take_peers_changed(&mut self) -> bool {
        std::mem::take(&mut self.peers_changed)
    }

    /// Applies placement `p` (parsed against the policy in force). On an
    /// error nothing changes; the refusal is counted and logged.
    pub fn update_placement(&mut self, p: &Placement) -> Result<PlacementDelta, PlacementRefused> {
        self.install(None, p)
    }

    /// Applies a new policy and placement `p` (parsed against `policy`)
    /// together: the pair an operator writes when each is refused alone
    /// against the other one in force (a policy that drops a service the old
    /// placement still places, a placement that names a service only the new
    /// policy defines). Compiled whole into scratch tables first; on an error
    /// nothing changes, and the refusal is counted and logged.
    pub fn update_policy_and_placement(
        &mut self,
        policy: sidecore_sikker_policy::Policy,
        p: &Placement,
    ) -> Result<PlacementDelta, PlacementRefused> {
        self.install(Some(policy), p)
    }

    /// Installs placement `p` with `policy` (`None`: the one in force).
    fn install(
        &mut self,
        policy: Option<sidecore_sikker_policy::Policy>,
        p: &Placement,
    ) -> Result<PlacementDelta, PlacementRefused> {
        let with_policy = policy.is_some();
        let policy = policy.unwrap_or_else(|| self.nos.policy().clone());
        let r = self.compile_placement(policy, with_policy, p);
        let (nos, rate) = match r {
            Ok(x) => x,
            Err(e) => {
                self.placement_refused(&e.to_string());
                return Err(e);
            }
        };
        let mut d = PlacementDelta::default();
        for s in nos.policy().services.values() {
            for &proc in s.processes.keys() {
                let (now, was) = (nos.locate(s.id, proc), self.nos.locate(s.id, proc));
                if now.map(|l| l.0) != was.map(|l| l.0) {
                    d.moved += 1;
                }
            }
        }
        let (old_hosts, new_hosts) = (self.nos.host_names(), nos.host_names());
        d.peers_changed = new_hosts
            .iter()
            .chain(&old_hosts)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .filter(|h| {
                old_hosts.contains(h) != new_hosts.contains(h)
                    || self.agents.get(*h) != p.agents.get(*h)
            })
            .count();
        let policy = self.nos.policy().clone();
        self.nos = nos;
        if let Some(rc) = rate {
            self.rate = rc;
        }
        self.reattach(&policy);
        self.agents = p.agents.clone();
        self.peers_changed |= d.peers_changed > 0;
        self.counters.placement_updates += 1;
        if with_policy {
            self.counters.policy_updates += 1;
        }
        Ok(d)
    }

    /// The tables for `policy` (`new_policy`: not the one in force) and `p`,
    /// and new rate control if what it is built from changed.
    fn compile_placement(
        &self,
        policy: sidecore_sikker_policy::Policy,
        new_policy: bool,
        p: &Placement,
    ) -> Result<(Nos, Option<RateControl>), PlacementRefused> {
        if !p.hosts.iter().any(|(h, _)| *h == self.host) {
            return Err(PlacementRefused::NotHere {
                host: self.host.clone(),
                known: p
                    .hosts
                    .iter()
                    .map(|h| h.0.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        // A new policy is checked as `update_policy` would; the one in force
        // was checked when it was installed.
        if new_policy {
            Nos::check_policy(&policy)?;
        }
        let nos = Nos::compile(policy, p)?;
        if rate_shape(&nos) == rate_shape(&self.nos) {
            return Ok((nos, None));
        }
        let mut rc = RateControl::new(&nos, &self.host, 0.0).map_err(PlacementRefused::Rates)?;
        let alive = self
            .linked
            .iter()
            .filter(|h| nos.tables(h).is_some())
            .cloned()
            .collect();
        rc.set_view(alive, 0.0);
        Ok((nos, Some(rc)))
    }

    /// Counts and logs a refused placement (from [`AgentCore::update_placement`],
    /// or a placement text the I/O layer could not parse).
    pub fn placement_refused(&mut self, why: &str) {
        self.counters.placement_refused += 1;
        eprintln!(
            "sikker agent {}: placement update refused, the last good placement stays in force: {why}",
            self.host
        );
    }
}

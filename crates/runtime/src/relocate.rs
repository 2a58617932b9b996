//! HYDRA's reaction to a dead PE inside one running app: only the offcodes that
//! ran on the dead PE move. Given the app's layout solved again without that
//! PE ([`Runtime::relocate`]), the moved offcodes are built afresh on their new
//! PEs (here, or handed to a peer node as a part of their own), their channels
//! are connected again, and the offcodes they talked to are *rewired* in place
//! ([`Command::Rewire`]): their executors swap the dead channel ends for the
//! new ones between two turns, so they keep their state, counters and
//! out-of-band endpoint, and nothing else in the app stops. Every neighbour's
//! inputs are swapped first, then the old instances are told to stop (on a
//! dead PE they have already failed), then the outputs. The dead PE's own
//! resources (its executor, or the lease of the peer's part) are released in
//! the background.
//!
//! Moving only those offcodes is refused, with the reason, when the new layout
//! also moves an offcode that lived; when an offcode joined to a moved one
//! has already ended or runs on a peer node (that peer would have to rewire
//! it); or when calls join them. The daemon then restarts the whole app. A
//! stream to a peer that was killed, or whose part the origin gave up, is
//! *lost* rather than closed (`sidecore_channel::stream`): for its grace period
//! the offcode at this end waits instead of ending, which is the time a
//! monitor has to declare the peer dead and this to rewire it.

use std::collections::BTreeMap;
use std::sync::Arc;

use sidecore_offcode::{Inlet, Offcode, Outlet};
use sidecore_types::{AppId, AppState, PeKind};

use crate::app::ChannelEntry;
use crate::error::DeployError;
use crate::executor::{Command, ExecutorState, Rewiring};
use crate::handle::OffcodeHandle;
use crate::node::origin;
use crate::plan::{Plan, PlannedChannel, PlannedOffcode};
use crate::restart::{RestartTracker, Restarter};
use crate::runtime::Runtime;
use crate::start::{self, Env, Exec};
use crate::tree::{ResourceId, ResourceKind};

/// Why only the dead PE's offcodes could not be moved.
#[derive(Debug, thiserror::Error)]
pub enum RelocateError {
    /// Moving them alone is not possible: the app must restart whole.
    #[error("{0}")]
    NotAlone(String),
    /// Deploying the moved offcodes failed; nothing of it is left running.
    #[error(transparent)]
    Deploy(#[from] DeployError),
}

/// What one running app looks like to a relocation, read under the apps lock.
struct Snapshot {
    root: ResourceId,
    /// Plan indices of the offcodes on the dead PE, and their handles.
    moved: Vec<usize>,
    old: Vec<Arc<OffcodeHandle>>,
    /// Plan indices of the offcodes that lived and share a channel with a moved one.
    neighbours: Vec<usize>,
    /// Each neighbour's executor.
    txs: BTreeMap<usize, crossbeam_channel::Sender<Command>>,
    /// Executors of the app that live, by name, with a sender to each.
    execs: BTreeMap<String, (crossbeam_channel::Sender<Command>, Arc<ExecutorState>)>,
}

impl Runtime {
    /// Moves the offcodes of app `id` that ran on `dead` to where `plan` (the
    /// app's layout solved without `dead`) puts them, and rewires the offcodes
    /// they talked to; every other offcode runs on untouched. Returns the moves
    /// as (offcode, new PE). A refusal ([`RelocateError::NotAlone`]) changes
    /// nothing; after a failed deployment ([`RelocateError::Deploy`]) the moved
    /// offcodes' new parts are gone and their out-of-band names were taken
    /// back, so the caller restarts the app.
    pub fn relocate(
        self: &Arc<Self>,
        id: AppId,
        dead: &str,
        plan: &Plan,
    ) -> Result<Vec<(String, String)>, RelocateError> {
        let snap = self.snapshot(id, dead, plan)?;
        let sub = sub_plan(plan, &snap);
        let env = self.env();
        // A moved offcode that ran here still holds its out-of-band name on the
        // dead PE's executor, which may never run again to let it go.
        for &m in &snap.moved {
            env.oob
                .evict(&format!("{}/{}", plan.app, plan.offcodes[m].name));
        }
        let label = format!("re-placement without {dead}");
        let node = env
            .tree
            .add(Some(snap.root), ResourceKind::Other, label, || {});
        let placed = place_moved(&env, &sub, &snap, node).inspect_err(|_| {
            env.tree.teardown(node);
        })?;
        self.adopt(id, dead, plan, &snap, placed);
        self.release_dead(snap.root, dead);
        Ok(snap
            .moved
            .iter()
            .map(|&m| (plan.offcodes[m].name.clone(), plan.offcodes[m].pe.clone()))
            .collect())
    }

    /// Reads what a relocation needs of the app and checks that the dead PE's
    /// offcodes can move alone.
    fn snapshot(&self, id: AppId, dead: &str, plan: &Plan) -> Result<Snapshot, RelocateError> {
        let apps = self.apps();
        let not_alone = |why: String| Err(RelocateError::NotAlone(why));
        let Some(a) = apps.iter().find(|a| a.id == id) else {
            return not_alone(format!("app {id} is gone"));
        };
        if a.state != AppState::Running {
            return not_alone("every offcode of it has already ended".into());
        }
        let same_shape = plan.app == a.name
            && plan.offcodes.len() == a.handles.len()
            && plan
                .offcodes
                .iter()
                .zip(&a.handles)
                .all(|(o, h)| o.name == h.name);
        if !same_shape {
            return not_alone("the new plan is not the running app's".into());
        }
        let moved: Vec<usize> = (0..a.handles.len())
            .filter(|&i| a.handles[i].pe == dead)
            .collect();
        if moved.is_empty() {
            return not_alone(format!("no offcode of it ran on {dead}"));
        }
        if let Some(&m) = moved.iter().find(|&&m| plan.offcodes[m].pe == dead) {
            return not_alone(format!(
                "the new layout keeps `{}` on {dead}",
                plan.offcodes[m].name
            ));
        }
        if let Some((o, h)) = plan
            .offcodes
            .iter()
            .zip(&a.handles)
            .find(|(o, h)| h.pe != dead && o.pe != h.pe)
        {
            return not_alone(format!(
                "the new layout also moves `{}` from {} to {}",
                o.name, h.pe, o.pe
            ));
        }
        let neighbours = neighbours(plan, &moved);
        for &n in &neighbours {
            let (o, h) = (&plan.offcodes[n], &a.handles[n]);
            if o.pe_kind == PeKind::Node {
                return not_alone(format!(
                    "`{}` shares a channel with a moved offcode and runs on {} (that peer \
                     would have to rewire it)",
                    o.name, o.pe
                ));
            }
            if h.exited() {
                return not_alone(format!(
                    "`{}` shares a channel with a moved offcode and has already ended ({})",
                    o.name,
                    h.stop_reason()
                        .unwrap_or_else(|| format!("{:?}", h.state()))
                ));
            }
        }
        if let Some(&c) = moved
            .iter()
            .chain(&neighbours)
            .find(|&&i| !plan.offcodes[i].calls.is_empty())
        {
            return not_alone(format!(
                "`{}` takes part in calls, whose bindings cannot be rewired",
                plan.offcodes[c].name
            ));
        }
        let mut execs = BTreeMap::new();
        for (i, r) in a.restarters.iter().enumerate() {
            let name = start::exec_name(plan, i);
            if let (Some(tx), false) = (&r.tx, moved.contains(&i))
                && let Some(st) = a.executors.iter().find(|e| e.name == name)
            {
                execs.insert(name, (tx.clone(), Arc::clone(st)));
            }
        }
        let txs = neighbours
            .iter()
            .filter_map(|&n| Some((n, a.restarters[n].tx.clone()?)))
            .collect();
        Ok(Snapshot {
            root: a.root,
            old: moved.iter().map(|&m| Arc::clone(&a.handles[m])).collect(),
            moved,
            neighbours,
            txs,
            execs,
        })
    }

    /// Puts the moved offcodes' new handles, executors and channels into the
    /// app's entry.
    fn adopt(&self, id: AppId, dead: &str, plan: &Plan, snap: &Snapshot, placed: Placed) {
        let mut apps = self.apps();
        let Some(a) = apps.iter_mut().find(|a| a.id == id) else {
            return;
        };
        for (&m, h) in snap.moved.iter().zip(placed.handles) {
            a.restarters[m] = Restarter {
                tx: placed.txs.get(&m).cloned(),
                tracker: RestartTracker::new(plan.offcodes[m].restart),
            };
            a.handles[m] = h;
        }
        a.executors.retain(|e| e.name != dead);
        a.executors.extend(placed.executors);
        for entry in placed.channels {
            match a.channels.iter_mut().find(|c| c.name == entry.name) {
                Some(c) => *c = entry,
                None => a.channels.push(entry),
            }
        }
    }

    /// Releases, in the background, what the app still holds on the dead PE.
    /// The lease of a peer's part is torn down (the peer is told to stop, should
    /// it ever run again). An executor of a dead core is abandoned rather than
    /// joined: its offcodes were told to stop already, and every sender to it
    /// is dropped, so it exits if its CPU ever runs it again; its teardown's
    /// taking back of out-of-band names (which the moved offcodes now hold)
    /// never runs.
    fn release_dead(self: &Arc<Self>, root: ResourceId, dead: &str) {
        let exec = format!("executor {dead}");
        let part = format!("part on {dead} ");
        let tree = self.tree();
        // Anywhere under the app: an earlier re-placement put its own under its node.
        let execs = tree.find_under(root, |l| l == exec || l.starts_with(&format!("{exec} (")));
        let parts = tree.find_under(root, |l| l.starts_with(&part));
        if execs.is_empty() && parts.is_empty() {
            return;
        }
        let rt = Arc::clone(self);
        let _ = std::thread::Builder::new()
            .name("sc-release".into())
            .spawn(move || {
                for id in execs {
                    rt.tree().abandon(id);
                }
                for id in parts {
                    rt.tree().teardown(id);
                }
            });
    }
}

/// The offcodes that lived and share a channel with a moved one, in plan order.
fn neighbours(plan: &Plan, moved: &[usize]) -> Vec<usize> {
    let mut out: Vec<usize> = plan
        .channels
        .iter()
        .filter(|ch| touches(ch, moved))
        .flat_map(|ch| std::iter::once(ch.from.0).chain(ch.to.iter().map(|t| t.0)))
        .filter(|i| !moved.contains(i))
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

fn touches(ch: &PlannedChannel, moved: &[usize]) -> bool {
    moved.contains(&ch.from.0) || ch.to.iter().any(|t| moved.contains(&t.0))
}

/// The plan restricted to the moved offcodes, their neighbours and the
/// channels that touch a moved offcode; `index[i]` is offcode `i`'s index in it.
struct Sub {
    plan: Plan,
    index: BTreeMap<usize, usize>,
}

fn sub_plan(plan: &Plan, snap: &Snapshot) -> Sub {
    let mut members: Vec<usize> = snap.moved.iter().chain(&snap.neighbours).copied().collect();
    members.sort_unstable();
    let index: BTreeMap<usize, usize> = members.iter().enumerate().map(|(k, &i)| (i, k)).collect();
    let channels = plan
        .channels
        .iter()
        .filter(|ch| touches(ch, &snap.moved))
        .map(|ch| PlannedChannel {
            from: (index[&ch.from.0], ch.from.1),
            to: ch.to.iter().map(|&(o, p)| (index[&o], p)).collect(),
            ..ch.clone()
        })
        .collect();
    Sub {
        plan: Plan {
            app: plan.app.clone(),
            offcodes: members.iter().map(|&i| plan.offcodes[i].clone()).collect(),
            channels,
            groups: vec![(0..members.len()).collect()],
            layout: plan.layout.clone(),
            nodes: plan.nodes.clone(),
            scheduler: plan.scheduler,
        },
        index,
    }
}

/// What placing the moved offcodes produced, for the app's entry.
struct Placed {
    /// New handles of the moved offcodes, in `moved` order.
    handles: Vec<Arc<OffcodeHandle>>,
    /// The executor of each moved offcode that runs here (plan index).
    txs: BTreeMap<usize, crossbeam_channel::Sender<Command>>,
    executors: Vec<Arc<ExecutorState>>,
    channels: Vec<ChannelEntry>,
}

/// Deploys the moved offcodes under `node` and rewires their neighbours; on
/// error the caller tears `node` down.
fn place_moved(
    env: &Env<'_>,
    sub: &Sub,
    snap: &Snapshot,
    node: ResourceId,
) -> Result<Placed, DeployError> {
    let sp = &sub.plan;
    let here = |k: usize| sp.offcodes[k].pe_kind != PeKind::Node;
    let moved: Vec<usize> = snap.moved.iter().map(|m| sub.index[m]).collect();
    // Only the moved offcodes that run here are built; the neighbours run on.
    let mut instances: Vec<Option<Box<dyn Offcode>>> = sp.offcodes.iter().map(|_| None).collect();
    for &k in moved.iter().filter(|&&k| here(k)) {
        instances[k] = Some(start::build_instance(&sp.offcodes[k])?);
    }
    let delegation = origin::delegate(sp)?;
    let mut ports = start::connect_channels(env, sp, node, delegation.attachments)?;
    let handles = start::handles(sp);
    for part in delegation.parts {
        start::follow_part(env, sp, node, &handles, part);
    }
    // Executors for the moved offcodes that run here: the app's own where one
    // lives on that PE, a new one otherwise.
    let mut execs: BTreeMap<String, Exec> = BTreeMap::new();
    let mut executors = Vec::new();
    for &k in moved.iter().filter(|&&k| here(k)) {
        let name = start::exec_name(sp, k);
        if execs.contains_key(&name) {
            continue;
        }
        let exec = match snap.execs.get(&name) {
            Some((tx, state)) => Exec {
                tx: tx.clone(),
                state: Arc::clone(state),
                node,
            },
            None => {
                let e = start::spawn_executor(env, sp, node, k)?;
                executors.push(Arc::clone(&e.state));
                e
            }
        };
        execs.insert(name, exec);
    }
    start::land_and_start(env, sp, &execs, &handles, instances, &mut ports)?;
    rewire_neighbours(sp, sub, snap, &mut ports)?;
    Ok(Placed {
        handles: moved.iter().map(|&k| Arc::clone(&handles[k])).collect(),
        txs: snap
            .moved
            .iter()
            .filter(|&&m| here(sub.index[&m]))
            .map(|&m| (m, execs[&start::exec_name(sp, sub.index[&m])].tx.clone()))
            .collect(),
        executors,
        channels: std::mem::take(&mut ports.channels),
    })
}

/// Hands each neighbour its new channel ends: every neighbour's inputs first
/// (the old ones are kept unread, so an old instance still sending is not
/// failed), then the old instances are told to stop, then the outputs (which
/// closes the old channels into the old instances).
fn rewire_neighbours(
    sp: &Plan,
    sub: &Sub,
    snap: &Snapshot,
    ports: &mut start::Ports,
) -> Result<(), DeployError> {
    for inputs in [true, false] {
        for &n in &snap.neighbours {
            let k = sub.index[&n];
            let mut w = Rewiring::default();
            if inputs {
                for (p, e) in ports.inlets[k].iter_mut().enumerate() {
                    if !matches!(e, Inlet::Unconnected) {
                        w.inlets.push((p, std::mem::replace(e, Inlet::Unconnected)));
                    }
                }
            } else {
                for (p, e) in ports.outlets[k].iter_mut().enumerate() {
                    if !matches!(e, Outlet::Unconnected(_)) {
                        w.outlets
                            .push((p, std::mem::replace(e, Outlet::Unconnected(0))));
                    }
                }
                w.connected = ports.connected[k].clone();
            }
            rewire(&sp.offcodes[k], snap.txs.get(&n), w)?;
        }
        if inputs {
            for h in snap.old.iter().filter(|h| !h.exited()) {
                h.request_stop(format!("re-placed off {}", h.pe));
            }
        }
    }
    Ok(())
}

/// Sends one neighbour its rewiring and waits for its executor to apply it.
fn rewire(
    o: &PlannedOffcode,
    tx: Option<&crossbeam_channel::Sender<Command>>,
    w: Rewiring,
) -> Result<(), DeployError> {
    let fail = |error: String| DeployError::Offcode {
        offcode: o.name.clone(),
        pe: o.pe.clone(),
        error,
    };
    let tx = tx.ok_or_else(|| fail("it has no executor here to rewire".into()))?;
    start::ask(tx, |r| Command::Rewire(o.name.clone(), Box::new(w), r))
        .map_err(|e| fail(format!("rewiring it: {e}")))
}

//! The resource tree (HYDRA §5.1, Resource Management): every resource a
//! deployment holds — executors (threads, pinned cores), offcodes, channels,
//! kernel objects, sockets — is a node under its owner. Tearing down a node
//! tears down its children first, newest first, then the node itself, so a
//! failing parent never leaves its children behind.

use std::sync::Mutex;

use serde::Serialize;

/// Identifies a node in the tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct ResourceId(usize);

/// What kind of resource a node is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ResourceKind {
    App,
    Executor,
    Offcode,
    Channel,
    KernelObject,
    Socket,
    /// The part of an app that a peer node runs (its lease).
    Remote,
    Other,
}

type Teardown = Box<dyn FnOnce() + Send>;

struct Node {
    parent: Option<usize>,
    kind: ResourceKind,
    label: String,
    teardown: Option<Teardown>,
    alive: bool,
    children: Vec<usize>,
}

/// A tree of live resources.
#[derive(Default)]
pub struct ResourceTree {
    nodes: Mutex<Vec<Node>>,
}

impl ResourceTree {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Node>> {
        self.nodes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Adds a live resource under `parent`; `teardown` releases it.
    pub fn add(
        &self,
        parent: Option<ResourceId>,
        kind: ResourceKind,
        label: impl Into<String>,
        teardown: impl FnOnce() + Send + 'static,
    ) -> ResourceId {
        let mut nodes = self.lock();
        let id = nodes.len();
        nodes.push(Node {
            parent: parent.map(|p| p.0),
            kind,
            label: label.into(),
            teardown: Some(Box::new(teardown)),
            alive: true,
            children: Vec::new(),
        });
        if let Some(p) = parent {
            nodes[p.0].children.push(id);
        }
        ResourceId(id)
    }

    /// Tears down `id` and everything under it: children first (newest
    /// first), then the node. Returns the labels in teardown order.
    pub fn teardown(&self, id: ResourceId) -> Vec<String> {
        let mut order = Vec::new();
        self.teardown_inner(id.0, &mut order);
        order
    }

    fn teardown_inner(&self, id: usize, order: &mut Vec<String>) {
        let children = {
            let nodes = self.lock();
            match nodes.get(id) {
                Some(n) if n.alive => n.children.clone(),
                _ => return,
            }
        };
        for c in children.into_iter().rev() {
            self.teardown_inner(c, order);
        }
        // Take the action out under the lock, run it outside: teardown may
        // block (joining a thread) or touch the tree itself.
        let (action, label) = {
            let mut nodes = self.lock();
            let n = &mut nodes[id];
            if !n.alive {
                return;
            }
            n.alive = false;
            (n.teardown.take(), n.label.clone())
        };
        if let Some(a) = action {
            a();
        }
        order.push(label);
    }

    /// Marks a node released without running its teardown (it went away on its
    /// own, e.g. an offcode that finished). Its live children are torn down.
    pub fn forget(&self, id: ResourceId) {
        let children = self
            .lock()
            .get(id.0)
            .map(|n| n.children.clone())
            .unwrap_or_default();
        let mut order = Vec::new();
        for c in children.into_iter().rev() {
            self.teardown_inner(c, &mut order);
        }
        if let Some(n) = self.lock().get_mut(id.0) {
            n.alive = false;
            n.teardown = None;
        }
    }

    /// Marks `id` and everything under it released without running any of
    /// their teardowns (they are dropped unrun): for resources on a PE that may
    /// never run again, let go of rather than waited for.
    pub fn abandon(&self, id: ResourceId) {
        let mut nodes = self.lock();
        let mut stack = vec![id.0];
        while let Some(i) = stack.pop() {
            let Some(n) = nodes.get_mut(i) else { continue };
            if n.alive {
                n.alive = false;
                n.teardown = None;
                stack.extend(n.children.iter().copied());
            }
        }
    }

    /// The live nodes under `root` (at any depth, not `root` itself) whose
    /// label `pick` accepts, outermost first; the search does not go below a
    /// node it picks.
    pub fn find_under(&self, root: ResourceId, pick: impl Fn(&str) -> bool) -> Vec<ResourceId> {
        let nodes = self.lock();
        let mut out = Vec::new();
        let mut stack: Vec<usize> = nodes
            .get(root.0)
            .map(|n| n.children.iter().rev().copied().collect())
            .unwrap_or_default();
        while let Some(i) = stack.pop() {
            let n = &nodes[i];
            if !n.alive {
                continue;
            }
            if pick(&n.label) {
                out.push(ResourceId(i));
            } else {
                stack.extend(n.children.iter().rev().copied());
            }
        }
        out
    }

    /// Live resources as (kind, label, parent label).
    pub fn live(&self) -> Vec<(ResourceKind, String, Option<String>)> {
        let nodes = self.lock();
        nodes
            .iter()
            .filter(|n| n.alive)
            .map(|n| {
                (
                    n.kind,
                    n.label.clone(),
                    n.parent.map(|p| nodes[p].label.clone()),
                )
            })
            .collect()
    }

    /// Number of live resources of `kind`.
    pub fn count(&self, kind: ResourceKind) -> usize {
        self.lock()
            .iter()
            .filter(|n| n.alive && n.kind == kind)
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn parent_teardown_takes_children_first_newest_first() {
        let t = ResourceTree::new();
        let log = Arc::new(Mutex::new(Vec::new()));
        let rec = |name: &'static str| {
            let log = Arc::clone(&log);
            move || log.lock().unwrap().push(name)
        };
        let app = t.add(None, ResourceKind::App, "app", rec("app"));
        let e1 = t.add(Some(app), ResourceKind::Executor, "core:0", rec("core:0"));
        let _o1 = t.add(Some(e1), ResourceKind::Offcode, "a", rec("a"));
        let _o2 = t.add(Some(e1), ResourceKind::Offcode, "b", rec("b"));
        let e2 = t.add(Some(app), ResourceKind::Executor, "core:1", rec("core:1"));
        let _o3 = t.add(Some(e2), ResourceKind::Offcode, "c", rec("c"));
        let order = t.teardown(app);
        assert_eq!(order, vec!["c", "core:1", "b", "a", "core:0", "app"]);
        assert_eq!(
            *log.lock().unwrap(),
            vec!["c", "core:1", "b", "a", "core:0", "app"]
        );
        assert!(t.live().is_empty());
        assert!(t.teardown(app).is_empty(), "a second teardown does nothing");
    }

    #[test]
    fn subtree_teardown_leaves_siblings() {
        let t = ResourceTree::new();
        let app = t.add(None, ResourceKind::App, "app", || {});
        let e1 = t.add(Some(app), ResourceKind::Executor, "e1", || {});
        let _a = t.add(Some(e1), ResourceKind::Offcode, "a", || {});
        let _e2 = t.add(Some(app), ResourceKind::Executor, "e2", || {});
        t.teardown(e1);
        let live: Vec<_> = t.live().into_iter().map(|(_, l, _)| l).collect();
        assert_eq!(live, vec!["app", "e2"]);
        assert_eq!(t.count(ResourceKind::Offcode), 0);
    }

    #[test]
    fn forget_skips_the_nodes_own_teardown() {
        let t = ResourceTree::new();
        let ran = Arc::new(Mutex::new(false));
        let r = Arc::clone(&ran);
        let a = t.add(None, ResourceKind::Offcode, "a", move || {
            *r.lock().unwrap() = true;
        });
        t.forget(a);
        assert!(!*ran.lock().unwrap());
        assert!(t.live().is_empty());
    }

    #[test]
    fn abandon_releases_a_subtree_without_running_any_teardown() {
        let t = ResourceTree::new();
        let ran = Arc::new(Mutex::new(Vec::new()));
        let log = |name: &'static str| {
            let r = Arc::clone(&ran);
            move || r.lock().unwrap().push(name)
        };
        let app = t.add(None, ResourceKind::App, "app", log("app"));
        let e = t.add(Some(app), ResourceKind::Executor, "e", log("e"));
        let o = t.add(Some(e), ResourceKind::Offcode, "o", log("o"));
        let _k = t.add(Some(app), ResourceKind::Executor, "kept", log("kept"));
        assert_eq!(t.find_under(app, |l| l.starts_with('e')), [e]);
        assert_eq!(t.find_under(app, |l| l == "o"), [o], "at any depth");
        t.abandon(e);
        assert!(ran.lock().unwrap().is_empty(), "nothing ran");
        let live: Vec<_> = t.live().into_iter().map(|(_, l, _)| l).collect();
        assert_eq!(live, vec!["app", "kept"]);
        // The app's own teardown no longer reaches what was abandoned.
        t.teardown(app);
        assert_eq!(*ran.lock().unwrap(), vec!["kept", "app"]);
    }
}

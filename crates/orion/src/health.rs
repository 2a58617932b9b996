//! The process's board of processing-element health: where this process's Orion
//! monitors (the `orion-monitor` offcode, a daemon's ring watch) post what they
//! declare — a peer node or a core dead, or back — and where whoever acts on it (the
//! daemon, which tells its runtime to re-place the PE's offcodes) subscribes. It also
//! answers what the node's views gossip to the rest of the ring: the PEs declared dead
//! here.
//!
//! One board per process: monitors run as offcodes, with no handle to the runtime that
//! runs them, so the board is the meeting point. Subscribers are called on the
//! declaring thread, after the board's lock is released.

use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};

/// One declaration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Declaration {
    /// The PE (`node:b`, `core:3`).
    pub pe: String,
    /// Who declared it (the watching node or monitor).
    pub by: String,
    /// Dead (`true`), or recovered (`false`: the declaration was a false positive).
    pub dead: bool,
    /// Why, in words (the counter, its last progress, the deadline).
    pub evidence: String,
}

type Subscriber = Arc<dyn Fn(&Declaration) + Send + Sync>;

#[derive(Default)]
struct Board {
    dead: BTreeMap<String, Declaration>,
    subscribers: Vec<Subscriber>,
}

fn board() -> &'static Mutex<Board> {
    static BOARD: OnceLock<Mutex<Board>> = OnceLock::new();
    BOARD.get_or_init(|| Mutex::new(Board::default()))
}

fn lock() -> std::sync::MutexGuard<'static, Board> {
    board()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Posts a declaration; subscribers hear of it only when it changes the PE's standing
/// (a second monitor declaring the same PE dead is not news). Returns whether it did.
pub fn declare(d: Declaration) -> bool {
    let subs = {
        let mut b = lock();
        let changed = if d.dead {
            !b.dead.contains_key(&d.pe) && b.dead.insert(d.pe.clone(), d.clone()).is_none()
        } else {
            b.dead.remove(&d.pe).is_some()
        };
        if !changed {
            return false;
        }
        b.subscribers.clone()
    };
    for s in subs {
        s(&d);
    }
    true
}

/// The PEs declared dead in this process, with their declarations.
pub fn dead() -> Vec<Declaration> {
    lock().dead.values().cloned().collect()
}

/// Whether `pe` stands declared dead.
pub fn is_dead(pe: &str) -> bool {
    lock().dead.contains_key(pe)
}

/// Calls `f` for every later change of standing.
pub fn subscribe(f: impl Fn(&Declaration) + Send + Sync + 'static) {
    lock().subscribers.push(Arc::new(f));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn only_changes_of_standing_are_news() {
        let heard = Arc::new(AtomicUsize::new(0));
        let h = Arc::clone(&heard);
        subscribe(move |d| {
            if d.pe == "node:health-test" {
                h.fetch_add(1, Ordering::SeqCst);
            }
        });
        let d = |dead, by: &str| Declaration {
            pe: "node:health-test".into(),
            by: by.into(),
            dead,
            evidence: String::new(),
        };
        assert!(declare(d(true, "a")));
        assert!(!declare(d(true, "b")), "already dead");
        assert!(is_dead("node:health-test"));
        assert_eq!(
            dead()
                .iter()
                .find(|x| x.pe == "node:health-test")
                .map(|x| x.by.as_str()),
            Some("a")
        );
        assert!(declare(d(false, "b")));
        assert!(!declare(d(false, "b")), "already alive");
        assert_eq!(heard.load(Ordering::SeqCst), 2);
    }
}

//! Running code inside a named network namespace (one made with `ip netns
//! add`, bound at `/run/netns/NAME`): the calling thread joins it with
//! setns(2) for the length of a closure and returns to its own namespace after,
//! even if the closure panics. A socket or a BPF link made inside keeps that
//! namespace for its whole life, whichever thread uses it later; this is how
//! offcodes open their sockets in the testbed's hosts.

use std::fs::File;
use std::os::fd::AsFd;
use std::path::PathBuf;

use nix::sched::{CloneFlags, setns};

/// Where `ip netns` binds named namespaces.
pub const NETNS_DIR: &str = "/run/netns";

/// Why a namespace could not be entered.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("no network namespace `{name}` ({path}): {source}")]
    Missing {
        name: String,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot enter network namespace `{name}`: {source} (needs CAP_SYS_ADMIN)")]
    Enter {
        name: String,
        #[source]
        source: nix::Error,
    },
    #[error("cannot open this thread's own network namespace: {0}")]
    Own(#[source] std::io::Error),
}

/// The path a named namespace is bound at.
pub fn path(name: &str) -> PathBuf {
    PathBuf::from(NETNS_DIR).join(name)
}

/// Returns the thread to the namespace it came from when dropped.
struct Back(File);

impl Drop for Back {
    fn drop(&mut self) {
        // Cannot fail for a namespace file this thread just opened; if it did,
        // the thread would stay in the wrong namespace, so stop here.
        if let Err(e) = setns(self.0.as_fd(), CloneFlags::CLONE_NEWNET) {
            panic!("cannot return to the thread's own network namespace: {e}");
        }
    }
}

/// Runs `f` with the calling thread in namespace `name` (`None`: where it is).
pub fn within<T>(name: Option<&str>, f: impl FnOnce() -> T) -> Result<T, NetnsError> {
    let Some(name) = name else {
        return Ok(f());
    };
    let p = path(name);
    let target = File::open(&p).map_err(|source| NetnsError::Missing {
        name: name.to_string(),
        path: p.display().to_string(),
        source,
    })?;
    let own = File::open("/proc/thread-self/ns/net").map_err(NetnsError::Own)?;
    setns(target.as_fd(), CloneFlags::CLONE_NEWNET).map_err(|source| NetnsError::Enter {
        name: name.to_string(),
        source,
    })?;
    let _back = Back(own);
    Ok(f())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_namespace_is_named() {
        let e = within(Some("sidecore-no-such-ns"), || ()).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("no network namespace `sidecore-no-such-ns`"),
            "{e}"
        );
        assert_eq!(within(None, || 7).unwrap(), 7);
    }
}

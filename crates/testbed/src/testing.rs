//! What every test that builds a testbed needs: whether it may (root, and on
//! CI it must: `SIDECORE_REQUIRE_ROOT` turns a skip into a failure), and a
//! guard that removes the testbed even when the test fails.

/// Whether this process runs as root. When it does not, tests that need
/// namespaces skip, unless `SIDECORE_REQUIRE_ROOT` is set (CI sets it), where
/// this fails the test instead of letting it pass without running.
///
/// # Panics
/// When `SIDECORE_REQUIRE_ROOT` is set and this process is not root.
pub fn root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { nix::libc::geteuid() } == 0;
    if !root {
        assert!(
            std::env::var_os("SIDECORE_REQUIRE_ROOT").is_none(),
            "SIDECORE_REQUIRE_ROOT is set but the tests do not run as root"
        );
    }
    root
}

/// Removes every namespace of the testbed with this prefix when dropped.
pub struct Cleanup(pub String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = crate::topology::down(&self.0);
    }
}

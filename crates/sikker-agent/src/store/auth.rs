//! etcd's own user/password authentication, as its JSON gateway speaks it:
//! `/v3/auth/authenticate` trades a user name and password for a token, and
//! every later request carries the token in its `Authorization` header. The
//! password is read from a file (`--etcd-password-file`), never taken on the
//! command line where `ps` would show it, and never printed: [`EtcdAuth`]'s
//! `Debug` leaves it out. A token etcd no longer knows (simple tokens expire
//! after `--auth-token-ttl`, 300 s by default, and etcd answers 401 "invalid
//! auth token") is traded again once, then the request is retried.
//!
//! The exchange itself is the client's (`Etcd::authenticate`, and the
//! administration calls `enable_auth` and `add_user` that tests and
//! demonstrations use to turn authentication on; a production cluster is
//! set up with `etcdctl`).

use std::path::Path;

/// A user of etcd and its password.
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdAuth {
    pub user: String,
    pub(super) password: String,
}

impl std::fmt::Debug for EtcdAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdAuth")
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

/// Why a password file could not be used.
#[derive(Debug, thiserror::Error)]
#[error("--etcd-password-file {}: {why}", path.display())]
pub struct PasswordFileError {
    pub path: std::path::PathBuf,
    pub why: String,
}

impl EtcdAuth {
    /// `user` with `password`.
    #[must_use]
    pub fn new(user: &str, password: &str) -> EtcdAuth {
        EtcdAuth {
            user: user.to_string(),
            password: password.to_string(),
        }
    }

    /// `user` with the password on the first line of `file` (its line end
    /// dropped; an empty one is refused).
    pub fn from_file(user: &str, file: &Path) -> Result<EtcdAuth, PasswordFileError> {
        let bad = |why: String| PasswordFileError {
            path: file.to_path_buf(),
            why,
        };
        let text = std::fs::read_to_string(file).map_err(|e| bad(e.to_string()))?;
        let password = text.lines().next().unwrap_or("");
        if password.is_empty() {
            return Err(bad("the first line (the password) is empty".into()));
        }
        if user.is_empty() {
            return Err(bad("--etcd-user is empty".into()));
        }
        Ok(EtcdAuth::new(user, password))
    }
}

/// True when etcd's answer says the token is not (or no longer) valid.
pub(super) fn token_refused(status: u16, text: &str) -> bool {
    status == 401 || text.contains("invalid auth token")
}

/// True when etcd's answer says it has authentication on and the request
/// named no user.
pub(super) fn wants_user(text: &str) -> bool {
    text.contains("user name is empty")
}

/// The hint added to an answer that says etcd wants a user.
pub(super) fn hint(text: &str, auth: Option<&EtcdAuth>) -> &'static str {
    if auth.is_none() && wants_user(text) {
        " (etcd has authentication on: give --etcd-user and --etcd-password-file)"
    } else {
        ""
    }
}

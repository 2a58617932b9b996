//! etcd's own user/password authentication, as its JSON gateway speaks it:
//! `/v3/auth/authenticate` trades a user name and password for a token, and
//! every later request carries the token in its `Authorization` header. The
//! password is read from a file (`--etcd-password-file`), never taken on the
//! command line where `ps` would show it, and never printed: [`EtcdAuth`]'s
//! `Debug` leaves it out. A token etcd no longer knows (simple tokens expire
//! after `--auth-token-ttl`, 300 s by default, and etcd answers 401 "invalid
//! auth token") is traded again once, then the request is retried.
//!
//! The administration calls (`enable_auth`, `add_user`) are what
//! [`super::LocalEtcd`]'s tests and demonstrations need to turn it on; a
//! production cluster is set up with `etcdctl`.

use std::path::Path;

use base64::Engine as _;
use serde_json::{Value, json};

use super::{B64, Etcd, EtcdError};

/// A user of etcd and its password.
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdAuth {
    pub user: String,
    password: String,
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

/// The hint added to an answer that says etcd wants a user.
pub(super) fn hint(text: &str, auth: Option<&EtcdAuth>) -> &'static str {
    if auth.is_none() && text.contains("user name is empty") {
        " (etcd has authentication on: give --etcd-user and --etcd-password-file)"
    } else {
        ""
    }
}

impl Etcd {
    /// Trades the user and password for a token at `base` (an endpoint URL).
    pub(super) fn authenticate(&self, base: &str, auth: &EtcdAuth) -> Result<String, String> {
        let url = format!("{base}/v3/auth/authenticate");
        let body = json!({"name": auth.user, "password": auth.password}).to_string();
        let mut r = self
            .short
            .post(&url)
            .send(body.as_bytes())
            .map_err(|e| format!("{url}: {e}"))?;
        let text = r.body_mut().read_to_string().unwrap_or_default();
        if !r.status().is_success() {
            return Err(format!(
                "{url}: authentication as user `{}` failed: HTTP {}: {}",
                auth.user,
                r.status(),
                text.trim()
            ));
        }
        let v: Value = serde_json::from_str(&text).map_err(|e| format!("{url}: {e}: {text}"))?;
        v["token"]
            .as_str()
            .filter(|t| !t.is_empty())
            .map(str::to_string)
            .ok_or_else(|| format!("{url}: authenticated, but no token came back: {text}"))
    }

    /// Creates user `root` with `password`, gives it the root role and turns
    /// authentication on (what `etcdctl user add root`, `user grant-role root
    /// root` and `auth enable` do). This client then acts as root.
    pub fn enable_auth(&mut self, password: &str) -> Result<(), EtcdError> {
        self.call(
            "/v3/auth/user/add",
            &json!({"name": "root", "password": password}),
        )?;
        self.call(
            "/v3/auth/user/grant",
            &json!({"user": "root", "role": "root"}),
        )?;
        self.call("/v3/auth/enable", &json!({}))?;
        self.set_auth(Some(EtcdAuth::new("root", password)));
        Ok(())
    }

    /// Adds `user` with `password` and a role of its own that may read
    /// (or, with `write`, also write) the keys under `prefix`.
    pub fn add_user(
        &mut self,
        user: &str,
        password: &str,
        prefix: &str,
        write: bool,
    ) -> Result<(), EtcdError> {
        let role = format!("{user}-role");
        let mut end = prefix.as_bytes().to_vec();
        if let Some(last) = end.last_mut() {
            *last += 1;
        }
        self.call("/v3/auth/role/add", &json!({"name": role}))?;
        self.call(
            "/v3/auth/role/grant",
            &json!({"name": role, "perm": {
                "permType": if write { "READWRITE" } else { "READ" },
                "key": B64.encode(prefix),
                "range_end": B64.encode(end),
            }}),
        )?;
        self.call(
            "/v3/auth/user/add",
            &json!({"name": user, "password": password}),
        )?;
        self.call("/v3/auth/user/grant", &json!({"user": user, "role": role}))?;
        Ok(())
    }
}

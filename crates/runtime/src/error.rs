//! Why planning or deploying an app failed. Every stage of the pipeline
//! reports through these two types, so the daemon and the CLI print one shape
//! of message whichever stage refused.

use sidecore_layout::LayoutError;

/// Why planning failed (resolve, place or plan).
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("offcode `{offcode}` ({origin}): {problem}")]
    Offcode {
        offcode: String,
        /// Where the manifest declares it (`file:line:col`).
        origin: String,
        problem: String,
    },
    #[error("no layout satisfies the manifest: {0}")]
    Layout(#[from] LayoutError),
}

/// Why a deployment failed. Nothing of it is left running.
#[derive(Debug, thiserror::Error)]
pub enum DeployError {
    #[error("offcode `{offcode}`: cannot build it: {error}")]
    Build { offcode: String, error: String },
    #[error("channel `{channel}`: {error}")]
    Channel { channel: String, error: String },
    #[error("PE {pe}: {error}")]
    Executor { pe: String, error: String },
    #[error("offcode `{offcode}` on {pe}: {error}")]
    Offcode {
        offcode: String,
        pe: String,
        error: String,
    },
    #[error("an app named `{0}` is already running")]
    Duplicate(String),
    /// A peer node refused or failed its part, with its reason.
    #[error("peer {node}: {error}")]
    Node { node: String, error: String },
    /// The connection to a peer node failed (the error names the peer).
    #[error(transparent)]
    Link(#[from] sidecore_wire::LinkError),
}

/// Why a control message could not be delivered or answered.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("no app `{0}` is running")]
    NoApp(String),
    #[error("app `{app}` has no offcode `{offcode}` here (offcodes: {known})")]
    NoOffcode {
        app: String,
        offcode: String,
        known: String,
    },
    #[error("offcode `{0}` did not answer within {1:?}")]
    NoAnswer(String, std::time::Duration),
    #[error("offcode `{0}`: {1}")]
    Oob(String, sidecore_channel::oob::OobError),
}

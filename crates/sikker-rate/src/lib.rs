//! Sikker's distributed rate control (dissertation ch. 5) as sans-IO state machines.
//!
//! Six algorithms enforce a unidirectional aggregate rate limit `R_a` from a source
//! service to a destination service:
//!
//! | algorithm | module / type | what runs where |
//! |---|---|---|
//! | NE (§5.1) | none needed | nothing is enforced |
//! | RE (§5.2) | [`relay`] | `N_r = ceil(R_a/R_r)` relays, each a token bucket at `R_a/N_r` |
//! | SE-FA (§5.3) | [`SeSender`] with [`SeVariant::FixedAllocation`] | one bucket per source process at a fixed share |
//! | SE-TE (§5.4) | [`SeSender`] with [`SeVariant::TokenExchange`] | buckets ask peers for tokens (Eq. 5.3, 5.4) |
//! | SE-RE (§5.5) | [`SeSender`] with [`SeVariant::RateExchange`] | buckets ask peers for rate (Eq. 5.5, 5.6) |
//! | SE-TRE (§5.6) | [`SeSender`] with [`SeVariant::TokenAndRateExchange`] | both, in the same messages |
//!
//! [`RateFsm`] wraps all six behind one set of calls (`on_send`, `on_request`,
//! `on_response`, `on_credit`), the per-destination `RateFSM` of §6.2.6.
//!
//! Nothing here owns a thread, a clock or a socket: every entry point takes the current
//! time `now` (any monotonic unit; RateSim uses cycles of 1 ns) and returns the messages
//! to send. Units follow the dissertation: one token is one phit, rates are normalised
//! so that `1.0` is the line rate (one phit per time unit).
//!
//! The formulas are exactly those of chapter 5 ([`formulas`]). Where chapter 5 does not
//! say how a step works (Fig. 5.7 is missing from the text), this crate follows the
//! reconstruction in the Sikker digest (§4.3 of the digest); each such choice is marked
//! **[A]** in the documentation of the item that makes it, and nothing else is assumed.

mod algorithm;
mod bucket;
pub mod formulas;
mod fsm;
pub mod relay;
mod se;

pub use algorithm::Algorithm;
pub use bucket::{EPSILON, TokenBucket};
pub use fsm::{Decision, RateFsm};
pub use se::{Request, Response, SeAccounting, SeParams, SeSender, SeVariant};

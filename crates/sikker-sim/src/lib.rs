//! The dissertation's two simulators, rebuilt on sidecore's real Sikker code:
//! SikkerSim ([`sikkersim`], ch. 7) times real permission checks against real NMU
//! tables built from the connectivity model; RateSim ([`ratesim`], ch. 8) runs the six
//! rate-control state machines of `sidecore-sikker-rate` in a deterministic
//! discrete-event network. [`report`] assembles RateSim's tables; the `sidecore sim`
//! command (in the binary) parses options and prints them.

pub mod error;
pub mod plot;
pub mod ratesim;
pub mod report;
pub mod sikkersim;
pub mod timing;

pub use error::SimError;

//! TCPServers (Bohra 2008, chapter 2) rebuilt for today's Linux: packet
//! processing engines (PPEs) on dedicated cores own the listening and
//! connected sockets; applications get per-connection receive queues and
//! never enter the network stack.
//!
//! | module | what |
//! |---|---|
//! | [`gr3`] | the connection scheduler (Eqs. 2.1–2.8, Alg. 1 with E1), sans-IO |

pub mod gr3;

//! Helpers shared by FileWall's integration tests: a real nfs-ganesha server
//! (`ganesha`) and the libnfs command-line clients, and a small NFSv3 client on
//! the crate's codec (`client`). Each test binary uses part of them.
#![allow(dead_code)]

pub mod client;
pub mod ganesha;

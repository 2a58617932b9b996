//! Helpers shared by FileWall's integration tests: a real nfs-ganesha server
//! (`ganesha`) and the libnfs command-line clients.

pub mod ganesha;

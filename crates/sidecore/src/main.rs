//! The `sidecore` command: both the command-line interface and the daemon.

use clap::Parser;

/// sidecore offloads functionality onto processing elements that would otherwise sit idle.
#[derive(Parser, Debug)]
#[command(name = "sidecore", version, about)]
struct Cli {}

fn main() -> anyhow::Result<()> {
    let _cli = Cli::parse();
    Ok(())
}

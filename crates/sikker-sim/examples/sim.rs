//! Runs `sidecore sim ...` without the main binary: `cargo run --release -p
//! sidecore-sikker-sim --example sim -- sikker --hosts 131072`.

use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    cmd: sidecore_sikker_sim::SimCommand,
}

fn main() -> anyhow::Result<()> {
    sidecore_sikker_sim::run(Cli::parse().cmd)
}

//! `cargo run -p sidecore-total-order-net --example mesh -- N LOSS PER_NODE [variants]`:
//! one mesh, the variants measured on it, as JSON lines.
#![allow(clippy::unwrap_used)]

use sidecore_total_order_net::{Bed, RunOptions, Variant, run};

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let n: usize = a.get(1).map_or(3, |s| s.parse().unwrap());
    let loss: f64 = a.get(2).map_or(5.0, |s| s.parse().unwrap());
    let per: usize = a.get(3).map_or(200, |s| s.parse().unwrap());
    let vs: Vec<Variant> = a.get(4).map_or(Variant::ALL.to_vec(), |s| {
        s.split(',').map(|v| Variant::parse(v).unwrap()).collect()
    });
    let _ = sidecore_testbed::topology::down("tomesh");
    let bed = Bed::up(n, "tomesh", loss).unwrap();
    eprintln!("loss by {}", bed.loss);
    let opts = RunOptions {
        per_node: per,
        ..RunOptions::default()
    };
    for v in vs {
        match run(&bed, v, &opts) {
            Ok(m) => println!("{}", serde_json::to_string(&m).unwrap()),
            Err(e) => println!("{}: {e}", v.name()),
        }
    }
    bed.down().unwrap();
}

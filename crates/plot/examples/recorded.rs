//! Draws the charts of every data file in `docs/plots/data/` (figures
//! recorded in BENCHMARKS.md) into the plots folder:
//! `cargo run -p sidecore-plot --example recorded [DATA_DIR]`.

fn main() -> std::process::ExitCode {
    let data = std::env::args_os().nth(1).map_or_else(
        || sidecore_plot::out_dir().join("data"),
        std::path::PathBuf::from,
    );
    let out = sidecore_plot::out_dir();
    let run = || -> Result<usize, sidecore_plot::PlotError> {
        let mut n = 0;
        for f in sidecore_plot::recorded::data_files(&data)? {
            let file = sidecore_plot::recorded::load(&f)?;
            for p in sidecore_plot::recorded::draw(&file, &out)? {
                println!("{} → {}", f.display(), p.display());
                n += 1;
            }
        }
        Ok(n)
    };
    match run() {
        Ok(n) => {
            println!("{n} chart(s) written");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

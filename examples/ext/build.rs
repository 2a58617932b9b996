//! A small guest stack (16 KiB instead of rustc's 1 MiB default) keeps each module's
//! linear memory — region 'C, capped by sidecore — and its working set small.
fn main() {
    if std::env::var("TARGET").is_ok_and(|t| t.starts_with("wasm32")) {
        println!("cargo:rustc-link-arg=-zstack-size=16384");
    }
}

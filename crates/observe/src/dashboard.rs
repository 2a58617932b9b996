//! The dashboard's files, bundled by `build.rs` (esbuild) from dashboard/ and
//! compiled into the binary.

pub const INDEX_HTML: &str = include_str!(concat!(env!("OUT_DIR"), "/index.html"));
pub const STYLE_CSS: &str = include_str!(concat!(env!("OUT_DIR"), "/style.css"));
pub const APP_JS: &str = include_str!(concat!(env!("OUT_DIR"), "/app.js"));

//! The files a Wasm extension comes with: its module (binary or text) and the
//! machine's calibration (the given file, the default one, or the built-in
//! fallback figures), read with errors that name the file.

use std::path::Path;

use sidecore_ext_verify::Calibration;

use crate::calibrate;

/// Why a module or calibration file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("{path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: neither a Wasm binary nor valid Wasm text: {detail}")]
    NotWasm { path: String, detail: String },
    /// The calibration file's own message (it names the file and position, and
    /// already ends with the cause, so it is not chained as a source: `{:#}` would
    /// print the cause twice).
    #[error("{0}")]
    Calibration(calibrate::CalibrationFileError),
}

/// Reads a module, accepting Wasm binary or text.
pub fn read_module(path: &Path) -> Result<Vec<u8>, FileError> {
    let bytes = std::fs::read(path).map_err(|source| FileError::Read {
        path: path.display().to_string(),
        source,
    })?;
    if bytes.starts_with(b"\0asm") {
        return Ok(bytes);
    }
    wat::parse_bytes(&bytes)
        .map(std::borrow::Cow::into_owned)
        .map_err(|e| FileError::NotWasm {
            path: path.display().to_string(),
            detail: e.to_string(),
        })
}

/// The calibration to use: the given file, else the default file, else the
/// fallback figures; with a line saying which.
pub fn load_calibration(path: Option<&Path>) -> Result<(Calibration, String), FileError> {
    let from = |p: &Path| {
        calibrate::load(p)
            .map(|c| (c, p.display().to_string()))
            .map_err(FileError::Calibration)
    };
    match path {
        Some(p) => from(p),
        None => {
            let p = calibrate::default_path();
            if p.exists() {
                from(&p)
            } else {
                Ok((
                    Calibration::fallback(),
                    format!(
                        "built-in fallback figures (no {}; run `sidecore calibrate`)",
                        p.display()
                    ),
                ))
            }
        }
    }
}

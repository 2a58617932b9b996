//! Diagnostics for manifests: every problem names the file, line and column and
//! says what is wrong, rendered by codespan-reporting with the offending source
//! line underlined.

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

use codespan_reporting::diagnostic::{Diagnostic, Label};
use codespan_reporting::files::{Files, SimpleFiles};
use codespan_reporting::term::{self, Config};

/// Identifies one loaded source file.
pub type FileId = usize;

/// Every source file read while loading a manifest and its imports.
#[derive(Clone, Default)]
pub struct Sources {
    files: SimpleFiles<String, String>,
    paths: Vec<PathBuf>,
}

impl fmt::Debug for Sources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sources")
            .field("paths", &self.paths)
            .finish()
    }
}

impl Sources {
    /// Adds a file; `display` is the name shown in messages.
    pub fn add(&mut self, path: &Path, display: String, text: String) -> FileId {
        self.paths.push(path.to_path_buf());
        self.files.add(display, text)
    }

    /// The text of a file.
    pub fn text(&self, id: FileId) -> &str {
        self.files
            .get(id)
            .map(|f| f.source().as_str())
            .unwrap_or("")
    }

    /// The path a file was read from.
    pub fn path(&self, id: FileId) -> &Path {
        &self.paths[id]
    }

    /// The display name of a file.
    pub fn name(&self, id: FileId) -> String {
        self.files.name(id).unwrap_or_default()
    }

    /// The file already loaded from `path`, if any.
    pub fn find(&self, path: &Path) -> Option<FileId> {
        self.paths.iter().position(|p| p == path)
    }

    /// `file:line:column` (1-based) of a byte offset.
    pub fn origin(&self, id: FileId, span: &Range<usize>) -> Origin {
        let loc = self.files.location(id, span.start).ok();
        Origin {
            file: self.name(id),
            line: loc.as_ref().map_or(0, |l| l.line_number),
            column: loc.as_ref().map_or(0, |l| l.column_number),
        }
    }

    /// Renders diagnostics against these sources.
    pub fn render(&self, diagnostics: &[Diagnostic<FileId>], color: bool) -> String {
        let config = Config::default();
        if color {
            let mut buf = codespan_reporting::term::termcolor::Buffer::ansi();
            for d in diagnostics {
                let _ = term::emit_to_write_style(&mut buf, &config, &self.files, d);
            }
            String::from_utf8_lossy(buf.as_slice()).into_owned()
        } else {
            let mut out = String::new();
            for d in diagnostics {
                let _ = term::emit_to_string(&mut out, &config, &self.files, d);
            }
            out
        }
    }
}

/// Where something was declared: `file:line:column`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, serde::Serialize)]
pub struct Origin {
    pub file: String,
    pub line: usize,
    pub column: usize,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.column)
    }
}

/// A manifest that could not be accepted, with every problem found.
pub struct ManifestError {
    pub sources: Sources,
    pub diagnostics: Vec<Diagnostic<FileId>>,
}

impl ManifestError {
    /// Renders every diagnostic (ANSI colours when `color`).
    pub fn render(&self, color: bool) -> String {
        self.sources.render(&self.diagnostics, color)
    }

    /// The primary messages, one per problem.
    pub fn messages(&self) -> Vec<String> {
        self.diagnostics.iter().map(|d| d.message.clone()).collect()
    }
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.render(false).trim_end())
    }
}

impl fmt::Debug for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::error::Error for ManifestError {}

/// Collects diagnostics while loading.
#[derive(Default)]
pub(crate) struct Report {
    pub diagnostics: Vec<Diagnostic<FileId>>,
}

impl Report {
    /// An error at `span` of `file`.
    pub fn error(
        &mut self,
        file: FileId,
        span: Range<usize>,
        message: impl Into<String>,
        label: impl Into<String>,
    ) -> &mut Diagnostic<FileId> {
        self.diagnostics.push(
            Diagnostic::error()
                .with_message(message.into())
                .with_labels(vec![Label::primary(file, span).with_message(label.into())]),
        );
        self.diagnostics.last_mut().expect("just pushed")
    }

    pub fn has_errors(&self) -> bool {
        !self.diagnostics.is_empty()
    }
}

/// Adds a secondary label to a diagnostic.
pub(crate) fn also(
    d: &mut Diagnostic<FileId>,
    file: FileId,
    span: Range<usize>,
    message: impl Into<String>,
) {
    d.labels
        .push(Label::secondary(file, span).with_message(message.into()));
}

/// Adds a note to a diagnostic.
pub(crate) fn note(d: &mut Diagnostic<FileId>, text: impl Into<String>) {
    d.notes.push(text.into());
}

//! The documentation names only things that exist: every file or folder path
//! and every Rust path (`sidecore_runtime::start::start`) that
//! `docs/ARCHITECTURE.md` or the README names in backticks must be in the
//! tree, and the architecture page must name every crate of the workspace.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed run

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(&std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("../..")
}

/// Every `code span` of a Markdown text, with its line.
fn spans(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut in_block = false;
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
            continue;
        }
        if in_block {
            continue;
        }
        let mut rest = line;
        while let Some(a) = rest.find('`') {
            let Some(b) = rest[a + 1..].find('`') else {
                break;
            };
            out.push((i + 1, rest[a + 1..a + 1 + b].to_string()));
            rest = &rest[a + 2 + b..];
        }
    }
    out
}

/// Package name (`sidecore_runtime`, as Rust spells it) → its folder.
fn packages() -> BTreeMap<String, PathBuf> {
    let mut m = BTreeMap::new();
    for e in std::fs::read_dir(repo().join("crates")).unwrap() {
        let dir = e.unwrap().path();
        let Ok(toml) = std::fs::read_to_string(dir.join("Cargo.toml")) else {
            continue;
        };
        let name = toml
            .lines()
            .find_map(|l| l.strip_prefix("name = \""))
            .map(|n| n.trim_end_matches('"').replace('-', "_"))
            .unwrap();
        m.insert(name, dir);
    }
    m
}

fn is_repo_path(s: &str) -> bool {
    let roots = ["crates/", "docs/", "examples/", "scripts/", ".ci/"];
    roots.iter().any(|r| s.starts_with(r))
        && !s.contains(' ')
        && !s.contains('*')
        && !s.contains('{')
        && !s.contains('<')
}

/// Whether module file `file` defines or re-exports `ident`.
fn defines(file: &Path, ident: &str) -> bool {
    let Ok(text) = std::fs::read_to_string(file) else {
        return false;
    };
    let kw = [
        "fn ",
        "struct ",
        "enum ",
        "type ",
        "trait ",
        "mod ",
        "const ",
        "static ",
        "macro_rules! ",
    ];
    kw.iter().any(|k| text.contains(&format!("{k}{ident}")))
        // Declared through a macro: `keyword_enum!(PeKind, "PE kind", { … })`.
        || text.lines().any(|l| l.trim_start().starts_with(&format!("{ident},")))
        // A re-export, on one line or spread over several.
        || text.split(';').any(|stmt| {
            let stmt = stmt.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join(" ");
            stmt.trim_start().starts_with("pub use")
                && stmt
                    .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .any(|w| w == ident)
        })
}

/// Checks a Rust path `sidecore_x::a::b::Item` against the tree.
fn rust_path_exists(path: &str, pkgs: &BTreeMap<String, PathBuf>) -> Result<(), String> {
    let segs: Vec<&str> = path.trim_end_matches("()").split("::").collect();
    let Some(dir) = pkgs.get(segs[0]) else {
        return Err(format!("no crate `{}`", segs[0]));
    };
    let src = dir.join("src");
    let mut file = if src.join("lib.rs").exists() {
        src.join("lib.rs")
    } else {
        src.join("main.rs")
    };
    let mut module_dir = src.clone();
    for seg in &segs[1..] {
        let as_file = module_dir.join(format!("{seg}.rs"));
        let as_dir = module_dir.join(seg).join("mod.rs");
        if as_file.exists() {
            file = as_file;
            module_dir = module_dir.join(seg);
        } else if as_dir.exists() {
            file = as_dir;
            module_dir = module_dir.join(seg);
        } else if defines(&file, seg) {
            // An item of the module: anything after it (a method, a variant)
            // is the item's own business.
            return Ok(());
        } else {
            return Err(format!(
                "`{seg}` is neither a module nor an item of {}",
                file.display()
            ));
        }
    }
    Ok(())
}

fn check(doc: &str) -> Vec<String> {
    let path = repo().join(doc);
    let text = std::fs::read_to_string(&path).unwrap();
    let pkgs = packages();
    let mut bad = Vec::new();
    for (line, span) in spans(&text) {
        let token = span.trim_end_matches(['.', ',', ':']);
        if is_repo_path(token) {
            if !repo().join(token.trim_end_matches('/')).exists() {
                bad.push(format!("{doc}:{line}: `{token}` does not exist"));
            }
        } else if token.starts_with("sidecore_")
            && token.contains("::")
            && token
                .chars()
                .all(|c| c.is_alphanumeric() || c == '_' || c == ':' || c == '(' || c == ')')
            && let Err(e) = rust_path_exists(token, &pkgs)
        {
            bad.push(format!("{doc}:{line}: `{token}`: {e}"));
        }
    }
    bad
}

#[test]
fn the_architecture_page_names_only_what_exists_and_every_crate() {
    let bad = check("docs/ARCHITECTURE.md");
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    let text = std::fs::read_to_string(repo().join("docs/ARCHITECTURE.md")).unwrap();
    for dir in packages().values() {
        let folder = format!("crates/{}", dir.file_name().unwrap().to_string_lossy());
        assert!(
            text.contains(&format!("`{folder}`")),
            "docs/ARCHITECTURE.md does not name `{folder}`"
        );
    }
}

#[test]
fn the_readme_names_only_what_exists() {
    let bad = check("README.md");
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn the_checker_catches_what_is_missing() {
    let pkgs = packages();
    assert!(rust_path_exists("sidecore_runtime::start::start", &pkgs).is_ok());
    assert!(rust_path_exists("sidecore_runtime::plan_manifest", &pkgs).is_ok());
    assert!(rust_path_exists("sidecore_runtime::supervisor", &pkgs).is_ok());
    assert!(rust_path_exists("sidecore_runtime::remote", &pkgs).is_err());
    assert!(rust_path_exists("sidecore_nowhere::x", &pkgs).is_err());
    assert!(is_repo_path("crates/wire/src/frame.rs"));
    assert!(!is_repo_path("crates/*/src"));
}

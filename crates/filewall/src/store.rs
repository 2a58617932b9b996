//! FileWall's persistent state (§4.5 "State Maintenance") in an embedded
//! transactional store, redb: what must survive a restart — per-object
//! permission matrices (as their shadow-file text), run-time changes to the user
//! assignment, threat sessions until an administrator lifts them, the export
//! roots, and the audit log of LOG and ALARM events. Soft state (sessions, owners,
//! names) is rebuilt by watching traffic. Each change is one write transaction;
//! audit lines are batched and written by [`Store::flush_audit`].

use std::path::Path;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

/// Object handle → its matrix as shadow-file text.
const MATRICES: TableDefinition<&[u8], &str> = TableDefinition::new("matrices");
/// User name → assigned role names, comma-separated.
const ASSIGN: TableDefinition<&str, &str> = TableDefinition::new("assign");
/// `uid@ip` → 1.
const THREATS: TableDefinition<&str, u8> = TableDefinition::new("threats");
/// Root handle → export path.
const ROOTS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("roots");
/// Sequence number → audit line.
const AUDIT: TableDefinition<u64, &str> = TableDefinition::new("audit");

/// Audit lines kept; older ones are deleted as new ones are written.
pub const MAX_AUDIT: u64 = 100_000;

/// A store operation that failed: the path and what redb said.
#[derive(Debug, thiserror::Error)]
#[error("store {path}: {what}: {source}")]
pub struct StoreError {
    pub path: String,
    pub what: &'static str,
    #[source]
    pub source: Box<redb::Error>,
}

/// Export roots: (handle, path).
pub type Roots = Vec<(Vec<u8>, Vec<u8>)>;

/// The open store.
pub struct Store {
    db: Database,
    path: String,
    audit_next: u64,
    audit_buffer: Vec<String>,
}

impl Store {
    /// Opens (or creates) the store at `path`, with every table.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        let p = path.display().to_string();
        let fail = |what, e: redb::Error| StoreError {
            path: p.clone(),
            what,
            source: Box::new(e),
        };
        let db = Database::create(path).map_err(|e| fail("opening", e.into()))?;
        let tx = db
            .begin_write()
            .map_err(|e| fail("creating tables", e.into()))?;
        {
            tx.open_table(MATRICES)
                .map_err(|e| fail("creating tables", e.into()))?;
            tx.open_table(ASSIGN)
                .map_err(|e| fail("creating tables", e.into()))?;
            tx.open_table(THREATS)
                .map_err(|e| fail("creating tables", e.into()))?;
            tx.open_table(ROOTS)
                .map_err(|e| fail("creating tables", e.into()))?;
            tx.open_table(AUDIT)
                .map_err(|e| fail("creating tables", e.into()))?;
        }
        tx.commit().map_err(|e| fail("creating tables", e.into()))?;
        let mut s = Store {
            db,
            path: p,
            audit_next: 0,
            audit_buffer: Vec::new(),
        };
        s.audit_next = s.audit_last()?.map_or(0, |n| n + 1);
        Ok(s)
    }

    fn fail(&self, what: &'static str, e: impl Into<redb::Error>) -> StoreError {
        StoreError {
            path: self.path.clone(),
            what,
            source: Box::new(e.into()),
        }
    }

    fn audit_last(&self) -> Result<Option<u64>, StoreError> {
        let tx = self.db.begin_read().map_err(|e| self.fail("reading", e))?;
        let t = tx.open_table(AUDIT).map_err(|e| self.fail("reading", e))?;
        let last = t.last().map_err(|e| self.fail("reading", e))?;
        Ok(last.map(|(k, _)| k.value()))
    }

    /// The stored matrix text of object `fh`.
    pub fn matrix(&self, fh: &[u8]) -> Result<Option<String>, StoreError> {
        let tx = self
            .db
            .begin_read()
            .map_err(|e| self.fail("reading a matrix", e))?;
        let t = tx
            .open_table(MATRICES)
            .map_err(|e| self.fail("reading a matrix", e))?;
        let v = t.get(fh).map_err(|e| self.fail("reading a matrix", e))?;
        Ok(v.map(|g| g.value().to_string()))
    }

    /// Stores (or, with `None`, forgets) the matrix of object `fh`.
    pub fn set_matrix(&self, fh: &[u8], text: Option<&str>) -> Result<(), StoreError> {
        let what = "writing a matrix";
        let tx = self.db.begin_write().map_err(|e| self.fail(what, e))?;
        {
            let mut t = tx.open_table(MATRICES).map_err(|e| self.fail(what, e))?;
            match text {
                Some(text) => t.insert(fh, text).map(drop),
                None => t.remove(fh).map(drop),
            }
            .map_err(|e| self.fail(what, e))?;
        }
        tx.commit().map_err(|e| self.fail(what, e))
    }

    /// Every run-time assignment: (user, role names).
    pub fn assignments(&self) -> Result<Vec<(String, Vec<String>)>, StoreError> {
        let what = "reading assignments";
        let tx = self.db.begin_read().map_err(|e| self.fail(what, e))?;
        let t = tx.open_table(ASSIGN).map_err(|e| self.fail(what, e))?;
        let mut out = Vec::new();
        for row in t.iter().map_err(|e| self.fail(what, e))? {
            let (k, v) = row.map_err(|e| self.fail(what, e))?;
            let roles = v
                .value()
                .split(',')
                .filter(|r| !r.is_empty())
                .map(str::to_string)
                .collect();
            out.push((k.value().to_string(), roles));
        }
        Ok(out)
    }

    /// Records `user`'s assignment.
    pub fn set_assignment(&self, user: &str, roles: &[String]) -> Result<(), StoreError> {
        let what = "writing an assignment";
        let tx = self.db.begin_write().map_err(|e| self.fail(what, e))?;
        {
            let mut t = tx.open_table(ASSIGN).map_err(|e| self.fail(what, e))?;
            t.insert(user, roles.join(",").as_str())
                .map_err(|e| self.fail(what, e))?;
        }
        tx.commit().map_err(|e| self.fail(what, e))
    }

    /// Every threat, as `uid@ip`.
    pub fn threats(&self) -> Result<Vec<String>, StoreError> {
        let what = "reading threats";
        let tx = self.db.begin_read().map_err(|e| self.fail(what, e))?;
        let t = tx.open_table(THREATS).map_err(|e| self.fail(what, e))?;
        let mut out = Vec::new();
        for row in t.iter().map_err(|e| self.fail(what, e))? {
            let (k, _) = row.map_err(|e| self.fail(what, e))?;
            out.push(k.value().to_string());
        }
        Ok(out)
    }

    /// Replaces the set of threats.
    pub fn set_threats(&self, threats: &[String]) -> Result<(), StoreError> {
        let what = "writing threats";
        let tx = self.db.begin_write().map_err(|e| self.fail(what, e))?;
        {
            let mut t = tx.open_table(THREATS).map_err(|e| self.fail(what, e))?;
            t.retain(|_, _| false).map_err(|e| self.fail(what, e))?;
            for k in threats {
                t.insert(k.as_str(), 1).map_err(|e| self.fail(what, e))?;
            }
        }
        tx.commit().map_err(|e| self.fail(what, e))
    }

    /// Every export root handle, with its path.
    pub fn roots(&self) -> Result<Roots, StoreError> {
        let what = "reading roots";
        let tx = self.db.begin_read().map_err(|e| self.fail(what, e))?;
        let t = tx.open_table(ROOTS).map_err(|e| self.fail(what, e))?;
        let mut out = Vec::new();
        for row in t.iter().map_err(|e| self.fail(what, e))? {
            let (k, v) = row.map_err(|e| self.fail(what, e))?;
            out.push((k.value().to_vec(), v.value().to_vec()));
        }
        Ok(out)
    }

    pub fn add_root(&self, fh: &[u8], path: &[u8]) -> Result<(), StoreError> {
        let what = "writing a root";
        let tx = self.db.begin_write().map_err(|e| self.fail(what, e))?;
        {
            let mut t = tx.open_table(ROOTS).map_err(|e| self.fail(what, e))?;
            t.insert(fh, path).map_err(|e| self.fail(what, e))?;
        }
        tx.commit().map_err(|e| self.fail(what, e))
    }

    /// Queues an audit line (written by the next `flush_audit`).
    pub fn audit(&mut self, line: String) {
        self.audit_buffer.push(line);
    }

    /// Writes the queued audit lines in one transaction, dropping the oldest
    /// beyond `MAX_AUDIT`.
    pub fn flush_audit(&mut self) -> Result<usize, StoreError> {
        if self.audit_buffer.is_empty() {
            return Ok(0);
        }
        let what = "writing the audit log";
        let lines = std::mem::take(&mut self.audit_buffer);
        let tx = self.db.begin_write().map_err(|e| self.fail(what, e))?;
        {
            let mut t = tx.open_table(AUDIT).map_err(|e| self.fail(what, e))?;
            for l in &lines {
                t.insert(self.audit_next, l.as_str())
                    .map_err(|e| self.fail(what, e))?;
                self.audit_next += 1;
            }
            let keep_from = self.audit_next.saturating_sub(MAX_AUDIT);
            if keep_from > 0 {
                t.retain_in(..keep_from, |_, _| false)
                    .map_err(|e| self.fail(what, e))?;
            }
        }
        tx.commit().map_err(|e| self.fail(what, e))?;
        Ok(lines.len())
    }

    /// The last `n` audit lines, oldest first (queued ones included).
    pub fn audit_tail(&self, n: usize) -> Result<Vec<String>, StoreError> {
        let what = "reading the audit log";
        let tx = self.db.begin_read().map_err(|e| self.fail(what, e))?;
        let t = tx.open_table(AUDIT).map_err(|e| self.fail(what, e))?;
        let mut out: Vec<String> = Vec::new();
        for row in t.iter().map_err(|e| self.fail(what, e))?.rev().take(n) {
            let (_, v) = row.map_err(|e| self.fail(what, e))?;
            out.push(v.value().to_string());
        }
        out.reverse();
        out.extend(self.audit_buffer.iter().cloned());
        let skip = out.len().saturating_sub(n);
        Ok(out.split_off(skip))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_survives_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fw.redb");
        {
            let mut s = Store::open(&path).unwrap();
            s.set_matrix(b"fh1", Some("READ allow=admin\n")).unwrap();
            s.set_matrix(b"fh2", Some("x")).unwrap();
            s.set_matrix(b"fh2", None).unwrap();
            s.set_assignment("bob", &["admin".into(), "user".into()])
                .unwrap();
            s.set_threats(&["1001@127.0.0.1".into()]).unwrap();
            s.add_root(b"root", b"/srv/export").unwrap();
            s.audit("LOG one".into());
            s.audit("ALARM two".into());
            assert_eq!(
                s.audit_tail(5).unwrap(),
                ["LOG one", "ALARM two"],
                "queued lines show"
            );
            assert_eq!(s.flush_audit().unwrap(), 2);
        }
        let mut s = Store::open(&path).unwrap();
        assert_eq!(
            s.matrix(b"fh1").unwrap().as_deref(),
            Some("READ allow=admin\n")
        );
        assert_eq!(s.matrix(b"fh2").unwrap(), None);
        assert_eq!(
            s.assignments().unwrap(),
            vec![(
                "bob".to_string(),
                vec!["admin".to_string(), "user".to_string()]
            )]
        );
        assert_eq!(s.threats().unwrap(), ["1001@127.0.0.1"]);
        assert_eq!(
            s.roots().unwrap(),
            vec![(b"root".to_vec(), b"/srv/export".to_vec())]
        );
        s.audit("LOG three".into());
        s.flush_audit().unwrap();
        assert_eq!(s.audit_tail(2).unwrap(), ["ALARM two", "LOG three"]);
        s.set_threats(&[]).unwrap();
        assert!(s.threats().unwrap().is_empty());
    }

    #[test]
    fn a_file_that_is_not_a_store_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("not.redb");
        std::fs::write(&path, b"this is not a redb file at all, just text").unwrap();
        let e = Store::open(&path).err().unwrap();
        assert!(
            e.to_string()
                .starts_with(&format!("store {}: opening: ", path.display())),
            "{e}"
        );
    }
}

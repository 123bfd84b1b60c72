//! The audit log: one JSON line per effect an agent caused through hako
//! (a command, a file operation, a policy refusal, a proxy decision), each
//! carrying the SHA-256 of the line before it, so that editing, removing,
//! reordering or cutting off lines is found by [`verify`].
//!
//! A line is a JSON object: `seq` (1, 2, ...), `at_ms` (Unix milliseconds),
//! `kind`, the record's own fields, `prev` (the previous line's `hash`, or
//! the SHA-256 of the empty string for the first line) and `hash`: the hex
//! SHA-256 of the line's JSON without `hash`. An edited line no longer
//! matches its own hash; a removed, added or moved line breaks the `seq`
//! count or the `prev` link. A log that was closed cleanly ends
//! with a record of kind `end`; one without it was cut off (or its writer
//! was killed).
//!
//! What it does not do: a writer that can rewrite the whole file can
//! recompute every hash. Keep the log where the sandbox cannot reach (it is
//! written by hako, outside the boundary) and, for more, copy it away.

use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// The kind of the record a cleanly closed log ends with.
pub const END: &str = "end";

/// The hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut out = String::with_capacity(64);
    for b in digest {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// Why a log cannot be appended to or does not verify.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// An I/O error on the log file.
    #[error("audit log {path}: {source}")]
    Io {
        /// The log.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The log was tampered with (or is not an audit log): the first line
    /// that does not follow from the ones before it.
    #[error("audit log {path}: line {line}: {reason}")]
    Broken {
        /// The log.
        path: PathBuf,
        /// The first broken line, counting from 1.
        line: u64,
        /// What is wrong with it.
        reason: String,
    },
}

/// What [`verify`] found in a sound log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// Records, the closing one included.
    pub records: u64,
    /// Whether it ends with its closing record.
    pub closed: bool,
    /// The last line's hash: kept elsewhere, it also shows whole runs cut
    /// off the end of the log.
    pub head: String,
}

/// The hash of a record: of its JSON without `hash`.
fn record_hash(obj: &Map<String, Value>) -> String {
    let mut without = obj.clone();
    without.remove("hash");
    sha256_hex(Value::Object(without).to_string().as_bytes())
}

struct Tail {
    file: File,
    seq: u64,
    prev: String,
    ended: bool,
}

/// An audit log open for appending.
pub struct AuditLog {
    path: PathBuf,
    tail: Mutex<Tail>,
}

impl std::fmt::Debug for AuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditLog")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

impl AuditLog {
    /// Opens `path` for appending, creating it (mode 0600) if missing. An
    /// existing log must verify: its chain continues from its last line. A
    /// log closed before (ending with `end`) is continued after that
    /// record.
    pub fn open(path: &Path) -> Result<AuditLog, AuditError> {
        let io = |source| AuditError::Io {
            path: path.to_path_buf(),
            source,
        };
        let (seq, prev) = match std::fs::metadata(path) {
            Ok(_) => {
                let (_, seq, prev) = walk(path)?;
                (seq, prev)
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => (0, sha256_hex(b"")),
            Err(e) => return Err(io(e)),
        };
        let file = {
            use std::os::unix::fs::OpenOptionsExt;
            OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .open(path)
                .map_err(io)?
        };
        Ok(AuditLog {
            path: path.to_path_buf(),
            tail: Mutex::new(Tail {
                file,
                seq,
                prev,
                ended: false,
            }),
        })
    }

    /// Appends one record of `kind` with `fields` (an object; its `seq`,
    /// `at_ms`, `kind`, `prev` and `hash` keys, if any, are replaced) and
    /// flushes it.
    pub fn record(&self, kind: &str, fields: Value) -> Result<(), AuditError> {
        let io = |source| AuditError::Io {
            path: self.path.clone(),
            source,
        };
        let mut tail = self
            .tail
            .lock()
            .map_err(|_| io(io::Error::other("the audit log's lock is poisoned")))?;
        if tail.ended {
            return Err(io(io::Error::other("the audit log is closed")));
        }
        let mut obj = Map::new();
        obj.insert("seq".into(), Value::from(tail.seq + 1));
        obj.insert("at_ms".into(), Value::from(now_ms()));
        obj.insert("kind".into(), Value::from(kind));
        if let Value::Object(fields) = fields {
            for (k, v) in fields {
                if !matches!(k.as_str(), "seq" | "at_ms" | "kind" | "prev" | "hash") {
                    obj.insert(k, v);
                }
            }
        }
        obj.insert("prev".into(), Value::from(tail.prev.clone()));
        let hash = record_hash(&obj);
        obj.insert("hash".into(), Value::from(hash.clone()));
        let line = Value::Object(obj).to_string();
        let mut bytes = line.clone().into_bytes();
        bytes.push(b'\n');
        tail.file.write_all(&bytes).map_err(io)?;
        tail.file.flush().map_err(io)?;
        tail.seq += 1;
        tail.prev = hash;
        if kind == END {
            tail.ended = true;
        }
        Ok(())
    }

    /// Writes the closing record (idempotent).
    pub fn close(&self) -> Result<(), AuditError> {
        let ended = self.tail.lock().map(|t| t.ended).unwrap_or(true);
        if ended {
            return Ok(());
        }
        self.record(END, Value::Object(Map::new()))?;
        if let Ok(tail) = self.tail.lock() {
            let _ = tail.file.sync_all();
        }
        Ok(())
    }
}

impl Drop for AuditLog {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

/// Walks a log: every record, the next `seq` and the last hash. Checks
/// each line follows from the one before.
/// One record of a log.
pub type Record = Map<String, Value>;

fn walk(path: &Path) -> Result<(Vec<Record>, u64, String), AuditError> {
    let broken = |line: u64, reason: String| AuditError::Broken {
        path: path.to_path_buf(),
        line,
        reason,
    };
    let file = File::open(path).map_err(|source| AuditError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let mut reader = BufReader::new(file);
    let mut prev = sha256_hex(b"");
    let mut records = Vec::new();
    let mut n: u64 = 0;
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let got = reader
            .read_until(b'\n', &mut buf)
            .map_err(|source| AuditError::Io {
                path: path.to_path_buf(),
                source,
            })?;
        if got == 0 {
            break;
        }
        n += 1;
        if buf.last() != Some(&b'\n') {
            return Err(broken(
                n,
                "the line is cut off (the file was truncated)".into(),
            ));
        }
        buf.pop();
        let line =
            std::str::from_utf8(&buf).map_err(|_| broken(n, "the line is not UTF-8".into()))?;
        let value: Value = serde_json::from_str(line)
            .map_err(|e| broken(n, format!("the line is not a JSON record: {e}")))?;
        let Value::Object(obj) = value else {
            return Err(broken(n, "the line is not a JSON object".into()));
        };
        let hash = obj.get("hash").and_then(Value::as_str).unwrap_or("");
        if hash != record_hash(&obj) {
            return Err(broken(
                n,
                "the line does not match its own hash: it was edited".into(),
            ));
        }
        if obj.get("seq").and_then(Value::as_u64) != Some(n) {
            return Err(broken(
                n,
                format!(
                    "its seq is {} where {n} was due (a line was removed, added or moved)",
                    obj.get("seq")
                        .map(Value::to_string)
                        .unwrap_or_else(|| "missing".into())
                ),
            ));
        }
        if obj.get("prev").and_then(Value::as_str) != Some(prev.as_str()) {
            return Err(broken(
                n,
                "it does not follow the line before it (lines were removed, added or reordered, or the line before was rewritten whole)".into(),
            ));
        }
        prev = hash.to_string();
        records.push(obj);
    }
    Ok((records, n, prev))
}

/// Checks a whole log: `Err(Broken)` names the first line that does not
/// follow from those before it; a log whose last record is not `end` is
/// reported as cut off at the line after its last.
pub fn verify(path: &Path) -> Result<Verified, AuditError> {
    let (records, n, head) = walk(path)?;
    let closed = records
        .last()
        .and_then(|r| r.get("kind"))
        .and_then(Value::as_str)
        == Some(END);
    if !closed {
        return Err(AuditError::Broken {
            path: path.to_path_buf(),
            line: n + 1,
            reason: "the log ends without its closing record: lines were cut off the end, or the hako that wrote it was killed".into(),
        });
    }
    Ok(Verified {
        records: n,
        closed,
        head,
    })
}

/// Every record of a log, in order, after [`verify`]ing the chain (a log
/// without its closing record is shown too).
pub fn records(path: &Path) -> Result<Vec<Record>, AuditError> {
    walk(path).map(|(records, _, _)| records)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// A closed log of five records (four and `end`), and its lines.
    fn log() -> (tempfile::TempDir, PathBuf, Vec<String>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let log = AuditLog::open(&path).unwrap();
        for i in 0..4 {
            log.record(
                "exec",
                serde_json::json!({"argv": ["echo", i], "exit_code": 0}),
            )
            .unwrap();
        }
        drop(log);
        let lines = std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect();
        (dir, path, lines)
    }

    fn write(path: &Path, lines: &[String]) {
        let mut text = lines.join("\n");
        text.push('\n');
        std::fs::write(path, text).unwrap();
    }

    fn broken_at(path: &Path) -> (u64, String) {
        match verify(path) {
            Err(AuditError::Broken { line, reason, .. }) => (line, reason),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_sound_log_verifies_and_continues_after_reopening() {
        let (_dir, path, lines) = log();
        assert_eq!(lines.len(), 5);
        let v = verify(&path).unwrap();
        assert_eq!((v.records, v.closed), (5, true));
        let log = AuditLog::open(&path).unwrap();
        log.record("write", serde_json::json!({"path": "a", "size": 1}))
            .unwrap();
        drop(log);
        let v2 = verify(&path).unwrap();
        assert_eq!(v2.records, 7);
        assert_ne!(v.head, v2.head);
    }

    #[test]
    fn an_edited_line_is_named() {
        let (_dir, path, mut lines) = log();
        lines[2] = lines[2].replace("\"exit_code\":0", "\"exit_code\":1");
        write(&path, &lines);
        let (line, reason) = broken_at(&path);
        assert_eq!(line, 3, "{reason}");
        assert!(reason.contains("edited"), "{reason}");
        // Reopening a tampered log for appending is refused.
        assert!(matches!(
            AuditLog::open(&path),
            Err(AuditError::Broken { line: 3, .. })
        ));
    }

    #[test]
    fn an_edited_line_with_its_hash_recomputed_breaks_the_next_link() {
        let (_dir, path, mut lines) = log();
        let mut obj: Map<String, Value> = serde_json::from_str(&lines[1]).unwrap();
        obj.insert("exit_code".into(), Value::from(7));
        let hash = record_hash(&obj);
        obj.insert("hash".into(), Value::from(hash));
        lines[1] = Value::Object(obj).to_string();
        write(&path, &lines);
        assert_eq!(broken_at(&path).0, 3);
    }

    #[test]
    fn a_removed_line_is_named() {
        let (_dir, path, mut lines) = log();
        lines.remove(1);
        write(&path, &lines);
        let (line, reason) = broken_at(&path);
        assert_eq!(line, 2, "{reason}");
        assert!(reason.contains("seq"), "{reason}");
    }

    #[test]
    fn reordered_lines_are_named() {
        let (_dir, path, mut lines) = log();
        lines.swap(1, 2);
        write(&path, &lines);
        assert_eq!(broken_at(&path).0, 2);
    }

    #[test]
    fn a_truncated_log_is_named() {
        let (_dir, path, lines) = log();
        // Cut in the middle of the last line.
        let mut text = lines.join("\n");
        text.truncate(text.len() - 10);
        std::fs::write(&path, text).unwrap();
        let (line, reason) = broken_at(&path);
        assert_eq!(line, 5, "{reason}");
        // Whole lines cut off the end: no closing record.
        write(&path, &lines[..3]);
        let (line, reason) = broken_at(&path);
        assert_eq!(line, 4, "{reason}");
        assert!(reason.contains("closing record"), "{reason}");
    }

    #[test]
    fn a_line_that_is_not_a_record_is_named() {
        let (_dir, path, mut lines) = log();
        lines.insert(2, "not json".into());
        write(&path, &lines);
        assert_eq!(broken_at(&path).0, 3);
    }
}

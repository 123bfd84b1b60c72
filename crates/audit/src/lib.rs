//! The audit log: one JSON line per effect an agent caused through hako
//! (a command, a file operation, a policy refusal, a proxy decision), each
//! carrying the SHA-256 of the line before it, so that editing, removing,
//! reordering or cutting off lines is found by [`verify`].
//!
//! A line is a JSON object with, first, `seq` (1, 2, ...), `at_ms` (Unix
//! milliseconds), `kind`, then the record's own fields, and last `prev`:
//! the hex SHA-256 of the previous line's bytes (without its newline), or of
//! the empty string for the first line. A log that was closed cleanly ends
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
    /// `at_ms`, `kind` and `prev` keys, if any, are replaced) and flushes it.
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
                if !matches!(k.as_str(), "seq" | "at_ms" | "kind" | "prev") {
                    obj.insert(k, v);
                }
            }
        }
        obj.insert("prev".into(), Value::from(tail.prev.clone()));
        let line = serde_json::to_string(&Value::Object(obj))
            .map_err(|e| io(io::Error::other(e.to_string())))?;
        let mut bytes = line.clone().into_bytes();
        bytes.push(b'\n');
        tail.file.write_all(&bytes).map_err(io)?;
        tail.file.flush().map_err(io)?;
        tail.seq += 1;
        tail.prev = sha256_hex(line.as_bytes());
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
fn walk(path: &Path) -> Result<(Vec<Map<String, Value>>, u64, String), AuditError> {
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
                "its prev hash is not the hash of the line before (that line was edited, or lines were reordered)".into(),
            ));
        }
        prev = sha256_hex(line.as_bytes());
        records.push(obj);
    }
    Ok((records, n, prev))
}

/// Checks a whole log: `Err(Broken)` names the first line that does not
/// follow from those before it; a log whose last record is not `end` is
/// reported as cut off at the line after its last.
pub fn verify(path: &Path) -> Result<Verified, AuditError> {
    let (records, n, _) = walk(path)?;
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
    Ok(Verified { records: n, closed })
}

/// Every record of a log, in order, after [`verify`]ing the chain (a log
/// without its closing record is shown too).
pub fn records(path: &Path) -> Result<Vec<Map<String, Value>>, AuditError> {
    walk(path).map(|(records, _, _)| records)
}

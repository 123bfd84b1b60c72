//! The audit log: one JSON line per effect an agent caused through hako
//! (a command, a file operation, a policy refusal, a proxy decision), each
//! carrying the SHA-256 of the line before it, so that editing, removing,
//! reordering or cutting off lines is found by [`verify`].
//!
//! What is recorded is one typed [`Record`] per effect (see [`record`]),
//! built the same way by every front end and written with
//! [`AuditLog::write`].
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
//!
//! Where a log may live. hako writes it with the user's full rights, and
//! what it writes carries text chosen inside the sandbox (a command, a
//! host name the proxy refused), so [`AuditLog::open`] refuses:
//! - a path that resolves beneath a directory the sandbox can write (its
//!   workspace, a writable bind): a command inside could replace the log
//!   with a symbolic link between two runs and make hako append to any
//!   file the user can write;
//! - a symbolic link as the log itself (opened with `O_NOFOLLOW`, so no
//!   link is followed even if one appears after the checks);
//! - anything but a regular file with one link, owned by the user who runs
//!   hako (no FIFO, device, hard link to another file, or file planted by
//!   another user in a shared directory);
//! - a line longer than [`MAX_LINE`] while verifying (a log replaced by
//!   `/dev/zero` is refused, not read without bound).
//!
//! A log cut mid-line (hako killed while it wrote a record, a full disk)
//! is not refused for good, nor is the damage dropped: the next
//! [`AuditLog::open`] keeps the cut bytes where they are, ends their line,
//! and writes a record of kind [`CUT`] naming them (their line, length and
//! SHA-256, and the last whole record before them), chained from that
//! record; [`AuditLog::repaired`] tells the front end, which says so.
//! [`verify`] accepts a line that is not a record only when the `cut`
//! record right after it names exactly those bytes, and reports every
//! such cut in [`Verified::cuts`].

use std::fs;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

pub mod record;

pub use record::{
    is_refusal, Committed, Exec, Failure, File, FileOp, FrontEnd, Process, ProcessOp, Record,
    Review, ReviewOp, SandboxClosed, SandboxLost, SandboxOpened, Session, SessionOp,
    MAX_MESSAGE_CHARS,
};

/// A time in seconds since the epoch as UTC's calendar date and time of
/// day: `(year, month, day, hour, minute, second)` (proleptic Gregorian,
/// Howard Hinnant's civil-from-days). For the readable times the log's
/// readers and the front ends print.
pub fn utc_parts(secs: u64) -> (i64, i64, i64, u64, u64, u64) {
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day, rem / 3600, rem % 3600 / 60, rem % 60)
}

/// The kind of the record a cleanly closed log ends with.
pub const END: &str = "end";

/// The kind of the record that names a line cut by a crash (see the
/// crate's documentation).
pub const CUT: &str = "cut";

/// The longest line (without its newline) a log may hold. A record whose
/// line would be longer is written as a digest of its fields instead (see
/// [`AuditLog::record`]); a longer line read back is refused.
pub const MAX_LINE: usize = 1 << 20;

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
    /// The log's place or file is one hako will not write: what was
    /// refused and why.
    #[error("audit log {path}: refused: {reason}")]
    Refused {
        /// The log, as given.
        path: PathBuf,
        /// Why it was refused.
        reason: String,
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
    /// The lines cut by a crash and named by the `cut` record after each,
    /// in order: damage the chain survived, reported, never hidden.
    pub cuts: Vec<Cut>,
}

/// A line of the log cut by a crash of its writer: what was kept of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cut {
    /// The line of the file the cut bytes are on, counting from 1.
    pub line: u64,
    /// How many bytes of the record were written before the cut.
    pub bytes: u64,
    /// The hex SHA-256 of those bytes.
    pub sha256: String,
    /// The `seq` of the last whole record before the cut (0: none): the
    /// record after it was lost.
    pub after_seq: u64,
}

impl std::fmt::Display for Cut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "line {} holds {} bytes of a record cut off by a crash after record {} (sha256 {}); what that record said is lost",
            self.line, self.bytes, self.after_seq, self.sha256
        )
    }
}

/// A record's line and hash: the record with its `hash` added.
fn finish(mut obj: Line) -> (String, String) {
    // `obj` has no `hash` yet: its JSON is what `record_hash` hashes.
    let hash = sha256_hex(serde_json::to_string(&obj).unwrap_or_default().as_bytes());
    obj.insert("hash".into(), Value::from(hash.clone()));
    (Value::Object(obj).to_string(), hash)
}

/// The hash of a record: of its JSON without `hash`.
fn record_hash(obj: &Map<String, Value>) -> String {
    let mut without = obj.clone();
    without.remove("hash");
    sha256_hex(Value::Object(without).to_string().as_bytes())
}

struct Tail {
    file: fs::File,
    seq: u64,
    prev: String,
    ended: bool,
}

/// An audit log open for appending.
pub struct AuditLog {
    path: PathBuf,
    tail: Mutex<Tail>,
    repaired: Option<Cut>,
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
    /// record. A log whose last line was cut by a crash is continued
    /// after a [`CUT`] record that names the cut bytes (see
    /// [`AuditLog::repaired`]).
    ///
    /// `sandbox_writable` lists every directory the sandboxes this log
    /// records can write (their workspace and writable binds): a log that
    /// resolves beneath one of them is refused, and so is anything at
    /// `path` but a regular file with one link owned by this user (see the
    /// crate's documentation).
    pub fn open(path: &Path, sandbox_writable: &[PathBuf]) -> Result<AuditLog, AuditError> {
        let file = open_log_file(path, sandbox_writable)?;
        let walked = walk(path, BufReader::new(&file), false, true)?;
        let mut log = AuditLog {
            path: path.to_path_buf(),
            tail: Mutex::new(Tail {
                file,
                seq: walked.seq,
                prev: walked.prev,
                ended: false,
            }),
            repaired: None,
        };
        match walked.end {
            End::Clean => {}
            End::Unterminated => {
                // Cut just before its newline: the record is whole.
                log.append_after(b"\n", "", Map::new())?;
            }
            End::Fragment {
                line,
                bytes,
                terminated,
            } => {
                let cut = Cut {
                    line,
                    bytes: bytes.len() as u64,
                    sha256: sha256_hex(&bytes),
                    after_seq: walked.seq,
                };
                let mut fields = Map::new();
                fields.insert("cut_line".into(), Value::from(cut.line));
                fields.insert("cut_bytes".into(), Value::from(cut.bytes));
                fields.insert("cut_sha256".into(), Value::from(cut.sha256.clone()));
                fields.insert("cut_after_seq".into(), Value::from(cut.after_seq));
                fields.insert("note".into(), Value::from(cut.to_string()));
                let prefix: &[u8] = if terminated { b"" } else { b"\n" };
                log.append_after(prefix, CUT, fields)?;
                log.repaired = Some(cut);
            }
        }
        Ok(log)
    }

    /// The cut this open found at the end of the log and recorded (a
    /// [`CUT`] record), if any: a front end says so.
    pub fn repaired(&self) -> Option<&Cut> {
        self.repaired.as_ref()
    }

    /// Appends `record` and flushes it.
    pub fn write(&self, record: &Record) -> Result<(), AuditError> {
        self.append(record.kind(), record.fields())
    }

    /// Appends one record of `kind` with `fields` (its `seq`, `at_ms`,
    /// `kind`, `prev` and `hash` keys, if any, are replaced) and flushes
    /// it. A line longer than [`MAX_LINE`] is written as a digest of its
    /// fields.
    fn append(&self, kind: &str, fields: Map<String, Value>) -> Result<(), AuditError> {
        self.append_after(b"", kind, fields)
    }

    /// [`AuditLog::append`], its line written in one piece after `prefix`
    /// (the newline that ends a cut line). An empty `kind` writes the
    /// prefix alone.
    fn append_after(
        &self,
        prefix: &[u8],
        kind: &str,
        fields: Map<String, Value>,
    ) -> Result<(), AuditError> {
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
        if kind.is_empty() {
            tail.file.write_all(prefix).map_err(io)?;
            return tail.file.flush().map_err(io);
        }
        // What every record has; an oversized one keeps only this.
        let mut head = Map::new();
        head.insert("seq".into(), Value::from(tail.seq + 1));
        head.insert("at_ms".into(), Value::from(now_ms()));
        head.insert("kind".into(), Value::from(kind));
        head.insert("prev".into(), Value::from(tail.prev.clone()));
        let mut obj = head.clone();
        for (k, v) in fields {
            if !matches!(k.as_str(), "seq" | "at_ms" | "kind" | "prev" | "hash") {
                obj.insert(k, v);
            }
        }
        let (mut line, mut hash) = finish(obj);
        if line.len() > MAX_LINE {
            // Too long to be read back within the bound: the record keeps
            // its kind and a digest of what it would have said.
            let mut short = head;
            short.insert("oversized_bytes".into(), Value::from(line.len()));
            short.insert(
                "oversized_sha256".into(),
                Value::from(sha256_hex(line.as_bytes())),
            );
            (line, hash) = finish(short);
        }
        let mut bytes = prefix.to_vec();
        bytes.extend_from_slice(line.as_bytes());
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
        self.append(END, Map::new())?;
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

/// One line of a log, as read back: a JSON object, whatever the record
/// type that wrote it (a log written before [`Record`] reads the same).
pub type Line = Map<String, Value>;

/// Why hako will not write the log at `path`.
fn refused(path: &Path, reason: impl Into<String>) -> AuditError {
    AuditError::Refused {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// Opens the log file for reading and appending, after the checks
/// [`AuditLog::open`] lists. The directory is reached by its canonical
/// path: no component of it lies beneath a directory the sandbox can
/// write (that is what was checked), so nothing inside can swap one; the
/// file itself is opened relative to that directory without following a
/// link, and checked by its descriptor, not by its name.
fn open_log_file(path: &Path, sandbox_writable: &[PathBuf]) -> Result<fs::File, AuditError> {
    use rustix::fs::{Mode, OFlags};
    let io = |source: io::Error| AuditError::Io {
        path: path.to_path_buf(),
        source,
    };
    let Some(name) = path.file_name() else {
        return Err(refused(path, "the path names no file"));
    };
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let dir = std::fs::canonicalize(parent).map_err(io)?;
    if let Some(writable) =
        hako_fence::placement::writable_dir_holding(path, sandbox_writable).map_err(io)?
    {
        return Err(refused(
            path,
            format!(
                "it lies beneath {}, which the sandbox can write: a command inside could replace the log with a link and make hako write where it points; keep the log outside the workspace and every writable bind",
                writable.display()
            ),
        ));
    }
    let dirfd = rustix::fs::open(
        &dir,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io(e.into()))?;
    let fd = match rustix::fs::openat(
        &dirfd,
        name,
        OFlags::RDWR
            | OFlags::APPEND
            | OFlags::CREATE
            | OFlags::NOFOLLOW
            | OFlags::NONBLOCK
            | OFlags::NOCTTY
            | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    ) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::LOOP) => {
            return Err(refused(
                path,
                "it is a symbolic link; hako follows no link to its log",
            ))
        }
        Err(rustix::io::Errno::NXIO) => {
            return Err(refused(path, "it is not a regular file"));
        }
        Err(e) => return Err(io(e.into())),
    };
    let st = rustix::fs::fstat(&fd).map_err(|e| io(e.into()))?;
    let kind = rustix::fs::FileType::from_raw_mode(st.st_mode);
    if kind != rustix::fs::FileType::RegularFile {
        return Err(refused(
            path,
            format!("it is not a regular file but a {kind:?}"),
        ));
    }
    if st.st_nlink != 1 {
        return Err(refused(
            path,
            format!(
                "it has {} links: another name for it could be a file hako should not write",
                st.st_nlink
            ),
        ));
    }
    let me = rustix::process::geteuid().as_raw();
    if st.st_uid != me {
        return Err(refused(
            path,
            format!(
                "it is owned by uid {}, not by the user running hako (uid {me})",
                st.st_uid
            ),
        ));
    }
    // Blocking again: the flag was only so that opening a FIFO could not
    // hang before it was refused.
    let flags = rustix::fs::fcntl_getfl(&fd).map_err(|e| io(e.into()))?;
    rustix::fs::fcntl_setfl(&fd, flags - OFlags::NONBLOCK).map_err(|e| io(e.into()))?;
    Ok(fs::File::from(fd))
}

/// How a log's last line ends, as [`walk`] found it when cuts may be
/// repaired.
enum End {
    /// With its newline (or the log is empty).
    Clean,
    /// A whole record without its newline.
    Unterminated,
    /// Bytes that are no record, at the end, not yet named by a `cut`
    /// record; `terminated` when their line already has its newline.
    Fragment {
        line: u64,
        bytes: Vec<u8>,
        terminated: bool,
    },
}

/// What [`walk`] found.
struct Walked {
    records: Vec<Line>,
    /// The last record's `seq`.
    seq: u64,
    /// The last record's hash.
    prev: String,
    cuts: Vec<Cut>,
    end: End,
}

/// A line as a JSON object, or why it is none.
fn parse_line(bytes: &[u8]) -> Result<Map<String, Value>, String> {
    let line = std::str::from_utf8(bytes).map_err(|_| "the line is not UTF-8".to_string())?;
    let value: Value =
        serde_json::from_str(line).map_err(|e| format!("the line is not a JSON record: {e}"))?;
    match value {
        Value::Object(obj) => Ok(obj),
        _ => Err("the line is not a JSON object".into()),
    }
}

/// Walks a log: its records (when `keep`), the last `seq` and hash, and
/// the cuts named in it. Checks each record follows from the one before;
/// no line is read past [`MAX_LINE`]. A line that is no record is
/// accepted only when the next record is a `cut` that names its bytes;
/// with `repair` (opening to append), one at the very end is returned as
/// [`End::Fragment`] to be named, and a whole last record without its
/// newline as [`End::Unterminated`].
fn walk(
    path: &Path,
    mut reader: impl BufRead,
    keep: bool,
    repair: bool,
) -> Result<Walked, AuditError> {
    let broken = |line: u64, reason: String| AuditError::Broken {
        path: path.to_path_buf(),
        line,
        reason,
    };
    let mut prev = sha256_hex(b"");
    let mut records = Vec::new();
    let mut cuts = Vec::new();
    let mut seq: u64 = 0;
    let mut n: u64 = 0;
    let mut buf = Vec::new();
    // A line that was no record: (its line, its bytes, why).
    let mut pending: Option<(u64, Vec<u8>, String)> = None;
    let mut end = End::Clean;
    loop {
        buf.clear();
        let got = (&mut reader)
            .take(MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut buf)
            .map_err(|source| AuditError::Io {
                path: path.to_path_buf(),
                source,
            })?;
        if got == 0 {
            break;
        }
        n += 1;
        let terminated = buf.last() == Some(&b'\n');
        if terminated {
            buf.pop();
        } else if buf.len() > MAX_LINE {
            return Err(broken(
                n,
                format!("the line is longer than {MAX_LINE} bytes: this is not an audit log"),
            ));
        }
        let obj = match parse_line(&buf) {
            Ok(obj) => obj,
            Err(reason) => {
                if let Some((line, _, reason)) = pending {
                    return Err(broken(line, reason));
                }
                if !terminated {
                    if repair {
                        end = End::Fragment {
                            line: n,
                            bytes: std::mem::take(&mut buf),
                            terminated: false,
                        };
                        break;
                    }
                    return Err(broken(
                        n,
                        "the line is cut off (the file was truncated)".into(),
                    ));
                }
                pending = Some((n, std::mem::take(&mut buf), reason));
                continue;
            }
        };
        if !terminated && !repair {
            return Err(broken(
                n,
                "the line is cut off (the file was truncated)".into(),
            ));
        }
        let hash = obj.get("hash").and_then(Value::as_str).unwrap_or("");
        if hash != record_hash(&obj) {
            return Err(broken(
                n,
                "the line does not match its own hash: it was edited".into(),
            ));
        }
        if let Some((line, bytes, reason)) = pending.take() {
            // Only a `cut` record naming exactly these bytes, right after
            // them, makes them a cut rather than damage.
            let cut = Cut {
                line,
                bytes: bytes.len() as u64,
                sha256: sha256_hex(&bytes),
                after_seq: seq,
            };
            let names_it = obj.get("kind").and_then(Value::as_str) == Some(CUT)
                && obj.get("cut_line").and_then(Value::as_u64) == Some(cut.line)
                && obj.get("cut_bytes").and_then(Value::as_u64) == Some(cut.bytes)
                && obj.get("cut_sha256").and_then(Value::as_str) == Some(cut.sha256.as_str())
                && obj.get("cut_after_seq").and_then(Value::as_u64) == Some(cut.after_seq);
            if !names_it {
                return Err(broken(line, reason));
            }
            cuts.push(cut);
        }
        if obj.get("seq").and_then(Value::as_u64) != Some(seq + 1) {
            return Err(broken(
                n,
                format!(
                    "its seq is {} where {} was due (a line was removed, added or moved)",
                    obj.get("seq")
                        .map(Value::to_string)
                        .unwrap_or_else(|| "missing".into()),
                    seq + 1
                ),
            ));
        }
        if obj.get("prev").and_then(Value::as_str) != Some(prev.as_str()) {
            return Err(broken(
                n,
                "it does not follow the line before it (lines were removed, added or reordered, or the line before was rewritten whole)".into(),
            ));
        }
        seq += 1;
        prev = hash.to_string();
        if keep {
            records.push(obj);
        }
        if !terminated {
            end = End::Unterminated;
        }
    }
    if let Some((line, bytes, reason)) = pending {
        if !repair {
            return Err(broken(line, reason));
        }
        // Its line was ended, the record naming it never written.
        end = End::Fragment {
            line,
            bytes,
            terminated: true,
        };
    }
    Ok(Walked {
        records,
        seq,
        prev,
        cuts,
        end,
    })
}

/// Checks a whole log: `Err(Broken)` names the first line that does not
/// follow from those before it; a log whose last record is not `end` is
/// reported as cut off at the line after its last.
pub fn verify(path: &Path) -> Result<Verified, AuditError> {
    let walked = walk(path, open_for_reading(path)?, true, false)?;
    let (records, n, head) = (walked.records, walked.seq, walked.prev);
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
        cuts: walked.cuts,
    })
}

/// Every record of a log, in order, after [`verify`]ing the chain (a log
/// without its closing record is shown too).
pub fn records(path: &Path) -> Result<Vec<Line>, AuditError> {
    walk(path, open_for_reading(path)?, true, false).map(|w| w.records)
}

fn open_for_reading(path: &Path) -> Result<BufReader<fs::File>, AuditError> {
    fs::File::open(path)
        .map(BufReader::new)
        .map_err(|source| AuditError::Io {
            path: path.to_path_buf(),
            source,
        })
}

#[cfg(test)]
mod tests;

//! `hako audit`: checks and shows the audit logs `--audit FILE` writes.

use std::fmt::Write as _;
use std::io::Write as _;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use clap::{Args, Subcommand};
use hako_audit::AuditError;
use serde_json::Value;

use crate::exit;
use crate::show::{self, escaped, message};

/// Flags of `hako audit`.
#[derive(Debug, Args)]
pub struct AuditArgs {
    #[command(subcommand)]
    op: AuditOp,
}

#[derive(Debug, Subcommand)]
enum AuditOp {
    /// Check the hash chain: exits 1 and names the first broken line when a
    /// line was edited, removed, added, reordered or the file cut off.
    Verify {
        /// The log.
        file: PathBuf,
    },
    /// Print the log, one readable line per record.
    Show {
        /// The log.
        file: PathBuf,
        /// Print the records as JSON lines instead.
        #[arg(long)]
        json: bool,
    },
}

/// Runs `hako audit`.
pub fn run(args: AuditArgs) -> u8 {
    match args.op {
        AuditOp::Verify { file } => match hako_audit::verify(&file) {
            Ok(v) => {
                let damage = match v.cuts.len() {
                    0 => String::new(),
                    1 => ", 1 line cut by a crash (named by the cut record after it)".into(),
                    n => format!(
                        ", {n} lines cut by crashes (each named by the cut record after it)"
                    ),
                };
                println!(
                    "{}: {} records, chain intact{damage}, closed; head {}",
                    escaped(file.as_os_str().as_bytes()),
                    v.records,
                    v.head
                );
                for cut in &v.cuts {
                    println!("  damage: {cut}");
                }
                0
            }
            Err(e @ AuditError::Broken { .. }) => {
                println!("hako: {}", message(&e.to_string()));
                1
            }
            Err(e) => {
                eprintln!("hako: {}", message(&e.to_string()));
                exit::SANDBOX_FAILED
            }
        },
        AuditOp::Show { file, json } => {
            let records = match hako_audit::records(&file) {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("hako: {}", message(&e.to_string()));
                    return 1;
                }
            };
            let mut out = std::io::stdout().lock();
            for r in &records {
                let line = if json {
                    Value::Object(r.clone()).to_string()
                } else {
                    readable(r)
                };
                match writeln!(out, "{line}") {
                    Ok(()) => {}
                    // A closed pipe (`| head`) is the reader's choice.
                    Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return 0,
                    Err(e) => {
                        eprintln!("hako: write the records: {e}");
                        return exit::SANDBOX_FAILED;
                    }
                }
            }
            if let Err(e) = out.flush() {
                if e.kind() != std::io::ErrorKind::BrokenPipe {
                    eprintln!("hako: write the records: {e}");
                    return exit::SANDBOX_FAILED;
                }
                return 0;
            }
            drop(out);
            if let Err(e) = hako_audit::verify(&file) {
                eprintln!("hako: {}", message(&e.to_string()));
                return 1;
            }
            0
        }
    }
}

/// `seq  time  kind  field=value ...` (hashes and `null` fields left out),
/// one line whatever the record holds: its strings come from inside (a
/// command, a path, a guest's message), so each is shown escaped (see
/// [`show::escaped`]).
fn readable(r: &serde_json::Map<String, Value>) -> String {
    let seq = r.get("seq").and_then(Value::as_u64).unwrap_or(0);
    let at = r.get("at_ms").and_then(Value::as_u64).unwrap_or(0);
    let kind = r.get("kind").and_then(Value::as_str).unwrap_or("?");
    let kind = escaped(kind).to_string();
    let mut out = format!("{seq:>5}  {}  {kind:<8}", utc(at));
    for (k, v) in r {
        // A field that does not apply is `null` in the record (each kind
        // has the same fields whoever wrote it); shown, it is only noise.
        if matches!(k.as_str(), "seq" | "at_ms" | "kind" | "prev" | "hash") || v.is_null() {
            continue;
        }
        let _ = write!(out, " {}=", escaped(k));
        match v {
            Value::String(s) => {
                let _ = write!(out, "{}", escaped(s));
            }
            other => out.push_str(&inert_json(other)),
        }
    }
    out
}

/// `value` as compact JSON in which every character [`show::is_unsafe`]
/// names is a JSON escape (`\u009b`): the same value, still valid JSON,
/// and printable. (serde_json already escapes the C0 controls; DEL, the C1
/// and the bidi controls it writes as they are. Outside a string, JSON
/// text is ASCII, so every one found is inside a string.)
fn inert_json(value: &Value) -> String {
    let mut out = String::new();
    for c in value.to_string().chars() {
        if show::is_unsafe(c) {
            let _ = write!(out, "\\u{:04x}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    out
}

/// Milliseconds since the epoch as `YYYY-MM-DD HH:MM:SS.mmm` UTC.
fn utc(ms: u64) -> String {
    let (year, month, day, hour, minute, second) = hako_audit::utc_parts(ms / 1000);
    format!(
        "{year:04}-{month:02}-{day:02} {hour:02}:{minute:02}:{second:02}.{:03}",
        ms % 1000
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_print_as_utc() {
        assert_eq!(utc(0), "1970-01-01 00:00:00.000");
        assert_eq!(utc(1_795_987_755_966), "2026-11-29 21:29:15.966");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00.000");
    }

    fn record(fields: Value) -> serde_json::Map<String, Value> {
        let mut r = serde_json::Map::new();
        r.insert("seq".into(), 3.into());
        r.insert("at_ms".into(), 0.into());
        r.insert("kind".into(), "exec".into());
        if let Value::Object(fields) = fields {
            r.extend(fields);
        }
        r
    }

    #[test]
    fn a_record_whose_strings_hold_controls_is_one_printable_line() {
        let line = readable(&record(serde_json::json!({
            "tool": "run_command",
            "command": "true\x1b]0;pwned\x07\r\n    4  1970-01-01 00:00:00.000  exec     command=rm",
            "ke\ny": "v\u{9b}2J",
        })));
        assert!(!line.chars().any(show::is_unsafe), "{line:?}");
        assert_eq!(line.lines().count(), 1, "{line:?}");
        assert!(
            line.contains("command=true\\x1b]0;pwned\\x07\\r\\n    4"),
            "{line}"
        );
        assert!(line.contains(" ke\\ny=v\\u{9b}2J"), "{line}");
    }

    #[test]
    fn null_fields_are_left_out_and_the_others_kept() {
        let line = readable(&record(serde_json::json!({
            "tool": null,
            "exit_code": 0,
            "signal": null,
            "timed_out": false,
        })));
        assert!(
            line.contains(" exit_code=0") && line.contains(" timed_out=false"),
            "{line}"
        );
        assert!(!line.contains("tool") && !line.contains("signal"), "{line}");
    }

    #[test]
    fn json_values_keep_their_meaning_with_every_control_escaped() {
        let argv = serde_json::json!(["sh", "-c", "echo \"hi\"\u{9b}\u{202e}\u{7f}\x1b"]);
        let line = readable(&record(serde_json::json!({ "argv": argv })));
        assert!(!line.chars().any(show::is_unsafe), "{line:?}");
        let shown = line
            .split_once(" argv=")
            .map(|(_, v)| v)
            .unwrap_or_default();
        assert_eq!(
            shown,
            r#"["sh","-c","echo \"hi\"\u009b\u202e\u007f\u001b"]"#
        );
        let back: Value = serde_json::from_str(shown).unwrap_or_default();
        assert_eq!(back, argv);
    }
}

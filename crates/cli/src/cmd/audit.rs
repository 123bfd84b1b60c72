//! `hako audit`: checks and shows the audit logs `--audit FILE` writes.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use hako_audit::AuditError;
use serde_json::Value;

use crate::exit;

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
                println!(
                    "{}: {} records, chain intact, closed; head {}",
                    file.display(),
                    v.records,
                    v.head
                );
                0
            }
            Err(e @ AuditError::Broken { .. }) => {
                println!("hako: {e}");
                1
            }
            Err(e) => {
                eprintln!("hako: {e}");
                exit::SANDBOX_FAILED
            }
        },
        AuditOp::Show { file, json } => {
            let records = match hako_audit::records(&file) {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("hako: {e}");
                    return 1;
                }
            };
            for r in &records {
                if json {
                    println!("{}", Value::Object(r.clone()));
                } else {
                    println!("{}", readable(r));
                }
            }
            if let Err(e) = hako_audit::verify(&file) {
                eprintln!("hako: {e}");
                return 1;
            }
            0
        }
    }
}

/// `seq  time  kind  field=value ...` (hashes left out).
fn readable(r: &serde_json::Map<String, Value>) -> String {
    let seq = r.get("seq").and_then(Value::as_u64).unwrap_or(0);
    let at = r.get("at_ms").and_then(Value::as_u64).unwrap_or(0);
    let kind = r.get("kind").and_then(Value::as_str).unwrap_or("?");
    let mut out = format!("{seq:>5}  {}  {kind:<8}", utc(at));
    for (k, v) in r {
        if matches!(k.as_str(), "seq" | "at_ms" | "kind" | "prev") {
            continue;
        }
        let text = match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        out.push_str(&format!(" {k}={text}"));
    }
    out
}

/// Milliseconds since the epoch as `YYYY-MM-DD HH:MM:SS.mmm` UTC.
fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}.{:03}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
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
}

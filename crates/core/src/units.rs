//! Parsing of the durations and sizes the CLI and profiles accept.

use std::time::Duration;

/// A duration or size that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} {input:?}: {hint}")]
pub struct ParseUnitError {
    what: &'static str,
    input: String,
    hint: &'static str,
}

fn split_number(s: &str) -> Option<(u64, &str)> {
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let number = s[..end].parse().ok()?;
    Some((number, s[end..].trim()))
}

/// Parses `500ms`, `30s`, `2m`, `1h` (a bare number is seconds).
pub fn parse_duration(input: &str) -> Result<Duration, ParseUnitError> {
    let err = || ParseUnitError {
        what: "duration",
        input: input.to_string(),
        hint: "use a whole number with ms, s, m or h, e.g. 30s, 2m, 500ms",
    };
    let (n, unit) = split_number(input.trim()).ok_or_else(err)?;
    let millis = match unit {
        "ms" => Some(n),
        "" | "s" => n.checked_mul(1000),
        "m" => n.checked_mul(60_000),
        "h" => n.checked_mul(3_600_000),
        _ => None,
    }
    .ok_or_else(err)?;
    Ok(Duration::from_millis(millis))
}

/// Parses `512`, `512K`, `10M`, `1G` (binary multiples; `KiB`, `MB` and
/// friends are accepted too and also mean powers of 1024).
pub fn parse_size(input: &str) -> Result<u64, ParseUnitError> {
    let err = || ParseUnitError {
        what: "size",
        input: input.to_string(),
        hint: "use a whole number with an optional K, M or G suffix, e.g. 512K, 10M, 1G",
    };
    let (n, unit) = split_number(input.trim()).ok_or_else(err)?;
    let shift = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => return Err(err()),
    };
    n.checked_mul(1u64 << shift).ok_or_else(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
        for bad in ["", "s", "1.5s", "-1s", "3 days", "99999999999999999999h"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512K"), Ok(512 << 10));
        assert_eq!(parse_size("10M"), Ok(10 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("100"), Ok(100));
        assert_eq!(parse_size("4MiB"), Ok(4 << 20));
        for bad in ["", "M", "1.5M", "10X", "-1"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}

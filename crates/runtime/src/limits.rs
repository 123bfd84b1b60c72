//! The limit flags' values: parsed strictly and checked against the range
//! a sandbox can run in, when the flags are read, so that a bad value is
//! refused naming the flag and the form it takes, never found later as an
//! unrelated failure (`--memory 1` used to end as "hako-guest ended
//! without a reply", `--pids 0` as "cannot fork a supervisor").
//!
//! The minimums are what the guest and its supervisors need to run one
//! command: memory for pid 1, the zygote, a supervisor, a shell and the
//! command; processes for the same (and the forwarder, and a spare
//! supervisor); descriptors for a supervisor's channel, the command's
//! stdio and a pipe or two.

use std::time::Duration;

use hako_core::units;

/// The least `--memory`: 16 MiB.
pub const MIN_MEMORY: u64 = 16 << 20;
/// The least `--pids`.
pub const MIN_PIDS: u64 = 16;
/// The most `--pids` (the kernel's own ceiling, `PID_MAX_LIMIT`).
pub const MAX_PIDS: u64 = 4 << 20;
/// The least `--cpus`, in thousandths: 0.01, the smallest share a cgroup
/// quota takes.
pub const MIN_CPUS_MILLI: u64 = 10;
/// The most `--cpus`, in thousandths.
pub const MAX_CPUS_MILLI: u64 = 4096 * 1000;
/// The least `--max-open-files`.
pub const MIN_OPEN_FILES: u64 = 16;
/// The most `--max-open-files` (the kernel's default `nr_open`).
pub const MAX_OPEN_FILES: u64 = 1 << 20;
/// The least `--max-file-size`: one byte (zero would fail every write).
pub const MIN_FILE_SIZE: u64 = 1;
/// The most `--max-output` (kept in memory, for each of stdout and stderr).
pub const MAX_OUTPUT: u64 = 1 << 30;
/// The least `--timeout`.
pub const MIN_TIMEOUT: Duration = Duration::from_millis(1);
/// The most `--timeout`: a day, as `hako serve` and `hako mcp` allow.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
/// The least `--max-sessions` and `--max-processes`.
pub const MIN_HANDLES: u64 = 1;
/// The most `--max-sessions` and `--max-processes`.
pub const MAX_HANDLES: u64 = 4096;

/// How a size is written.
const SIZE_FORM: &str =
    "a number of bytes with an optional K, M, G or T suffix (binary: 1K = 1024), e.g. 512M, 2G";
/// How a count is written.
const COUNT_FORM: &str = "a whole number";
/// How a duration is written.
const DURATION_FORM: &str =
    "a whole number with ms, s, m or h (a bare number is seconds), e.g. 500ms, 30s, 2m";

/// A size as the flags take it: digits and an optional binary suffix
/// (`K`, `M`, `G`, `T`, any case, or `KiB`, `MiB`, `GiB`, `TiB`). `KB`,
/// `MB`, ... are refused: they mean powers of 1000 to some tools and of
/// 1024 to others, and a limit must not be a guess.
pub fn parse_size_strict(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(end);
    let bad = || format!("{s:?} is not a size; accepted: {SIZE_FORM}");
    if digits.is_empty() {
        return Err(bad());
    }
    let shift = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KIB" => 10,
        "M" | "MIB" => 20,
        "G" | "GIB" => 30,
        "T" | "TIB" => 40,
        u @ ("KB" | "MB" | "GB" | "TB") => {
            return Err(format!(
                "{s:?} is ambiguous ({u} is 1000-based to some tools, 1024-based to others); write {digits}{} for binary units; accepted: {SIZE_FORM}",
                &u[..1]
            ))
        }
        _ => return Err(bad()),
    };
    let n: u64 = digits.parse().map_err(|_| format!("{s:?} is too large"))?;
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// A size shown as the flags take it (`16M`), exact.
fn show_size(n: u64) -> String {
    for (shift, suffix) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
        if n >= 1 << shift && n % (1 << shift) == 0 {
            return format!("{}{suffix}", n >> shift);
        }
    }
    n.to_string()
}

fn count(s: &str) -> Result<u64, String> {
    s.trim()
        .parse::<u64>()
        .map_err(|_| format!("{s:?} is not a number; accepted: {COUNT_FORM}"))
}

/// `--memory`: at least [`MIN_MEMORY`].
pub fn check_memory(n: u64) -> Result<u64, String> {
    if n < MIN_MEMORY {
        return Err(format!(
            "{}: at least {} is needed for the guest and its supervisors; accepted: {SIZE_FORM}",
            show_size(n),
            show_size(MIN_MEMORY)
        ));
    }
    Ok(n)
}

/// `--pids`: from [`MIN_PIDS`] to [`MAX_PIDS`].
pub fn check_pids(n: u64) -> Result<u64, String> {
    if n < MIN_PIDS {
        return Err(format!(
            "{n}: at least {MIN_PIDS} is needed for the guest, its supervisors and one command; accepted: {COUNT_FORM} from {MIN_PIDS} to {MAX_PIDS}"
        ));
    }
    if n > MAX_PIDS {
        return Err(format!(
            "{n}: more than the kernel's {MAX_PIDS}; accepted: {COUNT_FORM} from {MIN_PIDS} to {MAX_PIDS}"
        ));
    }
    Ok(n)
}

/// `--cpus`, in thousandths: from [`MIN_CPUS_MILLI`] to [`MAX_CPUS_MILLI`].
pub fn check_cpus_milli(n: u64) -> Result<u64, String> {
    if !(MIN_CPUS_MILLI..=MAX_CPUS_MILLI).contains(&n) {
        return Err(format!(
            "{}: out of range; accepted: a number of CPUs from 0.01 to 4096, e.g. 0.5, 2",
            n as f64 / 1000.0
        ));
    }
    Ok(n)
}

/// `--max-open-files`: from [`MIN_OPEN_FILES`] to [`MAX_OPEN_FILES`].
pub fn check_open_files(n: u64) -> Result<u64, String> {
    if !(MIN_OPEN_FILES..=MAX_OPEN_FILES).contains(&n) {
        return Err(format!(
            "{n}: out of range (a command needs at least {MIN_OPEN_FILES} for its stdio and the guest's channel); accepted: {COUNT_FORM} from {MIN_OPEN_FILES} to {MAX_OPEN_FILES}"
        ));
    }
    Ok(n)
}

/// `--max-file-size`: at least [`MIN_FILE_SIZE`].
pub fn check_file_size(n: u64) -> Result<u64, String> {
    if n < MIN_FILE_SIZE {
        return Err(format!(
            "{n}: every write would fail; accepted: {SIZE_FORM}, at least 1"
        ));
    }
    Ok(n)
}

/// `--max-output`: at most [`MAX_OUTPUT`] (0 keeps nothing, counts all).
pub fn check_max_output(n: u64) -> Result<usize, String> {
    if n > MAX_OUTPUT {
        return Err(format!(
            "{}: more than {} is held in memory for each stream; accepted: {SIZE_FORM}, at most {}",
            show_size(n),
            show_size(MAX_OUTPUT),
            show_size(MAX_OUTPUT)
        ));
    }
    usize::try_from(n).map_err(|_| format!("{n} does not fit in memory"))
}

/// `--max-sessions` and `--max-processes`: from [`MIN_HANDLES`] to
/// [`MAX_HANDLES`].
pub fn check_handles(n: u64) -> Result<usize, String> {
    if !(MIN_HANDLES..=MAX_HANDLES).contains(&n) {
        return Err(format!(
            "{n}: out of range; accepted: {COUNT_FORM} from {MIN_HANDLES} to {MAX_HANDLES}"
        ));
    }
    usize::try_from(n).map_err(|_| format!("{n} does not fit in memory"))
}

/// `--timeout`: from [`MIN_TIMEOUT`] to [`MAX_TIMEOUT`].
pub fn check_timeout(d: Duration) -> Result<Duration, String> {
    if d < MIN_TIMEOUT || d > MAX_TIMEOUT {
        return Err(format!(
            "{} ms: out of range; accepted: {DURATION_FORM}, from 1ms to 24h",
            d.as_millis()
        ));
    }
    Ok(d)
}

/// `--memory SIZE`.
pub fn parse_memory(s: &str) -> Result<u64, String> {
    parse_size_strict(s).and_then(check_memory)
}

/// `--pids N`.
pub fn parse_pids(s: &str) -> Result<u64, String> {
    count(s).and_then(check_pids)
}

/// `--cpus N`, as thousandths of a CPU: `0.5` is 500.
pub fn parse_cpus(s: &str) -> Result<u64, String> {
    let cpus: f64 = s.trim().parse().map_err(|_| {
        format!("{s:?} is not a number of CPUs; accepted: a number from 0.01 to 4096, e.g. 0.5, 2")
    })?;
    if !cpus.is_finite() || cpus <= 0.0 || cpus > 4096.0 {
        return Err(format!(
            "{s}: out of range; accepted: a number of CPUs from 0.01 to 4096, e.g. 0.5, 2"
        ));
    }
    check_cpus_milli((cpus * 1000.0).round() as u64)
}

/// `--max-open-files N`.
pub fn parse_open_files(s: &str) -> Result<u64, String> {
    count(s).and_then(check_open_files)
}

/// `--max-file-size SIZE`.
pub fn parse_file_size(s: &str) -> Result<u64, String> {
    parse_size_strict(s).and_then(check_file_size)
}

/// `--max-output SIZE`.
pub fn parse_max_output(s: &str) -> Result<usize, String> {
    parse_size_strict(s).and_then(check_max_output)
}

/// `--max-sessions N`, `--max-processes N`.
pub fn parse_handles(s: &str) -> Result<usize, String> {
    count(s).and_then(check_handles)
}

/// `--timeout DUR`.
pub fn parse_timeout(s: &str) -> Result<Duration, String> {
    let d = units::parse_duration(s)
        .map_err(|_| format!("{s:?} is not a duration; accepted: {DURATION_FORM}"))?;
    check_timeout(d)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_memory_limit_of_one_byte_is_refused_naming_the_minimum_and_the_form() {
        let err = parse_memory("1").unwrap_err();
        assert!(err.contains("at least 16M"), "{err}");
        assert!(err.contains("K, M, G"), "{err}");
        assert_eq!(parse_memory("16M"), Ok(16 << 20));
        assert_eq!(parse_memory("1g"), Ok(1 << 30));
    }

    #[test]
    fn a_memory_limit_in_mb_is_refused_as_ambiguous() {
        let err = parse_memory("64MB").unwrap_err();
        assert!(err.contains("ambiguous") && err.contains("64M"), "{err}");
        assert_eq!(parse_memory("64MiB"), Ok(64 << 20));
        for bad in [
            "",
            "M",
            "1.5G",
            "-1G",
            "10X",
            "1 G B",
            "99999999999999999999",
        ] {
            assert!(parse_memory(bad).is_err(), "{bad:?}");
        }
        assert!(parse_size_strict("99999999999T").is_err());
    }

    #[test]
    fn a_pids_limit_of_zero_is_refused_naming_the_minimum() {
        let err = parse_pids("0").unwrap_err();
        assert!(err.contains("at least 16"), "{err}");
        assert!(parse_pids("15").is_err() && parse_pids("-1").is_err());
        assert!(parse_pids("5000000").is_err() && parse_pids("many").is_err());
        assert_eq!(parse_pids("16"), Ok(16));
    }

    #[test]
    fn a_cpu_share_of_zero_or_past_4096_is_refused() {
        for bad in ["0", "0.001", "-1", "4097", "NaN", "inf", "lots"] {
            assert!(parse_cpus(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_cpus("0.5"), Ok(500));
        assert_eq!(parse_cpus("0.01"), Ok(10));
    }

    #[test]
    fn an_open_files_limit_too_small_for_stdio_is_refused() {
        assert!(parse_open_files("3").unwrap_err().contains("at least 16"));
        assert!(parse_open_files("2000000").is_err());
        assert_eq!(parse_open_files("256"), Ok(256));
    }

    #[test]
    fn a_file_size_limit_of_zero_is_refused() {
        assert!(parse_file_size("0").is_err());
        assert!(parse_file_size("10MB").is_err());
        assert_eq!(parse_file_size("10M"), Ok(10 << 20));
    }

    #[test]
    fn an_output_cap_past_a_gibibyte_is_refused_and_zero_keeps_nothing() {
        assert!(parse_max_output("2G").is_err());
        assert_eq!(parse_max_output("0"), Ok(0));
        assert_eq!(parse_max_output("1M"), Ok(1 << 20));
    }

    #[test]
    fn a_timeout_of_zero_or_past_a_day_is_refused() {
        assert!(parse_timeout("0").is_err() && parse_timeout("0s").is_err());
        assert!(parse_timeout("25h").is_err() && parse_timeout("1.5s").is_err());
        assert_eq!(parse_timeout("500ms"), Ok(Duration::from_millis(500)));
    }

    #[test]
    fn session_and_process_bounds_are_at_least_one() {
        assert!(parse_handles("0").is_err() && parse_handles("5000").is_err());
        assert_eq!(parse_handles("8"), Ok(8));
    }
}

//! Output caps: each stream keeps at most the cap and counts the rest.

use hako_core::{Command, ExitStatus, Output};

use crate::check::{bytes_eq, run, Res};

const FLOOD: u64 = 50_000_000;
const CAP: usize = 1 << 20;

fn yes_pattern(len: usize) -> Vec<u8> {
    b"y\n".iter().copied().cycle().take(len).collect()
}

fn check_flood(out: &Output, flooded: &str) -> Res {
    ensure_eq!(out.status, ExitStatus::Code(0), "status of the flood");
    ensure!(!out.timed_out, "the flood timed out");
    let (kept, truncated, total, other, other_total) = match flooded {
        "stdout" => (
            &out.stdout,
            out.stdout_truncated,
            out.stdout_total,
            &out.stderr,
            out.stderr_total,
        ),
        _ => (
            &out.stderr,
            out.stderr_truncated,
            out.stderr_total,
            &out.stdout,
            out.stdout_total,
        ),
    };
    bytes_eq(
        kept,
        &yes_pattern(CAP),
        format!("{flooded} kept under a 1 MiB cap"),
    )?;
    ensure!(truncated, "{flooded} not marked truncated");
    ensure_eq!(total, FLOOD, "{flooded} total");
    bytes_eq(other, b"", "the other stream")?;
    ensure_eq!(other_total, 0, "the other stream's total");
    Ok(())
}

case! {
    /// 50 MB on stdout with a 1 MiB cap: exactly the first 1 MiB is kept,
    /// marked truncated, and all 50 000 000 bytes are counted.
    fn stdout_flood_is_capped_and_counted(h) {
        let out = run(h, &Command::shell(format!("yes | head -c {FLOOD}")).max_output(CAP))?;
        check_flood(&out, "stdout")?;
        ensure!(!out.stderr_truncated, "stderr marked truncated");
        Ok(())
    }
}

case! {
    /// The same flood on stderr.
    fn stderr_flood_is_capped_and_counted(h) {
        let out = run(h, &Command::shell(format!("yes | head -c {FLOOD} >&2")).max_output(CAP))?;
        check_flood(&out, "stderr")?;
        ensure!(!out.stdout_truncated, "stdout marked truncated");
        Ok(())
    }
}

case! {
    /// At the cap nothing is truncated; one byte over is; a cap of zero keeps
    /// nothing and still counts.
    fn output_at_or_under_the_cap_is_not_truncated(h) {
        let out = run(h, &Command::shell("printf abc; printf de >&2"))?;
        bytes_eq(&out.stdout, b"abc", "small stdout")?;
        bytes_eq(&out.stderr, b"de", "small stderr")?;
        ensure_eq!(
            (out.stdout_truncated, out.stderr_truncated, out.stdout_total, out.stderr_total),
            (false, false, 3, 2),
            "small output (truncated, truncated, total, total)"
        );
        for (script, cap, kept, truncated, total) in [
            ("printf 0123456789", 10, &b"0123456789"[..], false, 10u64),
            ("printf 0123456789X", 10, &b"0123456789"[..], true, 11),
            ("printf 012345678", 10, &b"012345678"[..], false, 9),
            ("printf x", 0, &b""[..], true, 1),
            ("true", 0, &b""[..], false, 0),
        ] {
            for stream in ["stdout", "stderr"] {
                let script = if stream == "stderr" { format!("{script} >&2") } else { script.to_string() };
                let out = run(h, &Command::shell(&script).max_output(cap))?;
                let (got, got_truncated, got_total) = if stream == "stdout" {
                    (&out.stdout, out.stdout_truncated, out.stdout_total)
                } else {
                    (&out.stderr, out.stderr_truncated, out.stderr_total)
                };
                bytes_eq(got, kept, format!("{stream} of {script:?} with cap {cap}"))?;
                ensure_eq!(
                    (got_truncated, got_total),
                    (truncated, total),
                    "{stream} of {script:?} with cap {cap} (truncated, total)"
                );
            }
        }
        Ok(())
    }
}

/// Ten GiB: more than hako could ever hold, and more than a 32-bit count.
const HUGE_FLOOD: u64 = 10 << 30;

case! {
    /// 10 GiB on stdout, as fast as a command can write, with the default
    /// cap: the caller keeps the cap and counts all of it exactly, nothing
    /// crashes, and the sandbox goes on.
    fn a_ten_gib_output_flood_is_capped_and_counted_exactly(h) {
        // In writes of a MiB: the writer's own cost is not what is tested
        // (busybox's `head -c` writes a few KiB at a time).
        let out = run(h, &Command::shell(format!("dd if=/dev/zero bs=1M count={} 2>/dev/null", HUGE_FLOOD >> 20)))?;
        ensure_eq!(out.status, ExitStatus::Code(0), "status of the flood");
        ensure!(!out.timed_out, "the flood timed out");
        ensure!(out.stdout_truncated, "stdout not marked truncated");
        ensure_eq!(out.stdout.len(), hako_core::DEFAULT_MAX_OUTPUT, "bytes kept");
        ensure!(out.stdout.iter().all(|&b| b == 0), "the bytes kept are not the command's");
        ensure_eq!(out.stdout_total, HUGE_FLOOD, "stdout total");
        crate::check::still_works(h, "a 10 GiB flood")
    }
}

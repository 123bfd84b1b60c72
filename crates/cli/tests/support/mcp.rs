//! What the tests of `hako mcp` share: whether a Python MCP client and
//! the guest binary are there.

use std::path::Path;
use std::process::Command;

fn must_work() -> bool {
    std::env::var_os("HAKO_MUST_WORK").is_some_and(|v| v == "1")
}

/// Skips (returns `false`) with `reason` printed, or fails under
/// `HAKO_MUST_WORK=1`.
pub fn skip(reason: &str) -> bool {
    assert!(!must_work(), "{reason} and HAKO_MUST_WORK=1");
    eprintln!("SKIPPED: {reason}");
    false
}

/// The Python that runs the clients: the test virtualenv's
/// (`HAKO_TEST_PYTHON`, set by the test command), else `python3`.
pub fn python() -> Command {
    Command::new(std::env::var_os("HAKO_TEST_PYTHON").unwrap_or_else(|| "python3".into()))
}

/// Whether `python3` has the `mcp` package and `hako-guest` is beside
/// `hako` (the server runs under tokio, so it starts the guest binary);
/// prints why not.
pub fn client_and_guest_ready() -> bool {
    let python = python().args(["-c", "import mcp"]).output();
    match python {
        Err(e) => return skip(&format!("python3 cannot run ({e})")),
        Ok(out) if !out.status.success() => {
            return skip(&format!(
                "the Python mcp package is missing (the test command installs it into its virtualenv, HAKO_TEST_PYTHON): {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
        Ok(_) => {}
    }
    let guest = Path::new(env!("CARGO_BIN_EXE_hako")).with_file_name("hako-guest");
    if std::env::var_os("HAKO_GUEST").is_none() && !guest.is_file() {
        return skip(&format!(
            "{} is missing; run `cargo build --workspace` first",
            guest.display()
        ));
    }
    true
}

//! Exit codes, as the container tools use them.

use hako_core::{Error, Output};

/// The command timed out.
pub const TIMED_OUT: u8 = 124;
/// The sandbox itself failed, or the policy refused the run.
pub const SANDBOX_FAILED: u8 = 125;
/// The command was found but cannot be executed.
pub const CANNOT_EXECUTE: u8 = 126;
/// The command was not found.
pub const NOT_FOUND: u8 = 127;
/// A file operation was refused or failed (`hako fs`).
pub const FS_FAILED: u8 = 1;

/// What `hako run` says on stderr of a command the
/// sandbox's memory limit killed (its exit code stays 137, `SIGKILL`'s).
pub const OOM_KILLED_MESSAGE: &str = "killed by the sandbox's memory limit (--memory): the command used more memory than it allows, and only this command was killed. Running it again will be killed again: give it a larger --memory, or make it use less";
/// A review command refused (`hako commit`: nothing was written; `hako
/// diff`/`discard`: a path named has no change, or cannot be discarded
/// alone).
pub const REVIEW_REFUSED: u8 = 1;
/// `hako commit` stopped part-way: some changes were applied (each
/// entry whole), the rest not; it says which.
pub const COMMIT_PARTIAL: u8 = 3;

/// The exit code for a command that ran.
pub fn for_output(output: &Output) -> u8 {
    if output.timed_out {
        return TIMED_OUT;
    }
    u8::try_from(output.status.shell_code() & 0xff).unwrap_or(SANDBOX_FAILED)
}

/// The exit code for a command that did not run.
pub fn for_error(error: &Error) -> u8 {
    match error {
        Error::CommandNotFound { .. } => NOT_FOUND,
        Error::CannotExecute { .. } => CANNOT_EXECUTE,
        _ => SANDBOX_FAILED,
    }
}

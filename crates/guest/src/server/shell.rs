//! What the guest says to a session's shell and reads back: the shell to
//! run, its first line (it reports its pid), the line that runs a script
//! in the shell itself and then reports its status, and the status lines,
//! each marked with a nonce no script can guess.

use crate::GuestError;

/// The shell a session runs: the one asked for, or (`None`) `bash
/// --noprofile --norc` where there is one, else `sh`.
pub(super) fn shell(
    asked: Option<Vec<String>>,
    bash_exists: bool,
) -> Result<Vec<String>, GuestError> {
    match asked {
        Some(shell) if shell.first().is_some_and(|p| !p.is_empty()) => Ok(shell),
        Some(_) => Err(GuestError::EmptyShell),
        None if bash_exists => Ok(vec![
            "/bin/bash".into(),
            "--noprofile".into(),
            "--norc".into(),
        ]),
        None => Ok(vec!["/bin/sh".into()]),
    }
}

/// The shell's first line: it reports its own pid, marked with `nonce`.
pub(super) fn hello_line(nonce: &str) -> String {
    format!("printf '%s %d\\n' {nonce} \"$$\" >&3\n")
}

/// The line that runs `script` in the shell itself (so `cd`, `export`,
/// functions and jobs persist), reading nothing of the shell's own input
/// and without the status descriptor; then the shell reports the status
/// with the command's `nonce` on descriptor 3.
pub(super) fn script_line(script: &str, nonce: &str) -> String {
    let quoted = script.replace('\'', "'\\''");
    // `command eval`: a syntax error in the script fails the command, not
    // the shell (POSIX lets a non-interactive shell exit on a syntax error
    // in the special builtin `eval`; busybox ash does).
    format!("command eval '{quoted}' </dev/null 3>&-; printf '%s %d\\n' {nonce} \"$?\" >&3\n")
}

/// A status line (without its newline): a nonce and a number, one space
/// apart; anything else is not a status.
pub(super) fn status_line(line: &[u8]) -> Option<(String, i32)> {
    let line = String::from_utf8_lossy(line);
    let mut words = line.split(' ');
    let (Some(nonce), Some(value), None) = (words.next(), words.next(), words.next()) else {
        return None;
    };
    let value = value.parse::<i32>().ok()?;
    Some((nonce.to_string(), value))
}

/// 128 random bits as hex, from the kernel.
pub(super) fn nonce() -> String {
    let mut bytes = [0u8; 16];
    let filled = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes));
    if filled.is_err() {
        // No /dev/urandom: the clock and the pid still make it unique.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        bytes = (t ^ u128::from(std::process::id())).to_le_bytes();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shell_asked_for_is_used_and_an_empty_one_refused() {
        let asked = vec!["/bin/zsh".to_string(), "-f".to_string()];
        assert_eq!(shell(Some(asked.clone()), true).unwrap(), asked);
        assert!(matches!(
            shell(Some(vec![]), true),
            Err(GuestError::EmptyShell)
        ));
        assert!(matches!(
            shell(Some(vec![String::new()]), true),
            Err(GuestError::EmptyShell)
        ));
    }

    #[test]
    fn the_default_shell_is_bash_without_its_startup_files_else_sh() {
        assert_eq!(
            shell(None, true).unwrap(),
            ["/bin/bash", "--noprofile", "--norc"]
        );
        assert_eq!(shell(None, false).unwrap(), ["/bin/sh"]);
    }

    #[test]
    fn a_script_is_quoted_whole_for_eval() {
        let line = script_line("echo 'it''s' \"$HOME\"; cd /tmp", "N");
        assert_eq!(
            line,
            "command eval 'echo '\\''it'\\'''\\''s'\\'' \"$HOME\"; cd /tmp' </dev/null 3>&-; \
             printf '%s %d\\n' N \"$?\" >&3\n"
        );
        assert_eq!(line.matches('\n').count(), 1, "one line");
    }

    #[test]
    fn a_script_and_the_shells_first_line_report_on_descriptor_3() {
        assert_eq!(hello_line("H"), "printf '%s %d\\n' H \"$$\" >&3\n");
        assert!(script_line("true", "N").ends_with("N \"$?\" >&3\n"));
    }

    #[test]
    fn a_status_line_is_a_nonce_and_a_number() {
        assert_eq!(status_line(b"abc 0"), Some(("abc".into(), 0)));
        assert_eq!(status_line(b"abc -1"), Some(("abc".into(), -1)));
        assert_eq!(status_line(b"abc 4242"), Some(("abc".into(), 4242)));
    }

    #[test]
    fn anything_else_on_descriptor_3_is_not_a_status() {
        for line in [
            &b""[..],
            b"abc",
            b"abc 1 2",
            b"abc x",
            b"abc  1",
            b"abc 99999999999",
        ] {
            assert_eq!(status_line(line), None, "{line:?}");
        }
    }

    #[test]
    fn nonces_are_128_bits_of_hex_and_differ() {
        let (a, b) = (nonce(), nonce());
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}

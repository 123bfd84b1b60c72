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

/// Set while a session's script runs: what the `SIGINT` trap checks.
const RUNNING_VAR: &str = "__hako_running";
/// The script's status, kept until it is reported.
const STATUS_VAR: &str = "__hako_status";
/// The descriptor the shell reads the script from.
const SCRIPT_FD: u8 = 9;

/// The lines that run `script` in the shell itself (so `cd`, `export`,
/// variables, functions, positional parameters and jobs persist), reading
/// nothing of the shell's own input and without the status descriptor;
/// then the shell reports the status with the command's `nonce` on
/// descriptor 3.
///
/// The script is a here-document the shell reads as a dot script
/// (`command .`: a syntax error in it fails the command, not the shell),
/// ended by a line only the guest knows (the nonce), with a `SIGINT` trap
/// that returns from it: at the command's deadline the guest stops the
/// shell, sends it `SIGINT`, kills what it started and continues it, and
/// the shell returns from the script at once, running nothing after the
/// command the deadline cut short (`sleep 5; touch after` never touches
/// `after`), yet keeps its state. The trap returns only while the script
/// runs (the variable [`RUNNING_VAR`], set by the script's first line and
/// cleared by its last, which returns the script's status): a late
/// signal, between commands, changes
/// nothing, and between commands the shell ignores `SIGINT`. (A deadline
/// that falls inside a function the script itself defined returns from
/// that function only, and the rest of the script runs: POSIX shells offer
/// no way out of every function at once.)
pub(super) fn script_line(script: &str, nonce: &str) -> String {
    let end = format!("HAKO_END_{nonce}");
    let newline = if script.ends_with('\n') { "" } else { "\n" };
    format!(
        "trap 'if [ -n \"${RUNNING_VAR}\" ]; then {RUNNING_VAR}=; return 130; fi' INT; \
         command . /dev/fd/{SCRIPT_FD} {SCRIPT_FD}<<'{end}' </dev/null 3>&-; \
         {STATUS_VAR}=$?; {RUNNING_VAR}=; trap '' INT; printf '%s %d\\n' {nonce} \"${STATUS_VAR}\" >&3\n\
         {RUNNING_VAR}=1\n{script}{newline}{STATUS_VAR}=$?; {RUNNING_VAR}=; return \"${STATUS_VAR}\"\n{end}\n"
    )
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
    fn a_script_is_carried_whole_in_a_here_document_ended_by_the_nonce() {
        let script = "echo 'it''s' \"$HOME\"\ncd /tmp";
        let lines = script_line(script, "N");
        let lines: Vec<&str> = lines.lines().collect();
        assert!(lines[0].contains("9<<'HAKO_END_N'"), "{}", lines[0]);
        assert_eq!(
            lines[1..],
            [
                "__hako_running=1",
                "echo 'it''s' \"$HOME\"",
                "cd /tmp",
                "__hako_status=$?; __hako_running=; return \"$__hako_status\"",
                "HAKO_END_N"
            ]
        );
        assert!(script_line("true\n", "N").contains("\ntrue\n__hako_status=$?;"));
    }

    #[test]
    fn a_script_and_the_shells_first_line_report_on_descriptor_3() {
        assert_eq!(hello_line("H"), "printf '%s %d\\n' H \"$$\" >&3\n");
        let line = script_line("true", "N");
        assert!(
            line.lines()
                .next()
                .unwrap()
                .ends_with("N \"$__hako_status\" >&3"),
            "{line}"
        );
    }

    /// The shells a session may run, those on this host.
    fn shells() -> Vec<Vec<&'static str>> {
        [
            vec!["/bin/sh"],
            vec!["/bin/bash", "--noprofile", "--norc"],
            vec!["/bin/dash"],
            vec!["/bin/busybox", "sh"],
        ]
        .into_iter()
        .filter(|argv| std::path::Path::new(argv[0]).exists())
        .collect()
    }

    /// What the guest does at a session command's deadline, done to a
    /// real shell: nothing after the command runs, and the shell goes on
    /// with its state.
    #[test]
    fn a_command_cut_by_its_deadline_ends_its_line_in_every_shell() {
        use hako_sys::rustix::process::{kill_process, Pid, Signal};
        use std::io::{BufRead, BufReader, Write};
        use std::process::{Command, Stdio};
        fn line(from: &mut impl BufRead) -> String {
            let mut l = String::new();
            from.read_line(&mut l).unwrap();
            l
        }
        // As the guest does where its process tree starts: a test run as a
        // shell's background job inherits SIGINT ignored, which the shells
        // started here would keep, and a shell cannot trap.
        hako_sys::signal::restore_ignored_signals().unwrap();
        let shells = shells();
        assert!(!shells.is_empty(), "no shell here");
        for argv in shells {
            let dir = tempfile::tempdir().unwrap();
            let mut child = Command::new(argv[0])
                .args(&argv[1..])
                .current_dir(dir.path())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let shell = Pid::from_child(&child);
            let mut to = child.stdin.take().unwrap();
            let mut from = BufReader::new(child.stdout.take().unwrap());
            // Descriptor 3 is stdout here: the status comes with the output.
            writeln!(to, "exec 3>&1; KEEP=kept").unwrap();
            for script in [
                "echo started; sleep 30; touch after1",
                "echo started; sleep 30 && touch after2",
                "echo started\nsleep 30\ntouch after3",
                "echo started; (sleep 30); touch after4",
                "echo started; while :; do :; done; echo > after5",
            ] {
                to.write_all(script_line(script, "N").as_bytes()).unwrap();
                to.flush().unwrap();
                assert_eq!(line(&mut from), "started\n", "{argv:?}: {script}");
                // As the guest does at the deadline (session.rs).
                kill_process(shell, Signal::STOP).unwrap();
                kill_process(shell, Signal::INT).unwrap();
                for pid in hako_sys::proc::children_of(shell).unwrap() {
                    let _ = kill_process(pid, Signal::KILL);
                }
                kill_process(shell, Signal::CONT).unwrap();
                assert_eq!(line(&mut from), "N 130\n", "{argv:?}: {script}");
            }
            // State carries over, positional parameters too, and a syntax
            // error fails the command, not the shell.
            for (script, want) in [
                ("set -- one two; G=global; f() { echo \"f $1\"; }", ""),
                ("f \"$2\"; echo \"$1 $G\"", "f two\none global\n"),
                ("if then", ""),
                ("echo out; (exit 7)", "out\n"),
            ] {
                to.write_all(script_line(script, "S").as_bytes()).unwrap();
                to.flush().unwrap();
                let mut got = String::new();
                let status = loop {
                    let l = line(&mut from);
                    match l.strip_prefix("S ") {
                        Some(status) => break status.trim().to_string(),
                        None => got.push_str(&l),
                    }
                };
                assert_eq!(got, want, "{argv:?}: {script}");
                let want_status = match script {
                    "if then" => "2",
                    "echo out; (exit 7)" => "7",
                    _ => "0",
                };
                if script == "if then" {
                    assert_ne!(status, "0", "{argv:?}: {script}");
                } else {
                    assert_eq!(status, want_status, "{argv:?}: {script}");
                }
            }
            // A late signal, between commands, changes nothing.
            kill_process(shell, Signal::INT).unwrap();
            to.write_all(script_line("echo $KEEP; ls", "M").as_bytes())
                .unwrap();
            to.flush().unwrap();
            assert_eq!(line(&mut from), "kept\n", "{argv:?}");
            assert_eq!(line(&mut from), "M 0\n", "{argv:?}: a file was created");
            drop(to);
            assert!(child.wait().unwrap().success(), "{argv:?}");
        }
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

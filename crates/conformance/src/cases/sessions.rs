//! Stateful shell sessions: state carries over, output and status are
//! delimited exactly, deadlines leave the session usable, sessions are
//! independent, and closing one kills what it started.

use std::time::Duration;

use hako_core::{Command, Error, ExitStatus, Output, Sandbox, SessionId, SessionOptions, Sessions};

use crate::check::{show, Ctx, Res};
use crate::procs::sandbox_processes_with_arg;
use crate::Outcome;

/// The sessions of a sandbox that must offer them.
fn sessions(sb: &dyn Sandbox) -> Res<&dyn Sessions> {
    match sb.sessions() {
        Some(s) => Ok(s),
        None => Err(Outcome::Skipped(format!(
            "the {} backend offers no sessions",
            sb.capabilities().backend
        ))),
    }
}

/// Runs `script` in `session` and checks it exited 0; returns its stdout.
fn run(s: &dyn Sessions, session: SessionId, script: &str) -> Res<String> {
    let out = s
        .session_exec(session, &Command::shell(script), None)
        .ctx(format!("session exec {script:?}"))?;
    ensure!(
        out.status == ExitStatus::Code(0),
        "{script:?} exited {:?}; stdout {} stderr {}",
        out.status,
        show(&out.stdout),
        show(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn exec(s: &dyn Sessions, session: SessionId, script: &str) -> Res<Output> {
    s.session_exec(session, &Command::shell(script), None)
        .ctx(format!("session exec {script:?}"))
}

case! {
    /// Successive commands in a session share the working directory,
    /// exported and plain variables, functions, options and background
    /// jobs, as in a terminal.
    fn session_keeps_cwd_variables_functions_and_jobs(h) {
        let sb = h.sandbox();
        let s = sessions(sb)?;
        let id = s
            .open_session(&SessionOptions {
                env: vec![("GREETING".into(), "hello".into())],
                ..SessionOptions::default()
            })
            .ctx("open a session")?;
        run(s, id, "mkdir -p sub/deeper && cd sub")?;
        let pwd = run(s, id, "pwd")?;
        ensure!(pwd.trim_end().ends_with("/sub"), "pwd after cd sub: {pwd:?}");
        run(s, id, "cd deeper")?;
        ensure!(run(s, id, "pwd")?.trim_end().ends_with("/sub/deeper"), "cd is relative to the last one");
        run(s, id, "export X=1")?;
        ensure_eq!(run(s, id, "echo $X")?, "1\n", "an exported variable");
        ensure_eq!(run(s, id, "sh -c 'echo $X'")?, "1\n", "an exported variable reaches child processes");
        run(s, id, "Y=two")?;
        ensure_eq!(run(s, id, "echo $Y")?, "two\n", "a shell variable");
        run(s, id, "greet() { echo \"$GREETING, $1\"; }")?;
        ensure_eq!(run(s, id, "greet world")?, "hello, world\n", "a function and the session's env");
        let m = h.marker();
        let pid = run(s, id, &format!("sleep {m} & echo $!"))?;
        // `jobs -p`: busybox's `jobs` does not show the command's text.
        let jobs = run(s, id, "jobs -p")?;
        ensure!(
            !pid.trim().is_empty() && jobs.lines().any(|l| l.trim() == pid.trim()),
            "the background job {pid:?} is not listed by `jobs -p`: {jobs:?}"
        );
        ensure_eq!(run(s, id, "kill %1; wait; echo done")?, "done\n", "waiting for the job");
        s.close_session(id).ctx("close the session")?;
        Ok(())
    }
}

case! {
    /// Whatever a command prints (text that looks like a status line, no
    /// final newline, binary, both streams) is its output, and its exit
    /// status is its own.
    fn session_output_and_status_are_delimited_exactly(h) {
        let sb = h.sandbox();
        let s = sessions(sb)?;
        let id = s.open_session(&SessionOptions::default()).ctx("open a session")?;
        let out = exec(s, id, "printf 'no newline'")?;
        ensure_eq!(show(&out.stdout), show(b"no newline"), "output without a final newline");
        let out = exec(s, id, "echo out; echo err >&2; (exit 7)")?;
        ensure_eq!(out.status, ExitStatus::Code(7), "the status of the last command");
        ensure_eq!(show(&out.stdout), show(b"out\n"), "stdout");
        ensure_eq!(show(&out.stderr), show(b"err\n"), "stderr");
        // Lines shaped like a status report, on both streams and on fd 3.
        let fake = "printf '%s 0\\n' 0123456789abcdef0123456789abcdef; echo 'x 0' >&2; echo 0 >&3; false";
        let out = exec(s, id, fake)?;
        ensure!(out.status != ExitStatus::Code(0), "a fake status line ended the command as successful: {out:?}");
        ensure!(show(&out.stdout).contains("0123456789abcdef"), "the fake line is output: {}", show(&out.stdout));
        let out = exec(s, id, "head -c 256 /dev/zero | tr '\\0' '\\377'")?;
        ensure_eq!(out.stdout, vec![0xffu8; 256], "binary output");
        let out = exec(s, id, "cat; echo after")?;
        ensure_eq!(show(&out.stdout), show(b"after\n"), "a command's stdin is empty, not the session's");
        let out = exec(s, id, "echo 'unterminated")?;
        ensure!(out.status != ExitStatus::Code(0), "a syntax error is the command's failure: {out:?}");
        ensure_eq!(run(s, id, "echo still here")?, "still here\n", "the session after a syntax error");
        s.close_session(id).ctx("close the session")?;
        Ok(())
    }
}

case! {
    /// A command's deadline kills what it started and says so; the session
    /// and its state stay.
    fn session_timeout_kills_the_command_and_the_session_goes_on(h) {
        let sb = h.sandbox();
        let s = sessions(sb)?;
        let id = s.open_session(&SessionOptions::default()).ctx("open a session")?;
        run(s, id, "KEEP=kept")?;
        let m = h.marker();
        let out = s
            .session_exec(
                id,
                &Command::shell(format!("echo started; sleep {m}")).timeout(Duration::from_millis(500)),
                None,
            )
            .ctx("a command past its deadline")?;
        ensure!(out.timed_out, "the result does not say timed out: {out:?}");
        ensure_eq!(show(&out.stdout), show(b"started\n"), "output before the deadline");
        let left = sandbox_processes_with_arg(sb, &m).ctx("scan /proc inside")?;
        ensure!(left.is_empty(), "the command survived its deadline: {left:?}");
        ensure_eq!(run(s, id, "echo $KEEP")?, "kept\n", "the session's state after a timeout");
        s.close_session(id).ctx("close the session")?;
        Ok(())
    }
}

case! {
    /// A command past its deadline ends its line: nothing after it runs
    /// (`sleep; touch after` never touches `after`, whether the rest
    /// follows `;`, `&&`, a newline or a subshell, or the command is a
    /// loop of builtins), and the session goes on with its state.
    fn session_command_past_its_deadline_runs_nothing_after_it(h) {
        let sb = h.sandbox();
        let s = sessions(sb)?;
        let id = s.open_session(&SessionOptions::default()).ctx("open a session")?;
        run(s, id, "KEEP=kept")?;
        let m = h.marker();
        let lines = [
            format!("sleep {m}; touch after-semicolon"),
            format!("sleep {m} && touch after-and"),
            format!("sleep {m}\ntouch after-newline"),
            format!("(sleep {m}); touch after-subshell"),
            "while :; do :; done; echo > after-builtin-loop".to_string(),
        ];
        for line in &lines {
            let out = s
                .session_exec(id, &Command::shell(line.as_str()).timeout(Duration::from_millis(500)), None)
                .ctx(format!("{line:?} past its deadline"))?;
            ensure!(out.timed_out, "{line:?}: the result does not say timed out: {out:?}");
            // The shell runs one line at a time: had it gone on with the
            // rest of that line, it would have done so before this one.
            ensure_eq!(run(s, id, "echo $KEEP")?, "kept\n", "the session's state after {line:?}");
            let names: Vec<String> = sb
                .list_dir(std::path::Path::new("."))
                .ctx("list the workspace")?
                .entries
                .iter()
                .map(|e| e.name.to_string_lossy().into_owned())
                .filter(|n| n.starts_with("after"))
                .collect();
            ensure!(names.is_empty(), "{line:?} went on past its deadline and made {names:?}");
        }
        let left = sandbox_processes_with_arg(sb, &m).ctx("scan /proc inside")?;
        ensure!(left.is_empty(), "a command survived its deadline: {left:?}");
        s.close_session(id).ctx("close the session")?;
        Ok(())
    }
}

case! {
    /// Sessions run at once and keep apart: each its own directory and
    /// variables.
    fn sessions_run_concurrently_and_stay_apart(h) {
        let sb = h.sandbox();
        sessions(sb)?;
        for dir in ["a", "b", "c", "d"] {
            h.plant_dir(dir)?;
        }
        let results: Vec<Res> = std::thread::scope(|scope| {
            let handles: Vec<_> = ["a", "b", "c", "d"]
                .into_iter()
                .map(|dir| {
                    scope.spawn(move || -> Res {
                        let s = sessions(sb)?;
                        let id = s.open_session(&SessionOptions::default()).ctx("open a session")?;
                        run(s, id, &format!("cd {dir}; NAME={dir}"))?;
                        for _ in 0..10 {
                            let got = run(s, id, "sleep 0.01; echo \"$NAME $(basename \"$PWD\")\"")?;
                            ensure_eq!(got, format!("{dir} {dir}\n"), "session {dir}");
                        }
                        s.close_session(id).ctx("close the session")
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(Outcome::Failed("a thread panicked".into())))).collect()
        });
        for r in results {
            r?;
        }
        Ok(())
    }
}

case! {
    /// Closing a session kills its shell and its background jobs; the
    /// closed session refuses commands; closing again is fine.
    fn closing_a_session_kills_its_jobs(h) {
        let sb = h.sandbox();
        let s = sessions(sb)?;
        let id = s.open_session(&SessionOptions::default()).ctx("open a session")?;
        let m = h.marker();
        run(s, id, &format!("sleep {m} & setsid sleep {m} &"))?;
        let before = sandbox_processes_with_arg(sb, &m).ctx("scan /proc inside")?;
        ensure!(!before.is_empty(), "the background jobs never started, so the check would prove nothing");
        s.close_session(id).ctx("close the session")?;
        let after = sandbox_processes_with_arg(sb, &m).ctx("scan /proc inside")?;
        ensure!(after.is_empty(), "background jobs survived closing the session: {after:?}");
        match s.session_exec(id, &Command::shell("true"), None) {
            Err(Error::SessionNotOpen { .. }) => {}
            other => fail!("exec in a closed session: got {other:?}, expected SessionNotOpen"),
        }
        s.close_session(id).ctx("close it again")?;
        Ok(())
    }
}

case! {
    /// `exit` in a session ends it: that command reports the status, the
    /// next says the session is over and why. Commands cannot set their own
    /// directory, environment or stdin in a session.
    fn a_session_that_exits_says_so_and_session_commands_are_checked(h) {
        let sb = h.sandbox();
        let s = sessions(sb)?;
        let id = s.open_session(&SessionOptions::default()).ctx("open a session")?;
        for (what, command) in [
            ("cwd", Command::shell("true").cwd(".")),
            ("env", Command::shell("true").env("A", "1")),
            ("stdin", Command::shell("true").stdin("x")),
        ] {
            match s.session_exec(id, &command, None) {
                Err(Error::InvalidCommand { .. }) => {}
                other => fail!("a session command setting its {what}: got {other:?}, expected InvalidCommand"),
            }
        }
        let argv = s
            .session_exec(id, &Command::new(["printf", "%s|", "a b", "it's", "$HOME"]), None)
            .ctx("an argument vector in a session")?;
        ensure_eq!(show(&argv.stdout), show(b"a b|it's|$HOME|"), "an argument vector is quoted, not expanded");
        let out = exec(s, id, "exit 3")?;
        ensure_eq!(out.status, ExitStatus::Code(3), "the status of `exit 3`");
        match s.session_exec(id, &Command::shell("true"), None) {
            Err(Error::SessionNotOpen { reason, .. }) => {
                ensure!(reason.contains('3'), "the reason does not say how the shell ended: {reason}")
            }
            other => fail!("exec after exit: got {other:?}, expected SessionNotOpen"),
        }
        s.close_session(id).ctx("close an ended session")?;
        match s.session_exec(SessionId(u64::MAX), &Command::shell("true"), None) {
            Err(Error::SessionNotOpen { .. }) => {}
            other => fail!("exec in a session never opened: got {other:?}, expected SessionNotOpen"),
        }
        Ok(())
    }
}

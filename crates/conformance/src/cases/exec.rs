//! Running commands: exit status, streams, stdin, and commands that cannot
//! run.

use std::path::Path;
use std::time::Duration;

use hako_core::{Command, Error, ExitStatus, Stream};

use crate::check::{bytes_eq, expect_output, run, sh, show, still_works, Ctx};

case! {
    /// `exit N` comes back as `Code(N)` for 0, 3 and 255, from an argv and
    /// from a shell string alike.
    fn exit_codes_are_reported_exactly(h) {
        for code in [0, 3, 255] {
            let script = format!("exit {code}");
            let out = run(h, &Command::new(["sh", "-c", script.as_str()]))?;
            ensure_eq!(out.status, ExitStatus::Code(code), "sh -c '{script}'");
            ensure!(!out.timed_out, "sh -c '{script}' says it timed out");
            let out = sh(h, &script)?;
            ensure_eq!(out.status, ExitStatus::Code(code), "shell {script:?}");
        }
        let out = run(h, &Command::new(["false"]))?;
        ensure_eq!(out.status, ExitStatus::Code(1), "false");
        Ok(())
    }
}

case! {
    /// A command that kills itself reports the signal, not an exit code, and
    /// keeps what it wrote first.
    fn a_command_killed_by_a_signal_reports_the_signal(h) {
        let out = sh(h, "printf before; kill -TERM $$; printf after")?;
        ensure_eq!(out.status, ExitStatus::Signal(15), "kill -TERM $$");
        bytes_eq(&out.stdout, b"before", "stdout before the signal")?;
        ensure!(!out.timed_out, "a signal is not a timeout");
        let out = sh(h, "kill -KILL $$")?;
        ensure_eq!(out.status, ExitStatus::Signal(9), "kill -KILL $$");
        ensure_eq!(out.status.shell_code(), 137, "shell code of SIGKILL");
        Ok(())
    }
}

case! {
    /// stdout and stderr arrive separately, each complete and counted.
    fn stdout_and_stderr_are_kept_apart(h) {
        let out = sh(h, "printf to-out; printf to-err >&2; printf more-out; printf more-err >&2")?;
        ensure_eq!(out.status, ExitStatus::Code(0), "status");
        bytes_eq(&out.stdout, b"to-outmore-out", "stdout")?;
        bytes_eq(&out.stderr, b"to-errmore-err", "stderr")?;
        ensure_eq!(out.stdout_total, 14, "stdout_total");
        ensure_eq!(out.stderr_total, 14, "stderr_total");
        ensure!(
            !out.stdout_truncated && !out.stderr_truncated,
            "small output marked truncated"
        );
        Ok(())
    }
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
}

case! {
    /// stdin reaches the command exactly: binary bytes, 1 MiB (more than a
    /// pipe buffer) and 3 MiB (more than the output cap).
    fn stdin_is_delivered_byte_for_byte(h) {
        let small = b"line one\n\0binary\xff\xfe\nlast".to_vec();
        let out = run(h, &Command::new(["cat"]).stdin(small.clone()))?;
        expect_output(&out, &small, "cat of a small binary stdin")?;

        let mib = pattern(1 << 20);
        let out = run(h, &Command::new(["cat"]).stdin(mib.clone()).max_output(2 << 20))?;
        expect_output(&out, &mib, "cat of 1 MiB stdin")?;
        ensure_eq!(out.stdout_total, 1 << 20, "stdout_total of 1 MiB");

        let out = run(h, &Command::new(["wc", "-c"]).stdin(pattern(3 << 20)))?;
        ensure_eq!(out.status, ExitStatus::Code(0), "wc -c");
        ensure_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "3145728",
            "wc -c of 3 MiB stdin"
        );
        Ok(())
    }
}

case! {
    /// A command that exits without reading its stdin, or reads only part of
    /// it, neither blocks nor fails.
    fn stdin_the_command_does_not_read_does_not_block_it(h) {
        let out = run(h, &Command::new(["true"]).stdin(vec![b'x'; 8 << 20]))?;
        expect_output(&out, b"", "true with 8 MiB of unread stdin")?;
        let data = pattern(4 << 20);
        let out = run(h, &Command::new(["head", "-c", "10"]).stdin(data.clone()))?;
        expect_output(&out, &data[..10], "head -c 10 of 4 MiB")?;
        still_works(h, "unread stdin")
    }
}

case! {
    /// Without stdin the command reads end of file at once (it is never
    /// attached to a terminal or to the caller's stdin).
    fn no_stdin_means_end_of_file_at_once(h) {
        let out = run(h, &Command::new(["cat"]).timeout(Duration::from_secs(60)))?;
        expect_output(&out, b"", "cat with no stdin")?;
        let out = run(h, &Command::new(["cat"]).stdin(Vec::new()))?;
        expect_output(&out, b"", "cat with empty stdin")?;
        let out = sh(h, "if read line; then echo got; else echo eof; fi")?;
        expect_output(&out, b"eof\n", "read with no stdin")
    }
}

case! {
    /// A program that does not exist is `CommandNotFound`, by name and by
    /// path, and the sandbox keeps working.
    fn a_missing_program_is_command_not_found(h) {
        let name = format!("hako-no-such-program-{}", h.marker());
        for program in [name.as_str(), "/nonexistent-hako-dir/prog", "./missing-here"] {
            match h.sandbox().exec(&Command::new([program, "arg"])) {
                Err(Error::CommandNotFound { program: p }) => {
                    ensure_eq!(p.as_str(), program, "the error names the program")
                }
                other => fail!("exec {program:?}: got {other:?}, expected CommandNotFound"),
            }
            still_works(h, format!("exec of missing {program:?}"))?;
        }
        Ok(())
    }
}

case! {
    /// A file without the execute bit, and a directory, are `CannotExecute`.
    fn a_file_without_the_execute_bit_cannot_execute(h) {
        h.sandbox()
            .write_file(Path::new("noexec.sh"), b"#!/bin/sh\necho ran > ran\n")
            .ctx("write noexec.sh")?;
        h.plant_dir("adir")?;
        for program in ["./noexec.sh", "./adir"] {
            match h.sandbox().exec(&Command::new([program])) {
                Err(Error::CannotExecute { program: p, .. }) => {
                    ensure_eq!(p.as_str(), program, "the error names the program")
                }
                other => fail!("exec {program:?}: got {other:?}, expected CannotExecute"),
            }
            still_works(h, format!("exec of {program:?}"))?;
        }
        ensure!(
            !h.host_path("ran").exists(),
            "the non-executable script ran"
        );
        Ok(())
    }
}

case! {
    /// An empty argv, an empty program name, a NUL in an argument or in the
    /// environment and a bad variable name are `InvalidCommand`; nothing runs.
    fn a_malformed_command_is_invalid_and_runs_nothing(h) {
        let leave = "echo ran > ran-marker";
        let commands = [
            ("empty argv", Command::new(Vec::<String>::new())),
            ("empty program", Command::new(["", "-c", leave])),
            ("NUL in an argument", Command::new(["sh", "-c", leave, "a\0b"])),
            ("NUL in the program", Command::new(["s\0h", "-c", leave])),
            ("NUL in a shell string", Command::shell(format!("{leave}; echo a\0b"))),
            ("NUL in an env value", Command::shell(leave).env("HAKO_V", "a\0b")),
            ("= in an env name", Command::shell(leave).env("A=B", "x")),
            ("empty env name", Command::shell(leave).env("", "x")),
            ("NUL in an env name", Command::shell(leave).env("A\0B", "x")),
        ];
        for (what, command) in &commands {
            match h.sandbox().exec(command) {
                Err(Error::InvalidCommand { reason }) => {
                    ensure!(!reason.is_empty(), "{what}: the error gives no reason")
                }
                other => fail!("{what}: got {other:?}, expected InvalidCommand"),
            }
            ensure!(
                !h.host_path("ran-marker").exists(),
                "{what}: refused but the command ran"
            );
            still_works(h, what)?;
        }
        Ok(())
    }
}

case! {
    /// A 100 KiB argument arrives exactly; a 4 MiB and a 20 MiB one (over the
    /// kernel's per-argument limit, and over any frame) are errors, and the
    /// sandbox stays usable.
    fn arguments_are_delivered_exactly_and_a_huge_one_is_an_error(h) {
        let args = ["", " spaces  and\ttabs ", "'quotes\" $HOME `x` \\", "ünïcødé"];
        for arg in args {
            let out = run(h, &Command::new(["sh", "-c", "printf %s \"$1\"", "sh", arg]))?;
            expect_output(&out, arg.as_bytes(), format!("argument {arg:?}"))?;
        }
        let big = "a".repeat(100 << 10);
        let out = run(h, &Command::new(["sh", "-c", "printf %s \"$1\"", "sh", big.as_str()]))?;
        expect_output(&out, big.as_bytes(), "a 100 KiB argument")?;
        for size in [4usize << 20, 20 << 20] {
            let huge = "b".repeat(size);
            let result = h.sandbox().exec(&Command::new(["echo", huge.as_str()]));
            ensure!(
                result.is_err(),
                "a {size}-byte argument: got {:?}, expected an error",
                result.map(|o| o.status)
            );
            still_works(h, format!("a {size}-byte argument"))?;
        }
        Ok(())
    }
}

case! {
    /// Commands run at the same time from several threads each get their own
    /// output.
    fn concurrent_execs_get_their_own_output(h) {
        let results: Vec<Result<(), crate::Outcome>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..8)
                .map(|t| {
                    scope.spawn(move || -> crate::check::Res {
                        for i in 0..4 {
                            let id = format!("thread-{t}-run-{i}");
                            let out = run(
                                h,
                                &Command::new([
                                    "sh",
                                    "-c",
                                    "sleep 0.05; printf %s \"$1\"; printf %s \"$1\" >&2",
                                    "sh",
                                    id.as_str(),
                                ]),
                            )?;
                            ensure_eq!(out.status, ExitStatus::Code(0), "{id}");
                            bytes_eq(&out.stdout, id.as_bytes(), format!("{id} stdout"))?;
                            bytes_eq(&out.stderr, id.as_bytes(), format!("{id} stderr"))?;
                        }
                        Ok(())
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|j| {
                    j.join()
                        .unwrap_or_else(|_| Err(crate::Outcome::Failed("a thread panicked".into())))
                })
                .collect()
        });
        results.into_iter().collect()
    }
}

case! {
    /// Streamed exec hands the sink exactly the bytes the output keeps, per
    /// stream, within the cap.
    fn exec_stream_delivers_the_same_bytes_as_the_output(h) {
        let Some(streaming) = h.sandbox().exec_stream() else {
            skip!("the backend does not offer exec_stream");
        };
        let mut chunks: Vec<(Stream, Vec<u8>)> = Vec::new();
        let out = streaming
            .exec_stream(
                &Command::shell("printf a; printf b >&2; sleep 0.1; printf c; printf d >&2"),
                &mut |stream, bytes| chunks.push((stream, bytes.to_vec())),
            )
            .ctx("exec_stream")?;
        let joined = |which: Stream| -> Vec<u8> {
            chunks
                .iter()
                .filter(|(s, _)| *s == which)
                .flat_map(|(_, b)| b.iter().copied())
                .collect()
        };
        ensure_eq!(out.status, ExitStatus::Code(0), "exec_stream status");
        bytes_eq(&out.stdout, b"ac", "stdout kept")?;
        bytes_eq(&joined(Stream::Stdout), b"ac", "streamed stdout")?;
        bytes_eq(&joined(Stream::Stderr), b"bd", "streamed stderr")?;
        bytes_eq(&out.stderr, b"bd", "stderr kept")?;

        let mut streamed = 0usize;
        let out = streaming
            .exec_stream(
                &Command::new(["head", "-c", "3000000", "/dev/zero"]).max_output(1000),
                &mut |_, bytes| streamed += bytes.len(),
            )
            .ctx("exec_stream of a flood")?;
        ensure_eq!(streamed, 1000, "bytes streamed under a cap of 1000");
        ensure_eq!(out.stdout.len(), 1000, "bytes kept");
        ensure_eq!(out.stdout_total, 3_000_000, "bytes counted");
        ensure!(out.stdout_truncated, "flood not marked truncated: {}", show(&out.stdout));
        Ok(())
    }
}

case! {
    /// Streamed output arrives while the command runs, not when it ends:
    /// the command waits for a file that only the sink creates on seeing
    /// its first line. Buffering until the end would leave it waiting for
    /// its deadline.
    fn exec_stream_delivers_output_while_the_command_runs(h) {
        let Some(streaming) = h.sandbox().exec_stream() else {
            skip!("the backend does not offer exec_stream");
        };
        let flag = h.host_path("streamed.flag");
        let mut seen = Vec::new();
        let out = streaming
            .exec_stream(
                &Command::shell(
                    "echo waiting; i=0; while [ ! -e streamed.flag ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; \
                     [ -e streamed.flag ] && echo seen",
                )
                .timeout(std::time::Duration::from_secs(60)),
                &mut |_, bytes| {
                    seen.extend_from_slice(bytes);
                    if seen.starts_with(b"waiting\n") && !flag.exists() {
                        let _ = std::fs::write(&flag, b"");
                    }
                },
            )
            .ctx("exec_stream")?;
        ensure!(!out.timed_out, "timed out: the first line never reached the sink while the command ran");
        bytes_eq(&out.stdout, b"waiting\nseen\n", "stdout")?;
        Ok(())
    }
}

case! {
    /// Everyday tools work: `ls -la` lists the workspace (its `.` and a
    /// file), and `stat FILE` and `stat .` describe them (GNU coreutils
    /// pass flags to `statx` that a sandbox's kernel must accept).
    fn everyday_tools_ls_la_and_stat_work(h) {
        // A sandbox that declares it fails them (a gVisor release that
        // refuses the flags of `statx`) is checked to fail exactly as it
        // says, and never picked by `auto`; any other must run them.
        let declared = h
            .sandbox()
            .capabilities()
            .defects
            .iter()
            .any(|d| d.contains("ls -la") && d.contains("stat"));
        let ls = sh(h, "printf hello > listed.txt && ls -la && ls -la . listed.txt")?;
        let ls_text = String::from_utf8_lossy(&ls.stdout);
        let ls_ok = ls.status == ExitStatus::Code(0)
            && ls_text.contains("listed.txt")
            && ls_text.contains(" .");
        let st = sh(h, "stat listed.txt && stat .")?;
        let st_text = String::from_utf8_lossy(&st.stdout);
        let st_ok = st.status == ExitStatus::Code(0)
            && st_text.contains("listed.txt")
            && st_text.contains("Size: 5");
        if declared {
            // The defect is the kernel's (GNU tools hit it; busybox's do
            // not): what fails must fail with it, nothing else.
            for (ok, out, what) in [(ls_ok, &ls, "ls -la"), (st_ok, &st, "stat")] {
                ensure!(
                    ok || String::from_utf8_lossy(&out.stderr).contains("Invalid argument"),
                    "{what} failed otherwise than the declared defect: {:?}, stderr {}",
                    out.status,
                    show(&out.stderr)
                );
            }
        } else {
            ensure!(
                ls_ok,
                "ls -la: {:?}, stdout {ls_text:?}, stderr {}",
                ls.status,
                show(&ls.stderr)
            );
            ensure!(
                st_ok,
                "stat: {:?}, stdout {st_text:?}, stderr {}",
                st.status,
                show(&st.stderr)
            );
        }
        still_works(h, "ls -la and stat")
    }
}
